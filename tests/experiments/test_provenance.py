"""A report names the files that ran (openinfer.provenance): the digest follows the source
and nothing else, and validate's and the decode bench's records carry it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from openinfer.provenance import source_digest, tree_digests

ROOT = Path(__file__).resolve().parents[2]


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    pkg = tmp_path / "openinfer"
    for rel, text in files.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    return pkg


def test_the_digest_changes_with_a_file_and_only_with_the_source(tmp_path):
    pkg = _package(tmp_path, {"__init__.py": "", "kernels/attn.py": "SPLITS = 64\n"})
    first = source_digest(pkg)
    assert first == source_digest(pkg) and len(first) == 16
    # compiled caches and other files are not source
    (pkg / "kernels" / "__pycache__").mkdir()
    (pkg / "kernels" / "__pycache__" / "attn.cpython-311.pyc").write_bytes(b"\x00\x01")
    (pkg / "notes.txt").write_text("not code")
    assert source_digest(pkg) == first
    (pkg / "kernels" / "attn.py").write_text("SPLITS = 0\n")            # a changed default
    changed = source_digest(pkg)
    assert changed != first
    (pkg / "kernels" / "attn.py").rename(pkg / "attn.py")              # same bytes, moved
    assert source_digest(pkg) not in (first, changed)


def test_the_tree_digest_covers_every_package_of_a_run():
    digests = tree_digests()
    assert set(digests) == {"openinfer", "tree"}
    assert digests["openinfer"] == source_digest(ROOT / "openinfer")
    assert digests["tree"] == source_digest(ROOT / "openinfer", ROOT / "sim", ROOT / "experiments")
    out = subprocess.run([sys.executable, "-m", "openinfer.provenance"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert digests["openinfer"] in out and digests["tree"] in out


def test_a_bench_worker_of_an_older_tree_still_gets_a_digest(tmp_path):
    """``--base``: the worker imports an older openinfer (first on its path) that has no
    provenance module; the digest comes from the bench's own tree, of the package that ran."""
    old = _package(tmp_path, {"__init__.py": "", "models/__init__.py": ""})
    code = ("import pathlib, openinfer, device_decode_bench as bench\n"
            "package = pathlib.Path(openinfer.__file__).parent\n"
            "print(package, bench.working_tree_module('provenance').source_digest(package))\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT / "scripts"), str(ROOT)]))
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(old), source_digest(old)]
