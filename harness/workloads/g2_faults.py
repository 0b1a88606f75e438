"""G2 under failure (``g2-faults``): an engine serving prompts whose KV is in the tier while kvgate takes the
tier's path away and puts it back; every request is judged as served from the tier, re-computed (the engine fell
back) or failed, and a fall-back is never counted as a hit.

One node (the gate's first), a launched engine (a profile with ``hit_metrics``; cpu-reference in CI):
1. Populate: the prompts (never seen) are served once; their KV is stored in the pool and each answer kept as
   the reference answer (greedy decoding: the same prompt must give the same answer however it is served).
2. The pool holds the expected KV bytes; the engine is stopped and started again (nothing of the prompts is in
   its memory or LMCache's CPU cache: each prompt's KV can only come from the tier).
3. The faulted phase: the prompts are sent one at a time, one every ``interval_s``, each once; the engine's hit
   counters are read before and after each request. The faults are made at their ``at_s`` (seconds after the
   phase starts) and undone ``duration_s`` later, each a logged step whose inverse is registered with the run's
   undo log before it is sent (harness.execute.undo): whatever ends the gate, it runs.

Per request (:func:`classify`, pure): ``tier`` (its prompt's stored KV read back: the hit counter grew by the KV
it stored), ``re-compute`` (answered, but the hit counter grew by less: the engine computed what the tier did not
give), ``failed`` (no answer: an HTTP error, a timeout; a lost request), and whether its answer equals the
reference. Judged (:func:`evaluate_g2_faults`, pure): TTFT before, during and after the faults; the longest TTFT
of a request in flight during a fault (``max_stall_s``: a request that waited on a dead path); the recovery (from
a fault's undo to the first answer served from the tier again). A fall-back is a degraded answer: counted,
reported in the verdict as DEGRADED, never a hit. A failed request, a wrong answer, or no recovery within
``recovery_bound_s`` is FAIL. The engine log's tier-failure lines during the phase are quoted beside the counters.

Faults: ``pool-path-loss`` (every packet from the engine's node to the pool's server dropped: a blackhole route
for the server's address, harness.rigs.faults; the server is the pool mount's source host unless given) and
``operator`` (the operator's command and undo, or by hand; docs/faults.md).
"""

from __future__ import annotations

from pathlib import Path

import dataclasses
import ipaddress
import json
import math
import posixpath
import threading
from typing import Any, Callable, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field, model_validator

from .kit.rederive import raw_text
from .kit.g2 import records_from_text
from ..engines import EngineProfile, load_profile, shell_line
from ..engines.client import RequestRecord, run_requests_sync
from ..execute.undo import UndoLog
from ..parsers.prometheus import counter_delta
from ..rigs import faults as F
from ..stats import percentile
from .kit.base import GateContext, PlannedStep, StrictModel, ValidityCheck, WorkloadResult, register_workload, \
    target_path, write_gate_file, write_summary
from .kit.engine import fallbacks_between, pool_contents, pool_files_argv, stored_kv_tokens
from .kit.faults import AppliedFault, ScheduledFault, check_operator_fields, make_fault, one_at_a_time
from .kit.g2 import G2Evidence, G2Params, G2Setup, G2Procedure
from .kit.phases import PhaseRecord, PhaseRunner
from .kit.session import EngineSession

STEP_TIMEOUT_S = 60.0
# LMCache 0.5.6's lines when its remote (fs://) backend could not answer: the tier failed for that lookup or read,
# and the engine computed instead (remote_backend.py). Quoted with the counters; the counters decide.
TIER_FAILURE_PATTERNS = (r"Remote connection failed in (batched_)?contains", r"Error occurred in get_blocking",
                         r"get blocking timeout", r"Connection is None in")
MOUNT_ARGV = ("findmnt", "-n", "-o", "TARGET,SOURCE", "--target")

Served = Literal["tier", "re-compute", "failed"]


class EngineFaultSpec(StrictModel):
    """One fault on the engine's path to its tier: what, when (s after the faulted phase starts), how long."""

    kind: Literal["pool-path-loss", "pool-unmount", "operator"]
    at_s: float = Field(gt=0, le=3600)
    duration_s: float = Field(gt=0, le=3600)
    server: str | None = None  # the pool's server (IPv4); default: the host of the pool mount's source
    description: str | None = None
    command: list[str] | None = None
    undo: list[str] | None = None

    @model_validator(mode="after")
    def _kind(self) -> "EngineFaultSpec":
        if check_operator_fields(self):
            return self
        if self.server is not None and self.kind != "pool-path-loss":
            raise ValueError(f"server: only for kind pool-path-loss, not {self.kind}")
        if self.server is not None:
            try:
                ipaddress.IPv4Address(self.server)
            except ValueError:
                raise ValueError(f"server {self.server!r}: expected an IPv4 address") from None
        return self


class G2FaultsParams(G2Params):
    prompt_tokens: list[int] = Field(default_factory=lambda: [512], min_length=1)
    prompts_per_length: int = Field(default=12, ge=2, le=1000)  # the faulted phase sends each prompt once
    pool_target: str | None = None  # a directory target of the node: the pool's root (an sshfs or NFS mount)
    interval_s: float = Field(default=2.0, gt=0, le=600)  # one request starts every interval_s (one at a time)
    recovery_bound_s: float = Field(default=30.0, gt=0)
    faults: list[EngineFaultSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _schedule(self) -> "G2FaultsParams":
        end = one_at_a_time(self.faults)
        last = (len(self.prompt_tokens) * self.prompts_per_length - 1) * self.interval_s
        if end >= last:
            raise ValueError(f"the last fault is undone at {end:g} s, not before the last request starts "
                             f"({last:g} s = (prompts - 1) x interval_s): recovery could not be measured")
        if min(f.at_s for f in self.faults) < self.interval_s:
            raise ValueError(f"the first fault at {min(f.at_s for f in self.faults):g} s leaves no request before "
                             f"it (one starts every {self.interval_s:g} s from 0): nothing to compare with")
        if self.attach is not None:
            raise ValueError("g2-faults launches its engine (attach: is not supported)")
        return self


# ------------------------------------------------------------------------------------------ evidence


class FaultedRequest(BaseModel):
    """One request of the faulted phase: when (s after the phase started, the control host's clock), what came
    back, what the engine's counters say it was served from, and whether its answer is the reference one."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    index: int
    request_id: str
    t_start_s: float
    t_end_s: float
    ttft_s: float | None = None
    error: str | None = None
    hit_tokens: float | None = None  # the engine's hit counter over this request (None: not read)
    prefill_tokens: float | None = None
    expected_hit_tokens: int
    answer_matches: bool | None = None  # None: failed, or no reference answer
    served: Served
    window: Literal["before", "during", "after"]


class EngineFaultRecord(BaseModel):
    """One fault as made and judged: when (s after the phase started), whether it and its inverse ran, and the
    requests it touched."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    index: int
    kind: str
    detail: str
    applied_ok: bool
    undone_ok: bool
    undone_by: str | None = None
    apply_error: str | None = None
    undo_error: str | None = None
    t_apply_s: float | None = None
    t_undo_s: float | None = None
    requests: int = 0  # requests in flight while it lasted
    tier: int = 0
    recompute: int = 0
    failed: int = 0
    max_ttft_s: float | None = None
    recovery_s: float | None = None  # from its undo to the first token of the first tier-served request after


class G2FaultsEvidence(G2Evidence):
    """G2 under faults: the G2 set-up, every request of the faulted phase, each fault judged, the log's lines."""

    interval_s: float | None = None
    recovery_bound_s: float | None = None
    pool_server: str | None = None
    pool_mount_point: str | None = None
    requests: list[FaultedRequest] = []
    faults: list[EngineFaultRecord] = []
    tier_requests: int = 0
    recompute_requests: int = 0
    wrong_answers: int = 0
    tier_failure_lines: list[str] = []  # the engine log's lines during the phase (LMCache's remote failures)


# ------------------------------------------------------------------------------------------ evaluation


def classify(ok: bool, hit_tokens: float | None, expected_hit_tokens: int) -> Served:
    """Pure: a request served from the tier (the hit counter grew by at least the KV its prompt stored), one the
    engine re-computed (answered; the counter grew by less, or was not read: never a hit unproven), or failed."""
    if not ok:
        return "failed"
    return "tier" if hit_tokens is not None and hit_tokens >= expected_hit_tokens else "re-compute"


def window_of(t_start: float, t_end: float, faults: list[tuple[float, float]]) -> Literal["before", "during", "after"]:
    """Pure: a request in flight at any moment of a fault ([apply, undo]) is ``during``; one that ended before
    the first fault ``before``; else ``after``."""
    if any(t_start <= u and t_end >= a for a, u in faults):
        return "during"
    return "before" if not faults or t_end < min(a for a, _ in faults) else "after"


def _p50(xs: list[float]) -> float | None:
    return percentile(xs, 50) if xs else None


def _judge_faults(ev: G2FaultsEvidence) -> list:
    """Pure: each fault with the requests inside its window counted by how they were served, its longest TTFT and
    its recovery: the first token served from the tier after the undo (a request in flight across it counts),
    before the next fault is made."""
    reqs, judged = ev.requests, []
    applies = [f.t_apply_s for f in ev.faults if f.t_apply_s is not None]
    for f in ev.faults:
        if f.t_apply_s is None:
            judged.append(f)
            continue
        undo = f.t_undo_s if f.t_undo_s is not None else f.t_apply_s
        inside = [r for r in reqs if window_of(r.t_start_s, r.t_end_s, [(f.t_apply_s, undo)]) == "during"]
        nxt = min((a for a in applies if a > f.t_apply_s), default=float("inf"))
        firsts = sorted(r.t_start_s + r.ttft_s for r in reqs if r.served == "tier" and r.ttft_s is not None
                        and undo <= r.t_start_s + r.ttft_s < nxt)
        rec = round(firsts[0] - undo, 3) if firsts and f.t_undo_s is not None else None
        judged.append(f.model_copy(update=dict(
            requests=len(inside), tier=sum(r.served == "tier" for r in inside),
            recompute=sum(r.served == "re-compute" for r in inside), failed=sum(r.served == "failed" for r in inside),
            max_ttft_s=max((r.ttft_s or 0.0 for r in inside if r.served != "failed"), default=None),
            recovery_s=rec)))
    return judged


def _faults_metrics(ev: G2FaultsEvidence, ttft: dict[str, list[float]]) -> dict[str, float]:
    """Pure: the gate's figures from the counted requests and the judged faults (``ev.faults``)."""
    metrics: dict[str, float] = {"tier_requests": float(ev.tier_requests),
                                 "recompute_requests": float(ev.recompute_requests),
                                 "failed_requests": float(ev.failed_requests), "wrong_answers": float(ev.wrong_answers)}
    for w, xs in ttft.items():
        if xs:
            metrics[f"ttft_{w}_p50_s"] = _p50(xs)
            metrics[f"ttft_{w}_max_s"] = max(xs)
    stalls = [f.max_ttft_s for f in ev.faults if f.max_ttft_s is not None]
    if stalls and len(stalls) == len(ev.faults):
        metrics["max_stall_s"] = max(stalls)
    recov = [f.recovery_s for f in ev.faults]
    if recov and all(r is not None for r in recov):
        metrics["max_recovery_s"] = max(recov)
    if ev.requests:
        metrics["tier_fraction"] = ev.tier_requests / len(ev.requests)
    return metrics


def _faults_validity(ev: G2FaultsEvidence, by: dict[str, list], ttft: dict[str, list[float]]) -> list[ValidityCheck]:
    """Pure: the gate's validity checks over the judged faults (``ev.faults``) and the requests by window."""
    judged = ev.faults
    before_tier = [r for r in by["before"] if r.served == "tier"]
    counted = [r for r in ev.requests if r.served != "failed"]
    # a fault the engine did not feel proves nothing about how it fails: in its window a request was not served
    # from the tier, or one took at least half the fault's length longer than the slowest before the first fault
    slowest_before = max(ttft["before"], default=0.0)
    unfelt = [f for f in judged if f.t_apply_s is not None and f.t_undo_s is not None
              and not (f.recompute or f.failed) and (f.max_ttft_s is None or f.max_ttft_s < slowest_before
                                                     + 0.5 * (f.t_undo_s - f.t_apply_s))]
    return [
        ValidityCheck(name="faults made", ok=bool(judged) and all(f.applied_ok and f.t_apply_s is not None
                                                                  for f in judged),
                      claim="every fault of the schedule was made, its time on the control host's clock",
                      how="each fault's command exited 0 as a step of the gate", figure="faults made",
                      value=float(sum(f.applied_ok for f in judged)), unit=None),
        ValidityCheck(name="faults undone", ok=all(f.undone_ok for f in judged),
                      claim="every fault was undone (its inverse exited 0)",
                      how="the inverse as a step, by the workload or, whatever ended the gate, by the runner",
                      figure="faults undone", value=float(sum(f.undone_ok for f in judged)), unit=None),
        ValidityCheck(name="tier served before the fault",
                      ok=bool(by["before"]) and len(before_tier) == len(by["before"]),
                      claim="before the first fault every request was served from the tier (there was a tier to lose)",
                      how="the engine's hit counter over each request grew by the KV its prompt stored",
                      figure="tier-served requests before the fault", value=float(len(before_tier)), unit=None),
        ValidityCheck(name="counters per request", ok=all(r.hit_tokens is not None for r in counted),
                      claim="each answered request's source is the engine's own counters, read around it alone",
                      how="/metrics before and after each request (one request at a time)",
                      figure="requests counted", value=float(sum(r.hit_tokens is not None for r in counted)),
                      unit=None),
        ValidityCheck(name="faults felt", ok=not unfelt,
                      claim="every fault reached the engine: in its window a request fell back, failed, or stalled",
                      how="per fault: requests re-computed or failed, or the slowest TTFT at least half the fault's "
                          f"length over the slowest before it ({slowest_before:.3g} s); not felt: "
                          + (", ".join(f"fault {f.index} ({f.detail})" for f in unfelt) or "none"),
                      figure="faults not felt", value=float(len(unfelt)), unit=None),
        ValidityCheck(name="requests during and after", ok=bool(by["during"]) and bool(by["after"]),
                      claim="requests were in flight during the fault and after it was undone",
                      how="request start and end times against each fault's apply and undo",
                      figure="requests during a fault", value=float(len(by["during"])), unit=None),
    ]


def _faults_failures(ev: G2FaultsEvidence) -> list[str]:
    """Pure: why the gate FAILs: lost requests, wrong answers, a tier that did not serve again in time."""
    failed = []
    if ev.failed_requests:
        lost = [r for r in ev.requests if r.served == "failed"]
        failed.append(f"{ev.failed_requests} request(s) failed (lost): " + "; ".join(
            f"#{r.index} at {r.t_start_s:g} s: {(r.error or '')[:120]}" for r in lost[:3]))
    if ev.wrong_answers:
        failed.append(f"{ev.wrong_answers} wrong answer(s): differ from the same prompt's re-computed answer")
    for f in ev.faults:
        if f.t_undo_s is not None and (f.recovery_s is None or f.recovery_s > ev.recovery_bound_s):
            failed.append(f"fault {f.index} ({f.detail}): the tier did not serve again within "
                          f"{ev.recovery_bound_s:g} s of the undo" + (f" (took {f.recovery_s:g} s)"
                                                                     if f.recovery_s is not None else ""))
    return failed


def evaluate_g2_faults(ev: G2FaultsEvidence) -> WorkloadResult:
    """Pure: the metrics, validity, FAIL reasons and DEGRADED note from the recorded requests and faults (each
    request already classified); fills the per-fault figures and the counts."""
    reqs = ev.requests
    by = {w: [r for r in reqs if r.window == w] for w in ("before", "during", "after")}
    ttft = {w: [r.ttft_s for r in rs if r.ttft_s is not None and r.served != "failed"] for w, rs in by.items()}
    ev.faults = _judge_faults(ev)
    ev.tier_requests = sum(r.served == "tier" for r in reqs)
    ev.recompute_requests = sum(r.served == "re-compute" for r in reqs)
    ev.failed_requests = sum(r.served == "failed" for r in reqs)
    ev.wrong_answers = sum(r.answer_matches is False for r in reqs)
    metrics = _faults_metrics(ev, ttft)
    ev.validity = checks = _faults_validity(ev, by, ttft)
    invalid = "; ".join(f"{c.name}: not proven ({c.how})" for c in checks if not c.ok) or None
    failed = _faults_failures(ev)
    degraded = None
    if ev.recompute_requests:
        hit = sum(r.hit_tokens or 0 for r in reqs if r.served == "re-compute")
        want = sum(r.expected_hit_tokens for r in reqs if r.served == "re-compute")
        degraded = (f"{ev.recompute_requests} of {len(reqs)} request(s) fell back to re-compute (engine counters: "
                    f"{hit:g} of {want} stored tokens read from the tier; {len(ev.tier_failure_lines)} tier-failure "
                    "line(s) in the engine log); not counted as hits")
    return WorkloadResult(metrics, ev, invalid_reason=invalid, failed_check="; ".join(failed) or None,
                          degraded=degraded)


def reevaluate_g2_faults(evidence: dict[str, Any], populate: list[RequestRecord], faulted: list[RequestRecord],
                         p: "G2FaultsParams") -> WorkloadResult:
    """Pure: a bundle's g2-faults result again from its raw request records: each faulted request's TTFT, error and
    answer from ``requests-faulted.jsonl`` (matched by request id, every one of them), its reference answer from
    ``requests-populate.jsonl`` (every populate request answered), its source classified again from the hit counter
    read around it and its window from the faults' recorded times (both kept only in the evidence); the recovery
    bound from the gate's params. Then :func:`evaluate_g2_faults`, as the run. ValueError when the raw records do
    not match the evidence's requests."""
    ev = G2FaultsEvidence.model_validate({k: v for k, v in evidence.items() if k != "validity"})
    if not populate or not all(r.ok for r in populate):
        raise ValueError("requests-populate.jsonl: a populate request failed or none was recorded, yet the faulted "
                         "phase ran")
    raw = {r.request_id: r for r in faulted}
    if len(raw) != len(faulted) or sorted(raw) != sorted(r.request_id for r in ev.requests):
        raise ValueError(f"requests-faulted.jsonl: its {len(faulted)} records are not the {len(ev.requests)} "
                         "requests the evidence records")
    spans = [(f.t_apply_s, f.t_undo_s if f.t_undo_s is not None else f.t_apply_s) for f in ev.faults
             if f.t_apply_s is not None]
    reqs = []
    for r in ev.requests:
        rec = raw[r.request_id]
        ref = populate[r.index].output_text if 0 <= r.index < len(populate) else None
        reqs.append(r.model_copy(update=dict(
            ttft_s=rec.ttft_s, error=rec.error, served=classify(rec.ok, r.hit_tokens, r.expected_hit_tokens),
            answer_matches=None if not rec.ok or ref is None else rec.output_text == ref,
            window=window_of(r.t_start_s, r.t_end_s, spans))))
    ev.requests = reqs
    ev.interval_s, ev.recovery_bound_s = p.interval_s, p.recovery_bound_s
    return evaluate_g2_faults(ev)


# ------------------------------------------------------------------------------------------ timeline


@dataclasses.dataclass(frozen=True)
class TimelinePoint:
    """One request on the faulted phase's time line (s after the phase started): when it was sent, how long it
    waited (its TTFT; a failed request's time until its error, ``ttft_s`` None), what it was served from, and the
    KV tokens the engine's hit counter says it read from the tier against what its prompt stored."""

    index: int
    t_sent_s: float
    t_end_s: float
    wait_s: float
    ttft_s: float | None
    served: Served
    tier_tokens: float | None
    expected_tier_tokens: int


@dataclasses.dataclass(frozen=True)
class TimelineWindow:
    """One fault on the time line: made at ``t_apply_s``, its inverse returned at ``t_undo_s`` (None: not
    recorded; the window runs to the time line's end)."""

    index: int
    kind: str
    t_apply_s: float
    t_undo_s: float | None
    undone_ok: bool


@dataclasses.dataclass(frozen=True)
class FaultsTimeline:
    """The faulted phase as the report draws it: every request in send order, every fault made in time order, and
    the time line's end (the last request's end or the last undo, whichever is later)."""

    points: tuple[TimelinePoint, ...]
    windows: tuple[TimelineWindow, ...]
    t_end_s: float


def _finite_or_none(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def faults_timeline(requests: list[FaultedRequest], faults: list[EngineFaultRecord]) -> FaultsTimeline:
    """Pure: the time line of the recorded requests (each already classified) and faults. A request's wait is
    its TTFT, or, without one (failed), the time from its send to its end; a request or fault whose times are
    not finite numbers, or a fault never made (no apply time), is left off (it cannot be placed on the line)."""
    points = []
    for r in sorted(requests, key=lambda r: (r.t_start_s, r.index)):
        ttft = _finite_or_none(r.ttft_s)
        if not (math.isfinite(r.t_start_s) and math.isfinite(r.t_end_s)):
            continue
        wait = ttft if ttft is not None else max(0.0, r.t_end_s - r.t_start_s)
        points.append(TimelinePoint(index=r.index, t_sent_s=r.t_start_s, t_end_s=r.t_end_s, wait_s=wait,
                                    ttft_s=ttft, served=r.served, tier_tokens=_finite_or_none(r.hit_tokens),
                                    expected_tier_tokens=r.expected_hit_tokens))
    windows = tuple(TimelineWindow(index=f.index, kind=f.kind, t_apply_s=f.t_apply_s,
                                   t_undo_s=_finite_or_none(f.t_undo_s), undone_ok=f.undone_ok)
                    for f in sorted(faults, key=lambda f: (f.t_apply_s or 0.0, f.index))
                    if _finite_or_none(f.t_apply_s) is not None)
    ends = [p.t_end_s for p in points] + [w.t_undo_s if w.t_undo_s is not None else w.t_apply_s for w in windows]
    return FaultsTimeline(tuple(points), windows, max(ends, default=0.0))


# ------------------------------------------------------------------------------------------ commands


def parse_mount(text: str) -> tuple[str | None, str | None]:
    """Pure: (mount point, server) from ``findmnt -n -o TARGET,SOURCE --target PATH``; the server None unless the
    source is a network mount's with an IPv4 host (:func:`parse_mount_server`)."""
    parts = text.strip().splitlines()[0].split(None, 1) if text.strip() else []
    if len(parts) != 2:
        return (parts[0] if parts else None), None
    return parts[0], parse_mount_server(parts[1])


def parse_mount_server(source: str) -> str | None:
    """Pure: the server of a network mount's source (sshfs ``user@host:path``, NFS ``host:/path``) when it is an
    IPv4 address; None otherwise."""
    s = source.strip().splitlines()[0] if source.strip() else ""
    if ":" not in s:
        return None
    host = s.split(":", 1)[0].rsplit("@", 1)[-1].strip("[]")
    try:
        return str(ipaddress.IPv4Address(host))
    except ValueError:
        return None


def fault_commands(f: EngineFaultSpec, server: str, mount_point: str = "", held: str = ""
                   ) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """(what, apply, inverse) of one fault on the engine's node (``held``: where pool-unmount keeps the pool)."""
    if f.kind == "operator":
        return (f"operator: {f.description}", tuple(f.command or ("true",)), tuple(f.undo or ("true",)))
    if f.kind == "pool-unmount":
        return (f"pool file system detached from {mount_point} (umount -l; held at {held})",
                *F.pool_unmount(mount_point, held))
    return (f"pool path lost (every packet to {server} dropped: blackhole route)", *F.pool_path_loss(server))


def faulted_phase(ctx: GateContext, node: str, faults: list[ScheduledFault], send_one: Callable[[int, float], Any],
                  n: int, interval_s: float, undo: UndoLog) -> tuple[list[Any], list[AppliedFault], float]:
    """The faulted phase's driver: ``send_one(i, t0)`` for i in 0..n-1, one every ``interval_s`` (a worker thread,
    one at a time) while the faults are made and undone on ``node`` at their times (kit/faults.py ``make_fault``:
    whatever ends the phase, a request that raised or the gate's cancellation, the node is put back, else the
    runner does). Returns the requests' results, each fault as made, and t0."""
    t0 = ctx.clock.now()
    results: list[Any] = [None] * n
    failure: list[BaseException] = []
    ended = threading.Event()

    def requests() -> None:
        try:
            for i in range(n):
                ctx.cancel.sleep(max(0.0, t0 + i * interval_s - ctx.clock.now()))
                results[i] = send_one(i, t0)
        except BaseException as exc:  # noqa: BLE001 - handed to the phase's thread below
            failure.append(exc)
            ended.set()

    def wait_until(t: float) -> None:  # the gate's cancellation, or the requests' end by an error, cuts it short
        while not ended.is_set() and ctx.clock.now() < t:
            ctx.cancel.sleep(min(0.1, t - ctx.clock.now()))

    worker = threading.Thread(target=requests, name=f"{ctx.gate.id}-requests", daemon=True)
    worker.start()
    made: list[AppliedFault] = []
    try:
        for fault in faults:
            wait_until(t0 + fault.spec.at_s)
            if failure:
                break
            made.append(make_fault(ctx, node, fault, undo, t0, wait_until, STEP_TIMEOUT_S))
    finally:
        worker.join()
    if failure:
        raise failure[0]
    return results, made, t0


def needs_mount(p: "G2FaultsParams") -> bool:
    """Whether a fault needs the pool's mount point or server looked up (findmnt) before the engine starts."""
    return any((f.kind == "pool-path-loss" and f.server is None) or f.kind == "pool-unmount" for f in p.faults)


def held_path(work_dir: str, gate_id: str) -> str:
    """Where pool-unmount holds the pool's file system while it is detached from its path."""
    return posixpath.join(work_dir, f"kvgate-pool-held-{gate_id}")


def rederive(gate_dir: Path, result: dict[str, Any], params: Any, ctx: dict[str, Any]):
    """g2-faults from its raw request records (``requests-populate.jsonl``: the reference answers;
    ``requests-faulted.jsonl``: each faulted request's TTFT, error and answer) with the recovery bound of
    config/gates.yaml, through the workload's own pure functions (harness.workloads.g2_faults.reevaluate_g2_faults);
    the per-request hit counters, request times, the faults' times and the tier-failure lines as recorded."""
    populate = records_from_text(raw_text(gate_dir, "requests-populate.jsonl", "the populate phase's requests"))
    faulted = records_from_text(raw_text(gate_dir, "requests-faulted.jsonl", "the faulted phase's requests"))
    return reevaluate_g2_faults(result.get("evidence") or {}, populate, faulted, params)


@register_workload("g2-faults")
class G2Faults(G2Procedure):
    """G2 while the engine's path to its tier is lost and comes back (docs/faults.md, "Engine gates")."""
    rederive = staticmethod(rederive)  # the gate re-judged from the bundle's raw files

    Params = G2FaultsParams
    EvidenceModel = G2FaultsEvidence
    ENDURANCE = None  # its runs break the tier's path on purpose: what they write prices nothing
    METRICS = {"max_stall_s": "s", "max_recovery_s": "s", "tier_requests": "", "recompute_requests": "",
               "failed_requests": "", "wrong_answers": "", "tier_fraction": "ratio",
               "ttft_before_p50_s": "s", "ttft_before_max_s": "s", "ttft_during_p50_s": "s",
               "ttft_during_max_s": "s", "ttft_after_p50_s": "s", "ttft_after_max_s": "s"}

    def validate_against(self, params: G2FaultsParams, nodes: dict[str, Any]) -> list[tuple[tuple, str]]:
        issues = super().validate_against(params, nodes)
        prof = load_profile(params.engine) if not issues else None
        if prof is not None and prof.hit_metrics is None:
            issues.append((("engine",), f"profile {params.engine}: no hit_metrics (a request's source is counted "
                                        "from the engine's hit counters)"))
        node = next(iter(nodes.values()), None)
        if params.pool_target is not None and node is not None:
            t = node.target(params.pool_target)
            if t is None or t.kind != "directory":
                issues.append((("pool_target",), f"node {node.name}: {params.pool_target!r} is not a kind directory "
                                                 "target"))
        if node is not None and any(f.kind == "pool-path-loss" and f.server is None for f in params.faults) and \
                params.pool_target is None and not params.pool_dir.startswith("/"):
            issues.append((("faults",), "a pool-path-loss fault without server: needs the pool on a network mount "
                                        "(pool_target or an absolute pool_dir) to find its server"))
        return issues

    def _pool_root(self, ctx: GateContext, p: G2FaultsParams) -> G2FaultsParams:
        if p.pool_target is None:
            return p
        node = next(iter(ctx.nodes.values()))
        return p.model_copy(update={"pool_dir": target_path(node, node.target(p.pool_target))})

    def plan(self, ctx: GateContext) -> list[PlannedStep]:
        p: G2FaultsParams = self._pool_root(ctx, ctx.params)
        prof = load_profile(p.engine)
        node, v, argv, env, n, steps = self._plan_launched(ctx, p, prof)
        server, mount_point = "<the pool mount's server>", "<the pool's mount point>"
        held = held_path(node.work_dir, ctx.gate.id)
        if needs_mount(p):
            steps.append(PlannedStep(node.name, "the pool's mount point and source (its server), before the engine "
                                                "starts", MOUNT_ARGV + (v["pool_dir"],)))
        steps += [
            PlannedStep(node.name, f"start {prof.name} in its own process group: {shell_line(argv, env)}", tuple(argv)),
            PlannedStep(node.name, f"populate: {n} never-seen prompts of {p.prompt_tokens} tokens, one at a time "
                        "(stores their KV; each answer kept as the reference)"),
            PlannedStep(node.name, f"wait until the finished chunk files in {v['pool_dir']} hold the expected KV bytes",
                        tuple(pool_files_argv(v["pool_dir"], prof.pool_files)), repeats=True),
            PlannedStep(node.name, "stop the engine (kill its process group) and start it again", tuple(argv))]
        steps.append(PlannedStep(node.name, f"faulted phase: the same {n} prompts, one every {p.interval_s:g} s, each "
                                 "once; the hit counters before and after each request; the faults below at their "
                                 "times (s after the phase starts)"))
        for i, f in enumerate(sorted(p.faults, key=lambda f: f.at_s)):
            what, apply, inverse = fault_commands(f, f.server or server, mount_point, held)
            steps.append(PlannedStep(node.name, f"fault {i} at {f.at_s:g} s: {what}", apply))
            steps.append(PlannedStep(node.name, f"fault {i} undone at {f.at_s + f.duration_s:g} s (whatever ends the "
                                                "gate: the runner runs it if the gate could not)", inverse))
        steps.append(PlannedStep(node.name, "stop the engine; its log's tier-failure lines during the faulted phase"))
        return steps

    def run(self, ctx: GateContext) -> WorkloadResult:
        p: G2FaultsParams = self._pool_root(ctx, ctx.params)
        prof = load_profile(p.engine)
        setup = self.setup_launched(ctx, p, prof, labels=("populate", "faulted"))
        if isinstance(setup, WorkloadResult):
            return setup
        ev = G2FaultsEvidence.model_validate({**setup.ev.model_dump(), "interval_s": p.interval_s,
                                              "recovery_bound_s": p.recovery_bound_s})
        return self._faulted(ctx, p, prof, dataclasses.replace(setup, ev=ev))

    def _mount(self, ctx: GateContext, p: G2FaultsParams, ev: G2FaultsEvidence, pool_dir: str
               ) -> tuple[str | None, str | None]:
        """The pool's mount point and its server (findmnt), when a fault needs them."""
        node = next(iter(ctx.nodes))
        if not needs_mount(p):
            return None, None
        r = ctx.steps.run(ctx.transports[node], "pool-mount", MOUNT_ARGV + (pool_dir,), timeout_s=STEP_TIMEOUT_S)
        ev.pool_mount_point, ev.pool_server = parse_mount(r.stdout) if r.ok else (None, None)
        return ev.pool_mount_point, ev.pool_server

    def _faulted(self, ctx: GateContext, p: G2FaultsParams, prof: EngineProfile, s: G2Setup) -> WorkloadResult:
        eng, ev, prompts = s.engine, s.ev, s.prompts
        node = next(iter(ctx.nodes))
        hm = prof.hit_metrics
        mount_point, server = self._mount(ctx, p, ev, s.pool_dir)
        if server is None and any(f.kind == "pool-path-loss" and f.server is None for f in p.faults):
            return WorkloadResult(evidence=ev, error=f"the pool {p.pool_dir} is not on a network mount with an IPv4 "
                                  "server (findmnt's SOURCE): give the fault's server")
        if any(f.kind == "pool-unmount" for f in p.faults) and mount_point in (None, "/"):
            return WorkloadResult(evidence=ev, error=f"the pool {p.pool_dir} is on no mount of its own (findmnt: "
                                  f"{mount_point}): nothing to detach")
        held = held_path(ctx.nodes[node].work_dir, ctx.gate.id)
        faults = [ScheduledFault(i, f, *fault_commands(f, f.server or server or "", mount_point or "", held))
                  for i, f in enumerate(sorted(p.faults, key=lambda f: f.at_s))]
        runner = PhaseRunner(ctx, {"engine": eng}, counters=True)
        undo = ctx.undo if ctx.undo is not None else UndoLog()
        level = prof.capabilities.level_counters  # the profile's per-level counters: tokens computed, if any
        prefill = [f"{level}prefill_tokens_total"] if level else []
        expected = [stored_kv_tokens(r.prompt_tokens, prof.kv_block_tokens) for r in prompts]
        made: list = []
        t0 = 0.0
        session = EngineSession({"engine": runner})

        def populate_then_faults() -> tuple[PhaseRecord, list[str | None]] | WorkloadResult:
            ctx.progress(f"{ctx.gate.id}: populate, {len(prompts)} prompts")
            pop = runner.phase("populate", lambda: self._send(ctx, p, prof, eng.base_url, prompts, concurrency=1))
            self._save(ctx.gate_dir / "requests-populate.jsonl", pop.output)
            if not all(r.ok for r in pop.output):
                bad = next(r for r in pop.output if not r.ok)
                return WorkloadResult(evidence=ev, error=f"populate: request {bad.request_id} failed: {bad.error}")
            reference = [r.output_text for r in pop.output]
            ev.pool_after_populate = pool_contents(ctx, s.pool_transport, s.pool_dir, s.expected_bytes,
                                                   p.populate_timeout_s, "g2-pool-after-populate", prof.pool_files)
            if ev.pool_after_populate.bytes < s.expected_bytes:
                return WorkloadResult(evidence=ev, error=f"the pool holds {ev.pool_after_populate.bytes} B of the "
                                      f"{s.expected_bytes} B the prompts' KV needs: nothing to lose")
            err = runner.forget() or runner.resume()  # a fresh process: no prompt's KV in its memory or LMCache's
            if err:
                return WorkloadResult(evidence=ev, error=err)

            def send_one(i: int, t_zero: float) -> dict[str, Any]:  # the counters around this request alone
                m0 = eng.metrics()
                a = ctx.clock.now() - t_zero
                rec: RequestRecord = run_requests_sync(
                    eng.base_url, [prompts[i]], p.served_model_name, concurrency=1,
                    timeout_s=ctx.cancel.bound_timeout_s(p.request_timeout_s), transport=ctx.http,
                    path=prof.api.request_path, api=prof.api.shape(), stop=ctx.cancel)[0]
                b = ctx.clock.now() - t_zero
                try:
                    m1 = eng.metrics()
                except (httpx.HTTPError, ValueError):
                    m1 = None
                hit = counter_delta(m0, m1, hm.hit_tokens) if m1 is not None else None
                pre = counter_delta(m0, m1, prefill) if m1 is not None else None
                return dict(rec=rec, t_start=round(a, 3), t_end=round(b, 3), hit=hit, prefill=pre)

            def phase() -> list[dict[str, Any]]:
                nonlocal made, t0
                ctx.progress(f"{ctx.gate.id}: faulted phase, {len(prompts)} prompts, one every {p.interval_s:g} s")
                out, made, t0 = faulted_phase(ctx, node, faults, send_one, len(prompts), p.interval_s, undo)
                return out

            fp = runner.phase("faulted", phase)
            reading = fp.engines["engine"]
            lines = fallbacks_between(reading.log_before, reading.log_after,
                                      list(prof.fallback_patterns) + list(TIER_FAILURE_PATTERNS))
            ev.tier_failure_lines = [m.quote() for m in lines][:50]
            ev.fallback_lines = ev.tier_failure_lines[:10]
            return fp, reference

        out = session.run(populate_then_faults, lambda why: WorkloadResult(evidence=ev, error=why))
        if isinstance(out, WorkloadResult):
            return out
        fp, reference = out
        spans = [(m.t_apply_s, m.t_undo_s) for m in made]
        reqs = []
        for i, x in enumerate(fp.output):
            if x is None:
                continue
            rec = x["rec"]
            served = classify(rec.ok, x["hit"], expected[i])
            reqs.append(FaultedRequest(
                index=i, request_id=rec.request_id, t_start_s=x["t_start"], t_end_s=x["t_end"], ttft_s=rec.ttft_s,
                error=rec.error, hit_tokens=x["hit"], prefill_tokens=x["prefill"], expected_hit_tokens=expected[i],
                answer_matches=None if not rec.ok else rec.output_text == reference[i], served=served,
                window=window_of(x["t_start"], x["t_end"], spans)))
        write_gate_file(ctx.gate_dir / "requests-faulted.jsonl",
                        "".join(json.dumps(x["rec"].to_dict()) + "\n" for x in fp.output if x is not None))
        ev.requests = reqs
        ev.faults = [EngineFaultRecord(index=m.fault.index, kind=m.fault.spec.kind, detail=m.fault.what,
                                       applied_ok=bool(m.applied is not None and m.applied.ok),
                                       undone_ok=bool(m.undo_entry.done), undone_by=m.undo_entry.ran_by,
                                       apply_error=None if m.applied is None or m.applied.ok else m.applied.summary(),
                                       undo_error=m.undo_entry.error, t_apply_s=m.t_apply_s, t_undo_s=m.t_undo_s)
                     for m in made]
        result = evaluate_g2_faults(ev)
        write_summary(ctx.gate_dir, "g2-faults-summary.json", result)
        return result

