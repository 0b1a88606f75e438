"""A fault's inverse runs whatever ends its gate: tried as an attacker would, one exit path at a time (the
workload forgets it, raises, hangs past the gate's timeout, the operator presses Ctrl-C, stop-loss ends the run,
the inverse itself fails). The runner runs what is pending as a step of the run, after the gate's own commands
were stopped, and a node it could not put back makes the gate an ERROR that says so."""

from __future__ import annotations

import json
import threading

import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from harness.config import load_config
from harness.suite import runner
from harness.transport.doubles import Reply, ScriptedTransport
from harness.workloads import WORKLOADS
from harness.workloads.kit.base import StrictModel, Workload, WorkloadResult

UNDO = ("kvgate-test-undo",)


class FaultyParams(StrictModel):
    mode: str
    undo_fails: bool = False


class Faulty(Workload):
    """Makes a 'fault' (a command), registers its inverse first, then ends the way ``mode`` says."""

    name = "test-faulty"
    Params = FaultyParams
    METRICS = {"stall_s": "s"}

    def plan(self, ctx):
        return []

    def run(self, ctx):
        node = next(iter(ctx.transports))
        argv = UNDO + (ctx.gate.id, "fail" if ctx.params.undo_fails else "ok")
        entry = ctx.undo.register(node, f"{ctx.gate.id}-fault", argv, gate=ctx.gate.id)
        ctx.steps.run(ctx.transports[node], "fault", ("kvgate-test-fault", ctx.gate.id))
        mode = ctx.params.mode
        if mode == "raises":
            raise RuntimeError("a bug mid-fault")
        if mode in ("hangs", "ctrl-c"):
            ctx.cancel.sleep(60)
        if mode == "undoes":  # the normal path: the workload ran its inverse itself
            r = ctx.steps.run(ctx.transports[node], "undo", argv)
            ctx.undo.mark(entry, r.ok)
        return WorkloadResult({"stall_s": 100.0 if mode == "stop-loss" else 1.0})


def run(tmp_path, monkeypatch, gates: list[dict], interrupt_after_s: float | None = None):
    monkeypatch.setitem(WORKLOADS, "test-faulty", Faulty)
    monkeypatch.setattr(runner, "STOP_GRACE_S", 2.0)
    full = [{"title": g["id"], "workload": "test-faulty", "metric": "stall_s", "pass": "<= 5 s",
             "stop_loss": "> 50 s", "timeout_s": 30, **g} for g in gates]
    (tmp_path / "g.yaml").write_text(yaml.safe_dump({"suite": {"name": "f", "version": 1}, "gates": full}))
    (tmp_path / "i.yaml").write_text(yaml.safe_dump({"nodes": [{"name": "n1", "transport": "local",
                                                                "work_dir": "/w"}]}))
    cfg = load_config(tmp_path / "i.yaml", tmp_path / "g.yaml", WORKLOADS)
    sent: list[tuple[str, ...]] = []

    def handler(call):
        sent.append(tuple(call.argv))
        return Reply(rc=1 if call.argv[-1] == "fail" else 0, stderr="configfs: busy" if call.argv[-1] == "fail" else "")
    node = ScriptedTransport(handler, name="n1")
    timer = None
    if interrupt_after_s is not None:
        import _thread
        timer = threading.Timer(interrupt_after_s, _thread.interrupt_main)
        timer.start()
    from signals import ctrl_c_raises
    with ctrl_c_raises():
        out = runner.run_suite(cfg, tmp_path / "out", Ed25519PrivateKey.generate(), transports={"n1": node},
                               progress=lambda m: None, make_tar=False)
    if timer is not None:
        timer.cancel()
    undos = [a[1:] for a in sent if a[:1] == UNDO]
    return out, undos, sent


def undo_steps(out) -> list[str]:
    return sorted(d.name.split("-", 2)[2] for d in (out.run_dir / "steps").iterdir() if "-undo-" in d.name)


@pytest.mark.parametrize("mode", ["undoes", "forgets", "raises"])
def test_the_inverse_runs_once_whether_the_workload_ran_it_forgot_it_or_raised(tmp_path, monkeypatch, mode):
    out, undos, sent = run(tmp_path, monkeypatch, [{"id": "F1", "params": {"mode": mode.replace("forgets", "returns")}},
                                                   {"id": "F2", "params": {"mode": "undoes"}}])
    assert undos == [("F1", "ok"), ("F2", "ok")]  # exactly once each, by whoever could
    # put back before the next gate starts, not at the end of the run
    assert sent.index(UNDO + ("F1", "ok")) < sent.index(("kvgate-test-fault", "F2"))
    rec = json.loads((out.run_dir / "undo.json").read_text())
    assert [(e["done"], e["ran_by"]) for e in rec][0] == (True, "workload" if mode == "undoes" else "runner")
    if mode == "raises":
        assert out.verdicts[0].outcome.value == "ERROR"


def test_a_gate_that_times_out_mid_fault_is_put_back_after_its_commands_were_stopped(tmp_path, monkeypatch):
    out, undos, sent = run(tmp_path, monkeypatch, [{"id": "F1", "timeout_s": 0.5, "params": {"mode": "hangs"}},
                                                   {"id": "F2", "params": {"mode": "undoes"}}])
    assert out.verdicts[0].outcome.value == "ERROR" and "timed out" in out.verdicts[0].reason
    assert undos == [("F1", "ok"), ("F2", "ok")]
    assert sent.index(("kvgate-test-fault", "F1")) < sent.index(UNDO + ("F1", "ok")) < \
        sent.index(("kvgate-test-fault", "F2"))
    assert undo_steps(out) == ["undo-F1-fault"]  # a step of the run, not of the ended gate


def test_ctrl_c_mid_fault_still_puts_the_node_back_and_writes_no_bundle(tmp_path, monkeypatch):
    out, undos, _ = run(tmp_path, monkeypatch, [{"id": "F1", "params": {"mode": "ctrl-c"}},
                                                {"id": "F2", "params": {"mode": "undoes"}}], interrupt_after_s=0.5)
    assert out.interrupted and out.bundle is None
    assert undos == [("F1", "ok")]  # F2 never started, so nothing of it to undo
    assert [v.outcome.value for v in out.verdicts] == ["ERROR", "SKIPPED"]


def test_stop_loss_ends_the_run_with_every_fault_undone(tmp_path, monkeypatch):
    out, undos, _ = run(tmp_path, monkeypatch, [{"id": "F1", "params": {"mode": "stop-loss"}},
                                                {"id": "F2", "params": {"mode": "undoes"}}])
    assert [v.outcome.value for v in out.verdicts] == ["STOP", "SKIPPED"]
    assert undos == [("F1", "ok")]


def test_an_inverse_that_fails_makes_the_gate_an_error_naming_it_and_is_tried_again_at_the_end(tmp_path,
                                                                                               monkeypatch):
    out, undos, _ = run(tmp_path, monkeypatch, [{"id": "F1", "params": {"mode": "undoes", "undo_fails": True}}])
    v = out.verdicts[0]
    assert v.outcome.value == "ERROR" and "NOT undone" in v.reason and "configfs: busy" in v.reason
    assert undos == [("F1", "fail")] * 3  # the workload's, the runner's after the gate, the run's last try
