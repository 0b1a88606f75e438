"""g2-faults (harness.workloads.g2_faults): G2 while the engine's path to its tier is lost and restored.

The whole workload on a scripted node and a scripted engine whose tier is down exactly while the fault's command
holds (the fault's tc command sets it, its inverse clears it): a request then answers from re-compute, and is
counted as such from the engine's counters, never as a hit, and the verdict says DEGRADED; a request that fails is
FAIL; the fault's inverse runs on every way the phase can end. The pure judgement on recorded requests; bad
schedules refused with file and line."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import httpx
import pytest

from doubles import gate_context
from harness.errors import ConfigError
from harness.execute.cancel import Cancelled
from harness.execute.clock import Clock
from harness.execute.undo import UndoLog
from harness.gates.verdict import Outcome, evaluate
from harness.rigs import faults as F
from harness.transport.doubles import Reply
from harness.workloads import WORKLOADS
from harness.workloads.kit.faults import ScheduledFault
from harness.workloads.g2_faults import (EngineFaultRecord, EngineFaultSpec, FaultedRequest, G2FaultsEvidence,
                                         classify, evaluate_g2_faults, fault_commands, faulted_phase,
                                         parse_mount_server, window_of)
from g2_faults_fixture import SERVER, Tier, faulty_node, run, signed_faults_run as _bundle, suite  # noqa: F401

def test_requests_the_engine_recomputed_while_the_path_was_lost_are_degraded_never_hits(tmp_path):
    tier = Tier()
    result, verdict, sent, ctx = run(tmp_path, tier)
    ev = result.evidence
    assert result.error is None and result.invalid_reason is None, (result.error, result.invalid_reason)
    assert tier.seen_down >= 1  # the fault did reach the engine's tier
    # every request the tier did not serve is counted as re-computed, from the counters, never as a hit
    recomputed = [r for r in ev.requests if r.served == "re-compute"]
    assert len(recomputed) == tier.seen_down and all(r.hit_tokens == 0 and r.window == "during" for r in recomputed)
    assert ev.tier_requests == len(ev.requests) - len(recomputed) == result.metrics["tier_requests"]
    assert result.metrics["recompute_requests"] == len(recomputed) and result.metrics["failed_requests"] == 0
    assert all(r.served == "tier" for r in ev.requests if r.window == "before")
    # the verdict passes on its metric and says, visibly, what was degraded
    assert verdict.outcome is Outcome.PASS
    assert f"DEGRADED: {len(recomputed)} of 10 request(s) fell back to re-compute" in verdict.reason
    assert "not counted as hits" in verdict.reason
    # the fault: made on the node with the pool mount's server, undone by the workload, recovery measured
    f = ev.faults[0]
    assert f.applied_ok and f.undone_ok and f.undone_by == "workload" and f.recompute == len(recomputed)
    assert f.recovery_s is not None and f.recovery_s <= 5
    assert ev.pool_server == SERVER
    assert sent == list(F.pool_path_loss(SERVER))  # made once with the mount's server, undone once
    assert ctx.undo.pending() == []
    assert (ctx.gate_dir / "requests-faulted.jsonl").read_text().count("\n") == 10


def test_a_request_that_fails_while_the_path_is_lost_is_fail(tmp_path):
    tier = Tier(fail_while_down=True)
    result, verdict, _, ctx = run(tmp_path, tier)
    assert tier.seen_down >= 1
    assert result.evidence.failed_requests == tier.seen_down
    assert verdict.outcome is Outcome.FAIL and "request(s) failed (lost)" in verdict.reason
    assert result.metrics["tier_requests"] == len(result.evidence.requests) - tier.seen_down
    assert ctx.undo.pending() == []


def test_a_tier_that_never_comes_back_is_fail(tmp_path):
    tier = Tier()
    cfg = suite(tmp_path)
    sent: list = []
    node = faulty_node(tier, sent)
    # the inverse is sent and succeeds, but the tier stays lost (as an sshfs mount whose connection died)
    node.handler.on(lambda c: "kvgate-pool-path-back" in c.argv, Reply())
    ctx = gate_context(tmp_path, cfg, transports={"n1": node}, http=tier, clock=Clock())
    result = WORKLOADS["g2-faults"]().run(ctx)
    v = evaluate(cfg.suite.gates[0], result, "s", WORKLOADS["g2-faults"].metric_unit)
    assert v.outcome is Outcome.FAIL and "did not serve again within 5 s" in v.reason and "DEGRADED" in v.reason
    ev = result.evidence
    first = min(r.t_start_s for r in ev.requests if r.served == "re-compute")
    assert not any(r.served == "tier" for r in ev.requests if r.t_start_s > first)  # lost for good


def test_a_fault_the_engine_never_felt_is_invalid_not_pass(tmp_path):
    # the fault's command "succeeds" but the tier keeps serving at full speed (a route to the wrong address, a
    # pool the engine does not read through that mount): nothing was tested, so nothing passes
    tier = Tier()
    cfg = suite(tmp_path)
    node = faulty_node(tier, [])
    node.handler.on(lambda c: c.argv[:3] == ("ip", "route", "add"), Reply())
    ctx = gate_context(tmp_path, cfg, transports={"n1": node}, http=tier, clock=Clock())
    result = WORKLOADS["g2-faults"]().run(ctx)
    v = evaluate(cfg.suite.gates[0], result, "s", WORKLOADS["g2-faults"].metric_unit)
    assert tier.seen_down == 0 and result.evidence.recompute_requests == result.evidence.failed_requests == 0
    assert v.outcome is Outcome.INVALID and "faults felt: not proven" in v.reason and "fault 0" in v.reason


# ------------------------------------------------------------------------------- the inverse, every exit


def driver_ctx(tmp_path, sent, timeout_s=None):
    def handler(call):
        sent.append(call.argv)
        return Reply()
    from harness.transport.doubles import ScriptedTransport
    ctx = gate_context(tmp_path, gate=SimpleNamespace(id="G", timeout_s=timeout_s), clock=Clock(),
                       transports={"n1": ScriptedTransport(handler, name="n1")}, timeout_s=timeout_s)
    return ctx


def one_fault():
    f = EngineFaultSpec(kind="pool-path-loss", at_s=0.05, duration_s=5)
    return [ScheduledFault(0, f, *fault_commands(f, SERVER))]


@pytest.mark.parametrize("ending", ["request raises", "gate cancelled"])
def test_the_inverse_runs_whatever_ends_the_faulted_phase(tmp_path, ending):
    sent: list = []
    ctx = driver_ctx(tmp_path, sent)
    undo = UndoLog()
    faults = one_fault()

    def send_one(i, t0):
        if i == 2:
            deadline = time.monotonic() + 30  # the fault has gone out (a loaded machine may send it late)
            while faults[0].apply not in sent and time.monotonic() < deadline:
                time.sleep(0.01)
            if ending == "request raises":
                raise httpx.ReadTimeout("the engine hung")
            ctx.cancel.cancel("gate timed out")
        return i

    with pytest.raises(httpx.ReadTimeout if ending == "request raises" else Cancelled):
        faulted_phase(ctx, "n1", faults, send_one, 6, 0.1, undo)
    apply, inverse = faults[0].apply, faults[0].inverse
    assert sent == [apply, inverse]  # made once, undone once, although the phase ended early
    assert undo.entries[0].done and undo.entries[0].ran_by == "workload"


def test_the_inverse_is_registered_before_the_fault_is_sent(tmp_path):
    undo = UndoLog()
    seen = []
    from harness.transport.doubles import ScriptedTransport

    def handler(call):
        seen.append((call.argv[:3], [e.name for e in undo.pending()]))
        return Reply()
    ctx = gate_context(tmp_path, gate=SimpleNamespace(id="G", timeout_s=None), clock=Clock(),
                       transports={"n1": ScriptedTransport(handler, name="n1")})
    f = EngineFaultSpec(kind="pool-path-loss", at_s=0.05, duration_s=0.05)
    faulted_phase(ctx, "n1", [ScheduledFault(0, f, *fault_commands(f, SERVER))], lambda i, t0: i, 3, 0.05, undo)
    assert seen[0] == (("ip", "route", "add"), ["fault0-pool-path-loss"])  # pending before the fault went out
    assert undo.pending() == []


def test_a_failed_inverse_stays_pending_for_the_runner(tmp_path):
    tier = Tier()
    cfg = suite(tmp_path)
    sent: list = []
    node = faulty_node(tier, sent, undo_rc=1)
    ctx = gate_context(tmp_path, cfg, transports={"n1": node}, http=tier, clock=Clock())
    ctx.undo = UndoLog()
    result = WORKLOADS["g2-faults"]().run(ctx)
    assert [e.name for e in ctx.undo.pending()] == ["fault0-pool-path-loss"]  # the runner tries it again
    assert not result.evidence.faults[0].undone_ok and "faults undone" in (result.invalid_reason or "")


# ------------------------------------------------------------------------------------------ pure parts


def req(i, t0, t1, served, window, hit=None, ttft=0.1, match=True):
    return FaultedRequest(index=i, request_id=f"r{i}", t_start_s=t0, t_end_s=t1, ttft_s=None if served == "failed"
                          else ttft, hit_tokens=hit if hit is not None else (512 if served == "tier" else 0),
                          expected_hit_tokens=512, served=served, window=window,
                          answer_matches=None if served == "failed" else match,
                          error="HTTP 500" if served == "failed" else None)


def evidence(*reqs, undo=4.0):
    return G2FaultsEvidence(recovery_bound_s=10, requests=list(reqs), faults=[EngineFaultRecord(
        index=0, kind="pool-path-loss", detail="pool path lost", applied_ok=True, undone_ok=True, t_apply_s=2.0,
        t_undo_s=undo)])


def test_classify_counts_a_hit_only_when_the_counters_prove_the_whole_stored_kv_was_read():
    assert classify(True, 512, 512) == "tier"
    assert classify(True, 256, 512) == "re-compute"  # part of it: the engine computed the rest
    assert classify(True, 0, 512) == "re-compute"
    assert classify(True, None, 512) == "re-compute"  # counters not read: never a hit unproven
    assert classify(False, 512, 512) == "failed"


def test_window_of_puts_a_request_in_flight_at_the_fault_during_it():
    spans = [(2.0, 4.0)]
    assert window_of(0.0, 1.0, spans) == "before"
    assert window_of(1.5, 2.5, spans) == "during"  # in flight when the fault landed
    assert window_of(3.9, 9.0, spans) == "during"
    assert window_of(4.5, 5.0, spans) == "after"


def test_evaluation_ttft_before_during_after_stall_and_recovery():
    res = evaluate_g2_faults(evidence(req(0, 0, 0.1, "tier", "before", ttft=0.1),
                                      req(1, 2.1, 9.0, "re-compute", "during", ttft=6.9),
                                      req(2, 9.1, 9.2, "tier", "after", ttft=0.1)))
    m = res.metrics
    assert m["ttft_before_p50_s"] == 0.1 and m["ttft_during_max_s"] == 6.9 and m["max_stall_s"] == 6.9
    assert m["recompute_requests"] == 1 and m["tier_requests"] == 2 and m["tier_fraction"] == pytest.approx(2 / 3)
    assert m["max_recovery_s"] == pytest.approx(9.2 - 4.0)
    assert res.failed_check is None and res.invalid_reason is None and "1 of 3 request(s)" in res.degraded


def test_a_wrong_answer_is_fail_and_a_tier_that_served_nothing_before_is_invalid():
    res = evaluate_g2_faults(evidence(req(0, 0, 0.1, "tier", "before"), req(1, 2.1, 2.2, "re-compute", "during",
                                                                            match=False),
                                      req(2, 5, 5.1, "tier", "after")))
    assert "1 wrong answer(s)" in res.failed_check
    res = evaluate_g2_faults(evidence(req(0, 0, 0.1, "re-compute", "before"), req(1, 2.1, 2.2, "tier", "during"),
                                      req(2, 5, 5.1, "tier", "after")))
    assert "tier served before the fault" in res.invalid_reason


@pytest.mark.parametrize("kind", ["pool-unmount"])
def test_the_pool_detached_from_its_path_is_re_computed_and_bound_back(tmp_path, kind):
    tier = Tier()
    result, verdict, sent, ctx = run(tmp_path, tier, faults=[{"kind": kind, "at_s": 0.1, "duration_s": 0.1}])
    ev = result.evidence
    assert tier.seen_down >= 1 and ev.recompute_requests == tier.seen_down
    assert verdict.outcome is Outcome.PASS and "DEGRADED" in verdict.reason
    # detached from the mount point findmnt named, held under the node's work dir, bound back
    assert sent == list(F.pool_unmount("/mnt/pool", "/w/kvgate-pool-held-G2-F1-pool-faults"))
    assert ev.pool_mount_point == "/mnt/pool" and ctx.undo.pending() == []


def test_pool_unmount_holds_the_pool_before_it_detaches_it_and_binds_it_back():
    apply, inverse = F.pool_unmount("/mnt/pool", "/w/held")
    assert apply[3:] == ("kvgate-pool-unmount", "/mnt/pool", "/w/held") and "umount -l" in apply[2]
    assert "mount --bind" in apply[2] and apply[2].index("mount --bind") < apply[2].index("umount -l")
    assert inverse[3:] == ("kvgate-pool-remount", "/mnt/pool", "/w/held") and 'mountpoint -q "$1"' in inverse[2]


def test_parse_mount():
    from harness.workloads.g2_faults import parse_mount
    assert parse_mount("/mnt/pool root@10.83.0.2:/var/tmp/pool\n") == ("/mnt/pool", "10.83.0.2")
    assert parse_mount("/ /dev/vda1\n") == ("/", None)
    assert parse_mount("") == (None, None)


def test_parse_mount_server():
    assert parse_mount_server("root@10.83.0.2:/var/tmp/pool\n") == "10.83.0.2"
    assert parse_mount_server("10.0.0.5:/export/kv") == "10.0.0.5"
    assert parse_mount_server("/dev/nvme0n1p1") is None
    assert parse_mount_server("nfs.example:/kv") is None


def test_pool_path_loss_and_its_inverse_are_a_blackhole_route_for_the_server():
    apply, inverse = F.pool_path_loss(SERVER)
    assert apply == ("ip", "route", "add", "blackhole", f"{SERVER}/32")
    assert inverse[-1] == SERVER and "ip route del blackhole" in inverse[2] and "exact" in inverse[2]


@pytest.mark.parametrize("faults, message", [
    ([{"kind": "pool-path-loss", "at_s": 1, "duration_s": 4}, {"kind": "pool-path-loss", "at_s": 3, "duration_s": 1}],
     "faults run one at a time"),
    ([{"kind": "pool-path-loss", "at_s": 1, "duration_s": 100}], "recovery could not be measured"),
    ([{"kind": "pool-path-loss", "at_s": 0.5, "duration_s": 1}], "leaves no request before it"),
    ([{"kind": "pool-path-loss", "server": "storage", "at_s": 1, "duration_s": 1}], "expected an IPv4 address"),
    ([{"kind": "operator", "at_s": 1, "duration_s": 1, "command": ["x"]}], "needs description"),
    ([{"kind": "pool-path-loss", "at_s": 1, "duration_s": 1, "command": ["x"]}], "only for kind operator"),
    ([{"kind": "pool-unmount", "server": "10.0.0.1", "at_s": 1, "duration_s": 1}], "only for kind pool-path-loss"),
])
def test_bad_fault_schedules_are_refused_with_file_and_line(tmp_path, faults, message):
    with pytest.raises(ConfigError) as exc:
        suite(tmp_path, interval_s=1, faults=faults)
    text = str(exc.value)
    assert "g.yaml:" in text and "gates[0].params" in text and message in text, text


def test_the_plan_lists_each_fault_and_its_inverse_as_run(tmp_path):
    from harness.suite.plan import gate_plan
    cfg = suite(tmp_path, faults=[{"kind": "pool-path-loss", "server": SERVER, "at_s": 0.1, "duration_s": 0.1}])
    steps = gate_plan(cfg, cfg.suite.gates[0])
    apply, inverse = F.pool_path_loss(SERVER)
    assert [s.argv for s in steps if s.argv in (apply, inverse)] == [apply, inverse]
    assert not any(s.argv[:1] == ("findmnt",) for s in steps)  # the server is given: nothing to look up


def test_degraded_key_a_g2_faults_bundle_with_a_degraded_result_is_re_verified_same(tmp_path):
    from harness.gates.reevaluate import reevaluate_bundle
    result, pred, ctx = _bundle(tmp_path, Tier())
    assert result.degraded and "degraded" in json.loads((ctx.gate_dir / "result.json").read_text())
    re = reevaluate_bundle(tmp_path, pred)
    assert re.same, re.differences
    assert re.checks[0].rederived and "DEGRADED:" in re.checks[0].reevaluated["reason"]


def test_g2_faults_a_failed_request_dropped_from_the_evidence_is_re_derived_from_its_raw_record(tmp_path):
    """A signer rewrites the evidence: the request that failed while the path was lost becomes a tier hit. The
    raw requests-faulted.jsonl still holds its error: the re-derived verdict is FAIL."""
    from harness.gates.reevaluate import reevaluate_bundle
    result, pred, ctx = _bundle(tmp_path, Tier(fail_while_down=True))
    assert pred["verdicts"][0]["outcome"] == "FAIL"
    res = json.loads((ctx.gate_dir / "result.json").read_text())
    for r in res["evidence"]["requests"]:
        if r["served"] == "failed":
            r.update(served="tier", error=None, ttft_s=0.01, hit_tokens=r["expected_hit_tokens"])
    res["failed_check"] = None
    (ctx.gate_dir / "result.json").write_text(json.dumps(res))
    pred["verdicts"][0].update(outcome="PASS")
    again = reevaluate_bundle(tmp_path, pred).checks[0].reevaluated
    assert again["outcome"] == "FAIL" and "request(s) failed (lost)" in again["reason"]


def test_g2_faults_empty_requests_file_is_an_error(tmp_path):
    from harness.gates.reevaluate import reevaluate_bundle
    _, pred, ctx = _bundle(tmp_path, Tier())
    (ctx.gate_dir / "requests-faulted.jsonl").write_text("")
    again = reevaluate_bundle(tmp_path, pred).checks[0].reevaluated
    assert again["outcome"] == "ERROR" and "requests-faulted.jsonl: the faulted phase's requests is empty" in \
        again["reason"]
