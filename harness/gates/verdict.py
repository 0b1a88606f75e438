"""Gate outcomes as data, and the pure evaluation of a workload's metrics against a gate."""

from __future__ import annotations

import enum
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Mapping

from ..stats import CONFIDENCE, Interval, min_trials_for_interval
from ..units import Threshold, unit_info
from ..workloads.kit.base import WorkloadResult


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
    # the gate metric's median and confidence interval over trials (harness.stats.Interval as a dict), when it
    # was measured over trials
    interval: dict[str, Any] | None = None

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


def metric_units_of(metrics: Mapping[str, float], unit_of: Callable[[str], str | None]) -> dict[str, str]:
    """Pure: the unit of each metric by the workload's ``unit_of`` (its ``metric_unit``); a metric it does not
    report, none. (A bundle of an older kvgate also holds an interval's bounds as metrics, ``M_ci_low`` /
    ``M_ci_high`` in M's unit and ``M_ci_trials`` a count: :data:`LEGACY_INTERVAL_PARTS`.)"""
    out = {}
    for name in metrics:
        base, _, part = name.rpartition("_ci_")
        if (unit := unit_of(name)) is not None:
            out[name] = unit
        elif part in LEGACY_INTERVAL_PARTS and (base_unit := unit_of(base)) is not None:
            out[name] = "count" if part == "trials" else base_unit
    return out


# How an older kvgate wrote a figure's interval: as metrics beside it (``M_ci_low``, ``M_ci_high``,
# ``M_ci_trials``). Read only from a bundle's result.json (:func:`legacy_intervals`), never written.
LEGACY_INTERVAL_PARTS = ("low", "high", "trials")


def legacy_intervals(metrics: Mapping[str, float]) -> dict[str, Interval]:
    """Pure: the intervals a bundle of an older kvgate recorded as ``M_ci_low`` / ``M_ci_high`` / ``M_ci_trials``
    metrics beside ``M``, typed (``method`` None: a percentile bootstrap), so its re-evaluation judges them by
    today's rule: from fewer trials than a 95 % interval for the median needs, no interval at all."""
    out = {}
    for name, v in metrics.items():
        base, _, part = name.rpartition("_ci_")
        if part != "low" or base not in metrics:
            continue
        hi, n = metrics.get(f"{base}_ci_high"), metrics.get(f"{base}_ci_trials")
        if hi is None:
            continue
        trials = int(n or 0)
        if trials < min_trials_for_interval(CONFIDENCE):  # a bootstrap of so few is no 95 % interval: none
            out[base] = Interval(median=float(metrics[base]), trials=trials)
        else:
            out[base] = Interval(median=float(metrics[base]), ci_low=float(v), ci_high=float(hi), trials=trials)
    return out


def evaluate(gate, result: WorkloadResult, metric_unit: str,
             unit_of: Callable[[str], str | None] | None = None) -> Verdict:
    """:func:`judge`, with every proof the gate turned off (a ValidityCheck with ``checked`` False) named
    "unproven" in the reason, and a workload's degraded answer (``result.degraded``: e.g. requests re-computed because the
    tier failed) appended to the reason, marked DEGRADED, whatever the outcome: never silent."""
    v = judge(gate, result, metric_unit, unit_of)
    unchecked = unchecked_proofs(getattr(result.evidence, "validity", None))
    if unchecked:  # a proof the gate turned off: said in the verdict's line, whatever the outcome
        v = replace(v, reason=f"{v.reason}; unproven (not checked): {'; '.join(unchecked)}")
    if result.degraded:
        v = replace(v, reason=f"{v.reason}; DEGRADED: {result.degraded}")
    return v


def unchecked_proofs(validity: Any) -> list[str]:
    """Pure: ``NAME (HOW)`` of each validity item marked not checked, from typed checks or a recorded list of
    dicts (a bundle's result.json); anything else, none."""
    out = []
    for c in validity if isinstance(validity, list) else []:
        d = c if isinstance(c, dict) else c.model_dump() if hasattr(c, "model_dump") else {}
        if d.get("checked") is False:
            out.append(f"{d.get('name')} ({d.get('how')})")
    return out


def judge(gate, result: WorkloadResult, metric_unit: str, unit_of: Callable[[str], str | None] | None = None
          ) -> Verdict:
    """Compare ``result.metrics[gate.metric]`` (in ``metric_unit``) with the gate's thresholds; ``unit_of``: the
    workload's ``metric_unit``, each metric's unit recorded in the verdict (:func:`metric_units_of`).

    Order: a failed check (``result.failed_check``: the system under test proved wrong, e.g. data read back
    differs) -> FAIL, whatever else; error -> ERROR; missing evidence -> INVALID; informational -> INFO;
    pass holds -> PASS; stop-loss holds -> STOP; otherwise FAIL. A metric measured over trials with a
    confidence interval (``result.intervals``, harness.stats.Interval) is judged on the interval
    (:func:`judge_interval`).
    """
    iv = result.intervals.get(gate.metric)
    common = dict(
        gate_id=gate.id, title=gate.title, metric=gate.metric, pass_threshold=str(gate.pass_),
        stop_loss_threshold=str(gate.stop_loss) if gate.stop_loss else None, unit=metric_unit,
        evidence=result.evidence_dict(), reference=gate.reference.model_dump() if gate.reference else {},
        metrics=dict(result.metrics), metric_units=metric_units_of(result.metrics, unit_of or (lambda _name: None)),
        interval=iv.model_dump(mode="json") if iv is not None else None,
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
        shown = f"{actual:.4g} {metric_unit}" if iv is None else iv.text(metric_unit)
        return Verdict(actual=actual, outcome=Outcome.INFO,
                       reason=f"informational: {shown} {'meets' if ok else 'misses'} {gate.pass_}", **common)
    if iv is not None:
        outcome, reason = judge_interval(gate.pass_, gate.stop_loss, iv, metric_unit, factor)
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


def trials_to_separate(trials: int, point: float, low: float, high: float, threshold: float) -> int | None:
    """About how many trials would put the interval on one side of ``threshold``: the half-width shrinks as
    1/sqrt(trials), and must become smaller than the median's distance from the threshold. None when the
    median sits on the threshold (no number of trials separates them)."""
    distance = abs(point - threshold)
    if distance == 0 or trials < 1:
        return None
    half = max(point - low, high - point)
    return max(trials, math.ceil(trials * (half / distance) ** 2))


def judge_interval(pass_: Threshold, stop_loss: Threshold | None, iv: Interval, unit: str,
                   factor: float = 1.0) -> tuple[Outcome, str]:
    """Pure: a threshold judged on a figure's median and confidence interval over trials.

    INVALID when a trial the gate asked for gave no figure (a failed trial counts: the gate judges only when every
    trial gave one). Too few trials for a 95 % interval ("N trials, no interval"): never PASS, an inconclusive
    FAIL naming the trials a conclusive verdict needs. Otherwise PASS only when the whole interval clears
    ``pass``, STOP only when the whole interval lies past ``stop_loss``; an interval across either threshold is
    an inconclusive FAIL, saying about how many trials would separate them; otherwise FAIL."""
    shown = iv.text(unit)
    if iv.failed_trials:
        return Outcome.INVALID, (f"{iv.failed_trials} of {iv.asked} trials gave no figure (a failed trial counts; "
                                 f"the gate judges only when every trial it asked for gives one): {shown}")
    if not iv.has_interval:
        need = min_trials_for_interval(CONFIDENCE)
        meets = "meets" if pass_.holds(iv.median * factor) else "misses"
        return Outcome.FAIL, (f"inconclusive: {shown}: {iv.trials} trial{'s' if iv.trials != 1 else ''} give no "
                              f"{CONFIDENCE * 100:g} % interval for the median, so no conclusive PASS (the median {meets} "
                              f"pass {pass_}; at least {need} trials needed)")
    assert iv.ci_low is not None and iv.ci_high is not None
    lo_b, hi_b = iv.ci_low * factor, iv.ci_high * factor
    if pass_.holds(lo_b) and pass_.holds(hi_b):
        return Outcome.PASS, f"{shown}: the whole interval meets pass {pass_}"
    if stop_loss is not None and stop_loss.holds(lo_b) and stop_loss.holds(hi_b):
        return Outcome.STOP, f"{shown}: the whole interval hits stop-loss {stop_loss}: acceptance stops"
    for thr, what in ((pass_, "pass"), (stop_loss, "stop-loss")):
        if thr is not None and thr.holds(lo_b) != thr.holds(hi_b):
            need = trials_to_separate(iv.trials, iv.median * factor, lo_b, hi_b, thr.quantity.base)
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
