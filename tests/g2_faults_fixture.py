"""g2-faults on a scripted node and a scripted engine whose tier is down exactly while the fault's command holds
(the fault's command sets it, its inverse clears it), kept as a bundle's run directory where a test asks: the unit
tests of the workload (tests/unit/test_g2_faults.py) and `kvgate report` on its bundle (tests/e2e)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from types import SimpleNamespace

import httpx
import yaml

from doubles import EngineServer, engine_node, gate_context
from harness.config import load_config
from harness.execute.clock import Clock
from harness.execute.undo import UndoLog
from harness.gates.verdict import evaluate
from harness.transport.doubles import Reply
from harness.workloads import WORKLOADS

ROOT = Path(__file__).resolve().parents[1]
SERVER = "10.83.0.2"


def suite(tmp_path, **params) -> SimpleNamespace:
    """The shipped gate on one local node whose pool is a directory target (an sshfs mount on the rig)."""
    data = yaml.safe_load((ROOT / "gates" / "g2-faults-cpu-reference.yaml").read_text())
    g = data["gates"][0]
    g["params"].update(python="/engine/bin/python", port=18000, populate_timeout_s=1, prompts_per_length=10,
                       interval_s=0.05, recovery_bound_s=5,
                       faults=[{"kind": "pool-path-loss", "at_s": 0.1, "duration_s": 0.1}])
    g["params"].update(params)
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    (tmp_path / "i.yaml").write_text(yaml.safe_dump({"nodes": [{
        "name": "n1", "transport": "local", "work_dir": "/w",
        "targets": [{"name": "kvpool", "kind": "directory", "path": "/mnt/pool"}]}]}))
    return load_config(tmp_path / "i.yaml", tmp_path / "g.yaml", WORKLOADS)


class Tier(EngineServer):
    """The engine double with a tier that can be lost: while ``down``, a stored prompt is re-computed (no hit,
    the answer the same); ``fail_while_down``: the request fails instead (HTTP 500)."""

    def __init__(self, fail_while_down: bool = False):
        super().__init__()
        self.tier_down = False
        self.fail_while_down = fail_while_down
        self.seen_down = 0
        self.felt = threading.Event()  # a request reached the tier while it was down

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/completions") and self.tier_down:
            self.seen_down += 1
            self.felt.set()
            if self.fail_while_down:
                return httpx.Response(500, text="retrieve failed")
            prompt = json.loads(request.content)["prompt"]
            self.query += len(prompt)  # looked up, nothing read: the engine computes it all
            sse = 'data: {"choices": [{"text": " t1"}]}\n\ndata: {"choices": [{"text": " t2"}]}\n\ndata: [DONE]\n\n'
            return httpx.Response(200, text=sse, headers={"content-type": "text/event-stream"})
        return super().__call__(request)


def faulty_node(tier: Tier, sent: list, undo_rc: int = 0):
    def route(call):
        sent.append(call.argv)
        if call.argv[:3] == ("ip", "route", "add") or "kvgate-pool-unmount" in call.argv:
            tier.tier_down = True
        elif "kvgate-pool-path-back" in call.argv or "kvgate-pool-remount" in call.argv:
            # The outage lasts until a request has met it (as a real one spans some request on a busy machine):
            # with the fault's 0.1 s against requests 0.05 s apart, a slow scheduler otherwise let the inverse run
            # before any request arrived (a unit run under load: seen_down 0).
            if tier.tier_down:
                tier.felt.wait(10)
            if undo_rc == 0:
                tier.tier_down = False
            return Reply(rc=undo_rc, stderr="tc: busy" if undo_rc else "")
        return Reply()
    node = engine_node("n1", engine=tier, pool=(4 * 10 ** 7,))
    node.handler.on(lambda c: c.argv[:2] == ("ip", "route") or any(a.startswith("kvgate-pool-") for a in c.argv),
                    route)
    node.handler.on(lambda c: c.argv[:1] == ("findmnt",), Reply(stdout=f"/mnt/pool root@{SERVER}:/srv/pool\n"))
    return node


def run(tmp_path, tier: Tier, **params):
    cfg = suite(tmp_path, **params)
    sent: list = []
    node = faulty_node(tier, sent)
    ctx = gate_context(tmp_path, cfg, transports={"n1": node}, http=tier, clock=Clock())
    ctx.undo = UndoLog(tmp_path / "undo.json")
    result = WORKLOADS["g2-faults"]().run(ctx)
    gate = cfg.suite.gates[0]
    return result, evaluate(gate, result, "s", WORKLOADS["g2-faults"].metric_unit), sent, ctx


def signed_faults_run(tmp_path, tier):
    """The run kept as a bundle's run directory (config/, gates/ID/result.json, steps/) and its signed verdict."""
    result, verdict, _, ctx = run(tmp_path, tier)
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "gates.yaml").write_text((tmp_path / "g.yaml").read_text())
    (tmp_path / "config" / "inventory.yaml").write_text((tmp_path / "i.yaml").read_text())
    (ctx.gate_dir / "result.json").write_text(json.dumps(result.as_dict(), default=str))
    pred = json.loads((ROOT / "tests" / "fixtures" / "reports" / "predicate.json").read_text())  # its shape
    pred.update(verdicts=[json.loads(json.dumps(verdict.to_dict(), default=str))], overall=verdict.outcome.value)
    return result, pred, ctx
