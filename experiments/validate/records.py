"""Timing records for calibration (issue #8), one JSON object per line.

The real executor (``CudaExecutor.timings``, ``StepTiming``) and transfer
(``CudaTransfer.records``, ``CopyRecord``) keep their own records; this module writes them
in the one form ``sim.calibration`` reads, keeping every original field:

step line: ``type="step"``, ``source`` (served:<name> / grid), ``run`` (steps of one run
ran back to back; grid steps each get their own run, so no host gap is read from them),
``t_start_s`` (runtime time at execute), ``kind``, ``wall_s`` (execute to result, what the
scheduler waited), ``gpu_s`` (CUDA events around forward + sampling), ``graph``,
``prefill_rows`` ``[[start, n, is_final, all_logits], ...]``, ``decode_positions``,
``decode_rows``, ``decode_rows_padded`` (the graph bucket actually replayed) and
``features`` (the ``sim.step_features.StepFeatures`` counts, with that real padding).

copy line: ``type="copy"``, ``source``, ``run``, ``dir`` (d2h / h2d), ``pages``, ``runs``
(memcpy calls after coalescing), ``bytes``, ``seconds`` (= ``gpu_s``, CUDA-event time on the
copy stream, else ``wall_s``), ``gpu_s``, ``wall_s``, ``submitted_at``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from openinfer.backend.jsonl import write_jsonl as backend_write_jsonl
from sim.calibration import features_of


def step_record(t: Any, source: str, run: str, **extra: Any) -> dict[str, Any]:
    d = t.as_dict() if hasattr(t, "as_dict") else dict(t)
    rows = [list(r) for r in d.get("prefill", d.get("prefill_rows", []))]
    out = dict(type="step", source=source, run=run, t_start_s=d.get("started_at", d.get("t_start_s")),
               **{k: v for k, v in d.items() if k != "prefill"}, prefill_rows=rows)
    out["features"] = features_of(dict(prefill=rows, decode_positions=list(d.get("decode_positions", [])),
                                       decode_rows_padded=d.get("decode_rows_padded",
                                                                len(d.get("decode_positions", []))),
                                       kind=d.get("kind"))).as_dict()
    out.update(extra)
    return out


def copy_record(r: Any, source: str, run: str, **extra: Any) -> dict[str, Any]:
    d = r.as_dict() if hasattr(r, "as_dict") else dict(r)
    seconds = d.get("gpu_s") if d.get("gpu_s") is not None else d.get("wall_s")
    return dict(type="copy", source=source, run=run, **d, seconds=seconds, **extra)


def write_jsonl(path: str | Path, records: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Write the records; what the report says about the file (name, lines, bytes)."""
    recs = list(records)
    p = backend_write_jsonl(path, recs)
    return dict(path=p.name, records=len(recs), bytes=p.stat().st_size)
