"""LoRA-control engine contract tests (spec §5.9, §9.2)."""

from __future__ import annotations

from sched_helpers import kinds, make_engine, only_terminal, prompt, run_until, wait
from openinfer.scheduler import ControlCommand, ControlOp, EventKind


def ask(rig, cmd: ControlCommand):  # type: ignore[no-untyped-def]
    """Issue a control command, run to quiescence, return its response."""
    ev = rig.eng.control(cmd)
    rig.run()
    assert ev.triggered
    return ev.value


def test_lora_control_unloads_adapter_when_idle() -> None:
    rig = make_engine(lora_control=True)
    r = ask(rig, ControlCommand(ControlOp.LOAD, "A"))
    assert r.ok and r.adapters == ["A"]
    assert ask(rig, ControlCommand(ControlOp.LIST)).adapters == ["A"]
    r = ask(rig, ControlCommand(ControlOp.UNLOAD, "A"))
    assert r.ok and r.message is None
    r = ask(rig, ControlCommand(ControlOp.LIST))
    assert r.ok and r.adapters == []
    assert rig.ex.adapters() == []


def test_lora_control_waits_until_scheduler_idle() -> None:
    rig = make_engine(lora_control=True)
    h = rig.submit(prompt(40, 1), 20)
    run_until(rig, lambda: len(h.tokens()) >= 2)
    ev = rig.eng.control(ControlCommand(ControlOp.LOAD, "A"))
    later = rig.submit(prompt(40, 5000), 3, lora="A")   # arrives after the Load: must see it
    rig.run(until=rig.rt.now() + 0.05)
    assert not ev.triggered and rig.ex.adapters() == []
    assert h.terminal_event() is None            # still generating
    rig.run()
    fin = only_terminal(h)
    assert fin.kind is EventKind.FINISHED and len(h.tokens()) == 20
    assert ev.triggered and ev.value.ok
    assert ev.value.applied_at >= fin.time
    # the Generate behind the control waited for it and then ran on the new adapter
    t = only_terminal(later)
    assert t.kind is EventKind.FINISHED
    assert later.events[0].time >= ev.value.applied_at
    assert rig.at_rest()


def test_malformed_control_is_answered_and_the_loop_keeps_serving() -> None:
    rig = make_engine(lora_control=True)
    bogus = rig.eng.control(ControlCommand("bogus", "A"))
    no_name = rig.eng.control(ControlCommand(ControlOp.LOAD))
    no_name_unload = rig.eng.control(ControlCommand("unload", None))
    h = rig.submit(prompt(40, 1), 4)
    rig.run()
    for ev, word in ((bogus, "bogus"), (no_name, "load"), (no_name_unload, "unload")):
        assert ev.triggered and ev.value.ok is False
        assert ev.value.message and word in ev.value.message
    assert only_terminal(h).kind is EventKind.FINISHED
    assert rig.eng.pending_control == []
    # still answering well-formed commands afterwards
    assert ask(rig, ControlCommand(ControlOp.LOAD, "A")).ok


def test_failing_control_reports_error_and_loop_keeps_serving() -> None:
    rig = make_engine(lora_control=True, max_loras=1)
    r = ask(rig, ControlCommand(ControlOp.UNLOAD, "nope"))
    assert r.ok is False and "nope" in (r.message or "")
    assert ask(rig, ControlCommand(ControlOp.LOAD, "A")).ok
    r = ask(rig, ControlCommand(ControlOp.LOAD, "B"))           # over max_loras
    assert r.ok is False and "max_loras" in (r.message or "") and r.adapters == ["A"]
    assert ask(rig, ControlCommand(ControlOp.LOAD, "A", load_inplace=True)).ok
    h = rig.submit(prompt(40, 1), 3, lora="A")
    rig.run()
    assert only_terminal(h).kind is EventKind.FINISHED


def test_control_on_plain_engine_is_refused_and_serving_continues() -> None:
    rig = make_engine(lora_control=False)
    ev = rig.eng.control(ControlCommand(ControlOp.LIST))
    h = rig.submit(prompt(40, 1), 3)
    rig.run()
    assert ev.triggered and ev.value.ok is False and "lora_control" in (ev.value.message or "")
    assert kinds(h)[-1] is EventKind.FINISHED


def test_unload_then_request_for_that_adapter_is_rejected() -> None:
    rig = make_engine(lora_control=True)
    assert ask(rig, ControlCommand(ControlOp.LOAD, "A")).ok
    ev = rig.eng.control(ControlCommand(ControlOp.UNLOAD, "A"))
    after = rig.submit(prompt(40, 1), 3, lora="A")               # arrives after the Unload
    base = rig.submit(prompt(40, 1), 3)
    rig.rt.run_process(wait(ev))
    rig.run()
    assert ev.value.ok
    t = only_terminal(after)
    assert t.kind is EventKind.REJECTED and t.message == "LoRA adapter is not loaded: A"
    assert only_terminal(base).kind is EventKind.FINISHED
    assert rig.at_rest()
