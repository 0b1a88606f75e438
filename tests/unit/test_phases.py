"""The one phase runner engine workloads share (harness/workloads/kit/phases.py), on engine handles the test scripts,
and the waits of the engine lifecycle on the gate's clock: a launched engine's readiness wait and the pool's poll
run on a ScriptedClock (no sleeping), give up at their own timeout and notice a crashed engine."""

from __future__ import annotations

import pytest

from doubles import FakeEngine, Router, engine_node, gate_context, pool_files, spawned
from harness.engines import load_profile
from harness.execute.cancel import Cancelled
from harness.execute.clock import ScriptedClock
from harness.transport.doubles import Reply, ScriptedTransport
from harness.workloads.kit.engine import EngineProcess, LaunchedEngine, pool_contents
from harness.workloads.kit.phases import PhaseRunner, first_fallback

DEGRADED = ". System will operate in degraded mode (recompute). (manager.py:107:lmcache.v1.manager)"


def counting(calls: list[str], name: str = "hit"):
    n = iter(range(0, 10 ** 6, 100))
    return lambda: f"{name}_tokens_total {next(n)}\n"


def test_a_phase_reads_counters_device_and_log_before_and_after_around_the_warm_up_and_the_requests(tmp_path):
    calls: list[str] = []
    eng = FakeEngine("e", calls, counters=counting(calls))
    device = iter(["d0", "d1"])
    runner = PhaseRunner(gate_context(None), {"e": eng}, counters=True,
                         warm_up=lambda name, h, label: calls.append(f"warm-up {name} {label}"))
    assert runner.open() is None

    def device_read():
        calls.append("device")
        return next(device)

    def send():
        calls.append("send")
        eng.say("served")
        return ["rec"]
    rec = runner.phase("readback", send, device=device_read)
    assert calls == ["e.open", "e.start", "warm-up e readback", "e.metrics", "device", "e.log", "send", "e.metrics", "device",
                     "e.log"]
    r = rec.engines["e"]
    assert rec.output == ["rec"] and (rec.device_before, rec.device_after) == ("d0", "d1")
    assert r.delta(["hit_tokens_total"]) == 100 and r.log_after.text.endswith("served\n")


def test_fall_backs_count_from_the_engines_start_a_fresh_process_wholly_a_persistent_one_from_now():
    fresh = FakeEngine("fresh", log=f"{DEGRADED}\n")   # the fall-back is a start-up line of its process
    kept = FakeEngine("kept", persistent=True, log=f"old {DEGRADED}\n")  # an operator's engine: an old line
    runner = PhaseRunner(gate_context(None), {"fresh": fresh, "kept": kept})
    runner.open()
    rec = runner.phase("p", lambda: None)
    why, lines = first_fallback(rec.engines, (), lambda name: name)
    assert why.startswith("the engine fell back in the fresh phase") and len(lines) == 1
    kept.say(DEGRADED)  # the attached engine's log gains one now: that one counts
    rec = runner.phase("p", lambda: None, on=["kept"])
    assert first_fallback(rec.engines, (), lambda name: name)[0].startswith("the engine fell back in the kept phase")
    # a profile's own pattern is a fall-back line too
    fresh.say("my engine: tier disabled")
    assert first_fallback(runner.phase("p", lambda: None, on=["fresh"]).engines, [r"tier disabled"],
                          lambda n: n)[1][-1].line.endswith("tier disabled")


def test_without_counters_only_an_engine_kvgate_does_not_restart_is_read_and_a_missing_endpoint_is_no_error():
    calls: list[str] = []
    launched, attached = FakeEngine("l", calls), FakeEngine("a", calls, persistent=True)  # neither serves /metrics
    runner = PhaseRunner(gate_context(None), {"l": launched, "a": attached})
    runner.open()
    rec = runner.phase("p", lambda: None)
    assert "l.metrics" not in calls and calls.count("a.metrics") == 2  # its start time marks a restart
    assert rec.engines["a"].metrics_before is None and rec.engines["a"].delta(["x"]) is None
    with pytest.raises(Exception, match="404"):
        PhaseRunner(gate_context(None), {"l": launched}, counters=True).phase("p", lambda: None)


def test_engines_opened_together_report_every_failure_and_close_gives_each_whole_log():
    calls: list[str] = []
    a, b = FakeEngine("a", calls, fail="a: rc 1"), FakeEngine("b", calls, fail="b: not ready")
    runner = PhaseRunner(gate_context(None), {"a": a, "b": b})
    why = runner.open(parallel=True)
    assert why.startswith("engine did not start: ") and "a: rc 1" in why and "b: not ready" in why
    assert runner.close(parallel=True, logs=True) == {} and a.closed and b.closed  # never started: no log claims
    c = FakeEngine("c", calls)
    runner = PhaseRunner(gate_context(None), {"c": c})
    runner.open()
    c.say(DEGRADED)  # written after the last phase (at shutdown): the whole log still counts
    logs = runner.close(logs=True)
    assert first_fallback(logs, (), lambda n: n)[0] is not None and c.closed


def test_forget_reads_no_log_and_resume_marks_where_the_new_process_begins():
    """An attached engine's log mark is a logged command on a node: forget adds none; after resume a fall-back
    counts from the restart on, not the lines of the process before."""
    calls: list[str] = []
    eng = FakeEngine("e", calls)
    runner = PhaseRunner(gate_context(None), {"e": eng})
    runner.open()
    eng.say(DEGRADED)
    del calls[:]
    assert runner.forget() is None and calls == ["e.forget"]
    eng.log = ""  # a fresh process, a fresh log
    assert runner.resume() is None and calls == ["e.forget", "e.open", "e.start"]
    rec = runner.phase("readback", lambda: None)
    assert rec.engines["e"].since.process == 2 and first_fallback(rec.engines, (), lambda n: n)[0] is None


# ---------------------------------------------------------------------------------- waits on the gate's clock

def launched(tmp_path, node: ScriptedTransport, http, clock: ScriptedClock, timeout_s: float | None = None):
    ctx = gate_context(tmp_path, transports={"n1": node}, http=http, clock=clock, timeout_s=timeout_s)
    prof = load_profile("cpu-reference")
    return ctx, EngineProcess(ctx, node, prof, ["engine"], {}, "http://127.0.0.1:9", "/w/engine.log",
                              tmp_path / "engine.log")


def test_a_launched_engines_readiness_wait_runs_on_the_gates_clock_and_gives_up_at_its_timeout(tmp_path):
    clock, probes = ScriptedClock(), []

    def never_ready(request):
        probes.append(request.url.path)
        import httpx
        return httpx.Response(503)
    _, eng = launched(tmp_path, ScriptedTransport(name="n1"), never_ready, clock)
    eng.start()
    ok, why = eng.wait_ready(10)
    assert not ok and why == "engine not ready after 10 s"
    assert clock.waits == [0.5] * 20 and len(probes) == 20  # one probe per half second of the scripted clock


def test_a_launched_engine_that_dies_ends_its_readiness_wait_at_once_and_its_log_is_kept(tmp_path):
    clock = ScriptedClock()
    node = ScriptedTransport(Router((spawned, Reply(rc=3, stdout="Traceback: boom\n", exit_after_s=0))), name="n1")
    ctx, _ = launched(tmp_path, node, lambda r: None, clock)
    eng = LaunchedEngine(ctx, node, load_profile("cpu-reference"), ["engine"], {}, "http://127.0.0.1:9", "/w",
                         ("recompute",), [])
    why = eng.open()
    assert "engine exited with rc 3 before it was ready" in why and "Traceback: boom" in why
    assert clock.waits == []  # not a single poll interval waited for a dead engine
    assert (ctx.gate_dir / "engine-recompute.log").read_text() == "Traceback: boom\n"


def test_the_gates_deadline_ends_a_launched_engines_readiness_wait(tmp_path):
    import httpx
    clock = ScriptedClock()
    _, eng = launched(tmp_path, ScriptedTransport(name="n1"), lambda r: httpx.Response(503), clock, timeout_s=2.2)
    eng.start()
    with pytest.raises(Cancelled, match="timed out after 2.2 s"):
        eng.wait_ready(300)
    assert sum(clock.waits) == pytest.approx(2.2)


def test_the_pool_poll_waits_on_the_gates_clock_until_the_kv_is_there_or_its_timeout(tmp_path):
    clock = ScriptedClock()
    looks = iter([[], [100], [100, 100], [100, 100, 100]])
    node = engine_node("n1", pool_files(lambda: next(looks)))
    ctx = gate_context(tmp_path, transports={"n1": node}, clock=clock)
    info = pool_contents(ctx, node, "/p", 200, 60, "pool")
    assert (info.bytes, info.files) == (200, 2) and clock.waits == [0.5, 0.5]
    # never enough: the last look at the timeout is the record (a logged step), and the wait is the timeout's
    node = engine_node("n1", pool_files([100]))
    ctx = gate_context(tmp_path / "again", transports={"n1": node}, clock=clock)
    info = pool_contents(ctx, node, "/p", 10 ** 6, 3, "pool")
    assert info.bytes == 100 and clock.waits[2:] == [0.5] * 6
    assert len(list((tmp_path / "again" / "steps").iterdir())) == 1
