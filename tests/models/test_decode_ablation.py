"""``scripts/decode_ablation.py``'s stand-ins remove exactly the kernels of their op kind.

The ablation is only as good as its stubs: if a model refactor routed an op around the
method a stub overrides, the tool would time the full step twice and report a cost of
zero. Here one decode step of the tiny model runs with each stub, and the launches of
every kernel entry point are counted against the unstubbed step.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from openinfer.models.qwen3 import SeqInput
from openinfer.models.qwen3.config import Qwen3Config
from openinfer.models.qwen3.weights import load_weights

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import decode_ablation as A  # noqa: E402


@pytest.fixture(scope="module")
def pack(tiny_ckpt, device):
    cfg = Qwen3Config.from_json(tiny_ckpt)
    return SimpleNamespace(cfg=cfg, weights=load_weights(tiny_ckpt, cfg, device, None))


def _launches(pack, kind: str, monkeypatch, fused_norm_rows: int) -> Counter:
    """Kernel entry points called by one batch-1 decode step with ``kind`` stubbed."""
    model = A.model_with(pack, A.stub_ops(kind, fused_norm_rows=fused_norm_rows))
    names = {**model.ops.proj, (pack.cfg.vocab_size, pack.cfg.hidden_size): "lm_head"}
    calls: Counter = Counter()
    k = model.ops.k

    def counted(fn, label):
        def wrapper(*args, **kw):
            calls[label(*args)] += 1
            return fn(*args, **kw)
        return wrapper

    monkeypatch.setattr(k, "skinny_linear", counted(k.skinny_linear,
                                                     lambda x, w, *_: names[tuple(w.shape)]))
    monkeypatch.setattr(k, "skinny_gated", counted(k.skinny_gated, lambda *_: "gate_up"))
    fused = k.skinny_linear_add_rms_norm   # OPENINFER_SKINNY_FUSED_NORM_ROWS: one launch,

    def projection_and_norm(x, w, *rest, **kw):   # both kinds' work
        calls[names[tuple(w.shape)]] += 1
        calls["norms"] += 1
        return fused(x, w, *rest, **kw)

    monkeypatch.setattr(k, "skinny_linear_add_rms_norm", projection_and_norm)
    monkeypatch.setattr(k, "rms_norm", counted(k.rms_norm, lambda *_: "norms"))
    monkeypatch.setattr(k, "decode_attention", counted(k.decode_attention, lambda *_: "attention"))
    arena = model.make_arena(4, 4)
    model([SeqInput([3, 1, 4, 1, 5], 0, [1, 2])], arena)
    calls.clear()
    model([SeqInput([9], 5, [1, 2])], arena)
    monkeypatch.undo()
    return calls


# the residual-add norms after o_proj and down_proj in their GEMM's tail (the default at
# batch 1), and in norm kernels of their own
TAIL = pytest.mark.parametrize("fused_norm_rows", [1, 0], ids=["norm_in_tail", "norm_kernels"])


@pytest.fixture(scope="module")
def full(pack) -> dict[int, Counter]:
    with pytest.MonkeyPatch.context() as mp:
        return {rows: _launches(pack, "", mp, rows) for rows in (0, 1)}


@TAIL
def test_unstubbed_step_launches_every_kind(pack, full, fused_norm_rows):
    layers = pack.cfg.num_hidden_layers
    assert full[fused_norm_rows] == Counter(attention=layers, norms=2 * layers + 1, qkv=layers,
                                            o_proj=layers, gate_up=layers, down=layers,
                                            lm_head=1)
    assert A.ops_per_step(pack.cfg) == {**full[fused_norm_rows], "norms": 2 * layers}


@TAIL
@pytest.mark.parametrize("kind", A.KINDS)
def test_each_stub_removes_only_its_kind(pack, full, kind, fused_norm_rows, monkeypatch):
    """A stubbed projection whose GEMM does the norm after it takes that launch whole."""
    want = full[fused_norm_rows].copy()
    want[kind] = 1 if kind == "norms" else 0     # the first layer's input norm stays
    if kind in ("o_proj", "down") and fused_norm_rows:
        want["norms"] -= pack.cfg.num_hidden_layers
    assert _launches(pack, kind, monkeypatch, fused_norm_rows) == +want
