"""Verdict order: failed check, error, invalid, informational, pass, stop-loss, fail; overall is the worst."""

import pytest

from harness.config import Gate
from harness.gates.verdict import Outcome, evaluate, legacy_intervals, overall_outcome, skipped
from harness.stats import ORDER_STATISTICS, Interval, median_interval
from harness.workloads.kit.base import WorkloadResult


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


def ci(median, low, high, trials=6, asked=None):
    iv = Interval(median=median, ci_low=low, ci_high=high, trials=trials, asked=asked, method=ORDER_STATISTICS)
    return WorkloadResult({"per_gpu_read_gb_s": median}, intervals={"per_gpu_read_gb_s": iv})


@pytest.mark.parametrize("median,low,high,outcome,inconclusive", [
    (5.5, 5.1, 5.9, Outcome.PASS, False),      # the whole interval clears pass
    (5.5, 4.8, 5.9, Outcome.FAIL, True),       # a median that passes is not enough: the interval straddles pass
    (4.5, 4.0, 4.9, Outcome.FAIL, False),      # between the thresholds throughout: a plain FAIL
    (2.5, 2.0, 2.9, Outcome.STOP, False),      # the whole interval past stop-loss
    (2.9, 2.5, 3.3, Outcome.FAIL, True),       # straddles stop-loss: acceptance does not stop on a maybe
])
def test_a_metric_measured_over_trials_is_judged_on_its_interval(median, low, high, outcome, inconclusive):
    v = evaluate(gate(), ci(median, low, high), "GB/s")
    assert v.outcome is outcome
    assert v.reason.startswith("inconclusive: ") is inconclusive
    assert "95 % CI" in v.reason and "6 trials" in v.reason
    assert v.interval == {"median": median, "ci_low": low, "ci_high": high, "trials": 6, "asked": None,
                          "method": ORDER_STATISTICS, "coverage": None}


def test_an_inconclusive_verdict_says_how_many_trials_would_separate_them():
    v = evaluate(gate(), ci(5.5, 4.5, 6.5), "GB/s")  # half-width 1.0, 0.5 from pass: 4x the trials
    assert v.reason.endswith("straddles pass >= 5 GB/s; about 24 trials would separate them")
    v = evaluate(gate(), ci(5.0 - 1e-12, 4.5, 5.5), "GB/s")
    assert "about" in v.reason
    v = evaluate(gate(), ci(5.0, 4.5, 5.5), "GB/s")  # on the threshold: passes on the point, not on the interval
    assert v.outcome is Outcome.FAIL and "more trials would not separate them" in v.reason


@pytest.mark.parametrize("trials", [1, 2, 3, 5])
def test_too_few_trials_for_an_interval_never_pass_and_say_so(trials):
    """A median from fewer trials than a 95 % interval needs (6) is no conclusive PASS, however far it clears the
    threshold: the verdict says "N trials, no interval" (issue 36's one-trial "interval")."""
    iv = median_interval([9.0 + i * 0.01 for i in range(trials)])
    v = evaluate(gate(), WorkloadResult({"per_gpu_read_gb_s": iv.median}, intervals={"per_gpu_read_gb_s": iv}),
                 "GB/s")
    assert v.outcome is Outcome.FAIL and v.reason.startswith("inconclusive: ")
    word = "trial" if trials == 1 else "trials"
    assert f"({trials} {word}, no interval)" in v.reason and "at least 6 trials needed" in v.reason
    info = evaluate(gate(informational=True),
                    WorkloadResult({"per_gpu_read_gb_s": iv.median}, intervals={"per_gpu_read_gb_s": iv}), "GB/s")
    assert info.outcome is Outcome.INFO and f"{trials} {word}, no interval" in info.reason


def test_a_trial_without_a_figure_is_a_failed_trial_and_the_gate_does_not_judge():
    """A gate asked for 7 trials; one gave a figure (the other six failed): INVALID, never PASS on 1 trial."""
    v = evaluate(gate(), ci(9.0, 8.0, 10.0, trials=6, asked=7), "GB/s")
    assert v.outcome is Outcome.INVALID and "1 of 7 trials gave no figure" in v.reason
    one = median_interval([0.0625], asked=7)
    v = evaluate(gate(metric="per_gpu_read_gb_s", **{"pass": "<= 0.5 GB/s"}, stop_loss=None),
                 WorkloadResult({"per_gpu_read_gb_s": 0.0625}, intervals={"per_gpu_read_gb_s": one}), "GB/s")
    assert v.outcome is Outcome.INVALID and "6 of 7 trials gave no figure" in v.reason


def test_an_older_bundles_suffix_interval_is_read_and_judged_by_todays_rule():
    """A result.json of an older kvgate holds M_ci_low/M_ci_high/M_ci_trials: read back typed; from 3 trials (a
    bootstrap's [min, max]) there is no 95 % interval, so its old PASS is now an inconclusive FAIL."""
    metrics = {"per_gpu_read_gb_s": 5.5, "per_gpu_read_gb_s_ci_low": 5.1, "per_gpu_read_gb_s_ci_high": 5.9,
               "per_gpu_read_gb_s_ci_trials": 3.0}
    ivs = legacy_intervals(metrics)
    assert ivs == {"per_gpu_read_gb_s": Interval(median=5.5, trials=3)}
    v = evaluate(gate(), WorkloadResult(metrics, intervals=ivs), "GB/s")
    assert v.outcome is Outcome.FAIL and "(3 trials, no interval)" in v.reason
    seven = {**metrics, "per_gpu_read_gb_s_ci_trials": 7.0}
    v = evaluate(gate(), WorkloadResult(seven, intervals=legacy_intervals(seven)), "GB/s")
    assert v.outcome is Outcome.PASS and "percentile bootstrap" in v.reason


def test_interval_thresholds_convert_units_like_single_values():
    assert evaluate(gate(), ci(5500, 5100, 5900), "MB/s").outcome is Outcome.PASS
    assert evaluate(gate(), ci(5500, 4900, 5900), "MB/s").outcome is Outcome.FAIL


def test_the_verdict_records_each_metric_with_its_declared_unit():
    """The report shows every metric with the unit its workload declares (METRICS), the interval's bounds in
    the metric's unit and its trials as a count; a metric the table lacks gets no unit (shown as a number)."""
    from harness.report.render import metric_rows
    from harness.workloads.fio_read import FioRead
    metrics = {"per_gpu_read_gb_s": 5.2, "per_gpu_read_gb_s_ci_low": 5.1, "per_gpu_read_gb_s_ci_high": 5.3,
               "per_gpu_read_gb_s_ci_trials": 3.0, "total_read_gb_s": 41.6, "extra_bytes": 2097152.0}
    v = evaluate(gate(), WorkloadResult(metrics), "GB/s", FioRead.metric_unit)
    assert v.metric_units == {"per_gpu_read_gb_s": "GB/s", "per_gpu_read_gb_s_ci_low": "GB/s",
                              "per_gpu_read_gb_s_ci_high": "GB/s", "per_gpu_read_gb_s_ci_trials": "count",
                              "total_read_gb_s": "GB/s"}
    shown = {r["name"]: r["value"] for r in metric_rows(v.to_dict())}
    assert shown == {"extra_bytes": "2.09715e+06", "per_gpu_read_gb_s": "5.2 GB/s", "per_gpu_read_gb_s_ci_high":
                     "5.3 GB/s", "per_gpu_read_gb_s_ci_low": "5.1 GB/s", "per_gpu_read_gb_s_ci_trials": "3",
                     "total_read_gb_s": "41.6 GB/s"}
    # a verdict of an older kvgate (no metric_units): the gate's metric keeps its unit, the others their number
    old = {**v.to_dict(), "metric_units": None}
    assert {r["name"]: r["value"] for r in metric_rows(old)}["per_gpu_read_gb_s"] == "5.2 GB/s"
