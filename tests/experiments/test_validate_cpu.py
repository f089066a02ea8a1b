"""experiments.validate on the CPU with the tiny model: every section that can run without
a GPU runs (golden vs HF transformers, the offload round trip through CudaTransfer, the
step grid through CudaExecutor, both served workloads through run_served); benchmarks
need CUDA events and graphs and must say so. The GPU run is scripts/device_validate.sh."""

from __future__ import annotations

import json
import os

import pytest
import torch

from openinfer.models.qwen3.kernels._interpret import interpreting

pytest.importorskip("transformers")
pytest.importorskip("simpy")
# The CPU path runs the Triton kernels in the interpreter, which only a machine without a
# GPU turns on by itself (tests/conftest.py); on a GPU machine: TRITON_INTERPRET=1 pytest ...
pytestmark = pytest.mark.skipif(
    torch.cuda.is_available() and not interpreting(),
    reason="validate's CPU path needs TRITON_INTERPRET=1 on a machine with a GPU")

from experiments.cli import parse_overrides  # noqa: E402
from experiments.validate.main import ValidateConfig, run  # noqa: E402
from openinfer.errors import ConfigError  # noqa: E402
from sim.calibration import read_jsonl, step_samples  # noqa: E402
from sim.workload_spec import workload_from_dict  # noqa: E402


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("validate")
    cfg = parse_overrides(ValidateConfig, [f"report={out}/report.json", "device=cpu", "dtype=float32",
                                           "golden_sizes=tiny", "bench_size=tiny", "served_size=tiny",
                                           f"scratch={out}/ckpt"])
    rep = run(cfg)
    return rep, out


def test_report_is_written_with_environment(report):
    rep, out = report
    on_disk = json.loads((out / "report.json").read_text())
    assert on_disk["environment"]["torch"] == torch.__version__
    assert on_disk["environment"]["date"] == on_disk["environment"]["date_utc"][:10]
    assert set(on_disk) >= {"golden", "offload", "served", "bench", "steps", "summary"}
    assert not (out / "ckpt").exists() or not any((out / "ckpt").iterdir())  # checkpoints removed


def test_the_report_and_its_summary_name_the_source_that_ran(report, capsys):
    """A report outlives its tree: it carries the digest of the files that ran, and the
    printed summary says it (compare with ``python -m openinfer.provenance``)."""
    from experiments.validate.main import print_summary
    from openinfer.provenance import tree_digests
    rep, out = report
    on_disk = json.loads((out / "report.json").read_text())
    assert on_disk["environment"]["source"] == tree_digests()
    print_summary(rep)
    assert f"source {tree_digests()['tree']}" in capsys.readouterr().out.splitlines()[0]


def test_golden_tiny_passes_both_backends(report):
    g = report[0]["golden"]["tiny"]
    assert g["status"] == "ok", g.get("error")
    for backend in ("reference", "triton"):
        cases = g["backends"][backend]["cases"]
        assert set(cases) == {"cold_prefill", "prefix_hit_prefill", "decode"}   # graphs: GPU only
        for c in cases.values():
            assert c["passed"] and c["rel_err_vs_hf"] < 1e-4 and c["top1_vs_hf"] == 1.0


def test_golden_tiny_passes_in_bf16_on_the_cpu(tmp_path):
    """The model's own dtype on the CPU: the interpreter rounds to bf16 as a GPU does, so
    the Triton backend meets the same bf16 bar as on a GPU (it truncated once and failed)."""
    cfg = parse_overrides(ValidateConfig, [f"report={tmp_path}/r.json", "device=cpu",
                                           "dtype=bfloat16", "golden_sizes=tiny",
                                           "sections=golden", f"scratch={tmp_path}/ckpt"])
    g = run(cfg)["golden"]["tiny"]
    assert g["status"] == "ok", g.get("error")
    assert all(g["backends"][b]["passed"] for b in ("reference", "triton")), g["backends"]


def test_offload_round_trip_is_byte_identical(report):
    o = report[0]["offload"]
    assert o["status"] == "ok", o.get("error")
    assert o["round_trip"]["restored_identical"] and o["round_trip"]["host_copy_identical"]


def test_benchmarks_skip_without_cuda(report):
    b = report[0]["bench"]
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert b["status"] == "skipped" and "CUDA" in b["reason"]


def test_grid_records_feed_the_calibration(report):
    rep, out = report
    s = rep["steps"]
    assert s["status"] == "ok", s.get("error")
    recs = read_jsonl([out / s["file"]["path"]])
    assert len(recs) == s["records"] > 0
    kinds = {r["kind"] for r in recs}
    assert kinds == {"prefill", "decode", "unified"}
    samples = step_samples(recs)
    assert len(samples) == len(recs) and all(sec > 0 for _, sec, _ in samples)
    assert all(r["run"] != recs[0]["run"] for r in recs[1:])   # no host gaps read from the grid


def test_served_workloads_finish_with_hits_from_both_tiers(report):
    rep, out = report
    sv = rep["served"]
    assert sv["status"] == "ok", sv.get("error")
    assert set(sv["workloads"]) == {"fit", "heldout"}
    for name, w in sv["workloads"].items():
        assert w["ok"] and w["all_finished"], name
        assert w["gpu_hit_blocks"] > 0 and w["cpu_hit_blocks"] > 0, name
        desc = json.loads(json.dumps(w["workload"]))
        if desc["arrival"]["rate"] == "inf":             # run_served writes non-finite floats as strings
            desc["arrival"]["rate"] = float("inf")
        wl = workload_from_dict(desc)                    # the simulator can rebuild it exactly
        assert wl.describe() == desc
        recs = read_jsonl([out / w["file"]["path"]])
        assert step_samples([r for r in recs if r["type"] == "step"])
        copies = [r for r in recs if r["type"] == "copy"]
        assert copies and {r["dir"] for r in copies} >= {"d2h", "h2d"}   # CPU copies: 0 s, unfit
    assert sv["workloads"]["fit"]["workload"]["kind"] != sv["workloads"]["heldout"]["workload"]["kind"]


def test_the_report_names_the_launch_knobs_it_ran_with(monkeypatch):
    """A validate run with OPENINFER_* launch knobs set did not time the tree's defaults:
    its environment record says which it had (and none when none is set)."""
    from experiments.validate.common import environment
    for var in [v for v in os.environ if v.startswith("OPENINFER_")]:
        monkeypatch.delenv(var)
    assert environment("cpu")["knobs"] == {}
    monkeypatch.setenv("OPENINFER_SKINNY_BLOCK_K_ONE_ROW", "128")
    assert environment("cpu")["knobs"] == {"OPENINFER_SKINNY_BLOCK_K_ONE_ROW": "128"}


def test_triton_goldens_on_the_cpu_need_the_interpreter(monkeypatch):
    """On a GPU machine the interpreter is off, and the Triton backend cannot run on CPU
    tensors: refused when the config is made, not as an error inside the golden section."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ConfigError, match="golden_backends"):
        ValidateConfig(report="x.json", device="cpu", golden_sizes="tiny")
    ValidateConfig(report="x.json", device="cpu", golden_sizes="tiny", golden_backends="reference")
    ValidateConfig(report="x.json", device="cpu", sections="offload")


def test_unknown_key_and_section_are_refused():
    with pytest.raises(ConfigError, match="repats"):
        parse_overrides(ValidateConfig, ["report=x.json", "repats=3"])
    with pytest.raises(ConfigError, match="sections"):
        parse_overrides(ValidateConfig, ["report=x.json", "sections=golden,bogus"])


def test_a_quoted_list_with_spaces_reads_as_meant():
    """``"sections=golden, offload"`` (one quoted argument) is the two sections, as bench's
    ``cases=chat, pd`` is: every comma list is read by one function."""
    cfg = parse_overrides(ValidateConfig, ["report=x.json", "sections=golden, offload,"])
    assert cfg.section_list() == ["golden", "offload"]


@pytest.mark.parametrize("part", ["section", "golden size"])
def test_a_section_that_raises_is_recorded_and_fails_the_command(part, monkeypatch, tmp_path, capsys):
    """The report keeps the error (the other sections still run), and the exit code says the
    run failed, so a script that checks it does not take the report for a good one: also
    when only a part of a section raised (each golden size and benchmark is guarded alone)."""
    import sys

    from experiments.validate import golden
    from experiments.validate import main as M

    def broken(*_a, **_k):
        raise RuntimeError("golden blew up")
    monkeypatch.setattr(*((M, "_golden") if part == "section" else (golden, "golden_for_pack")), broken)
    monkeypatch.setattr(sys, "argv", ["validate", f"report={tmp_path}/r.json", "device=cpu",
                                      "sections=golden", "golden_sizes=tiny", f"scratch={tmp_path}/ck"])
    with pytest.raises(SystemExit) as stop:
        M.main()
    assert stop.value.code == 1 and "section golden raised" in capsys.readouterr().err
    saved = json.loads((tmp_path / "r.json").read_text())
    failed = saved["golden"] if part == "section" else saved["golden"]["tiny"]
    assert failed["status"] == "error" and "golden blew up" in failed["error"]


def test_bench_reports_failed_bounds_instead_of_a_key_error(monkeypatch):
    from experiments.validate import bench as B
    from experiments.validate import main as M

    def broken(*_a, **_k):
        raise RuntimeError("no copy engine")
    monkeypatch.setattr(M, "is_cuda", lambda _d: True)
    monkeypatch.setattr(B, "copy_bandwidth", broken)
    out = M._bench(ValidateConfig(report="x.json", quick=True), packs=None)
    assert out["status"] == "failed" and "no copy engine" in out["reason"]
    assert out["bounds"]["status"] == "error" and "decode" not in out


def test_offload_uses_the_tiny_model_on_the_cpu(monkeypatch):
    from experiments.validate import main as M
    from experiments.validate import offload

    asked = []

    class Packs:
        def get(self, size):
            asked.append(size)
            return size
    monkeypatch.setattr(offload, "offload_section", lambda pack, *a: dict(pack=pack))
    assert M._offload(ValidateConfig(report="x.json", device="cpu", bench_size="4b"), Packs()) == dict(pack="tiny")
    monkeypatch.setattr(M, "is_cuda", lambda _d: True)
    assert M._offload(ValidateConfig(report="x.json", bench_size="4b"), Packs()) == dict(pack="4b")
    assert asked == ["tiny", "4b"]


def test_checkpoints_come_from_the_one_checked_generator(report, tmp_path):
    from openinfer.models.qwen3 import preset, write_random_checkpoint
    assert report[0]["checkpoints"]["tiny"]["generator"] == "write_random_checkpoint on cpu"
    with pytest.raises(ConfigError, match="dtype"):
        write_random_checkpoint(preset("tiny"), tmp_path, dtype="int8", device="cpu")


def test_a_longer_held_out_run_alone(tmp_path):
    """``served_workloads=heldout heldout_sessions=N``: a capture of only the held-out chat,
    N sessions long at the same rate and shape (a better-powered fidelity run needs no new
    fit workload)."""
    cfg = parse_overrides(ValidateConfig, [f"report={tmp_path}/r.json", "device=cpu", "dtype=float32",
                                           "sections=served", "served_size=tiny", "served_workloads=heldout",
                                           "heldout_sessions=3", f"scratch={tmp_path}/ckpt"])
    wl = run(cfg)["served"]["workloads"]
    assert list(wl) == ["heldout"] and wl["heldout"]["ok"]
    assert wl["heldout"]["workload"]["num_sessions"] == 3
    assert wl["heldout"]["requests"] == 3 * 2 * 3          # sessions x turns x phases
    for bad, field in (("served_workloads=fit,chat", "served_workloads"), ("served_workloads=fit,fit", "served_workloads"),
                       ("heldout_sessions=0", "heldout_sessions"), ("heldout_sessions=true", "heldout_sessions"),
                       ("served_workloads=fit heldout_sessions=8", "heldout_sessions"),
                       ("device=cpu served_host_tier_gib=28", "served_host_tier_gib"),
                       ("served_host_tier_gib=0", "served_host_tier_gib"),
                       # names a section would reach only after others ran: refused at start
                       ("golden_sizes=tiny,bogus", "golden_sizes"), ("bench_size=9b", "bench_size"),
                       ("served_size=x", "served_size"), ("grid_size=x", "grid_size"),
                       ("dtype=bf16", "dtype"), ("golden_backends=flash", "golden_backends"),
                       ("golden_backends=", "golden_backends"), ("block_size=24", "block_size")):
        with pytest.raises(ConfigError, match=field):
            parse_overrides(ValidateConfig, [f"report={tmp_path}/r.json", *bad.split()])
    cfg = parse_overrides(ValidateConfig, [f"report={tmp_path}/r.json", "served_host_tier_gib=28"])
    assert cfg.served_host_tier_gib == 28.0      # on a GPU (the default device)
