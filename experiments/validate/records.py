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

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any


def features(prefill_rows: Iterable[Iterable[Any]], decode_positions: list[int], padded: int) -> dict[str, int]:
    tokens = pairs = ctx = logits = 0
    for start, n, final, all_logits in prefill_rows:
        tokens += n
        pairs += n * start + n * (n + 1) // 2
        ctx += start + n
        logits += n if all_logits else (1 if final else 0)
    rows = len(decode_positions)
    return dict(prefill_tokens=tokens, prefill_attn_pairs=pairs, prefill_context_tokens=ctx,
                logit_rows=logits, decode_rows=rows, decode_rows_padded=int(padded),
                decode_context_tokens=sum(decode_positions) + rows)


def step_record(t: Any, source: str, run: str, **extra: Any) -> dict[str, Any]:
    d = t.as_dict() if hasattr(t, "as_dict") else dict(t)
    rows = [list(r) for r in d.get("prefill", d.get("prefill_rows", []))]
    out = dict(type="step", source=source, run=run, t_start_s=d.get("started_at", d.get("t_start_s")),
               **{k: v for k, v in d.items() if k != "prefill"}, prefill_rows=rows)
    out["features"] = features(rows, list(d.get("decode_positions", [])),
                               d.get("decode_rows_padded", len(d.get("decode_positions", []))))
    out.update(extra)
    return out


def copy_record(r: Any, source: str, run: str, **extra: Any) -> dict[str, Any]:
    d = r.as_dict() if hasattr(r, "as_dict") else dict(r)
    seconds = d.get("gpu_s") if d.get("gpu_s") is not None else d.get("wall_s")
    return dict(type="copy", source=source, run=run, **d, seconds=seconds, **extra)


def write_jsonl(path: str | Path, records: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with p.open("w") as f:
        for rec in records:
            f.write(json.dumps(rec, separators=(",", ":")) + "\n")
            n += 1
    return dict(path=p.name, records=n, bytes=p.stat().st_size)
