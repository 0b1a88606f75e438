"""The engine session every engine workload runs in (harness/workloads/kit/session.py), on engine handles the test
scripts: whatever the body does, every engine that was to start is closed, and a failure on the way is the gate's
error with the engines' log tails, never a lost exception or an engine left running."""

from __future__ import annotations

import httpx
import pytest

from doubles import FakeEngine, gate_context
from harness.errors import WorkloadError
from harness.workloads.kit.base import WorkloadResult
from harness.workloads.kit.phases import PhaseRunner
from harness.workloads.kit.session import EngineSession

DEGRADED = ". System will operate in degraded mode (recompute). (manager.py:107:lmcache.v1.manager)"


def runner(*engines: FakeEngine) -> PhaseRunner:
    return PhaseRunner(gate_context(None), {e.name: e for e in engines})


def failed(why: str) -> WorkloadResult:
    return WorkloadResult(evidence=None, error=why)


def test_an_engine_that_does_not_start_is_the_gates_error_and_is_closed_all_the_same():
    calls: list[str] = []
    e = FakeEngine("e", calls, fail="engine did not become ready in 600 s")
    after = []
    out = EngineSession({"engine": runner(e)}).run(lambda: pytest.fail("the body ran"), failed,
                                                   after=lambda: after.append("after"))
    assert out.error == "engine did not become ready in 600 s"
    assert calls == ["e.open", "e.close"] and after == ["after"]


@pytest.mark.parametrize("exc", [httpx.ConnectError("connection refused"), WorkloadError("pool not mounted"),
                                 OSError("No space left on device"), ValueError("not JSON")])
def test_an_engine_error_in_the_body_is_the_gates_error_with_the_log_tail_and_every_engine_is_closed(exc):
    calls: list[str] = []
    a, b = FakeEngine("a", calls), FakeEngine("b", calls)

    def body():
        raise exc
    out = EngineSession({"engines": runner(a, b)}).run(body, failed)
    assert out.error.startswith(f"{type(exc).__name__}: {exc}\n")
    assert "(log of a)" in out.error and "(log of b)" in out.error
    assert a.closed and b.closed


def test_a_defect_of_kvgate_raises_but_still_closes_every_engine():
    e = FakeEngine("e")

    def body():
        raise KeyError("a bug")
    with pytest.raises(KeyError):
        EngineSession({"engine": runner(e)}).run(body, failed)
    assert e.closed


def test_what_is_known_before_a_start_ends_the_gate_without_starting_an_engine_but_closes_it():
    """A text-only API without a usable tokenizer is known before the engine starts: no start, but the close that
    releases what the set-up made (a launched engine's pool device)."""
    calls: list[str] = []
    e = FakeEngine("e", calls)
    out = EngineSession({"engine": runner(e)}).run(lambda: pytest.fail("the body ran"), failed,
                                                   before=lambda: failed("no tokenizer"))
    assert out.error == "no tokenizer" and calls == ["e.close"]


def test_a_body_closes_its_engines_to_read_their_logs_and_they_are_not_closed_twice():
    calls: list[str] = []
    e = FakeEngine("e", calls, log=f"{DEGRADED}\n")
    session = EngineSession({"engine": runner(e)})

    def body():
        return session.fallback(session.close(), (), "load")
    reason, lines = session.run(body, failed)
    assert reason.startswith("the engine fell back in the load phase") and len(lines) == 1
    assert calls.count("e.close") == 1


def test_of_two_arms_started_at_once_the_one_that_fails_is_named_and_both_are_closed():
    tier, no_tier = FakeEngine("t", fail="exit 1 before ready"), FakeEngine("n")
    session = EngineSession({"tier": runner(tier), "no_tier": runner(no_tier)}, parallel=True,
                            label=lambda arm: f"{arm} arm")
    out = session.run(lambda: pytest.fail("the body ran"), failed)
    assert out.error == "tier arm: exit 1 before ready"
    assert tier.closed and no_tier.closed


def test_one_runner_named_by_its_label_and_logs_read_at_close_when_asked():
    e = FakeEngine("e", fail="port in use")
    out = EngineSession({"tier": runner(e)}, label=lambda arm: f"{arm} arm").run(lambda: None, failed)
    assert out.error == "tier arm: port in use"
    ok = FakeEngine("ok", log="served\n")
    session = EngineSession({"engines": runner(ok)}, logs=True)
    assert session.run(lambda: "done", failed) == "done"
    assert session.logs["engines"]["ok"].end.text.endswith("served\n")
