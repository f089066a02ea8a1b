"""The core reads no clock and no unseeded randomness: only the Runtime seam may.

Everything under ``openinfer/`` except ``openinfer/runtime/`` (the seam itself) and
``openinfer/models/`` (the real CUDA model) must get time, sleep, tasks and randomness
from the Runtime, or a simulated run would stop replaying exactly from its seed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "openinfer"
EXEMPT = ("runtime", "models")
BANNED_MODULES = {"time", "datetime", "asyncio", "threading"}
RANDOM_OK = {"Random"}  # a seeded instance is fine; the module-level functions are global state
NP_RANDOM_SEEDED = {"default_rng", "RandomState", "Generator", "SeedSequence", "PCG64", "Philox"}


def violations(source: str, filename: str = "<src>") -> list[str]:
    tree = ast.parse(source, filename)
    found: list[str] = []
    numpy_names = {"numpy"}
    np_random_names: set[str] = set()
    random_names: set[str] = set()

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                top = a.name.split(".")[0]
                if top in BANNED_MODULES:
                    found.append(f"{filename}:{node.lineno}: import {a.name}")
                if a.name == "random":
                    random_names.add(a.asname or "random")
                if a.name == "numpy":
                    numpy_names.add(a.asname or "numpy")
                if a.name == "numpy.random":
                    if a.asname:
                        np_random_names.add(a.asname)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            top = node.module.split(".")[0]
            if top in BANNED_MODULES:
                found.append(f"{filename}:{node.lineno}: from {node.module} import ...")
            if node.module == "random":
                for a in node.names:
                    if a.name not in RANDOM_OK:
                        found.append(f"{filename}:{node.lineno}: from random import {a.name}")
            if node.module == "numpy" and any(a.name == "random" for a in node.names):
                np_random_names.update(a.asname or "random" for a in node.names if a.name == "random")
            if node.module == "numpy.random":
                for a in node.names:
                    if a.name not in NP_RANDOM_SEEDED:
                        found.append(f"{filename}:{node.lineno}: from numpy.random import {a.name}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id in random_names and node.attr not in RANDOM_OK:
            found.append(f"{filename}:{node.lineno}: random.{node.attr}")
        if isinstance(node, ast.Call):
            fn = node.func
            if not isinstance(fn, ast.Attribute):
                continue
            owner = fn.value
            is_np_random = (isinstance(owner, ast.Attribute) and owner.attr == "random"
                            and isinstance(owner.value, ast.Name) and owner.value.id in numpy_names) \
                or (isinstance(owner, ast.Name) and owner.id in np_random_names)
            if not is_np_random:
                continue
            if fn.attr not in NP_RANDOM_SEEDED:
                found.append(f"{filename}:{node.lineno}: np.random.{fn.attr}() uses the global state")
            elif not node.args and not node.keywords:
                found.append(f"{filename}:{node.lineno}: np.random.{fn.attr}() without a seed")
    return found


def core_modules() -> list[Path]:
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts and rel.parts[0] in EXEMPT:
            continue
        out.append(path)
    return out


def test_the_scan_covers_the_core():
    names = {p.relative_to(ROOT).as_posix() for p in core_modules()}
    assert {"kv/store.py", "kv/pool.py", "kv/flush.py", "kv/host_tier.py"} <= names
    assert not any(n.startswith(("runtime/", "models/")) for n in names)


@pytest.mark.parametrize("path", core_modules(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_core_module_reads_no_clock_and_no_unseeded_randomness(path):
    assert violations(path.read_text(), str(path.relative_to(ROOT))) == []


@pytest.mark.parametrize("snippet", [
    "import time\n",
    "import time as t\n",
    "from time import monotonic\n",
    "import datetime\n",
    "from datetime import datetime\n",
    "import asyncio\n",
    "import threading\n",
    "from threading import Lock\n",
    "import random\nx = random.random()\n",
    "import random\nrandom.shuffle([1])\n",
    "from random import choice\n",
    "import numpy as np\nnp.random.rand(3)\n",
    "import numpy as np\nnp.random.default_rng()\n",
    "import numpy\nnumpy.random.randint(4)\n",
    "from numpy import random as npr\nnpr.normal()\n",
    "from numpy.random import rand\n",
])
def test_the_scanner_catches_violations(snippet):
    assert violations(snippet)


@pytest.mark.parametrize("snippet", [
    "import random\nr = random.Random(7)\n",
    "from random import Random\n",
    "import numpy as np\nrng = np.random.default_rng(3)\n",
    "import numpy as np\nrng = np.random.default_rng(seed=3)\n",
    "from openinfer.runtime import Runtime\n",
    "def f(rt):\n    return rt.now()\n",
])
def test_the_scanner_allows_seeded_and_seam_uses(snippet):
    assert violations(snippet) == []
