"""Re-evaluate a bundle's verdicts offline from its raw files, with the bundle's own suite.

For each gate of ``config/gates.yaml`` (validated against ``config/inventory.yaml``, both from the bundle):
the metrics are re-derived from the raw output where a re-deriver for the workload exists (fio-read: every
``gates/<gate>/<node>/fio.json`` through the same pure parser the run used; the cold-read proof from the
drop-caches step's recorded rc), else taken from ``gates/<gate>/result.json``; then the gate is evaluated with
:func:`harness.gates.verdict.evaluate` and compared with the signed verdict. Differences are data, never an exception.

Other workloads add a re-deriver with ``@rederiver("workload-name")``: ``fn(gate_dir, result, params, ctx)
-> (metrics, invalid_reason)`` or ``(metrics, invalid_reason, failed_check)`` where ``result`` is result.json as
a dict and ``ctx`` gives ``bundle_dir``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..config import load_config
from ..errors import ConfigError, HarnessError
from ..parsers.fio import parse_fio_json
from ..safeio import MAX_JSON_BYTES, InputFileError, check_keys, json_type, key_line, parse_json, read_text
from ..workloads import WORKLOADS
from ..workloads.base import RecordedEvidence, WorkloadResult
from ..engines import load_profile
from ..workloads.fio_faults import RAW_FILES as FAULT_RAW_FILES, reevaluate_faults
from ..workloads.fio_read import reevaluate_fio_read
from ..workloads.g2_gain import G2Gain, reevaluate_gain
from ..workloads.g2_load import accounting_counters, reevaluate_load
from ..workloads.kv_read import reevaluate_kv_read
from .verdict import Outcome, Verdict, evaluate, overall_outcome, skipped

REDERIVERS: dict[str, Callable[..., tuple[dict[str, float], str | None]]] = {}
REL_TOL = 1e-9


def rederiver(workload: str):
    def deco(fn):
        REDERIVERS[workload] = fn
        return fn
    return deco


@dataclass
class GateCheck:
    gate_id: str
    signed: dict[str, Any] | None
    reevaluated: dict[str, Any] | None
    source: str  # where the metrics came from
    differences: list[str] = field(default_factory=list)

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
RESULT_KEYS = frozenset({"metrics", "evidence", "invalid_reason", "error", "failed_check", "started_unix_s",
                         "finished_unix_s"})


def read_result(p: Path, name: str) -> dict[str, Any]:
    """A gate's result.json through the hardened JSON reader, checked for the shape the runner writes;
    InputFileError naming ``name`` (and the line) otherwise."""
    text = read_text(p, max_bytes=MAX_JSON_BYTES, what="result file", follow_symlinks=False, display_name=name)
    result = parse_json(text, name)
    check_keys(result, RESULT_KEYS, name, "result", text, root=True)
    for key, kinds, want in (("metrics", (dict, type(None)), "an object"), ("evidence", (dict, type(None)), "an object"),
                             ("invalid_reason", (str, type(None)), "a string"), ("error", (str, type(None)), "a string"),
                             ("failed_check", (str, type(None)), "a string")):
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
        cfg = load_config(bundle_dir / "config" / "inventory.yaml", bundle_dir / "config" / "gates.yaml", WORKLOADS)
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
        wl = WORKLOADS[gate.workload]
        unit = wl.METRICS[gate.metric]
        gate_dir = bundle_dir / "gates" / gate.id
        result_path = gate_dir / "result.json"
        source = "result.json"
        if stop_at or not result_path.is_file():
            reason = (f"skipped: stop-loss hit at {stop_at}" if stop_at else
                      (signed or {}).get("reason", "skipped: not run"))
            v = skipped(gate, reason, unit)
            source = "not run"
        else:
            try:
                result = read_result(result_path, f"gates/{gate.id}/result.json")
                metrics = {k: float(x) for k, x in (result.get("metrics") or {}).items()}
                invalid = result.get("invalid_reason")
                error = result.get("error")
                failed = result.get("failed_check")
                fn = REDERIVERS.get(gate.workload)
                if fn is not None and not error:
                    out = fn(gate_dir, result, cfg.params[gate.id], {"bundle_dir": bundle_dir})
                    metrics, invalid = out[0], out[1]
                    failed = out[2] if len(out) > 2 else failed
                    source = f"raw output re-parsed ({gate.workload})"
                evidence = RecordedEvidence.model_validate(result.get("evidence") or {})
                v = evaluate(gate, WorkloadResult(metrics, evidence, invalid, error, failed), unit, wl.METRICS)
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
        checks.append(GateCheck(gate.id, signed, new, source, diffs))
    extra = sorted(set(signed_by_id) - {g.id for g in cfg.suite.gates})
    diffs = [d for c in checks for d in c.differences]
    diffs += [f"{g}: signed verdict for a gate not in the bundle's suite" for g in extra]
    overall = overall_outcome(new_verdicts).value
    if overall != predicate.get("overall"):
        diffs.append(f"overall signed {predicate.get('overall')}, re-evaluated {overall}")
    return Reevaluation(checks, predicate.get("overall"), overall, diffs)


# --------------------------------------------------------------------------- re-derivers


@rederiver("fio-read")
def _fio_read(gate_dir: Path, result: dict[str, Any], params: Any, ctx: dict[str, Any]):
    """G1 from the raw fio JSON of every node; cold proof from the recorded drop-caches steps and, for a
    buffered read, each stream's bytes against its region. The metrics and the cold rules are the workload's
    own pure functions (harness.workloads.fio_read.reevaluate_fio_read)."""
    ev = result.get("evidence") or {}
    nodes = sorted((ev.get("nodes") or {}).keys()) or sorted(p.parent.name for p in gate_dir.glob("*/fio.json"))
    runs = {}
    for node in nodes:
        raw = read_text(gate_dir / node / "fio.json", max_bytes=MAX_JSON_BYTES, what="fio output",
                        follow_symlinks=False, display_name=f"gates/{gate_dir.name}/{node}/fio.json")
        run = parse_fio_json(raw)
        if not run.groups:
            raise HarnessError(f"{gate_dir.name}/{node}/fio.json: fio reported no jobs")
        runs[node] = run
    if not runs:
        raise HarnessError(f"{gate_dir.name}: no fio.json under the gate directory")
    # Cold proof: page cache dropped on every node, or O_DIRECT on. A node counts as dropped only when the
    # evidence says so AND the step log holds a drop-caches step on that node that exited 0.
    steps_dir = Path(ctx["bundle_dir"]) / "steps"
    dropped = {}
    for node in nodes:
        logged = any(rc.read_text().strip() == "0" for rc in steps_dir.glob(f"*-{node}-drop-caches/rc"))
        dropped[node] = logged and bool((ev.get("nodes") or {}).get(node, {}).get("page_cache_dropped"))
    # and for a buffered read, no stream read more than its region (the workload's own rule, from the raw figures)
    return reevaluate_fio_read(runs, ev, dropped, params)


@rederiver("kv-read")
def _kv_read(gate_dir: Path, result: dict[str, Any], params: Any, ctx: dict[str, Any]):
    """kv-read from every node's raw reader output (``read.json``) and fio JSON, through the workload's own pure
    functions (harness.workloads.kv_read.reevaluate_kv_read)."""
    ev = result.get("evidence") or {}
    raw = {}
    for node in sorted(ev.get("nodes") or {}):
        texts = []
        for name, what in (("read.json", "KV reader output"), ("fio.json", "fio output")):
            texts.append(read_text(gate_dir / node / name, max_bytes=MAX_JSON_BYTES, what=what, follow_symlinks=False,
                                   display_name=f"gates/{gate_dir.name}/{node}/{name}"))
        raw[node] = (texts[0], texts[1])
    if not raw:
        raise HarnessError(f"{gate_dir.name}: the evidence names no node")
    again = reevaluate_kv_read(ev, raw)
    return again.metrics, again.invalid_reason, again.failed_check


@rederiver("g2-load")
def _g2_load(gate_dir: Path, result: dict[str, Any], params: Any, ctx: dict[str, Any]):
    """g2-load from every point's raw requests file (its figures, the knee) and the engine counters the run read
    around it (its accounting), through the workload's own pure functions (harness.workloads.g2_load
    .reevaluate_load); the device bytes as the run recorded them, an engine fall-back as the run judged it."""
    ev = result.get("evidence") or {}
    texts: dict[str, dict[str, str]] = {"requests": {}, "counters": {}}
    for pt in (ev.get("points") or []) + (ev.get("spoiled") or []):  # the attempts set aside are judged too
        for key, kind, what in (("requests_file", "requests", "a load point's requests"),
                                ("counters_file", "counters", "a load point's engine counters")):
            name = pt.get(key)
            if name:
                texts[kind][name] = read_text(gate_dir / name, max_bytes=1 << 30, what=what, follow_symlinks=False,
                                              display_name=f"gates/{gate_dir.name}/{name}")
    prof = load_profile(params.engine)
    fallback = result.get("invalid_reason") if ev.get("fallback_lines") else None
    again = reevaluate_load(ev, texts["requests"], texts["counters"], accounting_counters(prof), prof.device_reads,
                            fallback)
    return again.metrics, again.invalid_reason


@rederiver("fio-faults")
def _fio_faults(gate_dir: Path, result: dict[str, Any], params: Any, ctx: dict[str, Any]):
    """fio-faults re-judged from the node's raw files (fio's completion log, output and JSON, the paths' samples)
    and each fault's recorded time on the node's clock, through the workload's own pure functions
    (harness.workloads.fio_faults.reevaluate_faults)."""
    ev = result.get("evidence") or {}
    nodes = sorted(p.parent.name for p in gate_dir.glob(f"*/{FAULT_RAW_FILES['clat']}"))
    if len(nodes) != 1:
        raise HarnessError(f"{gate_dir.name}: expected one node's {FAULT_RAW_FILES['clat']}, found {len(nodes)}")
    raw = {k: read_text(gate_dir / nodes[0] / name, max_bytes=1 << 30, what=f"the faulted read's {k}",
                        follow_symlinks=False, display_name=f"gates/{gate_dir.name}/{nodes[0]}/{name}")
           for k, name in FAULT_RAW_FILES.items()}
    again = reevaluate_faults(ev, raw, params)
    return again.metrics, again.invalid_reason, again.failed_check


@rederiver("g2-gain")
def _g2_gain(gate_dir: Path, result: dict[str, Any], params: Any, ctx: dict[str, Any]):
    """g2-gain from each arm's raw requests and counters files (``gates/ID/tier/``, ``gates/ID/no_tier/``) through
    the workload's own pure functions (harness.workloads.g2_gain.reevaluate_gain)."""
    ev = result.get("evidence") or {}
    texts: dict[str, dict[str, dict[str, str]]] = {"requests": {}, "counters": {}}
    for arm, arm_ev in (ev.get("arms") or {}).items():
        if arm not in ("tier", "no_tier"):
            continue
        for pt in (arm_ev.get("points") or []) + (arm_ev.get("spoiled") or []):
            for key, kind, what in (("requests_file", "requests", "a load point's requests"),
                                    ("counters_file", "counters", "a load point's engine counters")):
                name = pt.get(key)
                if name:
                    texts[kind].setdefault(arm, {})[name] = read_text(
                        gate_dir / arm / name, max_bytes=1 << 30, what=what, follow_symlinks=False,
                        display_name=f"gates/{gate_dir.name}/{arm}/{name}")
    profs = G2Gain()._profiles(params)
    again = reevaluate_gain(ev, texts["requests"], texts["counters"],
                            {a: accounting_counters(p) for a, p in profs.items()},
                            {a: p.device_reads for a, p in profs.items()})
    return again.metrics, again.invalid_reason
