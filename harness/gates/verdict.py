"""Gate outcomes as data, and the pure evaluation of a workload's metrics against a gate."""

from __future__ import annotations

import enum
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Mapping

from ..units import Threshold, unit_info
from ..workloads.base import WorkloadResult


class Outcome(str, enum.Enum):
    PASS = "PASS"
    FAIL = "FAIL"        # below pass, above stop-loss
    STOP = "STOP"        # stop-loss hit: later gates are SKIPPED
    ERROR = "ERROR"      # the workload could not run or a node failed
    INVALID = "INVALID"  # evidence the gate requires is missing
    SKIPPED = "SKIPPED"  # not run (after a STOP, or a failed prerequisite)
    INFO = "INFO"        # informational gate: measured, never decides


# Worst first: the overall outcome of a run is the worst of its gates' outcomes.
SEVERITY = [Outcome.STOP, Outcome.ERROR, Outcome.INVALID, Outcome.FAIL, Outcome.SKIPPED, Outcome.PASS, Outcome.INFO]


@dataclass(frozen=True)
class Verdict:
    gate_id: str
    title: str
    metric: str
    pass_threshold: str
    stop_loss_threshold: str | None
    actual: float | None
    unit: str
    outcome: Outcome
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)
    reference: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    # the unit of every metric in ``metrics`` (the workload's METRICS table), so a report shows each with its unit
    metric_units: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["outcome"] = self.outcome.value
        return d


def overall_outcome(verdicts: list[Verdict]) -> Outcome:
    """Worst outcome of all gates; a run with no gates, or any gate not run, is never PASS."""
    if not verdicts:
        return Outcome.ERROR
    outcomes = {v.outcome for v in verdicts}
    for o in SEVERITY:
        if o in outcomes:
            if o is Outcome.INFO:
                return Outcome.PASS
            return o
    return Outcome.ERROR


def metric_units_of(metrics: Mapping[str, float], table: Mapping[str, str]) -> dict[str, str]:
    """Pure: the unit of each metric from a workload's METRICS table; a confidence interval's bounds
    (``M_ci_low``, ``M_ci_high``) in M's unit, its ``M_ci_trials`` a count; a metric the table lacks, none."""
    out = {}
    for name in metrics:
        base, _, part = name.rpartition("_ci_")
        if name in table:
            out[name] = table[name]
        elif base in table and part in ("low", "high"):
            out[name] = table[base]
        elif base in table and part == "trials":
            out[name] = "count"
    return out


def evaluate(gate, result: WorkloadResult, metric_unit: str, metric_units: Mapping[str, str] | None = None) -> Verdict:
    """:func:`judge`, with a workload's degraded answer (``result.degraded``: e.g. requests re-computed because the
    tier failed) appended to the reason, marked DEGRADED, whatever the outcome: never silent."""
    v = judge(gate, result, metric_unit, metric_units)
    if result.degraded:
        v = replace(v, reason=f"{v.reason}; DEGRADED: {result.degraded}")
    return v


def judge(gate, result: WorkloadResult, metric_unit: str, metric_units: Mapping[str, str] | None = None) -> Verdict:
    """Compare ``result.metrics[gate.metric]`` (in ``metric_unit``) with the gate's thresholds; ``metric_units``:
    the workload's METRICS table, recorded per metric in the verdict (:func:`metric_units_of`).

    Order: a failed check (``result.failed_check``: the system under test proved wrong, e.g. data read back
    differs) -> FAIL, whatever else; error -> ERROR; missing evidence -> INVALID; informational -> INFO;
    pass holds -> PASS; stop-loss holds -> STOP; otherwise FAIL. A metric measured over trials with a
    confidence interval (:func:`interval_of`) is judged on the interval (:func:`judge_interval`).
    """
    common = dict(
        gate_id=gate.id, title=gate.title, metric=gate.metric, pass_threshold=str(gate.pass_),
        stop_loss_threshold=str(gate.stop_loss) if gate.stop_loss else None, unit=metric_unit,
        evidence=result.evidence_dict(), reference=gate.reference.model_dump() if gate.reference else {},
        metrics=dict(result.metrics), metric_units=metric_units_of(result.metrics, metric_units or {}),
    )
    actual = result.metrics.get(gate.metric)
    failed = result.failed_check
    if failed:
        return Verdict(actual=actual, outcome=Outcome.FAIL,
                       reason=failed + (f" (also: {result.error})" if result.error else ""), **common)
    if result.error:
        return Verdict(actual=actual, outcome=Outcome.ERROR, reason=result.error, **common)
    if result.invalid_reason:  # the evidence says the figure would not mean what it claims, if there is one
        return Verdict(actual=actual, outcome=Outcome.INVALID, reason=result.invalid_reason, **common)
    if actual is None:
        return Verdict(actual=None, outcome=Outcome.ERROR,
                       reason=f"workload did not report metric {gate.metric}", **common)
    _, factor = unit_info(metric_unit)
    base = actual * factor
    if gate.informational:
        ok = gate.pass_.holds(base)
        return Verdict(actual=actual, outcome=Outcome.INFO,
                       reason=f"informational: {actual:.4g} {metric_unit} {'meets' if ok else 'misses'} {gate.pass_}",
                       **common)
    ci = interval_of(result.metrics, gate.metric)
    if ci is not None:
        outcome, reason = judge_interval(gate.pass_, gate.stop_loss, actual, ci, metric_unit, factor)
        return Verdict(actual=actual, outcome=outcome, reason=reason, **common)
    if gate.pass_.holds(base):
        return Verdict(actual=actual, outcome=Outcome.PASS,
                       reason=f"{actual:.4g} {metric_unit} meets pass {gate.pass_}", **common)
    if gate.stop_loss is not None and gate.stop_loss.holds(base):
        return Verdict(actual=actual, outcome=Outcome.STOP,
                       reason=f"{actual:.4g} {metric_unit} hits stop-loss {gate.stop_loss}: acceptance stops",
                       **common)
    return Verdict(actual=actual, outcome=Outcome.FAIL,
                   reason=f"{actual:.4g} {metric_unit} misses pass {gate.pass_}", **common)


def interval_of(metrics: dict[str, float], metric: str) -> tuple[float, float, int] | None:
    """A metric's confidence interval, when the workload measured it over trials: ``METRIC_ci_low``,
    ``METRIC_ci_high`` and ``METRIC_ci_trials`` beside ``METRIC`` (its median) in the result's metrics."""
    lo, hi, n = (metrics.get(f"{metric}_ci_{k}") for k in ("low", "high", "trials"))
    if lo is None or hi is None:
        return None
    return float(lo), float(hi), int(n or 0)


def trials_to_separate(trials: int, point: float, low: float, high: float, threshold: float) -> int | None:
    """About how many trials would put the interval on one side of ``threshold``: the half-width shrinks as
    1/sqrt(trials), and must become smaller than the median's distance from the threshold. None when the
    median sits on the threshold (no number of trials separates them)."""
    distance = abs(point - threshold)
    if distance == 0 or trials < 1:
        return None
    half = max(point - low, high - point)
    return max(trials, math.ceil(trials * (half / distance) ** 2))


def judge_interval(pass_: Threshold, stop_loss: Threshold | None, point: float, ci: tuple[float, float, int],
                   unit: str, factor: float = 1.0) -> tuple[Outcome, str]:
    """Pure: a threshold judged on a confidence interval. PASS only when the whole interval clears ``pass``,
    STOP only when the whole interval lies past ``stop_loss``; an interval across either threshold is an
    inconclusive FAIL, saying about how many trials would separate them; otherwise FAIL."""
    low, high, trials = ci
    lo_b, hi_b = low * factor, high * factor
    shown = f"median {point:.4g} {unit} (95 % CI {low:.4g}-{high:.4g}, {trials} trials)"
    if pass_.holds(lo_b) and pass_.holds(hi_b):
        return Outcome.PASS, f"{shown}: the whole interval meets pass {pass_}"
    if stop_loss is not None and stop_loss.holds(lo_b) and stop_loss.holds(hi_b):
        return Outcome.STOP, f"{shown}: the whole interval hits stop-loss {stop_loss}: acceptance stops"
    for thr, what in ((pass_, "pass"), (stop_loss, "stop-loss")):
        if thr is not None and thr.holds(lo_b) != thr.holds(hi_b):
            need = trials_to_separate(trials, point * factor, lo_b, hi_b, thr.quantity.base)
            more = (f"; about {need} trials would separate them" if need is not None
                    else "; the median sits on the threshold: more trials would not separate them")
            return Outcome.FAIL, f"inconclusive: {shown} straddles {what} {thr}{more}"
    return Outcome.FAIL, f"{shown}: the whole interval misses pass {pass_}"


def skipped(gate, reason: str, metric_unit: str) -> Verdict:
    return Verdict(
        gate_id=gate.id, title=gate.title, metric=gate.metric, pass_threshold=str(gate.pass_),
        stop_loss_threshold=str(gate.stop_loss) if gate.stop_loss else None, actual=None, unit=metric_unit,
        outcome=Outcome.SKIPPED, reason=reason,
        reference=gate.reference.model_dump() if gate.reference else {},
    )
