"""How many requests per second an instance can serve: what "70 % load" is relative to.

A batching server has no single service time, so load is stated against saturation: the
request rate at which the decode batch sits at its cap and every step is full. Per request
the device then spends ``output · t_decode(B)/B`` on decode (B = the batch cap, context =
prompt + half the output) plus the marginal time of its uncached prefill tokens over an
empty step. This is an estimate from the step model (any model with ``features_time``),
good for choosing a rate, not a measured capacity.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from openinfer.errors import require
from sim.step_features import StepFeatures, padded_batch
from sim.workloads import ChatWorkload


class FeatureTimed(Protocol):
    def features_time(self, f: StepFeatures) -> float: ...


@dataclass(frozen=True)
class RequestShape:
    prompt_tokens: float
    cached_tokens: float
    output_tokens: float


def saturation_qps(model: FeatureTimed, shape: RequestShape, *, max_batch: int = 256,
                   chunk_tokens: int = 1024) -> float:
    require(shape.output_tokens >= 1, "shape.output_tokens", shape.output_tokens, "a number >= 1")
    b = max_batch
    ctx = int(shape.prompt_tokens + shape.output_tokens / 2)
    t_dec = model.features_time(StepFeatures(decode_rows=b, decode_rows_padded=padded_batch(b),
                                             decode_context_tokens=b * (ctx + 1)))
    decode_s = shape.output_tokens * t_dec / b
    new = max(0, int(shape.prompt_tokens - shape.cached_tokens))
    start = int(shape.cached_tokens)
    prefill_s, done = 0.0, 0
    empty = model.features_time(StepFeatures())
    while done < new:  # the prompt's chunks, each costed over an empty step
        n = min(chunk_tokens, new - done)
        s = start + done
        f = StepFeatures(prefill_tokens=n, prefill_attn_pairs=n * s + n * (n + 1) // 2,
                         prefill_context_tokens=s + n, logit_rows=1 if done + n == new else 0)
        prefill_s += max(0.0, model.features_time(f) - empty)
        done += n
    return 1.0 / (decode_s + prefill_s)


def chat_shape(w: ChatWorkload) -> RequestShape:
    """Mean prompt / cached / output tokens of a chat workload's turns (expected values:
    turn k's prompt repeats every earlier turn, which the prefix cache then holds)."""
    turns = int(round(w.mean_turns()))
    u, o, sys = w.user_len.expected, w.output_len.expected, w.system_prompt_len
    prompt = cached = 0.0
    for k in range(turns):
        prompt += sys + (k + 1) * u + k * o
        cached += sys + k * (u + o)  # steady state: the system prompt is already cached
    return RequestShape(prompt / turns, cached / turns, o)
