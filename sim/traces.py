"""Replay traces: JSONL request logs, including the public Mooncake trace format.

Mooncake (kvcache-ai/Mooncake ``mooncake_trace.jsonl``) lines look like
``{"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, ...]}``:
arrival in milliseconds, and one hash id per 512-token block of the prompt, equal ids
meaning equal text. The simulator turns ids into tokens with :class:`~sim.tokens.BlockTokens`
so shared prefixes in the trace are shared prefixes in the pool.

The generic format uses ``arrival_s``, ``input_len``, ``output_len`` and optionally
``prompt`` (token ids) or ``hash_ids`` (+ ``block_tokens``). Each line's format is detected
from its keys; errors name the line and the field.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from openinfer.errors import ConfigError, require

MOONCAKE_BLOCK_TOKENS = 512


@dataclass(frozen=True)
class TraceRecord:
    arrival_s: float
    input_len: int
    output_len: int
    hash_ids: tuple[int, ...] | None = None
    prompt: tuple[int, ...] | None = None
    block_tokens: int = MOONCAKE_BLOCK_TOKENS


def _int(d: dict, key: str, where: str, low: int) -> int:
    v = d.get(key)
    require(isinstance(v, int) and not isinstance(v, bool) and v >= low, f"{where}.{key}", v, f"an int >= {low}")
    return v


def parse_line(d: dict, where: str) -> TraceRecord:
    """One decoded JSON object of a trace."""
    require(isinstance(d, dict), where, d, "a JSON object")
    if "timestamp" in d:  # Mooncake
        ts = d["timestamp"]
        require(isinstance(ts, (int, float)) and not isinstance(ts, bool) and ts >= 0, f"{where}.timestamp", ts,
                "a number >= 0 (milliseconds)")
        n = _int(d, "input_length", where, 1)
        m = max(1, _int(d, "output_length", where, 0))  # a 0-token answer still samples one token
        ids = d.get("hash_ids", [])
        require(isinstance(ids, list) and all(isinstance(h, int) and not isinstance(h, bool) for h in ids),
                f"{where}.hash_ids", ids, "a list of ints")
        return TraceRecord(ts / 1000.0, n, m, tuple(ids))
    t = d.get("arrival_s")
    require(isinstance(t, (int, float)) and not isinstance(t, bool) and t >= 0, f"{where}.arrival_s", t,
            "a number >= 0 (seconds); or use the Mooncake keys timestamp/input_length/output_length/hash_ids")
    m = _int(d, "output_len", where, 1)
    prompt = d.get("prompt")
    if prompt is not None:
        require(isinstance(prompt, list) and prompt and all(isinstance(x, int) and x >= 0 for x in prompt),
                f"{where}.prompt", prompt, "a non-empty list of token ids")
        return TraceRecord(float(t), len(prompt), m, prompt=tuple(prompt))
    n = _int(d, "input_len", where, 1)
    ids = d.get("hash_ids")
    bt = d.get("block_tokens", MOONCAKE_BLOCK_TOKENS)
    require(isinstance(bt, int) and bt >= 1, f"{where}.block_tokens", bt, "an int >= 1")
    if ids is not None:
        require(isinstance(ids, list) and all(isinstance(h, int) for h in ids), f"{where}.hash_ids", ids,
                "a list of ints")
        ids = tuple(ids)
    return TraceRecord(float(t), n, m, ids, block_tokens=bt)


def parse_lines(lines: Iterable[str], source: str = "trace") -> list[TraceRecord]:
    """Records sorted by arrival (stable), arrival times shifted so the first is 0."""
    out: list[TraceRecord] = []
    for i, line in enumerate(lines, start=1):
        line = line.strip()
        if not line:
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError as err:
            raise ConfigError(f"{source}:{i}", line[:60], f"one JSON object per line ({err.msg})") from None
        out.append(parse_line(d, f"{source}:{i}"))
    if not out:
        return out
    out.sort(key=lambda r: r.arrival_s)
    t0 = out[0].arrival_s
    return [r if t0 == 0 else TraceRecord(r.arrival_s - t0, r.input_len, r.output_len, r.hash_ids, r.prompt,
                                          r.block_tokens) for r in out]


def load_trace(path: str | Path) -> list[TraceRecord]:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as err:
        raise ConfigError("trace", str(p), f"a readable JSONL file ({err.strerror})") from None
    return parse_lines(text.splitlines(), p.name)


def synthetic_mooncake_lines(n: int, rng_seed: int, *, rate: float = 2.0, mean_input: int = 2048,
                             mean_output: int = 128, share: float = 0.5) -> list[str]:
    """A small trace *in the Mooncake format* for demos and tests when no trace file is at
    hand: Poisson arrivals, and a fraction ``share`` of requests reusing an earlier
    request's leading hash ids. It is labelled synthetic wherever it is used."""
    import random
    rng = random.Random(rng_seed)
    t_ms = 0.0
    lines, history = [], []
    next_id = 0
    for _ in range(n):
        t_ms += rng.expovariate(rate) * 1000.0
        length = max(1, int(rng.expovariate(1.0 / mean_input)))
        blocks = -(-length // MOONCAKE_BLOCK_TOKENS)
        ids: list[int] = []
        if history and rng.random() < share:
            donor = rng.choice(history)
            ids = donor[:rng.randint(1, len(donor))][:blocks]
        while len(ids) < blocks:
            ids.append(next_id)
            next_id += 1
        history.append(ids)
        lines.append(json.dumps({"timestamp": int(t_ms), "input_length": length,
                                 "output_length": max(1, int(rng.expovariate(1.0 / mean_output))),
                                 "hash_ids": ids}))
    return lines
