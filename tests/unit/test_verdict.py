"""Verdict order: failed check, error, invalid, informational, pass, stop-loss, fail; overall is the worst."""

import pytest

from harness.config import Gate
from harness.gates.verdict import Outcome, evaluate, overall_outcome, skipped
from harness.workloads.base import WorkloadResult


def gate(**kw):
    base = {"id": "G1", "title": "t", "workload": "fio-read", "metric": "per_gpu_read_gb_s",
            "pass": ">= 5 GB/s", "stop_loss": "< 3 GB/s"}
    base.update(kw)
    return Gate.model_validate(base)


@pytest.mark.parametrize("value,outcome", [(5.23, Outcome.PASS), (5.0, Outcome.PASS), (4.0, Outcome.FAIL),
                                           (3.0, Outcome.FAIL), (2.9, Outcome.STOP)])
def test_thresholds(value, outcome):
    assert evaluate(gate(), WorkloadResult({"per_gpu_read_gb_s": value}), "GB/s").outcome is outcome


def test_metric_unit_conversion():
    # metric reported in MB/s, thresholds in GB/s
    assert evaluate(gate(), WorkloadResult({"per_gpu_read_gb_s": 5100}), "MB/s").outcome is Outcome.PASS


def test_error_and_invalid_win_over_a_good_number():
    r = WorkloadResult({"per_gpu_read_gb_s": 9.0}, error="node1: fio failed")
    assert evaluate(gate(), r, "GB/s").outcome is Outcome.ERROR
    r = WorkloadResult({"per_gpu_read_gb_s": 9.0}, invalid_reason="not cold")
    assert evaluate(gate(), r, "GB/s").outcome is Outcome.INVALID
    assert evaluate(gate(), WorkloadResult({}), "GB/s").outcome is Outcome.ERROR


def test_a_failed_check_is_fail_whatever_the_number_error_or_gate_kind():
    r = WorkloadResult({"per_gpu_read_gb_s": 9.0}, invalid_reason="not cold", failed_check="chunk K differs")
    v = evaluate(gate(), r, "GB/s")
    assert (v.outcome, v.reason, v.actual) == (Outcome.FAIL, "chunk K differs", 9.0)
    v = evaluate(gate(informational=True), WorkloadResult({}, error="stream 1 died", failed_check="chunk K differs"),
                 "GB/s")
    assert (v.outcome, v.reason) == (Outcome.FAIL, "chunk K differs (also: stream 1 died)")
    assert overall_outcome([v]) is Outcome.FAIL
    # result.json carries it only when set, so other workloads' results keep their shape
    assert "failed_check" not in WorkloadResult({}).as_dict()
    assert WorkloadResult({}, failed_check="x").as_dict()["failed_check"] == "x"


def test_informational_never_decides():
    v = evaluate(gate(informational=True), WorkloadResult({"per_gpu_read_gb_s": 1.0}), "GB/s")
    assert v.outcome is Outcome.INFO
    assert overall_outcome([v]) is Outcome.PASS


def test_overall_is_never_pass_when_a_gate_did_not_run():
    p = evaluate(gate(), WorkloadResult({"per_gpu_read_gb_s": 6.0}), "GB/s")
    s = skipped(gate(id="G2"), "skipped", "GB/s")
    assert overall_outcome([p]) is Outcome.PASS
    assert overall_outcome([p, s]) is Outcome.SKIPPED
    assert overall_outcome([]) is Outcome.ERROR
    stop = evaluate(gate(), WorkloadResult({"per_gpu_read_gb_s": 1.0}), "GB/s")
    err = evaluate(gate(), WorkloadResult(error="x"), "GB/s")
    assert overall_outcome([p, err, stop, s]) is Outcome.STOP
    assert overall_outcome([p, err, s]) is Outcome.ERROR


def test_lower_is_better_gate():
    g = gate(metric="ttft", **{"pass": "<= 12 s", "stop_loss": "> 20 s"})
    assert evaluate(g, WorkloadResult({"ttft": 11.85}), "s").outcome is Outcome.PASS
    assert evaluate(g, WorkloadResult({"ttft": 15}), "s").outcome is Outcome.FAIL
    assert evaluate(g, WorkloadResult({"ttft": 21000}), "ms").outcome is Outcome.STOP


def test_invalid_without_the_gate_metric_is_invalid_not_an_error():
    """A workload that proves its figure would be meaningless (an engine that fell back) may stop before it
    has the figure: that is INVALID with its reason, not ERROR 'did not report metric'."""
    from harness.config.models import Gate
    from harness.gates.verdict import Outcome, WorkloadResult, evaluate
    gate = Gate.model_validate({"id": "G2", "title": "t", "workload": "g2-ttft", "metric": "readback_speedup_p50",
                                "pass": ">= 2 x"})
    v = evaluate(gate, WorkloadResult(metrics={"ttft_recompute_p50_s": 1.0}, invalid_reason="engine fell back"), "x")
    assert v.outcome is Outcome.INVALID and v.reason == "engine fell back"
