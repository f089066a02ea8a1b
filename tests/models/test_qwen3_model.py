"""Qwen3Model over the paged arena vs HF transformers' Qwen3ForCausalLM, float32.

Same checkpoint files for both. HF runs each whole sequence at once (eager attention);
we run it the way the engine does, through the arena: cold prefill, prefill of a suffix
after a prefix-cache hit (prefix ending mid-page and page-aligned), and decode steps, all
in batches of sequences of different lengths on shuffled pages. Measured on CPU: max abs
logit difference ~3e-6 (reference and triton backends alike) for logits of std ~1;
the bound asserted is 1e-4.
"""

from __future__ import annotations

import pytest
import torch

from openinfer.errors import ConfigError
from openinfer.models.qwen3 import ForwardBatch, Qwen3Model, SeqInput

ATOL = 1e-4
BLOCK = 4
LENGTHS = (11, 6, 17)


@pytest.fixture(scope="module")
def sequences(hf_tiny, device):
    """Token ids and HF's logits at every position, per sequence."""
    g = torch.Generator().manual_seed(1)
    seqs = []
    for n in LENGTHS:
        ids = torch.randint(0, 256, (n,), generator=g)
        with torch.no_grad():
            logits = hf_tiny(ids[None].to(device)).logits[0].float()
        seqs.append((ids.tolist(), logits))
    return seqs


@pytest.fixture(scope="module", params=["reference", "triton", "triton-rope-in-attention"])
def model(request, tiny_ckpt, device):
    """``triton`` as configured (batch-1 decode does q/k norm + RoPE + KV write inside the
    decode attention; the 3-row batches here use the separate kernel);
    ``triton-rope-in-attention`` does it at every decode batch, with 3 KV splits (the tiny
    contexts here would otherwise take one)."""
    backend = request.param
    if backend == "triton-rope-in-attention":
        from openinfer.models.qwen3.ops import TritonOps
        backend = TritonOps(decode_splits=3, decode_from_qkv_rows=1 << 30)
    return Qwen3Model.from_pretrained(tiny_ckpt, device=device, backend=backend)


def _page_tables(n_seqs, pages_each, seed=0):
    """Disjoint, shuffled page lists; page 0 stays the (unused) padding page."""
    perm = (torch.randperm(n_seqs * pages_each, generator=torch.Generator().manual_seed(seed))
            + 1).tolist()
    return [perm[i * pages_each:(i + 1) * pages_each] for i in range(n_seqs)]


def _max_diff(a, b):
    return (a.float() - b.float()).abs().max().item()


def test_cold_prefill_batch(model, sequences):
    arena = model.make_arena(1 + 3 * 5, BLOCK)
    tables = _page_tables(3, 5)
    out = model([SeqInput(ids, 0, t) for (ids, _), t in zip(sequences, tables)], arena,
                all_logits=True)
    row = 0
    for ids, ref in sequences:
        assert _max_diff(out[row:row + len(ids)], ref) <= ATOL
        row += len(ids)
    last = model([SeqInput(ids, 0, t) for (ids, _), t in zip(sequences, tables)], arena)
    assert _max_diff(last, torch.stack([ref[-1] for _, ref in sequences])) <= ATOL


@pytest.mark.parametrize("prefix", [(5, 4, 9), (8, 4, 12)])  # mid-page, page-aligned
def test_prefill_after_prefix_hit(model, sequences, prefix):
    arena = model.make_arena(1 + 3 * 5, BLOCK)
    tables = _page_tables(3, 5, seed=2)
    model([SeqInput(ids[:p], 0, t) for (ids, _), p, t in zip(sequences, prefix, tables)], arena)
    out = model([SeqInput(ids[p:], p, t) for (ids, _), p, t in zip(sequences, prefix, tables)],
                arena, all_logits=True)
    row = 0
    for (ids, ref), p in zip(sequences, prefix):
        n = len(ids) - p
        assert _max_diff(out[row:row + n], ref[p:]) <= ATOL
        row += n


def test_decode_steps(model, sequences):
    steps = 4
    arena = model.make_arena(1 + 3 * 5, BLOCK)
    # Slots not yet written hold NaN: on a GPU the decode attention reads cached K/V
    # before waiting on the kernel that writes the newest token, so reading that slot
    # before its write (or any slot never written) would show as NaN logits.
    arena.data[1:] = float("nan")
    tables = _page_tables(3, 5, seed=3)
    starts = [len(ids) - steps for ids, _ in sequences]
    model([SeqInput(ids[:s], 0, t) for (ids, _), s, t in zip(sequences, starts, tables)], arena)
    for k in range(steps):
        seqs = [SeqInput([ids[s + k]], s + k, t)
                for (ids, _), s, t in zip(sequences, starts, tables)]
        batch = model.make_batch(seqs, arena)
        assert batch.is_decode
        out = model.forward(batch, arena)
        want = torch.stack([ref[s + k] for (_, ref), s in zip(sequences, starts)])
        assert _max_diff(out, want) <= ATOL


def test_arena_is_checked(model):
    bad = model.make_arena(4, BLOCK)
    bad.data = bad.data[:, :1]
    with pytest.raises(ValueError, match="arena"):
        model([SeqInput([1, 2], 0, [1])], bad)


# Tokens of no sequence get no attention program, so their rows start from uninitialised
# memory and may overflow, or hold NaN, on the way through the layers (the interpreter
# warns, depending on what that memory held); rows are independent and none of them reaches
# the logits, which is what this test checks.
@pytest.mark.filterwarnings("ignore:overflow encountered in multiply:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:invalid value encountered in matmul:RuntimeWarning")
def test_padded_batch_matches_unpadded(model, sequences):
    """A step padded to a prefill-graph bucket (extra tokens of no sequence, extra empty
    sequences) computes the real rows' logits exactly as the unpadded step, and the padding
    writes no page: what a graph replay of the bucket relies on."""
    from openinfer.models.qwen3.batch import FlatInputs
    tables = _page_tables(3, 5)
    arena = model.make_arena(1 + 3 * 5, BLOCK)
    prefix = [SeqInput(ids[:-3], 0, t) for (ids, _), t in zip(sequences, tables)]
    model(prefix, arena)
    step = [SeqInput(ids[-3:], len(ids) - 3, t) for (ids, _), t in zip(sequences[:2], tables)]
    step.append(SeqInput(sequences[2][0][-3:-2], len(sequences[2][0]) - 3, tables[2]))  # a decode row
    saved = arena.data.clone()
    plain = model.forward(ForwardBatch.from_seqs(step, BLOCK, model.device), arena)
    arena.data.copy_(saved)
    flat = FlatInputs.build(step, BLOCK, max_pages=6, pad_to=(16, 4))
    batch = flat.upload(model.device)
    padded = model.forward(batch, arena)
    assert padded.shape[0] == 4 and not batch.is_decode
    assert _max_diff(padded[:3], plain) <= 1e-5
    assert torch.equal(arena.data[0], saved[0])          # the padding page was not written
    with pytest.raises(ConfigError, match="pad_to"):
        FlatInputs.build(step, BLOCK, pad_to=(4, 4))


def test_padded_decode_batch_matches_unpadded(model, sequences):
    """A decode batch padded to a decode-graph bucket (extra one-token rows over the padding
    page) gives the real rows' logits of the unpadded batch and writes no page for the
    padding rows."""
    from openinfer.models.qwen3.batch import FlatInputs
    tables = _page_tables(3, 5)
    arena = model.make_arena(1 + 3 * 5, BLOCK)
    model([SeqInput(ids[:-1], 0, t) for (ids, _), t in zip(sequences, tables)], arena)
    step = [SeqInput(ids[-1:], len(ids) - 1, t) for (ids, _), t in zip(sequences, tables)]
    saved = arena.data.clone()
    plain = model.forward(ForwardBatch.from_seqs(step, BLOCK, model.device), arena)
    arena.data.copy_(saved)
    flat = FlatInputs.build(step, BLOCK, max_pages=6, pad_to=(4, 4), decode=True)
    batch = flat.upload(model.device)
    padded = model.forward(batch, arena)
    assert batch.is_decode and padded.shape[0] == 4
    assert _max_diff(padded[:3], plain) <= 1e-5
    assert torch.equal(arena.data[0], saved[0])
    with pytest.raises(ConfigError, match="pad_to"):
        FlatInputs.build(step, BLOCK, pad_to=(4, 8), decode=True)


def test_small_batches_norm_in_the_gemm_tail(tiny_ckpt, device, sequences, monkeypatch):
    """With OPENINFER_SKINNY_FUSED_NORM_ROWS covering the batch, o_proj and down_proj do the
    add + RMSNorm after them in their own launch: a decode step launches one norm kernel
    (the first layer's input norm) instead of 2 a layer + 1, and its logits are the
    separate kernels' (bit for bit in the interpreter) and HF's within the bound. A batch
    larger than the knob goes back to the norm kernels."""
    from openinfer.models.qwen3.ops import TritonOps
    fused = Qwen3Model.from_pretrained(tiny_ckpt, device=device,
                                       backend=TritonOps(fused_norm_rows=16))
    plain = Qwen3Model(fused.cfg, fused.w, TritonOps(fused_norm_rows=0))
    norms = []
    separate = fused.ops.k.rms_norm
    monkeypatch.setattr(fused.ops.k, "rms_norm",
                        lambda *a, **kw: norms.append(1) or separate(*a, **kw))
    tables = _page_tables(3, 5, seed=6)
    arenas = [m.make_arena(1 + 3 * 5, BLOCK) for m in (fused, plain)]
    for m, arena in zip((fused, plain), arenas):
        m([SeqInput(i[:-1], 0, t) for (i, _), t in zip(sequences, tables)], arena)
    norms.clear()
    step = [SeqInput(i[-1:], len(i) - 1, t) for (i, _), t in zip(sequences, tables)]
    got = fused(step, arenas[0])
    assert len(norms) == 1
    want = plain(step, arenas[1])
    if device == "cpu":
        assert torch.equal(got, want)
    assert _max_diff(got, torch.stack([ref[-1] for _, ref in sequences])) <= ATOL
    # a batch above the knob: the norm kernels again (the same step, the same K/V rewritten)
    fused.ops.fused_norm_rows = 2
    norms.clear()
    again = fused(step, arenas[0])
    assert len(norms) == 1 + 2 * fused.cfg.num_hidden_layers
    torch.testing.assert_close(again, got, atol=1e-6, rtol=0)


def test_batch1_decode_does_rope_inside_the_attention(tiny_ckpt, device, sequences, monkeypatch):
    """With the default knobs a one-row decode step runs q/k norm + RoPE + KV write inside
    the decode attention (no separate kernel launch), and still matches HF; a 3-row decode
    step uses the separate kernel."""
    from openinfer.models.qwen3.ops import TritonOps
    model = Qwen3Model.from_pretrained(tiny_ckpt, device=device, backend="triton")
    assert isinstance(model.ops, TritonOps) and model.ops.decode_from_qkv_rows == 1
    calls = []
    separate = model.ops.k.qkv_norm_rope_write
    monkeypatch.setattr(model.ops.k, "qkv_norm_rope_write",
                        lambda *a, **kw: calls.append(a[0].shape[1]) or separate(*a, **kw))
    arena = model.make_arena(1 + 3 * 5, BLOCK)
    tables = _page_tables(3, 5, seed=4)
    (ids, ref), t = sequences[0], tables[0]
    model([SeqInput(ids[:-1], 0, t)], arena)
    assert calls == [len(ids) - 1] * model.cfg.num_hidden_layers       # prefill: separate
    calls.clear()
    out = model([SeqInput(ids[-1:], len(ids) - 1, t)], arena)
    assert calls == [] and _max_diff(out[0], ref[-1]) <= ATOL
    model([SeqInput(i[:-1], 0, tb) for (i, _), tb in zip(sequences[1:], tables[1:])], arena)
    step = [SeqInput(i[-1:], len(i) - 1, tb) for (i, _), tb in zip(sequences, tables)]
    step[0] = SeqInput(ids[-1:], len(ids) - 1, t)
    model(step, arena)
    assert calls[-1] == 3
