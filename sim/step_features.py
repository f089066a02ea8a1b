"""What a step plan costs, reduced to a handful of counts.

Both step models (the roofline and the calibrated fit) read the same counts, so a model
fitted on the real executor's timings and the analytic one are interchangeable behind
``step_time(plan)``, and the counts are computed in one pass over the plan (this runs once
per simulated step, thousands of times a second).
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import asdict, dataclass

from openinfer.backend.buckets import GRAPH_BUCKETS, prefill_bucket  # shared with the real executor
from openinfer.backend.executor import DecodeBatch, StepKind, StepPlan


def padded_batch(rows: int, buckets: tuple[int, ...] = GRAPH_BUCKETS) -> int:
    """The CUDA-graph batch a decode of ``rows`` rows replays (rows beyond the last: as is)."""
    if rows <= 0:
        return 0
    i = bisect_left(buckets, rows)
    return buckets[i] if i < len(buckets) else rows


@dataclass(frozen=True, slots=True)
class StepFeatures:
    prefill_tokens: int = 0          # prompt tokens computed this step
    prefill_attn_pairs: int = 0      # causal (query, key) pairs of the chunks: quadratic in context
    prefill_context_tokens: int = 0  # KV the chunks read or write: sum of (start + n)
    logit_rows: int = 0              # prefill rows that need the LM head
    decode_rows: int = 0
    decode_rows_padded: int = 0      # rows the kernels run (graph bucket on pure decode steps)
    decode_context_tokens: int = 0   # KV the decode rows read or write: sum of (position + 1)
    prompt_graph: int = 0            # 1: a step with prompt tokens that replays a prefill graph
    graph_tokens: int = 0            # the token bucket that graph computes (prompt tokens and
                                     # decode rows padded up): a replay costs its bucket, not its rows

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def step_features(plan: StepPlan, pad_unified: bool = False, prefill_graphs: bool = False) -> StepFeatures:
    """Counts of one plan. Decode rows are padded to the graph bucket only on pure decode
    steps (decode graphs; a unified step's rows are not padded) unless ``pad_unified``.
    ``prefill_graphs``: the engine replays steps with prompt tokens as graphs where a
    (tokens, seqs) bucket holds them and no row wants every token's logits, as
    ``CudaExecutor`` does with ``prefill_graphs`` on (``prompt_graph`` says which)."""
    p_tokens = pairs = p_ctx = logits = 0
    every_logit = False
    for row in plan.prefill:
        n = len(row.tokens)
        s = row.start
        p_tokens += n
        pairs += n * s + n * (n + 1) // 2
        p_ctx += s + n
        if row.all_logits:
            logits += n
            every_logit = True
        elif row.is_final:
            logits += 1
    decode = plan.decode
    rows = len(decode)
    if not rows:
        ctx = 0
    elif isinstance(decode, DecodeBatch):  # the cohort's arrays: no row objects built
        ctx = decode.position_sum + rows
    else:
        ctx = sum(r.position for r in decode) + rows
    pad = padded_batch(rows) if rows and (plan.kind is StepKind.DECODE or pad_unified) else rows
    bucket = (prefill_bucket(p_tokens + rows, len(plan.prefill) + rows)
              if prefill_graphs and p_tokens > 0 and not every_logit else None)
    return StepFeatures(p_tokens, pairs, p_ctx, logits, rows, pad, ctx,
                        int(bucket is not None), bucket[0] if bucket else 0)
