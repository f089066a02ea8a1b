"""The figures: latency CDFs per variant, load and host-tier curves of a sweep, timelines,
and the simulator against the real executor request by request (``fidelity``).

Built on ``matplotlib.figure.Figure`` (no pyplot, no global backend), so the same functions
write PNGs from a headless job and draw inline in the notebook. The sweep figures take the
rows of ``experiments.collect``'s table (dicts of strings or numbers).

    python -m experiments.plots TABLE.csv [out=DIR]   # qps.png and host_tier.png from a sweep table
"""

from __future__ import annotations

import csv
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

COLORS = {"pr829": "tab:red", "fixed": "tab:blue"}


def _color(name: str) -> str | None:
    return COLORS.get(name)


def _save(fig: Figure, path: Path | None) -> Figure:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
    return fig


def cdfs(reports: Mapping[str, Mapping[str, Any]], path: Path | None = None) -> Figure:
    """TTFT and TPOT CDFs of finished requests, one line per variant."""
    fig = Figure(figsize=(10, 4), layout="constrained")
    axes = fig.subplots(1, 2)
    for ax, key, label in ((axes[0], "ttft_s", "TTFT (ms)"), (axes[1], "tpot_s", "TPOT (ms)")):
        span = []
        for name, rep in reports.items():
            x = np.sort(np.asarray(rep["samples"][key], dtype=float)) * 1e3
            if x.size:
                finished = rep["outcomes"]["finished"]
                ax.step(x, np.arange(1, x.size + 1) / x.size, where="post", color=_color(name),
                        label=f"{name} ({finished} finished)")
                span += [x[0], x[-1]]
        if span and min(span) > 0 and max(span) / min(span) > 10:
            ax.set_xscale("log")   # a tail decades long; within one decade log ticks only clutter
        ax.set_xlabel(label)
        ax.set_ylabel("fraction of finished requests")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
    fig.suptitle("Latency CDFs per variant")
    return _save(fig, path)


def timeline(report: Mapping[str, Any], path: Path | None = None, title: str = "") -> Figure:
    """Per instance: pool pages used and save-pinned, and the queue lengths, over simulated time."""
    insts = report["instances"]
    fig = Figure(figsize=(10, 3.2 * len(insts)), layout="constrained")
    axes = np.atleast_2d(fig.subplots(len(insts), 2, squeeze=False))
    for row, (name, inst) in enumerate(insts.items()):
        tl = inst["timeline"]
        cols = {c: i for i, c in enumerate(tl["columns"])}
        data = np.asarray(tl["rows"], dtype=float).reshape(-1, len(cols))
        t = data[:, cols["t"]]
        ax = axes[row, 0]
        ax.plot(t, data[:, cols["used_pages"]], label="used pages")
        ax.plot(t, data[:, cols["pinned_pages"]], label="pinned pages")
        ax.axhline(inst["total_blocks"], color="grey", ls=":", label="pool size")
        ax.set_title(f"{name} ({inst['role']}): pool")
        ax.set_xlabel("simulated time (s)")
        ax.legend(loc="upper right", fontsize=8)
        ax = axes[row, 1]
        for c in ("deferred", "resolving", "prefilling", "active"):
            ax.plot(t, data[:, cols[c]], label=c)
        ax.set_title(f"{name}: queues")
        ax.set_xlabel("simulated time (s)")
        ax.legend(loc="upper right", fontsize=8)
    v = report.get("violation")
    if v:
        for ax in axes.ravel():
            ax.axvline(v["time_s"], color="red", ls="--", lw=1)
    fig.suptitle(title + (f"  (stopped: {v['invariant']} at {v['time_s']:.2f}s)" if v else ""))
    return _save(fig, path)


PHASE_TITLES = {"cold": "cold", "gpu": "GPU-radix hits", "cpu": "CPU-tier restores"}


def fidelity(report: Mapping[str, Any], path: Path | None = None) -> Figure:
    """Per phase of an ``experiments.fidelity`` report: each request's simulated TTFT and
    E2E latency against the real executor's (a dot on the diagonal is exact)."""
    phases = [p for p in PHASE_TITLES if p in report["phases"]]
    fig = Figure(figsize=(3.4 * len(phases), 6.4), layout="constrained")
    axes = np.atleast_2d(fig.subplots(2, len(phases), squeeze=False))
    for col, ph in enumerate(phases):
        reqs = report["phases"][ph]["requests"]
        for row, (key, label) in enumerate((("ttft_ms", "TTFT (ms)"), ("e2el_ms", "E2E (ms)"))):
            pairs = np.asarray([r[key] for r in reqs if None not in r[key]], dtype=float).reshape(-1, 2)
            ax = axes[row, col]
            ax.scatter(pairs[:, 0], pairs[:, 1], s=12, alpha=0.7, color=f"C{row}")
            lo, hi = float(pairs.min()), float(pairs.max())
            ax.plot([lo, hi], [lo, hi], color="grey", ls=":", lw=1)
            err = report["phases"][ph]["error"]["ttft" if row == 0 else "e2el"]["mean"]
            ax.set_title(f"{PHASE_TITLES[ph]}: {label.split()[0]} mean {err:+.1%}", fontsize=9)
            ax.set_xlabel(f"real {label}")
            ax.set_ylabel(f"simulated {label}")
    fig.suptitle(f"{report.get('model', '')} on {report.get('gpu', '')}: simulator vs real, "
                 f"held-out {report.get('workload', {}).get('kind', '')} run", fontsize=10)
    return _save(fig, path)


def _num(x: Any) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return float("nan")


def _series(rows: Iterable[Mapping[str, Any]], x: str, ys: tuple[str, ...],
            fixed: Mapping[str, Any] | None = None) -> dict[str, dict[str, np.ndarray]]:
    """variant -> {x: sorted xs, y: mean of each y at that x} (rows with other ``fixed`` values dropped)."""
    acc: dict[str, dict[float, list[list[float]]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if fixed and any(str(r.get(k)) != str(v) for k, v in fixed.items()):
            continue
        acc[str(r["variant"])][_num(r[x])].append([_num(r[y]) for y in ys])
    out = {}
    for name, by_x in acc.items():
        xs = sorted(by_x)
        means = np.array([np.nanmean(np.asarray(by_x[v]), axis=0) for v in xs])
        out[name] = {"x": np.asarray(xs), **{y: means[:, i] for i, y in enumerate(ys)}}
    return out


def vs_qps(rows: list[Mapping[str, Any]], path: Path | None = None, x: str = "workload.qps",
           fixed: Mapping[str, Any] | None = None) -> Figure:
    """Throughput and p99 TTFT against the offered request rate, per variant."""
    s = _series(rows, x, ("request_throughput", "p99_ttft_ms", "finished", "sent"), fixed)
    fig = Figure(figsize=(10, 4), layout="constrained")
    a, b = fig.subplots(1, 2)
    for name, d in s.items():
        a.plot(d["x"], d["request_throughput"], "o-", color=_color(name), label=name)
        b.plot(d["x"], d["p99_ttft_ms"], "o-", color=_color(name), label=name)
    a.plot([0, max((d["x"].max() for d in s.values()), default=1)], [0, max((d["x"].max() for d in s.values()),
           default=1)], ":", color="grey", label="offered")
    a.set_xlabel("offered QPS")
    a.set_ylabel("finished requests / s")
    b.set_xlabel("offered QPS")
    b.set_ylabel("p99 TTFT (ms, finished requests)")
    b.set_yscale("log")
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("Throughput and p99 TTFT against load" + (f" ({_fmt(fixed)})" if fixed else ""))
    return _save(fig, path)


def vs_host_tier(rows: list[Mapping[str, Any]], path: Path | None = None, x: str = "store.host_tier_gib",
                 fixed: Mapping[str, Any] | None = None) -> Figure:
    """Prefix hit rate (all tiers, and the CPU tier's share) and mean TTFT against CPU-tier size."""
    s = _series(rows, x, ("hit_rate", "host_hit_rate", "mean_ttft_ms"), fixed)
    fig = Figure(figsize=(10, 4), layout="constrained")
    a, b = fig.subplots(1, 2)
    for name, d in s.items():
        a.plot(d["x"], d["hit_rate"], "o-", color=_color(name), label=f"{name}: all tiers")
        a.plot(d["x"], d["host_hit_rate"], "s--", color=_color(name), label=f"{name}: CPU tier")
        b.plot(d["x"], d["mean_ttft_ms"], "o-", color=_color(name), label=name)
    a.set_xlabel("CPU tier (GiB)")
    a.set_ylabel("prefix hit rate")
    b.set_xlabel("CPU tier (GiB)")
    b.set_ylabel("mean TTFT (ms)")
    for ax in (a, b):
        ax.set_xscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Hit rate and TTFT against host-tier size" + (f" ({_fmt(fixed)})" if fixed else ""))
    return _save(fig, path)


def _fmt(fixed: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in fixed.items())


def read_table(path: str | Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def sweep_figures(rows: list[dict[str, Any]], out: Path) -> list[Path]:
    """The sweep figures a table has the columns for (qps.png, host_tier.png)."""
    written = []
    cols = set(rows[0]) if rows else set()
    if "workload.qps" in cols and len({r["workload.qps"] for r in rows}) > 1:
        host = {r.get("store.host_tier_gib") for r in rows}
        fixed = {"store.host_tier_gib": sorted(host, key=_num)[len(host) // 2]} if len(host) > 1 else None
        vs_qps(rows, out / "qps.png", fixed=fixed)
        written.append(out / "qps.png")
    if "store.host_tier_gib" in cols and len({r["store.host_tier_gib"] for r in rows}) > 1:
        qps = {r.get("workload.qps") for r in rows}
        fixed = {"workload.qps": sorted(qps, key=_num)[len(qps) // 2]} if len(qps) > 1 else None
        vs_host_tier(rows, out / "host_tier.png", fixed=fixed)
        written.append(out / "host_tier.png")
    return written


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    tables = [a for a in args if "=" not in a]
    opts = dict(a.split("=", 1) for a in args if "=" in a)
    if len(tables) != 1 or set(opts) - {"out"}:
        print("usage: python -m experiments.plots TABLE.csv [out=DIR]", file=sys.stderr)
        raise SystemExit(2)
    if not Path(tables[0]).is_file():
        print(f"error: {tables[0]} is not a file: expected a table written by "
              "python -m experiments.collect MULTIRUN_DIR out=TABLE.csv", file=sys.stderr)
        raise SystemExit(2)
    out = Path(opts.get("out", Path(tables[0]).parent))
    written = sweep_figures(read_table(tables[0]), out)
    if not written:   # a table of one setting, or not a collect table at all: say so
        print(f"error: {tables[0]} has no column that varies over its rows among workload.qps and "
              "store.host_tier_gib: expected a sweep table (python -m experiments.collect)",
              file=sys.stderr)
        raise SystemExit(2)
    for p in written:
        print(p)


if __name__ == "__main__":
    main()
