"""A gate's cancellation: waits on the gate's clock end at its deadline or its cancellation (a scripted clock,
no sleeping), the HTTP client sends nothing after a stop and drops what is in flight, and a workload that writes
into its gate after the gate ended is refused, recorded, and leaves no file."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import httpx
import pytest

from harness.engines import load_profile
from harness.engines.client import CANCELLED, CompletionRequest, run_requests_sync
from harness.execute.cancel import Cancelled, GateEnded
from harness.execute.clock import ScriptedClock
from harness.suite.runner import gate_context, run_gate_workload
from harness.transport import ScopedTransport
from harness.transport.doubles import Reply, ScriptedTransport
from harness.transport.steps import StepLog
from harness.workloads.kit.attach import AttachedEngine, AttachParams
from harness.workloads.kit.base import WorkloadResult, write_gate_file, write_summary
import doubles


def attached(clock: ScriptedClock, answers: list[str], timeout_s: float | None = None) -> AttachedEngine:
    def engine(request: httpx.Request) -> httpx.Response:
        answers.append(request.url.path)
        return httpx.Response(503)
    ctx = doubles.gate_context(None, gate_id="G2", http=engine, clock=clock, timeout_s=timeout_s)
    attach = AttachParams(url="http://10.0.0.5:8000", restart=[{"node": "n1", "run": "true"}])
    return AttachedEngine(ctx, load_profile("vllm-attach"), attach)


def test_a_readiness_wait_runs_on_the_gates_clock_and_gives_up_at_its_own_timeout():
    clock, answers = ScriptedClock(), []
    ok, why = attached(clock, answers).wait_ready(30)
    assert not ok and "did not answer 200 within 30 s: HTTP 503" in why
    assert clock.waits == [1.0] * 30 and len(answers) == 31  # one probe a second of the scripted clock


def test_the_gates_deadline_ends_a_readiness_wait_and_no_probe_goes_out_after_it():
    clock, answers = ScriptedClock(), []
    with pytest.raises(Cancelled, match="gate G2 timed out after 4.5 s"):
        attached(clock, answers, timeout_s=4.5).wait_ready(30)
    # probes at 0..4 s; the last wait is cut to the 0.5 s left; nothing is sent at or after the deadline
    assert clock.waits == [1.0] * 4 + [0.5] and len(answers) == 5


def test_a_cancellation_from_another_thread_ends_the_wait_at_once():
    answers: list[str] = []

    def operator(clock, seconds):
        if len(clock.waits) == 3:
            eng.ctx.cancel.cancel("interrupted (SIGTERM)")
    clock = ScriptedClock(on_wait=operator)
    eng = attached(clock, answers)
    with pytest.raises(Cancelled, match="SIGTERM"):
        eng.wait_ready(30)
    assert len(answers) == 3 and clock.t == 1002.0  # the third wait did not pass: it was cut by the cancel


def test_a_stop_drops_requests_in_flight_and_sends_no_more():
    stop = threading.Event()
    sent: list[str] = []

    async def engine(request: httpx.Request) -> httpx.Response:
        sent.append(request.url.path)
        stop.set()  # the gate ends while this request is in flight; the engine never answers it
        await asyncio.sleep(3600)
        return httpx.Response(200)
    reqs = [CompletionRequest(f"r{i}", [1, 2, 3]) for i in range(3)]
    records = run_requests_sync("http://e", reqs, "m", concurrency=1, transport=httpx.MockTransport(engine),
                                stop=stop)
    assert len(sent) == 1  # the other two were never sent
    assert [r.error for r in records] == [CANCELLED] * 3 and not any(r.ok for r in records)


class LateWriter:
    """A workload that ignores its gate's end: once the gate is cancelled it still writes a summary, a gate
    file and a step, each through the writers workloads use."""

    def __init__(self, node):
        self.node = node
        self.outcomes: dict[str, str] = {}

    def run(self, ctx):
        while not ctx.cancel.is_set():
            threading.Event().wait(0.01)
        writes = {"summary": lambda: write_summary(ctx.gate_dir, "late-summary.json", WorkloadResult()),
                  "gate file": lambda: write_gate_file(ctx.gate_dir / "requests-late.jsonl", "{}\n"),
                  "step": lambda: ctx.steps.run(self.node, "late-step", ["true"])}
        for what, write in writes.items():
            try:
                write()
                self.outcomes[what] = "written"
            except GateEnded:
                self.outcomes[what] = "refused"
        return WorkloadResult(error="wrote late")


def test_writes_into_a_gate_after_it_ended_are_refused_and_recorded(tmp_path):
    run_dir = tmp_path / "run"
    gate_dir = run_dir / "gates" / "G9"
    gate_dir.mkdir(parents=True)
    steps = StepLog(run_dir)
    node = ScopedTransport(ScriptedTransport(lambda call: Reply(), name="n1"))
    gate = SimpleNamespace(id="G9", timeout_s=0.2)
    ctx = gate_context(gate, None, {"n1": None}, {"n1": node}, steps, gate_dir, lambda m: None)
    wl = LateWriter(node)
    result = run_gate_workload(wl, ctx, {"n1": node}, lambda m: None)
    assert "timed out after 0.2 s" in result.error
    assert wl.outcomes == {"summary": "refused", "gate file": "refused", "step": "refused"}
    assert list(gate_dir.iterdir()) == [] and list((run_dir / "steps").iterdir()) == []
    refused = result.evidence.refused_writes
    names = sorted(w["path"].rsplit("/", 1)[-1] for w in refused)
    assert names == ["001-n1-late-step", "late-summary.json", "requests-late.jsonl"], names
    assert all("gate G9 timed out after 0.2 s" in w["reason"] for w in refused)
    # the run's own log is not the gate's: a step of the run outside any gate still lands
    steps.run(ScriptedTransport(lambda call: Reply(), name="n1"), "after", ["true"])
    assert [d.name.split("-", 1)[1] for d in (run_dir / "steps").iterdir()] == ["n1-after"]


def test_a_workload_that_does_not_stop_ends_the_run_without_a_bundle(tmp_path, monkeypatch):
    """A workload stuck where no cancellation reaches it: no later gate runs beside it, and no bundle is written
    around a thread that may still write into the run."""
    import yaml
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from harness.config import load_config
    from harness.suite import runner
    from harness.workloads import WORKLOADS
    from harness.workloads.kit.base import Workload

    release = threading.Event()

    class Unstoppable(Workload):
        name = "test-unstoppable"
        METRICS = {"x_s": "s"}

        def plan(self, ctx):
            return []

        def run(self, ctx):
            release.wait(60)  # deaf to its gate's cancellation
            return WorkloadResult({"x_s": 1.0})

    monkeypatch.setitem(WORKLOADS, "test-unstoppable", Unstoppable)
    monkeypatch.setattr(runner, "STOP_GRACE_S", 0.2)
    gates = [{"id": g, "title": g, "workload": "test-unstoppable", "metric": "x_s", "pass": ">= 0 s",
              "timeout_s": 0.3} for g in ("U1", "U2")]
    (tmp_path / "g.yaml").write_text(yaml.safe_dump({"suite": {"name": "u", "version": 1}, "gates": gates}))
    (tmp_path / "i.yaml").write_text(yaml.safe_dump({"nodes": [{"name": "n1", "transport": "local", "work_dir": "/w"}]}))
    cfg = load_config(tmp_path / "i.yaml", tmp_path / "g.yaml", WORKLOADS)
    try:
        out = runner.run_suite(cfg, tmp_path / "out", Ed25519PrivateKey.generate(),
                               transports={"n1": ScriptedTransport(lambda call: Reply(), name="n1")},
                               progress=lambda m: None, make_tar=False)
    finally:
        release.set()
    assert [v.outcome.value for v in out.verdicts] == ["ERROR", "SKIPPED"], [v.reason for v in out.verdicts]
    assert "did not return within 0.2 s" in out.verdicts[0].reason
    assert "U1 (its workload did not stop)" in out.verdicts[1].reason
    assert out.bundle is None and out.unstopped == ["U1"] and any("no bundle was written" in m for m in out.messages)
    assert not [d for d in (tmp_path / "out").iterdir() if d.name.startswith("KVG-")]


def test_a_stop_signal_caught_by_a_worker_thread_still_reaches_the_waiting_main_thread():
    """The kernel may deliver kvgate's SIGINT to any of its threads. Caught by a worker, it only sets Python's
    flag; a main thread blocked in one long wait never looked at it (seen: kvgate sat out the 300 s of a gate
    after SIGINT, 1 run in 12 under load). ``_thread.interrupt_main`` sets exactly that flag without waking the
    main thread: the run's wait must notice it while the workload still runs."""
    import _thread
    import threading

    from harness.suite.runner import wait_interruptibly
    from signals import ctrl_c_raises

    release, finished = threading.Event(), threading.Event()

    def workload():
        release.wait(30)
        finished.set()

    threading.Thread(target=workload, daemon=True).start()
    timer = threading.Timer(0.3, _thread.interrupt_main)  # the flag only, as a signal caught by another thread
    try:
        with ctrl_c_raises(), pytest.raises(KeyboardInterrupt):
            timer.start()
            wait_interruptibly(finished, None)
        assert not finished.is_set()  # interrupted while the gate's workload still ran, not after it ended
    finally:
        release.set()
