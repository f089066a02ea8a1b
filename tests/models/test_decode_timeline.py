"""``scripts/decode_timeline.py`` charges each kernel of a traced step to the right kind,
and the charges add up to the step.

The GPU trace cannot run here, so these feed the accounting synthetic kernels laid out as
a PDL chain lays them out: each kernel starts before the one before it ends.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
sys.path.insert(0, str(SCRIPTS))
import decode_timeline as T  # noqa: E402

LAYER = ["_skinny_kernel", "_decode_split_kernel", "_decode_reduce_kernel", "_skinny_kernel",
         "_rms_norm_kernel", "_skinny_kernel", "_skinny_kernel", "_rms_norm_kernel"]


def step_names(layers: int) -> list[str]:
    return ["indexSelectSmallIndex", "_rms_norm_kernel", *LAYER * layers, "_skinny_kernel"]


def chain(names: list[str], t0: float = 0.0, dur: float = 5.0, overlap: float = 2.0
          ) -> list[T.Kernel]:
    """Kernels of ``dur`` us, each starting ``overlap`` us before the previous one ends."""
    out, start = [], t0
    for n in names:
        out.append(T.Kernel(n, start, start + dur))
        start += dur - overlap
    return out


def test_gemms_are_told_apart_by_their_order_in_the_layer():
    kinds = T.label_step(step_names(2), layers=2)
    gemms = [k for k, n in zip(kinds, step_names(2)) if "skinny" in n]
    assert gemms == ["qkv", "o_proj", "gate_up", "down"] * 2 + ["lm_head"]
    assert kinds[0] == "other" and kinds[1] == "norms"
    assert kinds.count("attention") == 4 and kinds.count("norms") == 5


def test_a_separate_qkv_rope_kernel_counts_as_attention():
    """With the q/k norm + RoPE in a kernel of its own (OPENINFER_DECODE_FROM_QKV_ROWS=0),
    it follows the QKV GEMM and is the attention's, as in the ablation's stub."""
    names = step_names(1)
    names.insert(names.index("_decode_split_kernel"), "_qkv_rope_write_kernel")
    kinds = T.label_step(names, layers=1)
    assert kinds[names.index("_qkv_rope_write_kernel")] == "attention"
    assert kinds.count("attention") == 3


def test_a_step_with_the_norms_in_the_gemms_is_labelled():
    """With OPENINFER_SKINNY_FUSED_NORM_ROWS, o_proj and down_proj do the norm after them:
    the next GEMM follows each directly, and the only norm left is the first layer's."""
    names = [n for i, n in enumerate(step_names(2)) if i < 2 or n != "_rms_norm_kernel"]
    kinds = T.label_step(names, layers=2)
    gemms = [k for k, n in zip(kinds, names) if "skinny" in n]
    assert gemms == ["qkv", "o_proj", "gate_up", "down"] * 2 + ["lm_head"]
    assert kinds.count("norms") == 1


def test_a_changed_layer_order_is_refused_not_mislabelled():
    with pytest.raises(ValueError, match="update LAYER_GEMMS"):        # a GEMM fewer
        T.label_step(step_names(2)[:-1], layers=2)
    swapped = step_names(2)
    i = swapped.index("_rms_norm_kernel", 2)      # o_proj's norm moved after gate_up
    swapped[i], swapped[i + 1] = swapped[i + 1], swapped[i]
    with pytest.raises(ValueError, match="followed by"):
        T.label_step(swapped, layers=2)


def test_steps_that_launched_different_kernels_are_refused():
    one = chain(step_names(1))
    other = chain(step_names(1), t0=1000.0)
    other[3] = T.Kernel("some_other_kernel", other[3].start_us, other[3].end_us)
    with pytest.raises(ValueError, match="different kernels"):
        T.summarize([one, other], layers=1)


def test_charges_add_up_to_the_span_and_leads_measure_the_overlap():
    names = step_names(3)
    step = chain(names)
    span, charges = T.charge_step(step, T.label_step(names, 3))
    assert span == pytest.approx(step[-1].end_us - step[0].start_us)
    assert sum(c.charge_us for c in charges.values()) == pytest.approx(span)
    assert sum(c.launches for c in charges.values()) == len(names)
    # every kernel after the first ends 3 us after the one before and started 2 us early
    assert charges["down"].charge_us == pytest.approx(3 * 3.0)
    assert charges["down"].busy_us == pytest.approx(3 * 5.0)
    assert set(charges["down"].leads_us) == {2.0}


def test_a_kernel_ending_before_its_predecessor_is_charged_nothing_net():
    """A short kernel that finishes inside the one before it must not move the chain back."""
    step = [T.Kernel("a", 0, 10), T.Kernel("b", 2, 4), T.Kernel("c", 9, 12)]
    span, charges = T.charge_step(step, ["x", "y", "z"])
    assert span == 12
    assert charges["y"].charge_us == 0
    assert charges["z"].charge_us == 2       # from a's end (10), not b's (4)
    assert sum(c.charge_us for c in charges.values()) == span


def test_steps_are_cut_in_start_order_and_uneven_traces_are_refused():
    names = step_names(1)
    one, two = chain(names, t0=0.0), chain(names, t0=1000.0)
    steps = T.split_steps(list(reversed(two + one)), replays=2)
    assert [k.start_us for k in steps[0]] == [k.start_us for k in one]
    with pytest.raises(ValueError, match="equal steps"):
        T.split_steps(one + two[:-1], replays=2)
    with pytest.raises(ValueError, match="equal steps"):
        T.split_steps([], replays=1)


def test_summary_takes_the_median_step():
    names = step_names(1)
    steps = [chain(names, t0=1000.0 * i, dur=d) for i, d in enumerate((5.0, 6.0, 50.0))]
    res = T.summarize(steps, layers=1)
    assert res["span_us"] == pytest.approx(T.charge_step(steps[1], T.label_step(names, 1))[0])
    assert res["kinds"]["qkv"]["launches"] == 1
    assert res["kinds"]["qkv"]["lead_us"] == pytest.approx(2.0)
    # by kernel name: the attention's two kernels apart, the four GEMMs of a layer together
    assert res["kernels"]["_decode_reduce_kernel"]["launches"] == 1
    assert res["kernels"]["_skinny_kernel"]["launches"] == 5
    assert (res["kernels"]["_decode_split_kernel"]["charge_us"]
            + res["kernels"]["_decode_reduce_kernel"]["charge_us"]
            == pytest.approx(res["kinds"]["attention"]["charge_us"]))


def _run(kinds: dict[str, float], step_s: float, context: int = 1024) -> dict:
    return dict(rows=[dict(context=context, step_s=step_s,
                           kinds={k: dict(charge_us=v) for k, v in kinds.items()})])


def test_variants_are_compared_with_the_defaults_kind_by_kind():
    runs = dict(defaults=_run(dict(attention=350.0, norms=220.0), 3.3e-3),
                fused=_run(dict(attention=670.0, norms=213.0), 3.6e-3))
    table = T.compare(runs)
    fused = next(line for line in table.splitlines() if line.strip().startswith("fused"))
    assert "3.600" in fused and "+9.1%" in fused
    assert "+320.0" in fused and "-7.0" in fused
    assert fused.split()[-1] == "-"             # a kind neither run has is not invented
    assert "against defaults" in table


@pytest.mark.parametrize("variant,says", [("nolabel", "LABEL:VAR=VALUE"),
                                          ("defaults:X=1", "must differ")])
def test_a_bad_variant_is_refused_before_any_run(tmp_path, variant, says):
    args = SimpleNamespace(variant=[variant], contexts="1024", replays=1, graph_context=0,
                           child_timeout=1)
    with pytest.raises(SystemExit, match=says):
        T.run_variants(args, tmp_path)
    assert not (tmp_path / "timelines.json").exists()


def test_variants_whose_runs_fail_are_reported_not_hidden(tmp_path, monkeypatch, capsys):
    """Each label runs in a process of its own with its knobs set; one that fails is named,
    the others still compared, and the summary keeps every exit status."""
    calls = []

    def fake_child(args, pythonpath, timeout, script, **env):
        assert Path(script).name == "decode_timeline.py"       # this script, in a child
        out = Path(args[args.index("--out") + 1])
        calls.append((out.name, env))
        if env:                                          # the variant's process fails
            return 1
        out.mkdir(parents=True)
        (out / "timeline.json").write_text(json.dumps(_run(dict(norms=200.0), 3e-3)))
        return 0

    monkeypatch.setattr(T, "run_child", fake_child)
    args = SimpleNamespace(variant=["v:OPENINFER_NORM_WARPS=8"], contexts="1024", replays=1,
                           graph_context=0, child_timeout=1)
    with pytest.raises(SystemExit, match="no timeline for v"):
        T.run_variants(args, tmp_path)
    assert calls == [("defaults", {}), ("v", {"OPENINFER_NORM_WARPS": "8"})]
    summary = json.loads((tmp_path / "timelines.json").read_text())
    assert summary["rc"] == {"defaults": 0, "v": 1} and list(summary["runs"]) == ["defaults"]
    printed = capsys.readouterr().out
    assert "v: no timeline (rc 1)" in printed and "defaults" in printed


@pytest.mark.parametrize("script", ["decode_timeline.py", "decode_ablation.py"])
def test_the_gpu_tools_say_they_need_a_gpu(tmp_path, script):
    out = subprocess.run([sys.executable, str(SCRIPTS / script), "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert out.returncode != 0
    assert "needs a CUDA GPU" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("text", ["1024,4096", "7"])
def test_contexts_take_token_counts(text):
    assert T.context_list(text) == text


@pytest.mark.parametrize("text", ["", "1k", "1024,0", "1024,,4096"])
def test_bad_contexts_are_refused_with_an_example(text):
    import argparse
    with pytest.raises(argparse.ArgumentTypeError, match="e.g. 1024,4096"):
        T.context_list(text)
