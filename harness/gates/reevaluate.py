"""Re-evaluate a bundle's verdicts offline from its raw files, with the bundle's own suite.

For each gate of ``config/gates.yaml`` (validated against ``config/inventory.yaml``, both from the bundle):
the metrics are re-derived from the raw output by the workload's re-deriver, with the bounds of the bundle's
``config/gates.yaml`` (never the ones its evidence records), engine logs re-scanned for fall-back lines and the
pool device's step outputs re-parsed where the workload proves cold reads; a raw file that is missing or empty
is an ERROR. A workload without a re-deriver has its metrics taken from ``gates/<gate>/result.json``, and says
so (``GateCheck.rederived``; ``Reevaluation.rederived_text``: "N of M gates re-derived from raw files"). Then
the gate is evaluated with :func:`harness.gates.verdict.evaluate` and compared with the signed verdict.
Differences are data, never an exception. docs/evidence.md lists per workload what is re-derived from which files.

A workload adds its re-deriver with ``@rederiver("workload-name")``: ``fn(gate_dir, result, params, ctx)`` returning
a :class:`WorkloadResult`, or ``(metrics, invalid_reason)`` / ``(metrics, invalid_reason, failed_check)``, where
``result`` is result.json as a dict and ``ctx`` gives ``bundle_dir``, ``gate`` and ``nodes`` (the gate's nodes of the
bundle's inventory).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from pydantic import ValidationError

from ..config import load_config
from ..engines import load_profile
from ..errors import ConfigError, HarnessError
from ..parsers.engine_log import scan_fallbacks
from ..parsers.fio import parse_fio_json
from ..parsers.pooldev import PoolDeviceStat, parse_pool_blockstat, read_bytes_between, write_bytes_between
from ..safeio import MAX_JSON_BYTES, InputFileError, check_keys, json_type, key_line, parse_json, read_text
from ..workloads import WORKLOADS
from ..workloads.kit.base import RecordedEvidence, WorkloadResult
from ..workloads.kit.engine import fallback_reason
from ..workloads.kit.phases import missing_in_text, not_in_force
from ..workloads.fio_faults import RAW_FILES as FAULT_RAW_FILES, reevaluate_faults
from ..workloads.fio_read import reevaluate_fio_read
from ..workloads.g2_faults import reevaluate_g2_faults
from ..workloads.g2_gain import G2Gain, GainEvidence, reevaluate_gain
from ..workloads.kit.load import G2LoadEvidence, accounting_counters, reevaluate_load
from ..workloads.g2_answer import reevaluate_answer
from ..workloads.g2_tenancy import DEVICE_PHASES, engine_log, engine_logs, reevaluate_tenancy
from ..workloads.kit.g2 import records_from_text, reevaluate_g2
from ..workloads.g3_shared_read import WITH_WRITER, G3SharedRead, reevaluate_g3
from ..parsers.g3series import cross_check_port_rate, port_rate
from ..workloads.kv_read import reevaluate_kv_read
from ..workloads.nvme_integrity import reevaluate_integrity
from ..workloads.pd_handoff import reevaluate_pd
from ..workloads.r3_cross_instance import reevaluate_r3
from ..stats import Interval
from .verdict import Outcome, Verdict, evaluate, legacy_intervals, overall_outcome, skipped

REDERIVERS: dict[str, Callable[..., Any]] = {}
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
    fn = REDERIVERS.get(gate.workload)
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


def raw_text(gate_dir: Path, rel: str, what: str, max_bytes: int = 1 << 30, empty_ok: bool = False) -> str:
    """A raw file of the gate (``gates/<gate>/<rel>``) through the hardened reader; missing, or empty (unless
    ``empty_ok``), is a HarnessError naming it: a figure with no raw basis is not re-derived from nothing."""
    name = f"gates/{gate_dir.name}/{rel}"
    text = read_text(gate_dir / rel, max_bytes=max_bytes, what=what, follow_symlinks=False, display_name=name)
    if not empty_ok and not text.strip():
        raise HarnessError(f"{name}: {what} is empty")
    return text


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


def step_number(d: Path) -> int:
    """A step directory's number (``NNN-node-name``: the run's order; past 999 the digits grow)."""
    head = d.name.split("-", 1)[0]
    return int(head) if head.isdigit() else -1


def pool_device_steps(bundle_dir: Path, pool_dir: str | None, name: str = "g2-pool-blockstat",
                      need_ok: bool = False) -> list[PoolDeviceStat | None]:
    """The run's pool-device probes (steps ``*-<name>``; with ``pool_dir``, only those whose argv ends in it), in
    the run's order, each re-parsed from its stdout (harness.parsers.pooldev; None where it names no device, or
    with ``need_ok`` where the command failed, as the run then had none). A probe step without its argv.json,
    stdout or rc is a HarnessError."""
    out = []
    for d in sorted((bundle_dir / "steps").glob(f"*-{name}"), key=step_number):
        rel = f"steps/{d.name}"
        argv = parse_json(read_text(d / "argv.json", max_bytes=MAX_JSON_BYTES, what="a step's argv",
                                    follow_symlinks=False, display_name=f"{rel}/argv.json"), f"{rel}/argv.json")
        args = argv.get("argv") if isinstance(argv, dict) else None
        if pool_dir is not None and (not isinstance(args, list) or not args or args[-1] != pool_dir):
            continue
        text = read_text(d / "stdout", max_bytes=1 << 20, what="a pool-device probe's output", follow_symlinks=False,
                         display_name=f"{rel}/stdout")
        rc = read_text(d / "rc", max_bytes=64, what="a step's exit status", follow_symlinks=False,
                       display_name=f"{rel}/rc").strip()
        try:
            out.append(None if need_ok and rc != "0" else parse_pool_blockstat(text))
        except ValueError:
            out.append(None)
    return out


def device_by_attempt(bundle_dir: Path, gate: str, pool_dir: str | None, attempts: list[Any]
                      ) -> dict[str, tuple[int | None, int | None]]:
    """Each load attempt's pool-device (read, written) bytes from the run's probe steps, re-parsed: two probes per
    attempt (before, after), the attempts in the order they started. A count that does not match (the steps of
    another gate on the same pool, or steps removed) is a HarnessError: the bytes cannot be told apart."""
    steps = pool_device_steps(bundle_dir, pool_dir) if pool_dir else []
    want = 2 * len(attempts) if pool_dir else 0
    if len(steps) != want:
        raise HarnessError(f"{gate}: {len(steps)} pool-device probe steps of {pool_dir} for {len(attempts)} load "
                           f"attempt(s) (two each expected): the device bytes cannot be re-derived")
    if any(pt.started_unix_s is None for pt in attempts):
        raise HarnessError(f"{gate}: a load attempt has no start time: its pool-device probes cannot be matched")
    order = sorted(attempts, key=lambda pt: pt.started_unix_s)
    return {pt.requests_file: (read_bytes_between(steps[2 * i], steps[2 * i + 1]),
                               write_bytes_between(steps[2 * i], steps[2 * i + 1])) for i, pt in enumerate(order)}


def rescanned_fallback(gate_dir: Path, log: str, patterns: Any, label: str, required: Any = ()) -> str | None:
    """An engine kvgate launched: its whole log (``gates/<gate>/<log>``, missing or empty an ERROR) scanned again
    with the built-in fall-back patterns and the profile's (harness.parsers.engine_log), and for the lines that show
    its cold regime in force (the profile's ``in_force_log``), as the run's reason."""
    text = raw_text(gate_dir, log, "an engine log")
    return (fallback_reason(scan_fallbacks(text, list(patterns)), label)
            or not_in_force(missing_in_text(text, list(required)), label))


def _load_texts(gate_dir: Path, sub: str, ev: G2LoadEvidence) -> dict[str, dict[str, str]]:
    """Every attempt's raw requests and counters files (``gates/<gate>/<sub><file>``), the set-aside ones too."""
    texts: dict[str, dict[str, str]] = {"requests": {}, "counters": {}}
    for pt in ev.points + ev.spoiled:
        texts["requests"][pt.requests_file] = raw_text(gate_dir, sub + pt.requests_file, "a load point's requests",
                                                       empty_ok=pt.figures is None)
        if pt.counters_file:
            texts["counters"][pt.counters_file] = raw_text(gate_dir, sub + pt.counters_file,
                                                           "a load point's engine counters")
    return texts


@rederiver("g2-load")
def _g2_load(gate_dir: Path, result: dict[str, Any], params: Any, ctx: dict[str, Any]):
    """g2-load from every point's raw requests file (its figures, the knee) and the engine counters the run read
    around it (its accounting), with the gate's bounds from config/gates.yaml, the pool device's bytes re-parsed
    from the run's probe steps and a launched engine's log (``engine-load.log``) re-scanned for fall-backs, through
    the workload's own pure functions (harness.workloads.kit.load.reevaluate_load). An attached engine's fall-back
    is taken as the run judged it (its log is the operator's, read through steps)."""
    ev_dict = result.get("evidence") or {}
    ev = G2LoadEvidence.model_validate(ev_dict)
    texts = _load_texts(gate_dir, "", ev)
    prof = load_profile(params.engine)
    if params.attach is None:
        fallback = rescanned_fallback(gate_dir, "engine-load.log", prof.fallback_patterns, "load", prof.in_force_log)
    else:
        fallback = result.get("invalid_reason") if ev.fallback_lines else None
    device = device_by_attempt(Path(ctx["bundle_dir"]), gate_dir.name, ev.pool_dir, ev.points + ev.spoiled)
    return reevaluate_load(ev_dict, texts["requests"], texts["counters"], accounting_counters(prof), prof.device_reads,
                           fallback, params=params, device=device)


@rederiver("g2-ttft")
def _g2_ttft(gate_dir: Path, result: dict[str, Any], params: Any, ctx: dict[str, Any]):
    """g2-ttft from both phases' raw request records (``requests-recompute.jsonl``, ``requests-readback.jsonl``), the
    read-back's pool-device bytes re-parsed from the run's two probe steps, a launched engine's logs
    (``engine-recompute.log``, ``engine-readback.log``) re-scanned for fall-backs, with the bounds of
    config/gates.yaml, through the workload's own pure functions (harness.workloads.kit.g2.reevaluate_g2)."""
    return reevaluate_g2(*_g2_phases(gate_dir, result, params, ctx), params, load_profile(params.engine))


@rederiver("g2-answer")
def _g2_answer(gate_dir: Path, result: dict[str, Any], params: Any, ctx: dict[str, Any]):
    """g2-answer from the same raw files as g2-ttft (both phases' records hold each answer's tokens and logprobs),
    with the bound of config/gates.yaml, through the workload's own pure functions
    (harness.workloads.g2_answer.reevaluate_answer); the flipped bytes of a corrupted run as its step recorded them."""
    return reevaluate_answer(*_g2_phases(gate_dir, result, params, ctx), params, load_profile(params.engine))


def _g2_phases(gate_dir: Path, result: dict[str, Any], params: Any, ctx: dict[str, Any]):
    """g2-ttft's raw inputs again: (evidence, re-compute records, read-back records, the read-back's device bytes,
    the fall-back re-scanned), as g2-ttft and g2-answer re-judge them."""
    ev = result.get("evidence") or {}
    prof = load_profile(params.engine)
    recompute = records_from_text(raw_text(gate_dir, "requests-recompute.jsonl", "the re-compute phase's requests"))
    fallback = None
    if params.attach is None:
        fallback = rescanned_fallback(gate_dir, "engine-recompute.log", prof.fallback_patterns, "re-compute",
                                      prof.in_force_log)
    elif ev.get("fallback_lines"):
        fallback = result.get("invalid_reason")
    readback: list = []
    if fallback is None and any(r.ok for r in recompute):  # the run read back: its records must be there
        readback = records_from_text(raw_text(gate_dir, "requests-readback.jsonl", "the read-back phase's requests"))
        if params.attach is None:
            fallback = rescanned_fallback(gate_dir, "engine-readback.log", prof.fallback_patterns, "read-back",
                                          prof.in_force_log)
    pool_dir = ev.get("pool_dir")
    steps = pool_device_steps(Path(ctx["bundle_dir"]), pool_dir) if pool_dir else []
    # before and after each phase run (re-compute, read-back); a bundle of a kvgate that did not count the
    # re-compute's writes has the read-back's two only
    want = ((4, 2) if readback else (2, 0)) if pool_dir else (0,)
    if len(steps) not in want:
        raise HarnessError(f"{gate_dir.name}: {len(steps)} pool-device probe steps of {pool_dir} "
                           f"({' or '.join(map(str, want))} expected: before and after each phase): the device bytes "
                           "cannot be re-derived")
    device = read_bytes_between(steps[-2], steps[-1]) if readback and steps else None
    if len(steps) == max(want) and steps:  # the re-compute's writes, to the read-back's start (or its own end)
        ev = {**ev, "recompute_device_write_bytes": write_bytes_between(steps[0], steps[2 if readback else 1])}
    return ev, recompute, readback, device, fallback


@rederiver("g2-tenancy")
def _g2_tenancy(gate_dir: Path, result: dict[str, Any], params: Any, ctx: dict[str, Any]):
    """g2-tenancy from every phase's raw request records (``requests-store-a.jsonl``, ``requests-cross-b.jsonl``,
    ``requests-fresh-b.jsonl``, ``requests-control-a.jsonl``: those the run's evidence lists), tenant B's and the
    control's pool-device bytes re-parsed from the run's probe steps (``*-tenancy-blockstat-PHASE``: before and
    after), the engine's logs (``engine-LABEL.log``) re-scanned for fall-backs, the bounds from config/gates.yaml,
    through the workload's own pure functions (harness.workloads.g2_tenancy.reevaluate_tenancy); the hit counters as
    recorded."""
    ev = result.get("evidence") or {}
    prof = load_profile(params.engine)
    phases = [ph.get("phase") for ph in ev.get("phases") or [] if isinstance(ph, dict)]
    records = {ph: records_from_text(raw_text(gate_dir, f"requests-{ph}.jsonl", f"the {ph} phase's requests"))
               for ph in phases}
    bundle = Path(ctx["bundle_dir"])
    device: dict[str, int | None] = {}
    probed = {}
    for ph in DEVICE_PHASES:
        if ph not in phases:
            continue
        steps = pool_device_steps(bundle, None, f"tenancy-blockstat-{ph}")
        if ph == "store-a" and not steps:  # a kvgate that did not count tenant A's stores
            continue
        if len(steps) != 2:
            raise HarnessError(f"{gate_dir.name}: {len(steps)} pool-device probe steps around {ph} (two expected: "
                               "before and after): the device bytes cannot be re-derived")
        device[ph], probed[ph] = read_bytes_between(steps[0], steps[1]), steps
    # tenant A's stores: from store-a's "before" to cross-b's (after the cold step's sync)
    store_writes = (write_bytes_between(probed["store-a"][0], probed["cross-b"][0])
                    if "store-a" in probed and "cross-b" in probed else None)
    fallback = None
    started = {engine_log(ph, params.restart_between) for ph in phases}  # the starts that served a phase
    for label in engine_logs(params.restart_between):
        if label in started and fallback is None:
            fallback = rescanned_fallback(gate_dir, f"engine-{label}.log", prof.fallback_patterns, label,
                                          prof.in_force_log)
    return reevaluate_tenancy(ev, records, device, fallback, params, prof, store_writes)


@rederiver("g2-faults")
def _g2_faults(gate_dir: Path, result: dict[str, Any], params: Any, ctx: dict[str, Any]):
    """g2-faults from its raw request records (``requests-populate.jsonl``: the reference answers;
    ``requests-faulted.jsonl``: each faulted request's TTFT, error and answer) with the recovery bound of
    config/gates.yaml, through the workload's own pure functions (harness.workloads.g2_faults.reevaluate_g2_faults);
    the per-request hit counters, request times, the faults' times and the tier-failure lines as recorded."""
    populate = records_from_text(raw_text(gate_dir, "requests-populate.jsonl", "the populate phase's requests"))
    faulted = records_from_text(raw_text(gate_dir, "requests-faulted.jsonl", "the faulted phase's requests"))
    return reevaluate_g2_faults(result.get("evidence") or {}, populate, faulted, params)


@rederiver("nvme-integrity")
def _nvme_integrity(gate_dir: Path, result: dict[str, Any], params: Any, ctx: dict[str, Any]):
    """nvme-integrity from every node's raw ``NODE-integrity.json`` (each read-back's digests and differing bytes),
    each pattern's digest computed again from the target's NQN in the bundle's inventory, through the workload's own
    pure functions (harness.workloads.nvme_integrity.reevaluate_integrity). The read-back bytes themselves are
    compared on the control host during the run and not kept."""
    nodes = ctx.get("nodes") or {}
    if not nodes:
        raise HarnessError(f"{gate_dir.name}: the bundle's inventory names no node of this gate")
    records = {n: raw_text(gate_dir, f"{n}-integrity.json", "a node's integrity record", max_bytes=MAX_JSON_BYTES)
               for n in nodes}
    nqn = {n: getattr(node.target(params.target), "nqn", None) for n, node in nodes.items()}
    return reevaluate_integrity(records, nqn)


@rederiver("pd-handoff")
def _pd_handoff(gate_dir: Path, result: dict[str, Any], params: Any, ctx: dict[str, Any]):
    """pd-handoff from its raw request records (``requests-prefill.jsonl``, ``requests-handoff.jsonl``,
    ``requests-recompute.jsonl``), each prompt's producer-written and consumer-read bytes re-parsed from the run's
    probe steps (``*-pd-producer-blockstat-I``, ``*-pd-consumer-blockstat-I``: before and after), launched engines'
    logs (``engine-producer.log``, ``engine-consumer.log``) re-scanned, the KV per prompt from the model and the
    bounds from config/gates.yaml, through the workload's own pure functions
    (harness.workloads.pd_handoff.reevaluate_pd)."""
    ev = result.get("evidence") or {}
    requests = {ph: records_from_text(raw_text(gate_dir, f"requests-{ph}.jsonl", f"the {ph} requests"))
                for ph in ("prefill", "handoff", "recompute")}
    profs = {r: load_profile(getattr(params, f"{r}_engine")) for r in ("producer", "consumer")}
    bundle = Path(ctx["bundle_dir"])
    device = []
    for i in range(len(ev.get("prompts") or [])):
        got = {}
        for role, between in (("producer", write_bytes_between), ("consumer", read_bytes_between)):
            steps = pool_device_steps(bundle, None, f"pd-{role}-blockstat-{i}", need_ok=True)
            if len(steps) != 2:
                raise HarnessError(f"{gate_dir.name}: prompt {i}: {len(steps)} {role} pool-device probe steps (two "
                                   "expected: before and after): the device bytes cannot be re-derived")
            got[role] = between(steps[0], steps[1])
        device.append((got["producer"], got["consumer"]))
    if params.attach is None:
        patterns = list(dict.fromkeys(profs["producer"].fallback_patterns + profs["consumer"].fallback_patterns))
        fallback = (rescanned_fallback(gate_dir, "engine-producer.log", patterns, "producer engine's")
                    or rescanned_fallback(gate_dir, "engine-consumer.log", patterns, "consumer engine's"))
    else:
        fallback = result.get("invalid_reason") if ev.get("fallback_lines") else None
    return reevaluate_pd(ev, requests, device, fallback, params, profs["producer"])


@rederiver("r3-cross-instance")
def _r3(gate_dir: Path, result: dict[str, Any], params: Any, ctx: dict[str, Any]):
    """r3-cross-instance from each role's raw files (the node client's ``requests-ROLE.json``, the engine counters it
    read, ``metrics-ROLE-before.prom`` and ``metrics-ROLE-after.prom``) and both engines' whole logs
    (``engine-writer.log``, ``engine-reader.log``) re-scanned, the prompts' KV from config/gates.yaml, through the
    workload's own pure functions (harness.workloads.r3_cross_instance.reevaluate_r3); the pool's bytes after the
    writer as recorded."""
    raw = {role: {"records": raw_text(gate_dir, f"requests-{role}.json", f"the {role}'s requests"),
                  "metrics_before": raw_text(gate_dir, f"metrics-{role}-before.prom", f"the {role}'s counters before",
                                             empty_ok=True),
                  "metrics_after": raw_text(gate_dir, f"metrics-{role}-after.prom", f"the {role}'s counters after")}
           for role in ("writer", "reader")}
    logs = {role: raw_text(gate_dir, f"engine-{role}.log", "an engine log") for role in ("writer", "reader")}
    return reevaluate_r3(result.get("evidence") or {}, raw, logs, params)


@rederiver("fio-faults")
def _fio_faults(gate_dir: Path, result: dict[str, Any], params: Any, ctx: dict[str, Any]):
    """fio-faults re-judged from the node's raw files (fio's completion log, output and JSON, the paths' samples)
    and each fault's recorded time on the node's clock, through the workload's own pure functions
    (harness.workloads.fio_faults.reevaluate_faults)."""
    ev = result.get("evidence") or {}
    nodes = sorted(p.parent.name for p in gate_dir.glob(f"*/{FAULT_RAW_FILES['clat']}"))
    if len(nodes) != 1:
        raise HarnessError(f"{gate_dir.name}: expected one node's {FAULT_RAW_FILES['clat']}, found {len(nodes)}")
    # fio's output (fio.log) is empty when no block failed its verify; the others never are
    raw = {k: raw_text(gate_dir, f"{nodes[0]}/{name}", f"the faulted read's {k}", empty_ok=k == "log")
           for k, name in FAULT_RAW_FILES.items()}
    again = reevaluate_faults(ev, raw, params)
    return again.metrics, again.invalid_reason, again.failed_check


@rederiver("g2-gain")
def _g2_gain(gate_dir: Path, result: dict[str, Any], params: Any, ctx: dict[str, Any]):
    """g2-gain from each arm's raw requests and counters files (``gates/ID/tier/``, ``gates/ID/no_tier/``), with the
    gate's bounds from config/gates.yaml, each arm's pool-device bytes re-parsed from the run's probe steps and a
    launched arm's log (``engine-ARM.log``) re-scanned, through the workload's own pure functions
    (harness.workloads.g2_gain.reevaluate_gain)."""
    ev = result.get("evidence") or {}
    gain = GainEvidence.model_validate(ev)
    texts: dict[str, dict[str, dict[str, str]]] = {"requests": {}, "counters": {}}
    device: dict[str, dict[str, tuple[int | None, int | None]]] = {}
    arms = ("tier",) if gain.capacity is not None else ("tier", "no_tier")
    for arm in arms:
        if arm not in gain.arms:
            raise HarnessError(f"gates/{gate_dir.name}/result.json: the evidence has no {arm} arm")
        arm_ev = gain.arms[arm]
        got = _load_texts(gate_dir, f"{arm}/", arm_ev)
        texts["requests"][arm], texts["counters"][arm] = got["requests"], got["counters"]
        device[arm] = device_by_attempt(Path(ctx["bundle_dir"]), gate_dir.name, arm_ev.pool_dir,
                                        arm_ev.points + arm_ev.spoiled)
    profs = G2Gain()._profiles(params)
    fallbacks = None
    if params.attach is None:
        fallbacks = {arm: rescanned_fallback(gate_dir, f"engine-{arm}.log", profs[arm].fallback_patterns, arm,
                                             profs[arm].in_force_log if arm == "tier" else ())
                     for arm in arms}
    return reevaluate_gain(ev, texts["requests"], texts["counters"],
                           {a: accounting_counters(p) for a, p in profs.items()},
                           {a: p.device_reads for a, p in profs.items()}, params=params, device=device,
                           fallbacks=fallbacks)


def _one_step_output(steps_dir: Path, node: str, name: str) -> str | None:
    """The stdout of the run's step ``name`` on ``node`` that exited 0, when the run holds exactly one distinct
    such output (a suite with two G3 gates on one port probes it twice, alike); else None."""
    outs = {(d / "stdout").read_text(errors="replace") for d in steps_dir.glob(f"*-{node}-{name}")
            if (d / "rc").is_file() and (d / "rc").read_text().strip() == "0" and (d / "stdout").is_file()}
    return outs.pop() if len(outs) == 1 else None


@rederiver("g3-shared-read")
def _g3(gate_dir: Path, result: dict[str, Any], params: Any, ctx: dict[str, Any]):
    """G3 from every reader's raw stream (``nodes/<node>/reader.jsonl``; with a writer also
    ``reader-with-writer.jsonl`` and ``nodes/<writer>/writer.jsonl``) with the bounds of the bundle's
    config/gates.yaml, the port's declared rate from its config/inventory.yaml and its measured rate from the
    run's port-speed and port-qdisc step outputs (else as the evidence records them), through the workload's
    own pure functions (harness.workloads.g3_shared_read.reevaluate_g3). A missing or empty raw stream of a
    reader the run says read is an error, never the signed figure."""
    ev = result.get("evidence") or {}
    port_node, nic, _ = G3SharedRead()._roles(params, ctx["nodes"])
    declared = next(n.line_rate_gbit_s for n in ctx["nodes"][port_node].nics if n.name == nic)
    steps_dir = Path(ctx["bundle_dir"]) / "steps"
    speed, qdisc = (_one_step_output(steps_dir, port_node, n) for n in ("port-speed", "port-qdisc"))
    recorded = ev.get("port_rate") if isinstance(ev.get("port_rate"), dict) else {}
    if speed is not None or qdisc is not None:
        port = cross_check_port_rate(declared, speed, qdisc, params.port_rate_tolerance)
    else:
        port = port_rate(declared, recorded.get("sysfs_speed_gbit_s"), recorded.get("tbf_rate_gbit_s"),
                         params.port_rate_tolerance)
    iso = ev.get("isolation") if isinstance(ev.get("isolation"), dict) else None
    wanted = [f"nodes/{n}/reader.jsonl" for n in ev.get("readers") or []]
    if iso is not None:
        wanted += [f"nodes/{n}/reader{WITH_WRITER}.jsonl" for n in iso.get("nodes") or {}]
        wanted.append(f"nodes/{iso.get('writer')}/writer.jsonl")
    raw: dict[str, str | None] = {}
    for rel in wanted:
        path = gate_dir / rel
        raw[rel] = read_text(path, max_bytes=1 << 30, what="a G3 node's raw stream", follow_symlinks=False,
                             display_name=f"gates/{gate_dir.name}/{rel}") if path.is_file() else None
    again = reevaluate_g3(ev, raw, params, port, gate_dir.name)
    if again.error:
        raise HarnessError(f"{gate_dir.name}: re-derived from the raw streams: {again.error}")
    return again.metrics, again.invalid_reason
