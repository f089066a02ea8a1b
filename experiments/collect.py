"""Collect every job of a multirun into one CSV: one row per job and variant, the job's
overrides as columns (plus the swept-over config values), then its summary metrics.

    python -m experiments.collect multirun/DATE out=table.csv
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Any

CONFIG_COLUMNS = ("workload.qps", "workload.num_requests", "store.host_tier_gib", "store.num_blocks",
                  "faults.name", "experiment.seed")


def _get(cfg: dict[str, Any], dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def collect(root: Path) -> list[dict[str, Any]]:
    rows = []
    for path in sorted(root.rglob("result.json"), key=lambda p: (len(p.parts), str(p))):
        res = json.loads(path.read_text())
        base: dict[str, Any] = {"job": str(path.parent.relative_to(root))}
        base.update({c: _get(res.get("config", {}), c) for c in CONFIG_COLUMNS})
        for o in res.get("overrides", []):
            k, _, v = o.partition("=")
            base[k.lstrip("+~")] = v
        for r in res["rows"]:
            rows.append({**base, **r})
    return rows


def write_csv(rows: list[dict[str, Any]], out: Path) -> None:
    cols: list[str] = []
    for r in rows:
        cols += [k for k in r if k not in cols]
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    dirs = [a for a in args if "=" not in a]
    opts = dict(a.split("=", 1) for a in args if "=" in a)
    if len(dirs) != 1 or set(opts) - {"out"}:
        print("error: usage: python -m experiments.collect MULTIRUN_DIR [out=table.csv]", file=sys.stderr)
        raise SystemExit(2)
    if not Path(dirs[0]).is_dir():
        print(f"error: {dirs[0]} is not a folder: give a Hydra multirun folder "
              f"(multirun/<date>_<time>, or the hydra.sweep.dir a sweep was given)", file=sys.stderr)
        raise SystemExit(2)
    rows = collect(Path(dirs[0]))
    if not rows:
        print(f"error: no result.json under {dirs[0]}", file=sys.stderr)
        raise SystemExit(2)
    out = Path(opts.get("out", Path(dirs[0]) / "table.csv"))
    try:
        write_csv(rows, out)
    except OSError as err:
        print(f"error: out={out} cannot be written ({err.strerror}): expected a CSV path in a "
              "folder that exists or can be made", file=sys.stderr)
        raise SystemExit(2) from None
    print(f"{len(rows)} rows -> {out}")


if __name__ == "__main__":
    main()
