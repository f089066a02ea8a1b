"""Golden checks: Qwen3Model over the paged arena against HF transformers on the same files.

Three cases, as the engine runs them: a cold prefill of a batch of sequences of different
lengths on shuffled pages; the prefill of the suffixes after a prefix-cache hit (prefixes
ending mid-page and page-aligned); and decode steps (eager, and for ``triton`` on a GPU
also replayed from a CUDA graph with a padding row). HF runs each whole sequence at once.

Tolerances are stated against HF's own rounding, not tuned to our numbers. HF's logits in
the model dtype (bf16) are compared with HF's logits of the same weights upcast to fp32
(the truth). Ours pass when
  * rel_err_vs_fp32 <= 2 * hf_rel_err_vs_fp32 + 1e-3   (‖out − truth‖ / ‖truth‖; the
    FlashAttention test criterion: at most twice the reference implementation's own error),
  * top1_vs_fp32 >= hf_top1_vs_fp32 − 0.05             (argmax agreement with the truth),
  * rel_err_vs_hf <= 5e-2                              (a cap on the direct difference).
In fp32 (the CPU test) the truth is HF itself, so the first bound is plain 1e-3.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from experiments.validate.common import is_cuda, log
from openinfer.models.qwen3 import Qwen3Model, SeqInput

REL_FACTOR = 2.0
REL_SLACK = 1e-3
TOP1_SLACK = 0.05
REL_VS_HF_CAP = 5e-2


@dataclass(frozen=True)
class GoldenSpec:
    lengths: tuple[int, ...] = (333, 128, 517)
    prefixes: tuple[int, ...] = (200, 64, 301)   # 200, 301: mid-page; 64: page-aligned (16)
    # Decode rows = sequences x steps: 96, so the top-1 rule's 0.05 slack is ~5 rows (at
    # 6 steps, 18 rows, one row was 0.056 and the rule allowed no row more than HF's own).
    decode_steps: int = 32
    block_size: int = 16
    seed: int = 1

    @classmethod
    def tiny(cls) -> GoldenSpec:
        return cls(lengths=(11, 6, 17), prefixes=(5, 4, 9), decode_steps=4, block_size=4)


def load_hf(ckpt: Any, dtype: torch.dtype, device: str):
    import transformers
    model = transformers.Qwen3ForCausalLM.from_pretrained(
        str(ckpt), dtype=dtype, attn_implementation="eager")
    return model.to(device).eval()


@torch.no_grad()
def hf_logits(hf, seqs: list[list[int]], device: str) -> list[torch.Tensor]:
    return [hf(torch.tensor([ids], device=device)).logits[0].float() for ids in seqs]


def compare(out: torch.Tensor, hf: torch.Tensor, truth: torch.Tensor) -> dict[str, Any]:
    out, hf, truth = out.float(), hf.float(), truth.float()
    tn = truth.norm().item()
    r = dict(
        rows=int(out.shape[0]),
        max_abs_vs_hf=(out - hf).abs().max().item(),
        rel_err_vs_hf=(out - hf).norm().item() / max(hf.norm().item(), 1e-30),
        top1_vs_hf=(out.argmax(-1) == hf.argmax(-1)).float().mean().item(),
        max_abs_vs_fp32=(out - truth).abs().max().item(),
        rel_err_vs_fp32=(out - truth).norm().item() / max(tn, 1e-30),
        top1_vs_fp32=(out.argmax(-1) == truth.argmax(-1)).float().mean().item(),
        hf_max_abs_vs_fp32=(hf - truth).abs().max().item(),
        hf_rel_err_vs_fp32=(hf - truth).norm().item() / max(tn, 1e-30),
        hf_top1_vs_fp32=(hf.argmax(-1) == truth.argmax(-1)).float().mean().item(),
        logit_std=truth.std().item())
    r["tol_rel_err_vs_fp32"] = REL_FACTOR * r["hf_rel_err_vs_fp32"] + REL_SLACK
    r["tol_top1_vs_fp32"] = r["hf_top1_vs_fp32"] - TOP1_SLACK
    r["tol_rel_err_vs_hf"] = REL_VS_HF_CAP
    r["passed"] = bool(r["rel_err_vs_fp32"] <= r["tol_rel_err_vs_fp32"]
                       and r["top1_vs_fp32"] >= r["tol_top1_vs_fp32"]
                       and r["rel_err_vs_hf"] <= REL_VS_HF_CAP)
    return r


def page_tables(n_seqs: int, pages_each: int, seed: int) -> list[list[int]]:
    """Disjoint, shuffled page lists; page 0 is the padding page."""
    perm = (torch.randperm(n_seqs * pages_each, generator=torch.Generator().manual_seed(seed)) + 1).tolist()
    return [perm[i * pages_each:(i + 1) * pages_each] for i in range(n_seqs)]


def run_cases(model: Qwen3Model, spec: GoldenSpec, seqs: list[list[int]], hf: list[torch.Tensor],
              truth: list[torch.Tensor], graphs: bool) -> dict[str, Any]:
    bs = spec.block_size
    pages_each = -(-max(spec.lengths) // bs) + 1
    n = len(seqs)
    out: dict[str, Any] = {}

    def arena():
        a = model.make_arena(1 + n * pages_each, bs)
        return a

    # cold prefill, every position's logits
    a = arena()
    tables = page_tables(n, pages_each, spec.seed)
    got = model([SeqInput(ids, 0, t) for ids, t in zip(seqs, tables)], a, all_logits=True)
    out["cold_prefill"] = compare(got, torch.cat(hf), torch.cat(truth))
    del got

    # suffix prefill after a prefix hit (the prefix's KV already in the arena)
    a = arena()
    tables = page_tables(n, pages_each, spec.seed + 1)
    model([SeqInput(ids[:p], 0, t) for ids, p, t in zip(seqs, spec.prefixes, tables)], a)
    got = model([SeqInput(ids[p:], p, t) for ids, p, t in zip(seqs, spec.prefixes, tables)], a,
                all_logits=True)
    out["prefix_hit_prefill"] = compare(got, torch.cat([h[p:] for h, p in zip(hf, spec.prefixes)]),
                                        torch.cat([t[p:] for t, p in zip(truth, spec.prefixes)]))
    out["prefix_hit_prefill"]["prefixes"] = list(spec.prefixes)
    del got

    # decode steps, eager
    D = spec.decode_steps
    starts = [len(ids) - D for ids in seqs]
    want_hf = torch.stack([torch.stack([h[s + k] for h, s in zip(hf, starts)]) for k in range(D)]).flatten(0, 1)
    want_tr = torch.stack([torch.stack([t[s + k] for t, s in zip(truth, starts)]) for k in range(D)]).flatten(0, 1)
    a = arena()
    tables = page_tables(n, pages_each, spec.seed + 2)
    model([SeqInput(ids[:s], 0, t) for ids, s, t in zip(seqs, starts, tables)], a)
    rows = []
    for k in range(D):
        batch = model.make_batch([SeqInput([ids[s + k]], s + k, t) for ids, s, t in zip(seqs, starts, tables)],
                                 a, max_pages=pages_each)
        assert batch.is_decode
        rows.append(model.forward(batch, a))
    out["decode"] = compare(torch.cat(rows), want_hf, want_tr)

    if graphs:
        from openinfer.models.qwen3.cuda_graphs import DecodeGraphs
        a = arena()
        tables = page_tables(n, pages_each, spec.seed + 3)
        bucket = 1 << (n - 1).bit_length()           # one padding row for n = 3
        g = DecodeGraphs(model, a, max_pages_per_seq=pages_each, buckets=[bucket])
        g.capture()
        model([SeqInput(ids[:s], 0, t) for ids, s, t in zip(seqs, starts, tables)], a)
        pad_before = a.data[0].clone()
        rows = []
        for k in range(D):
            batch = model.make_batch([SeqInput([ids[s + k]], s + k, t) for ids, s, t in zip(seqs, starts, tables)],
                                     a, max_pages=pages_each)
            rows.append(g.run(batch).clone())
        out["decode_cuda_graph"] = compare(torch.cat(rows), want_hf, want_tr)
        out["decode_cuda_graph"]["bucket"] = bucket
        out["decode_cuda_graph"]["padding_page_untouched"] = bool(torch.equal(a.data[0], pad_before))
        out["decode_cuda_graph"]["passed"] &= out["decode_cuda_graph"]["padding_page_untouched"]
        del g
    return out


def golden_for_pack(pack: Any, backends: tuple[str, ...], spec: GoldenSpec) -> dict[str, Any]:
    """``pack``: a loaded model (cfg, weights, ckpt, device, dtype, hf())."""
    device = pack.device
    g = torch.Generator().manual_seed(spec.seed)
    seqs = [torch.randint(0, pack.cfg.vocab_size, (n,), generator=g).tolist() for n in spec.lengths]
    hf = pack.hf()
    log(f"golden {pack.size}: HF {pack.dtype} logits")
    ref = hf_logits(hf, seqs, device)
    if pack.dtype != torch.float32:
        buffers = {n: b.clone() for n, b in hf.named_buffers()}
        hf.float()
        log(f"golden {pack.size}: HF fp32 truth")
        truth = hf_logits(hf, seqs, device)
        hf.to(pack.dtype)                       # exact: the weights were bf16 to begin with
        for n, b in hf.named_buffers():         # RoPE's inv_freq etc. as they were loaded
            b.data = buffers[n].data
    else:
        truth = ref
    result: dict[str, Any] = dict(size=pack.size, dtype=str(pack.dtype).replace("torch.", ""),
                                  lengths=list(spec.lengths), block_size=spec.block_size,
                                  hf_attn_implementation="eager", backends={})
    for backend in backends:
        log(f"golden {pack.size}: backend {backend}")
        model = Qwen3Model(pack.cfg, pack.weights, backend)
        use_graphs = backend == "triton" and is_cuda(device)
        cases = run_cases(model, spec, seqs, ref, truth, use_graphs)
        result["backends"][backend] = dict(cases=cases, passed=all(c["passed"] for c in cases.values()))
    result["passed"] = all(b["passed"] for b in result["backends"].values())
    result["tolerance_rule"] = (f"rel_err_vs_fp32 <= {REL_FACTOR}*hf_rel_err_vs_fp32 + {REL_SLACK}; "
                                f"top1_vs_fp32 >= hf_top1_vs_fp32 - {TOP1_SLACK}; rel_err_vs_hf <= {REL_VS_HF_CAP}")
    return result
