"""Which source a result came from: a digest of the Python files that ran.

A GPU report outlives the tree that made it, and a commit hash does not name that tree
reliably: the GPU machine's copy of ``.git`` can lag behind the files it was sent, and a
working tree may hold uncommitted changes. A digest of the files themselves names the
code exactly. ``python -m openinfer.provenance`` prints the local tree's digests, to
compare with a report's ``environment.source`` (or a decode bench worker's
``source_digest``).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
# The packages a validate or simulator run executes, beside openinfer/ in the repository.
TREE_PACKAGES = ("openinfer", "sim", "experiments")


def source_digest(*roots: Path) -> str:
    """16 hex digits over every ``*.py`` file under ``roots``: its path relative to the
    root's parent (so a moved file changes the digest) and its bytes. Compiled caches are
    not read, so the digest is the same before and after an import."""
    h = hashlib.sha256()
    for root in roots:
        root = Path(root).resolve()
        for path in sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts):
            h.update(path.relative_to(root.parent).as_posix().encode())
            h.update(b"\0")
            h.update(path.read_bytes())
            h.update(b"\0")
    return h.hexdigest()[:16]


def tree_digests(package: Path = PACKAGE) -> dict[str, str]:
    """The digest of ``package`` (the openinfer that ran) and of every tree package found
    beside it (``tree``): the first names the kernels and the store, the second the whole
    run, validate's own code included."""
    roots = [package.parent / name for name in TREE_PACKAGES if (package.parent / name).is_dir()]
    return dict(openinfer=source_digest(package), tree=source_digest(*roots))


if __name__ == "__main__":
    for name, digest in tree_digests().items():
        print(f"{name:10s} {digest}")
