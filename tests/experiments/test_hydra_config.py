"""Start-up validation: a wrong key, type or range is one line naming the key, exit code 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from experiments.config.preflight import check
from openinfer.errors import ConfigError


@pytest.mark.parametrize("argv, key, hint", [
    (["workload.qpss=3"], "workload.qpss", "qps"),
    (["workload.qps=abc"], "workload.qps", "float"),
    (["workload.qps=-1"], "workload.qps", "> 0"),
    (["store.num_blocks=1"], "store.num_blocks", ">= 2"),
    (["variant=foo"], "variant=foo", "pr829"),
    (["variant=fixed+H9"], "variant=fixed+H9", "variant.names=[fixed+H9]"),   # a mix, not a preset
    (["hydra/sweeper=host_tir"], "hydra/sweeper=host_tir", "host_tier"),
    (["hydra/sweeper=host_tier", "hydra.sweeper.n_trails=3"], "hydra.sweeper.n_trails", "OptunaSweeperConf"),
    (["hydra/sweeper=host_tier", "hydra.sweeper.n_trials=abc"], "hydra.sweeper.n_trials", "integer"),
    (["+workload.zz=1"], "workload.zz", "num_requests"),
    (["faults.schedule.0.port=xx"], "faults.schedule[0].port", "metaserver"),
    (["experiment.objective=nope"], "experiment.objective", "p99_ttft_ms"),
    (["-m", "workload.qps=1,2,-3"], "workload.qps", "> 0"),
    # ranges owned by the objects a world is built from, checked before any job starts
    (["store.block_size=24"], "store.block_size", "power of two"),
    (["scheduler.order=bogus"], "scheduler.order", "pct"),
    (["scheduler.max_decode_batch=0"], "scheduler.max_decode_batch", "[1, 256]"),
    (["scheduler.max_context_tokens=0"], "scheduler.max_context_tokens", ">= 2"),
    (["workload.abort_probability=2"], "workload.abort_probability", "[0, 1]"),
    (["workload.abort_after_s=-3"], "workload.abort_after_s", ">= 0"),
    (["experiment.metaserver_rpc_s=-1"], "experiment.metaserver_rpc_s", ">= 0"),
    (["experiment.monitor_pool_every=0"], "experiment.monitor_pool_every", ">= 1"),
    (["experiment.timeline_max_rows=0"], "experiment.timeline_max_rows", ">= 2"),
    # asked for but never used: refused rather than dropped
    (["experiment.mixed=2"], "experiment.mixed", "P/D"),
    (["faults.schedule=[{port:metaserver,kind:stall,target:decode0}]"], "faults.schedule[0].target",
     "shared"),
    (["workload=random", "workload.turns=9"], "workload.turns", "workload.kind=chat"),
    (["workload.prefix_len=64"], "workload.prefix_len", "workload.kind=random"),
    (["backend.calibration=x.json"], "backend.calibration", "step_model"),
    # conf/profiles/ is listed by --help as a group; its files are experiments.simulate's
    (["profiles=h200_qwen3-4b"], "profiles", "experiments.simulate profile=conf/profiles/"),
    (["profile=conf/profiles/h200_qwen3-4b.yaml"], "profile", "experiments.simulate"),
    (["workload.cv=2"], "workload.cv", "gamma"),
    (["store.host_tier_gib=0"], "store.host_tier_gib", "P/D"),   # the handoff needs the tier
    # limits under which not even the smallest request is served: every one rejected
    (["store.num_blocks=2"], "store.num_blocks", ">= 34"),
    (["workload=random", "workload.prefix_len=5000", "workload.input_len=100"], "store.num_blocks",
     "smallest request"),
    (["scheduler.max_context_tokens=100"], "scheduler.max_context_tokens", ">= 514"),
    (["experiment=mixed2", "store.host_tier_gib=0", "faults.schedule=[{port:save,kind:stall}]"],
     "faults.schedule[0].port", "host_tier_gib > 0"),
    # a bad value past the first MAX_COMBOS jobs of a grid
    (["-m", "workload.arrival=poisson,bogus", "experiment.seed=range(0,64)"], "workload.arrival", "gamma"),
])
def test_bad_override_names_the_key_and_the_accepted_values(argv, key, hint) -> None:
    msg = check(argv)
    assert msg is not None and key in msg and hint in msg, msg


def test_good_overrides_pass() -> None:
    assert check([]) is None
    assert check(["experiment=smoke", "variant=fixed", "workload.qps=4"]) is None
    assert check(["-m", "workload.qps=2,4"], "sweep") is None
    assert check(["-m", "hydra/sweeper=host_tier", "hydra.sweeper.n_trials=4"], "sweep") is None
    assert check(["-m", "workload=chat,random", "workload.turns=3"]) is None   # the chat jobs read it
    assert check(["workload.arrival=gamma", "workload.cv=2"]) is None
    assert check(["experiment=mixed2", "store.host_tier_gib=0", "faults=none"]) is None
    assert check(["experiment=mixed2", "store.host_tier_gib=0",
                  "faults.schedule=[{port:step,kind:error}]"]) is None


def test_cli_exits_2_with_one_line() -> None:
    p = subprocess.run([sys.executable, "-m", "experiments.run", "workload.qpss=3"], capture_output=True, text=True)
    assert p.returncode == 2
    assert p.stderr.strip().count("\n") == 0 and "workload.qpss" in p.stderr


def test_help_says_profiles_is_not_a_group() -> None:
    """--help lists conf/profiles/ among the groups (Hydra lists every folder); the line
    under the list says where a fitted profile goes instead."""
    p = subprocess.run([sys.executable, "-m", "experiments.run", "--help"], capture_output=True,
                       text=True)
    assert p.returncode == 0
    groups, _, rest = p.stdout.partition("(profiles is not a group")
    assert "profiles: h200_qwen3-4b" in groups
    assert "experiments.simulate profile=conf/profiles/NAME.yaml" in rest.split("== Config ==")[0]


def test_the_workload_group_builds_through_the_shared_flat_form() -> None:
    """experiments.config.build maps the Hydra keys onto sim.workload_spec.workload_from_flat
    (the form serve_real takes): chat qps is the request rate, sessions arrive at qps/turns."""
    from omegaconf import OmegaConf

    from experiments.config.build import make_workload
    from experiments.config.schema import WorkloadConf
    from sim.lengths import LengthDist
    from sim.workload_spec import workload_from_flat
    from sim.workloads import ChatWorkload, RandomWorkload

    chat = make_workload(OmegaConf.structured(WorkloadConf(kind="chat", num_requests=10, qps=8.0, turns=4)),
                         max_context_tokens=1200)
    assert isinstance(chat, ChatWorkload) and chat.num_sessions == 3 and chat.max_requests == 10
    assert chat.max_context_tokens == 1200   # sessions end before the instances would reject a turn
    assert chat.arrival.rate == 2.0 and chat.user_len == LengthDist.lognormal(150, 0.5, max=1200)
    rnd = make_workload(OmegaConf.structured(WorkloadConf(kind="random", qps=float("inf"), prefix_len=8)),
                        max_context_tokens=1200)
    assert isinstance(rnd, RandomWorkload) and rnd.prefix_len == 8 and rnd.arrival.rate == float("inf")
    flat = workload_from_flat(dict(kind="chat", num_sessions=2, turns=2, rate=5, seed=3))
    assert flat.turns == LengthDist.fixed(2) and flat.output_len == LengthDist.fixed(16) and flat.arrival.rate == 5
    with pytest.raises(ConfigError, match="workload.qps"):
        workload_from_flat(dict(kind="random", qps=3))
    with pytest.raises(ConfigError, match="workload.kind"):
        workload_from_flat(dict(kind="trace"))


@pytest.mark.parametrize("full_hit", [False, True])
def test_the_decode_policy_and_the_resolve_deadline_reach_the_instances(full_hit) -> None:
    """``scheduler.decode_full_hit`` and ``store.resolve_deadline_s`` are read by the decode
    instance's engine and by every store, not only accepted."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from experiments.config.build import build
    from experiments.config.preflight import CONF_DIR
    from experiments.config.schema import register
    from sim.cluster import build_cluster

    register()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=["variant=fixed", f"scheduler.decode_full_hit={full_hit}",
                                           "store.resolve_deadline_s=3"])
    GlobalHydra.instance().clear()
    cluster = build_cluster(build(cfg).clusters["fixed"])
    policies = {w.engine.name: w.engine.hub.policy.wait_for_full_hit for w in cluster.instances}
    assert policies == {"prefill0": False, "decode0": full_hit}
    assert {w.store.config.resolve_deadline_s for w in cluster.instances} == {3.0}


@pytest.mark.parametrize("argv, key, hint", [
    # an Optuna study's direction against the objective's sense
    (["-m", "hydra/sweeper=host_tier", "experiment.objective=request_throughput"],
     "experiment.objective=request_throughput", "direction=maximize"),
    (["-m", "hydra/sweeper=host_tier", "hydra.sweeper.direction=maximize"],
     "experiment.objective=p99_ttft_ms", "direction=minimize"),
    (["-m", "hydra/sweeper=host_tier", "hydra.sweeper.direction=up"], "hydra.sweeper.direction=up",
     "minimize or maximize"),
    # a search space that is out of range is refused before the study runs its trials
    (["-m", "hydra/sweeper=host_tier", "store.host_tier_gib=interval(-1,0)"], "store.host_tier_gib",
     ">= 0"),
    # ... also where it is given as the sweeper's params, and in a grid sweeper's range
    (["-m", "hydra/sweeper=host_tier",
      "hydra.sweeper.params={store.host_tier_gib:'interval(0.0,0.001)'}"], "store.host_tier_gib",
     "at least one page"),
    (["-m", "hydra/sweeper=pool_and_tier",
      "hydra.sweeper.params={store.num_blocks:'range(0,300,100)',store.host_tier_gib:'choice(1.0)'}"],
     "store.num_blocks=0", "store.num_blocks"),
    # Hydra's basic sweeper cannot take params from the command line (OmegaConf dies inside)
    (["-m", "hydra.sweeper.params={workload.qps:'2,4'}"], "hydra.sweeper.params",
     "overrides: workload.qps=2,4"),
    (["-m", "+hydra.sweeper.params={workload.qps:'2,4'}"], "hydra.sweeper.params",
     "overrides: workload.qps=2,4"),
    (["-m", "+hydra.sweeper.params.workload.qps=2,4"], "hydra.sweeper.params", "basic sweeper"),
    (["-m", "~hydra.sweeper.params"], "hydra.sweeper.params", "delete"),   # one line, no trace
    # a sweep job returns one variant's objective
    (["-m", "variant=compare"], "variant.names", "-m variant=pr829,fixed"),
])
def test_bad_sweep_is_refused_before_any_job(argv, key, hint) -> None:
    msg = check(argv, "sweep")
    assert msg is not None and key in msg and hint in msg, msg


def test_good_sweeps_pass() -> None:
    # empty params are what the basic sweeper has anyway
    assert check(["-m", "hydra.sweeper.params={}"], "sweep") is None
    assert check(["-m", "hydra/sweeper=host_tier"], "sweep") is None
    assert check(["-m", "hydra/sweeper=host_tier", "experiment.objective=hit_rate",
                  "hydra.sweeper.direction=maximize"], "sweep") is None
    assert check(["-m", "hydra/sweeper=host_tier", "workload.qps=interval(0,16)"], "sweep") is None
    assert check(["-m", "variant=pr829,fixed"], "sweep") is None
    assert check(["-m", "hydra/sweeper=pool_and_tier"], "sweep") is None
    # int(interval(...)) is an integer search space (Optuna draws integers), a plain one is not
    assert check(["-m", "hydra/sweeper=host_tier", "store.num_blocks=int(interval(200,800))"],
                 "sweep") is None
    assert "integer" in check(["-m", "hydra/sweeper=host_tier",
                               "store.num_blocks=interval(200,800)"], "sweep")
    # the command line's own value of a key wins over the sweeper's search space for it
    assert check(["-m", "hydra/sweeper=host_tier", "store.host_tier_gib=1"], "sweep") is None
