"""Re-evaluate a bundle's verdicts offline from its raw files, with the bundle's own suite.

For each gate of ``config/gates.yaml`` (validated against ``config/inventory.yaml``, both from the bundle):
the metrics are re-derived from the raw output by the workload's re-deriver, with the bounds of the bundle's
``config/gates.yaml`` (never the ones its evidence records), engine logs re-scanned for fall-back lines and the
pool device's step outputs re-parsed where the workload proves cold reads; a raw file that is missing or empty
is an ERROR. A workload without a re-deriver has its metrics taken from ``gates/<gate>/result.json``, and says
so (``GateCheck.rederived``; ``Reevaluation.rederived_text``: "N of M gates re-derived from raw files"). Then
the gate is evaluated with :func:`harness.gates.verdict.evaluate` and compared with the signed verdict.
Differences are data, never an exception. docs/evidence.md lists per workload what is re-derived from which files.

A workload's re-deriver is its own ``rederive(gate_dir, result, params, ctx)``, beside its run and evaluator in its
module (the bundle's raw files read through harness/workloads/kit/rederive.py), returning a :class:`WorkloadResult`,
or ``(metrics, invalid_reason)`` / ``(metrics, invalid_reason, failed_check)``, where ``result`` is result.json as a
dict and ``ctx`` gives ``bundle_dir``, ``gate`` and ``nodes`` (the gate's nodes of the bundle's inventory).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..config import load_config
from ..errors import ConfigError, HarnessError
from ..safeio import MAX_JSON_BYTES, InputFileError, check_keys, json_type, key_line, parse_json, read_text
from ..workloads import WORKLOADS
from ..workloads.kit.base import RecordedEvidence, WorkloadResult
from ..stats import Interval
from .verdict import Outcome, Verdict, evaluate, legacy_intervals, overall_outcome, skipped

REL_TOL = 1e-9


@dataclass
class GateCheck:
    gate_id: str
    signed: dict[str, Any] | None
    reevaluated: dict[str, Any] | None
    source: str  # where the metrics came from
    differences: list[str] = field(default_factory=list)
    rederived: bool = False  # the metrics were re-derived from the raw files (not taken from result.json)
    ran: bool = True  # the gate has a result (not skipped, not "not run")

    @property
    def same(self) -> bool:
        return not self.differences


@dataclass
class Reevaluation:
    checks: list[GateCheck]
    overall_signed: str | None
    overall_reevaluated: str | None
    differences: list[str]

    @property
    def same(self) -> bool:
        return not self.differences

    @property
    def rederived_text(self) -> str:
        """"N of M gates re-derived from raw files" (M: the gates that ran), and which were not."""
        ran = [c for c in self.checks if c.ran]
        bad = [c.gate_id for c in ran if c.source.startswith("unreadable")]
        taken = [c.gate_id for c in ran if not c.rederived and c.gate_id not in bad]
        notes = ([f"taken from result.json: {', '.join(taken)}"] if taken else []) + \
            ([f"raw files missing or unreadable, ERROR: {', '.join(bad)}"] if bad else [])
        return (f"{sum(c.rederived for c in ran)} of {len(ran)} gates re-derived from raw files"
                + (f" ({'; '.join(notes)})" if notes else ""))

    def verdicts_for_render(self) -> list[dict[str, Any]]:
        """The signed verdict where re-evaluation agrees (so a re-render is byte-identical), else the new one."""
        out = []
        for c in self.checks:
            v = c.signed if c.same and c.signed is not None else c.reevaluated
            if v is not None:
                out.append(v)
        return out


def _close(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    try:
        return math.isclose(float(a), float(b), rel_tol=REL_TOL, abs_tol=1e-12)
    except (TypeError, ValueError):
        return a == b


def compare_verdicts(signed: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What differs between a signed verdict and a re-evaluated one (numbers within a relative 1e-9)."""
    gid = signed.get("gate_id", "?")
    diffs = []
    for key in ("outcome", "metric", "unit", "pass_threshold", "stop_loss_threshold", "title"):
        if signed.get(key) != new.get(key):
            diffs.append(f"{gid}: {key} signed {signed.get(key)!r}, re-evaluated {new.get(key)!r}")
    if not _close(signed.get("actual"), new.get("actual")):
        diffs.append(f"{gid}: measured {signed.get('metric')} signed {signed.get('actual')!r}, "
                     f"re-evaluated from raw data {new.get('actual')!r}")
    sm, nm = signed.get("metrics") or {}, new.get("metrics") or {}
    for k in sorted(set(sm) | set(nm)):
        if k == signed.get("metric"):
            continue
        if not _close(sm.get(k), nm.get(k)):
            diffs.append(f"{gid}: metric {k} signed {sm.get(k)!r}, re-evaluated {nm.get(k)!r}")
    if not diffs and signed.get("reason") != new.get("reason"):
        diffs.append(f"{gid}: reason signed {signed.get('reason')!r}, re-evaluated {new.get('reason')!r}")
    return diffs


# What the runner writes into gates/<gate>/result.json; anything else is refused, not silently ignored.
RESULT_KEYS = frozenset({"metrics", "evidence", "invalid_reason", "error", "failed_check", "degraded",
                         "started_unix_s", "finished_unix_s", "intervals"})


def recorded_intervals(result: dict[str, Any], name: str) -> dict[str, Interval]:
    """The figures over trials a result.json recorded, typed: its ``intervals`` (this kvgate's form), else the
    ``M_ci_low`` / ``M_ci_high`` / ``M_ci_trials`` metrics a bundle of an older kvgate wrote
    (harness.gates.verdict.legacy_intervals). InputFileError naming ``name`` when an interval is malformed."""
    raw = result.get("intervals")
    if raw is None:
        return legacy_intervals({k: float(v) for k, v in (result.get("metrics") or {}).items()})
    if not isinstance(raw, dict):
        raise InputFileError(name, None, f"intervals: expected an object, got {json_type(raw)}")
    out = {}
    for k, v in raw.items():
        try:
            out[k] = Interval.model_validate(v)
        except ValidationError as exc:
            raise InputFileError(name, None, f"intervals.{k}: {exc.errors()[0]['msg']}") from None
    return out


def read_result(p: Path, name: str) -> dict[str, Any]:
    """A gate's result.json through the hardened JSON reader, checked for the shape the runner writes;
    InputFileError naming ``name`` (and the line) otherwise."""
    text = read_text(p, max_bytes=MAX_JSON_BYTES, what="result file", follow_symlinks=False, display_name=name)
    result = parse_json(text, name)
    check_keys(result, RESULT_KEYS, name, "result", text, root=True)
    for key, kinds, want in (("metrics", (dict, type(None)), "an object"), ("evidence", (dict, type(None)), "an object"),
                             ("invalid_reason", (str, type(None)), "a string"), ("error", (str, type(None)), "a string"),
                             ("failed_check", (str, type(None)), "a string"),
                             ("degraded", (str, type(None)), "a string")):
        if not isinstance(result.get(key), kinds):
            raise InputFileError(name, key_line(text, key), f"{key}: expected {want} or null, "
                                                            f"got {json_type(result[key])}")
    for k, v in (result.get("metrics") or {}).items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise InputFileError(name, key_line(text, k), f"metrics.{k}: expected a number, got {json_type(v)}")
    return result


def reevaluate_bundle(bundle_dir: str | Path, predicate: dict[str, Any]) -> Reevaluation:
    """Re-evaluate every gate of the bundle's suite from its raw files and compare with ``predicate``."""
    bundle_dir = Path(bundle_dir)
    verdicts = predicate.get("verdicts")
    if not isinstance(verdicts, list) or not all(isinstance(v, dict) and isinstance(v.get("gate_id"), str)
                                                 for v in verdicts):
        msg = "the signed predicate's verdicts are not a list of verdict objects with a gate_id"
        return Reevaluation([], predicate.get("overall"), None, [msg])
    signed_by_id = {v["gate_id"]: v for v in verdicts}
    try:
        cfg = load_config(bundle_dir / "config" / "inventory.yaml", bundle_dir / "config" / "gates.yaml", WORKLOADS,
                          trials_rule=False)
    except ConfigError as exc:
        first = str(exc.issues[0]) if exc.issues else str(exc)
        msg = f"the bundle's own suite does not load with this kvgate: {first}"
        return Reevaluation([GateCheck(g, v, None, "none", [msg]) for g, v in signed_by_id.items()],
                            predicate.get("overall"), None, [msg])
    checks: list[GateCheck] = []
    new_verdicts: list[Verdict] = []
    stop_at: str | None = None
    for gate in cfg.suite.gates:
        signed = signed_by_id.get(gate.id)
        unit = WORKLOADS[gate.workload].metric_unit(gate.metric)
        result_path = bundle_dir / "gates" / gate.id / "result.json"
        source, rederived, ran = "result.json", False, True
        if stop_at or not result_path.is_file():
            reason = (f"skipped: stop-loss hit at {stop_at}" if stop_at else
                      (signed or {}).get("reason", "skipped: not run"))
            v = skipped(gate, reason, unit)
            source, ran = "not run", False
        else:
            try:
                v, source, rederived = _reevaluate_gate(cfg, gate, bundle_dir)
            except (HarnessError, OSError, ValueError, KeyError, TypeError) as exc:
                v = Verdict(gate_id=gate.id, title=gate.title, metric=gate.metric, pass_threshold=str(gate.pass_),
                            stop_loss_threshold=str(gate.stop_loss) if gate.stop_loss else None, actual=None,
                            unit=unit, outcome=Outcome.ERROR, reason=f"raw data could not be re-evaluated: {exc}")
                source = f"unreadable raw data: {' '.join(str(exc).split())}"
        new_verdicts.append(v)
        if v.outcome is Outcome.STOP:
            stop_at = gate.id
        new = v.to_dict()
        diffs = (compare_verdicts(signed, new) if signed is not None
                 else [f"{gate.id}: in the bundle's suite but has no signed verdict"])
        checks.append(GateCheck(gate.id, signed, new, source, diffs, rederived, ran))
    extra = sorted(set(signed_by_id) - {g.id for g in cfg.suite.gates})
    diffs = [d for c in checks for d in c.differences]
    diffs += [f"{g}: signed verdict for a gate not in the bundle's suite" for g in extra]
    overall = overall_outcome(new_verdicts).value
    if overall != predicate.get("overall"):
        diffs.append(f"overall signed {predicate.get('overall')}, re-evaluated {overall}")
    return Reevaluation(checks, predicate.get("overall"), overall, diffs)


def _reevaluate_gate(cfg: Any, gate: Any, bundle_dir: Path) -> tuple[Verdict, str, bool]:
    """One gate of the bundle's suite (``cfg``) judged again: (verdict, where its metrics came from, whether they
    were re-derived from raw files). A run's error is kept as recorded (nothing to re-derive); a workload without
    a re-deriver has its figures taken from result.json, and says so."""
    wl = WORKLOADS[gate.workload]
    unit = wl.metric_unit(gate.metric)
    gate_dir = bundle_dir / "gates" / gate.id
    result = read_result(gate_dir / "result.json", f"gates/{gate.id}/result.json")
    evidence = RecordedEvidence.model_validate(result.get("evidence") or {})
    recorded = WorkloadResult({k: float(x) for k, x in (result.get("metrics") or {}).items()}, evidence,
                              result.get("invalid_reason"), result.get("error"), result.get("failed_check"),
                              result.get("degraded"),
                              intervals=recorded_intervals(result, f"gates/{gate.id}/result.json"))
    fn = wl.rederive
    if recorded.error:
        return evaluate(gate, recorded, unit, wl.metric_unit), "result.json (the run's error: nothing to re-derive)", False
    if fn is None:
        return (evaluate(gate, recorded, unit, wl.metric_unit), f"result.json (no re-deriver for {gate.workload})",
                False)
    nodes = {n.name: n for n in cfg.gate_nodes(gate)}
    out = fn(gate_dir, result, cfg.params[gate.id], {"bundle_dir": bundle_dir, "gate": gate, "nodes": nodes})
    if isinstance(out, WorkloadResult):  # a re-deriver of figures over trials carries their typed intervals
        again = WorkloadResult(out.metrics, evidence, out.invalid_reason, out.error, out.failed_check, out.degraded,
                               intervals=out.intervals)
    else:
        again = WorkloadResult(out[0], evidence, out[1], None, out[2] if len(out) > 2 else recorded.failed_check,
                               recorded.degraded, intervals=recorded.intervals)
    return evaluate(gate, again, unit, wl.metric_unit), f"raw output re-parsed ({gate.workload})", True




# --------------------------------------------------------------------------- re-derivers








































