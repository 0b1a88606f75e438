"""G1 under failure (``fio-faults``): a cold O_DIRECT read of a multipath NVMe-oF namespace while faults are
made on its target side, each undone after its ``duration_s``; measured and judged per fault.

The gate's ``target`` is the namespace (``kind: nvmeof``, resolved to the native multipath head by NQN);
``paths`` names every path's ``kind: nvmeof`` target (same NQN, each its own address: ``connect: managed``
connects them all). The target side must be kvgate's loopback (``kind: nvmeof-loopback`` with the same NQN and
an ``extra_ports`` entry per further path): the faults are nvmet configfs changes (harness.rigs.faults). On an
array kvgate cannot fail itself, see docs/faults.md.

Run: the write guard on the head, a fio write of the region with crc32c verify headers, the paths' counters,
then fio reads the region (time based, ``--verify=crc32c``: every block read is checked, during the faults and
after; ``--continue_on_error=all``: a failed read is counted, not the end of the measurement; a completion log
on the node's clock) while a sampler reads every path's counters every 0.5 s and the faults are made at their
``at_s`` and undone ``duration_s`` later. Each fault's inverse is registered with the run's undo log
(harness.execute.undo) before the fault is sent: whatever ends the gate, it runs.

Judged per fault (:func:`evaluate_faults`, pure): the I/O stall (the longest gap between completions from the
fault to the next fault or the end), the time to recover to ``recover_fraction`` of the rate before the fault,
the bytes each path read while it lasted; for the run: corrupted chunks (verify failures), failed reads, each
path's bytes. The gate's metric is the longest stall (``max_stall_s``); a corrupted chunk, a failed read or a
recovery over ``recovery_bound_s`` is FAIL whatever the stall. A slowed path does not stop the read: its recovery
is timed from when its delay was in force (its command's return), reported, not bound; with
``slowed_min_fraction`` the head's rate while it was slowed must keep that fraction of the rate before (else FAIL).
"""

from __future__ import annotations

from pathlib import Path

import json
import posixpath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..errors import HarnessError
from .kit.rederive import raw_text
from ..errors import WorkloadError
from ..execute.nvmeof import probe_commands as nvmeof_probes, NvmeofSpec
from ..execute.undo import UndoLog
from ..parsers.blockdev import BlockStat
from ..parsers.faultio import (Completion, iopolicy_argv, parse_clat_log, parse_iopolicy, parse_path_samples,
                               parse_path_stats, parse_verify_failures, path_sampler_argv, path_stats_argv)
from ..rigs import faults as F
from ..units import parse_size_bytes
from ..writeguard import block_probe_plan, check_write
from .kit.faults import AppliedFault, ScheduledFault, check_operator_fields, make_fault, one_at_a_time
from .kit.base import (Evidence, GateContext, PlannedStep, SeriesEvidence, StrictModel, ValidityCheck, Workload,
                   WorkloadResult, nvmeof_device, register_workload, write_gate_file)

FaultKind = Literal["path-down", "ana", "target-restart", "slow-path", "operator"]
LOST_IO_GAP_S = 0.5  # an operator's fault: its time is the first completion gap this long after the prompt
STEP_TIMEOUT_S = 60.0
RATE_WINDOW_S = 1.0  # recovery: the first window this long at the recovered rate
PRE_WINDOW_S = 2.0  # the rate before a fault: over at most this long before it


class FaultSpec(StrictModel):
    """One fault of the schedule: what, on which path, when (seconds after the read starts) and for how long."""

    kind: FaultKind
    path: str | None = None  # a kind nvmeof target of ``paths`` (path-down, ana, slow-path)
    at_s: float = Field(gt=0, le=3600)
    duration_s: float = Field(gt=0, le=3600)
    ana_state: Literal["non-optimized", "inaccessible"] = "inaccessible"
    interface: str = "lo"  # slow-path: where the port's replies leave
    delay_ms: float = Field(default=100.0, gt=0, le=10000)
    loss_pct: float = Field(default=0.0, ge=0, le=100)
    # operator: what the operator (or the array's own tooling) does, e.g. a controller failover; the argv is run
    # on the gate's node when given, else kvgate prompts and the operator acts by hand in the window
    description: str | None = None
    command: list[str] | None = None
    undo: list[str] | None = None

    @model_validator(mode="after")
    def _path(self) -> "FaultSpec":
        if check_operator_fields(self):
            return self
        if self.kind != "target-restart" and not self.path:
            raise ValueError(f"a {self.kind} fault needs path: the kind nvmeof target of the path it hits")
        if self.kind == "target-restart" and self.path:
            raise ValueError("a target-restart fault takes every path down: no path")
        return self


class FioFaultsParams(StrictModel):
    target: str
    paths: list[str] = Field(min_length=1)
    region_bytes: int = Field(default=64 << 20, alias="region")
    bs_bytes: int = Field(default=1 << 20, alias="bs")
    # concurrent readers (psync, each its own slice of the region): fio's libaio read with verify ends after one
    # pass of the region whatever time_based says (fio 3.33, seen in the guest and here); psync loops
    jobs: int = Field(default=4, ge=1, le=64)
    runtime_s: float = Field(default=20.0, gt=0, le=3600)
    recover_fraction: float = Field(default=0.5, gt=0, le=1)
    recovery_bound_s: float = Field(default=10.0, gt=0)
    # a slowed path: the least fraction of the rate before the fault the head must keep while the delay is in
    # force (in_force_rate_mb_s / pre_rate_mb_s), else FAIL; None: not judged (numa and round-robin crawl through
    # a slowed path at a few per cent, queue-depth routes around it: docs/faults.md)
    slowed_min_fraction: float | None = Field(default=None, gt=0, le=1)
    faults: list[FaultSpec] = Field(min_length=1)
    # the native multipath I/O policy for the read (the subsystem's /sys/class/nvme-subsystem/*/iopolicy), set
    # before the fill and put back after the read; None: the node's own, recorded. Which policy rides out which
    # fault is what a gate per policy shows (docs/faults.md: numa keeps every read on one path)
    iopolicy: Literal["numa", "round-robin", "queue-depth"] | None = None

    @field_validator("region_bytes", "bs_bytes", mode="before")
    @classmethod
    def _size(cls, v: Any) -> int:
        return parse_size_bytes(v, multiple_of=4096, what="size")

    @model_validator(mode="after")
    def _schedule(self) -> "FioFaultsParams":
        end = one_at_a_time(self.faults)
        if end >= self.runtime_s:
            raise ValueError(f"the last fault is undone at {end:g} s, not before the read ends ({self.runtime_s:g} s): "
                             "recovery could not be measured")
        if self.region_bytes % (self.jobs * self.bs_bytes):
            raise ValueError(f"region must split into {self.jobs} jobs of whole blocks ({self.bs_bytes} B)")
        for f in self.faults:
            if f.path and f.path not in self.paths:
                raise ValueError(f"fault path {f.path!r} is not one of paths ({', '.join(self.paths)})")
        return self


# ------------------------------------------------------------------------------------------ evidence


class FaultRecord(BaseModel):
    """One fault as it was made and judged: when (node clock, s after the read's first completion), the stall,
    the recovery, the bytes each path read while it lasted (to the next fault or the end)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    index: int
    kind: str
    path: str | None = None
    detail: str
    applied_ok: bool
    undone_ok: bool
    undone_by: str | None = None  # "workload" or "runner"
    apply_error: str | None = None
    undo_error: str | None = None
    t_apply_s: float | None = None
    t_undo_s: float | None = None
    timed_from: str = "the fault's command"  # an operator's fault: the first lost I/O
    t_apply_unix_s: float | None = None  # the same two times on the node's clock, as judged (re-evaluation)
    t_undo_unix_s: float | None = None
    # when the fault's command returned (its second clock reading): only from then is the change surely in
    # force. A slow path's delay starts with its filter, the last of three tc commands, which took seconds in the
    # qemu TCG guest: timed from the command's start, the window held seconds of undelayed reads
    t_in_force_s: float | None = None
    t_in_force_unix_s: float | None = None
    in_force_rate_mb_s: float | None = None  # MB/s completed from t_in_force_s to the undo (or the next fault)
    # the faulted path's own MB/s over the same window (its counters, from the first sample after the command's
    # return to the last before the undo), and that span: a policy that routes around a slow path keeps the
    # head's rate up while the slowed path's own stays within what its readers can complete through the delay
    in_force_path_mb_s: float | None = None
    in_force_path_window_s: float | None = None
    delay_ms: float | None = None  # slow-path: the delay put on the path's replies
    pre_rate_mb_s: float | None = None
    # the faulted path's bytes read over the PRE_WINDOW_S before the fault (its own counters, sampled): a fault on
    # a path that carried no reads (native multipath, iopolicy numa, keeps every read on one path) is not felt
    path_read_bytes_before: int | None = None
    stall_s: float | None = None
    recovery_s: float | None = None
    path_read_bytes: dict[str, int] = {}


class PathRead(BaseModel):
    """One path of the namespace: its target, controller, address, block device and the bytes it read."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    target: str
    controller: str | None = None
    address: str | None = None
    device: str | None = None
    read_bytes: int | None = None


class FioFaultsEvidence(Evidence, SeriesEvidence):
    """G1 under faults: the job, the namespace and its paths, each fault judged, integrity, the timeline."""

    device: str | None = None
    nvmeof: dict[str, Any] | None = None
    region_bytes: int
    bs_bytes: int
    jobs: int
    runtime_s: float
    recover_fraction: float
    recovery_bound_s: float
    slowed_min_fraction: float | None = None
    write_guard: dict[str, Any] | None = None
    iopolicy: str | None = None  # the subsystem's multipath I/O policy during the read (None: not known)
    iopolicy_before: str | None = None  # the node's own, put back after the read when the gate set another
    paths: list[PathRead] = []
    faults: list[FaultRecord] = []
    completions: int = 0
    read_bytes: int = 0
    read_mb_s: float | None = None
    corrupted_chunks: int | None = None
    corrupted_offsets: list[int] = []
    failed_reads: int | None = None
    fio_exit_code: int | None = None  # the faulted read's exit status (None: not known)
    baseline_max_gap_s: float | None = None
    # the report's timeline (SeriesEvidence): per path, (t_s since the first completion, read GB/s over the
    # sample interval ending there); series_marks: each fault and its inverse on the same time line


# ------------------------------------------------------------------------------------------ evaluation


def longest_gap(times: list[float], start: float, end: float) -> float:
    """Pure: the longest gap between consecutive completion times (sorted) from the last completion before
    ``start`` through the first at or after ``end``; a log that ends before ``end`` counts up to ``end``."""
    prev = max((t for t in times if t < start), default=start)
    best = 0.0
    for t in times:
        if t < start:
            continue
        best = max(best, t - prev)
        prev = t
        if t >= end:
            break
    else:
        best = max(best, end - prev)
    return best


def rate_mb_s(done: list[Completion], start: float, end: float) -> float | None:
    """Pure: MB/s (1e6) completed in [start, end); None for an empty window."""
    if end <= start:
        return None
    return sum(c.bytes for c in done if start <= c.t_s < end) / (end - start) / 1e6


def recovery_s(done: list[Completion], t_fault: float, pre_mb_s: float, fraction: float,
               window_s: float = RATE_WINDOW_S) -> float | None:
    """Pure: seconds from the fault to the start of the first ``window_s`` window (starting at the fault or at a
    completion after it) whose rate reaches ``fraction`` of the rate before the fault; None if none does before
    the log ends."""
    if not done or pre_mb_s <= 0:
        return None
    last = done[-1].t_s
    for t in [t_fault] + [c.t_s for c in done if c.t_s > t_fault]:
        if t + window_s > last:
            return None
        if (rate_mb_s(done, t, t + window_s) or 0.0) >= fraction * pre_mb_s:
            return round(t - t_fault, 3)
    return None


def path_bytes_between(samples: list[tuple[float, dict[str, BlockStat]]], start: float, end: float
                       ) -> dict[str, int]:
    """Pure: bytes each path read between the samples nearest before ``start`` and at or after ``end``."""
    before = [s for s in samples if s[0] <= start]
    after = [s for s in samples if s[0] >= end]
    a = before[-1] if before else (samples[0] if samples else None)
    b = after[0] if after else (samples[-1] if samples else None)
    if a is None or b is None:
        return {}
    return {dev: b[1][dev].read_bytes - st.read_bytes for dev, st in a[1].items() if dev in b[1]}


def path_rate_inside(samples: list[tuple[float, dict[str, BlockStat]]], device: str | None, start: float,
                     end: float) -> tuple[float, float] | None:
    """Pure: (MB/s (1e6) ``device`` read, the span in s) between its first and last samples inside [start, end]:
    no read before ``start`` or after ``end`` is counted; None with fewer than two such samples."""
    inside = [(t, st[device]) for t, st in samples if start <= t <= end and device in st]
    if device is None or len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return None
    span = inside[-1][0] - inside[0][0]
    return (inside[-1][1].read_bytes - inside[0][1].read_bytes) / span / 1e6, span


def path_bytes_before(samples: list[tuple[float, dict[str, BlockStat]]], device: str | None, start: float,
                      end: float) -> int | None:
    """Pure: bytes ``device`` read between the last sample at or before ``start`` (else the first sample) and the
    last sample at or before ``end``, counted only from samples taken before ``end``; None when fewer than two
    such samples name the device (not known)."""
    inside = [(t, st[device]) for t, st in samples if t <= end and device in st]
    if device is None or len(inside) < 2:
        return None
    a = max((x for x in inside if x[0] <= start), key=lambda x: x[0], default=inside[0])
    b = inside[-1]
    return None if b[0] <= a[0] else b[1].read_bytes - a[1].read_bytes


def timeline(samples: list[tuple[float, dict[str, BlockStat]]], t0: float) -> dict[str, list[tuple[float, float]]]:
    """Pure: per path device, (s since ``t0``, read MB/s over the interval ending there)."""
    out: dict[str, list[tuple[float, float]]] = {}
    for (ta, a), (tb, b) in zip(samples, samples[1:]):
        if tb <= ta:
            continue
        for dev in a:
            if dev in b:
                out.setdefault(dev, []).append(
                    (round(tb - t0, 3), round((b[dev].read_bytes - a[dev].read_bytes) / (tb - ta) / 1e6, 3)))
    return out


def first_lost_io(times: list[float], start: float, end: float, gap_s: float = LOST_IO_GAP_S) -> float | None:
    """Pure: the time of the last completion before the first gap of at least ``gap_s`` that begins in
    [start, end): when I/O was first lost (an operator's fault, whose moment kvgate does not know); None if the
    read never paused that long."""
    prev = max((t for t in times if t < start), default=None)
    for t in times:
        if t < start:
            continue
        if t >= end:
            break
        if prev is not None and t - prev >= gap_s and prev >= start - gap_s:
            return prev
        prev = t
    return None


def judge_fault(done: list[Completion], rec: FaultRecord, window_end: float, fraction: float,
                samples: list[tuple[float, dict[str, BlockStat]]], device: str | None = None) -> FaultRecord:
    """Pure: one fault's stall, pre-fault rate, recovery and per-path bytes from the completion log; ``device``:
    the faulted path's block device, whose reads before the fault (``path_read_bytes_before``) show whether the
    fault could be felt at all."""
    if rec.t_apply_s is None or not done:
        return rec
    t = rec.t_apply_s
    first = done[0].t_s
    pre_start = max(first, t - PRE_WINDOW_S)
    pre = rate_mb_s(done, pre_start, t) if t - pre_start >= 0.5 else None
    times = [c.t_s for c in done]
    stall = longest_gap(times, t, window_end)
    # a slowed path acts from its command's return (its tc commands take seconds in a TCG guest, and the read runs
    # at full rate meanwhile): timed from its start, the first window was always fast and the recovery always 0
    t_acts = rec.t_in_force_s if rec.kind == "slow-path" and rec.t_in_force_s is not None else t
    rec_s = recovery_s(done, t_acts, pre, fraction) if pre else None
    forced = path_forced = None
    if rec.t_in_force_s is not None:
        forced = rate_mb_s(done, rec.t_in_force_s, min(window_end, rec.t_undo_s or window_end))
        if device and rec.kind == "slow-path":
            path_forced = path_rate_inside(samples, device, rec.t_in_force_s, min(window_end,
                                                                                  rec.t_undo_s or window_end))
    return rec.model_copy(update=dict(
        in_force_rate_mb_s=None if forced is None else round(forced, 3),
        in_force_path_mb_s=None if path_forced is None else round(path_forced[0], 3),
        in_force_path_window_s=None if path_forced is None else round(path_forced[1], 3),
        pre_rate_mb_s=None if pre is None else round(pre, 3), stall_s=None if stall is None else round(stall, 3),
        recovery_s=rec_s, path_read_bytes=path_bytes_between(samples, t, window_end),
        path_read_bytes_before=path_bytes_before(samples, device, pre_start, t) if device else None))


def judge_run(ev: FioFaultsEvidence, done: list[Completion], samples: list[tuple[float, dict[str, BlockStat]]],
              recs: list[FaultRecord], fraction: float) -> WorkloadResult:
    """Pure: every fault (``recs``, times on the node's clock) judged from the completion log and the path
    samples, the read's figures and timeline filled in, then :func:`evaluate_faults`. What the run and a
    bundle's re-evaluation both call."""
    ev.completions = len(done)
    ev.read_bytes = sum(c.bytes for c in done)
    ev.read_mb_s = (round(ev.read_bytes / (done[-1].t_s - done[0].t_s) / 1e6, 3)
                    if len(done) > 1 and done[-1].t_s > done[0].t_s else None)
    t_first = done[0].t_s if done else 0.0
    end = done[-1].t_s if done else 0.0
    shift = lambda x: None if x is None else round(x - t_first, 3)  # noqa: E731
    judged = []
    by_target = {x.target: x.device for x in ev.paths}
    for k, rec in enumerate(recs):
        nxt = recs[k + 1].t_apply_s if k + 1 < len(recs) and recs[k + 1].t_apply_s else end
        r = judge_fault(done, rec, nxt, fraction, samples, by_target.get(rec.path) if felt_on_path(rec) else None)
        judged.append(r.model_copy(update=dict(t_apply_s=shift(r.t_apply_s), t_undo_s=shift(r.t_undo_s),
                                               t_in_force_s=shift(r.t_in_force_s), t_apply_unix_s=r.t_apply_s,
                                               t_undo_unix_s=r.t_undo_s, t_in_force_unix_s=r.t_in_force_s)))
    first_fault = recs[0].t_apply_s if recs and recs[0].t_apply_s else end
    ev.baseline_max_gap_s = longest_gap([c.t_s for c in done if c.t_s < first_fault], t_first, first_fault) \
        if done else None
    by_dev = {x.device: x.target for x in ev.paths}
    ev.series = {by_dev.get(d, d): [(t, round(mb_s / 1e3, 6)) for t, mb_s in pts]
                 for d, pts in timeline(samples, t_first).items()}
    ev.series_marks = [m for f in judged for m in
                       ([(f.t_apply_s, f"fault {f.index}: {f.detail}")] if f.t_apply_s is not None else [])
                       + ([(f.t_undo_s, f"fault {f.index} undone")] if f.t_undo_s is not None else [])]
    ev.faults = [fr.model_copy(update={"path_read_bytes": {by_dev.get(d, d): b for d, b in
                                                            fr.path_read_bytes.items()}}) for fr in judged]
    return evaluate_faults(ev)


def slow_path_bound_mb_s(jobs: int, bs_bytes: int, delay_ms: float, window_s: float) -> float:
    """Pure: the most MB/s (1e6) ``jobs`` synchronous readers of ``bs_bytes`` can complete in ``window_s`` when
    every reply waits ``delay_ms``: each completes at most one read per delay, plus the one it had in flight
    when the window opened."""
    return jobs * bs_bytes * (window_s / (delay_ms / 1e3) + 1) / window_s / 1e6


def slow_path_felt(ev: "FioFaultsEvidence") -> ValidityCheck | None:
    """Pure: whether each slow path's delay was felt: the slowed path's own read rate while the delay was surely
    in force (its counters between the fault command's return and its undo) within :func:`slow_path_bound_mb_s`.
    Without the path's samples the head's rate (fio's completion log) stands in: the same figure when every read
    stays on the slowed path (iopolicy numa), and above the bound when a policy routes reads around it. None
    without a slow path."""
    slow = [f for f in ev.faults if f.kind == "slow-path"]
    if not slow:
        return None
    notes, worst, sources = [], None, set()
    for f in slow:
        window = None if f.t_in_force_s is None or f.t_undo_s is None else f.t_undo_s - f.t_in_force_s
        on_path = f.in_force_path_mb_s is not None and f.in_force_path_window_s
        rate = f.in_force_path_mb_s if on_path else f.in_force_rate_mb_s
        span = f.in_force_path_window_s if on_path else window
        if window is None or window <= 0 or rate is None or not span or not f.delay_ms:
            notes.append(f"fault {f.index}: not in force before its undo" if window is not None and window <= 0
                         else f"fault {f.index}: no rate in force")
            continue
        sources.add("the slowed path's counters" if on_path else "the head's completions (no path samples)")
        bound = slow_path_bound_mb_s(ev.jobs, ev.bs_bytes, f.delay_ms, span)
        worst = max(worst or 0.0, rate / bound)
        if rate > bound:
            notes.append(f"fault {f.index}: {rate:g} MB/s over {span:.1f} s in force, above the {bound:.2f} MB/s "
                         f"{ev.jobs} readers of {ev.bs_bytes} B can reach through {f.delay_ms:g} ms")
    return ValidityCheck(
        name="delay felt", ok=not notes, claim="each slow path's delay was felt: while it was in force the slowed "
        "path completed no more than the readers could through the delay",
        how=f"bytes read from the fault command's return to its undo ({', '.join(sorted(sources)) or 'none'}), "
            "against jobs x bs x (window / delay + 1) / window" + (f"; {'; '.join(notes)}" if notes else ""),
        figure="highest rate in force over its bound", value=worst, unit="ratio")


def felt_on_path(rec: FaultRecord) -> bool:
    """Whether a fault acts on one path (path down, ANA change, slow path): it is felt only where that path
    carried reads before it."""
    return rec.kind in ("path-down", "ana", "slow-path") and rec.path is not None


def integrity_of(fio_log: str, fio_json: str) -> tuple[list[int], int | None]:
    """Pure: (the offsets fio's verify found bad, the failed reads that were not verify failures) from fio's
    output and JSON (``--continue_on_error=all``: ``total_err`` counts both)."""
    fails = parse_verify_failures(fio_log)
    try:
        job = json.loads(fio_json[fio_json.index("{"):])["jobs"][0]
        failed = max(0, int(job.get("total_err", 0)) - len(fails))
    except (ValueError, KeyError, IndexError, TypeError):
        failed = None
    return sorted({o for o, _ in fails}), failed


def reevaluate_faults(ev_dict: dict[str, Any], raw: dict[str, str], params: FioFaultsParams) -> WorkloadResult:
    """Pure: a bundle's fio-faults gate re-judged from its raw files (``raw``: the node's ``clat``, ``log``,
    ``json`` and ``paths`` files the run kept) and each fault's recorded time on the node's clock."""
    ev = FioFaultsEvidence.model_validate({k: v for k, v in ev_dict.items() if k != "validity"})
    done = parse_clat_log(raw["clat"])
    samples = parse_path_samples(raw["paths"])
    offsets, failed = integrity_of(raw["log"], raw["json"])
    ev.corrupted_offsets, ev.corrupted_chunks, ev.failed_reads = offsets, len(offsets), failed
    by_target = {x.target: x.device for x in ev.paths}
    recs = [f.model_copy(update=dict(t_apply_s=f.t_apply_unix_s, t_undo_s=f.t_undo_unix_s,
                                     t_in_force_s=f.t_in_force_unix_s, path_read_bytes={
        by_target.get(k, k): v for k, v in f.path_read_bytes.items()})) for f in ev.faults]
    return judge_run(ev, done, samples, recs, params.recover_fraction)


def _faults_metrics(ev: FioFaultsEvidence) -> dict[str, float]:
    """Pure: the gate's figures from the judged faults and the read's integrity counts."""
    stalls = [f.stall_s for f in ev.faults if f.stall_s is not None]
    recov = [f.recovery_s for f in ev.faults]
    metrics: dict[str, float] = {}
    if stalls and len(stalls) == len(ev.faults):
        metrics["max_stall_s"] = max(stalls)
    if all(r is not None for r in recov) and recov:
        metrics["max_recovery_s"] = max(recov)
    if ev.corrupted_chunks is not None:
        metrics["corrupted_chunks"] = float(ev.corrupted_chunks)
    if ev.failed_reads is not None:
        metrics["failed_reads"] = float(ev.failed_reads)
    if ev.read_mb_s is not None:
        metrics["read_mb_s"] = ev.read_mb_s
    return metrics


def _faults_checks(ev: FioFaultsEvidence) -> list[ValidityCheck]:
    """Pure: the gate's validity checks: reads logged, faults made and undone, a rate before each, integrity
    checked, fio finished, and where they apply each fault felt and the paths counted."""
    checks = [
        ValidityCheck(name="reads logged", ok=ev.completions > 0, claim="fio logged every completed read",
                      how="fio's completion log (--write_lat_log, unix ms on the node's clock)",
                      figure="completions", value=float(ev.completions), unit=None),
        ValidityCheck(name="faults made", ok=bool(ev.faults) and all(f.applied_ok and f.t_apply_s is not None
                                                                      for f in ev.faults),
                      claim="every fault of the schedule was made on the target, its time on the node's clock",
                      how="each fault's command exited 0 between two readings of the node's clock",
                      figure="faults made", value=float(sum(f.applied_ok for f in ev.faults)), unit=None),
        ValidityCheck(name="faults undone", ok=all(f.undone_ok for f in ev.faults),
                      claim="every fault was undone (its inverse exited 0)",
                      how="the inverse as a step, by the workload or, whatever ended the gate, by the runner",
                      figure="faults undone", value=float(sum(f.undone_ok for f in ev.faults)), unit=None),
        ValidityCheck(name="rate before each fault", ok=all(f.pre_rate_mb_s for f in ev.faults),
                      claim="each fault has a rate before it to recover to",
                      how=f"bytes completed in the {PRE_WINDOW_S:g} s before the fault (at least 0.5 s)",
                      figure="lowest rate before a fault",
                      value=min((f.pre_rate_mb_s or 0.0) for f in ev.faults) * 1e6 if ev.faults else None,
                      unit="B/s"),
        ValidityCheck(name="integrity checked", ok=ev.corrupted_chunks is not None and ev.failed_reads is not None,
                      claim="every block read was checked against the crc32c written with it, and every failed "
                            "read counted",
                      how="fio --verify=crc32c on the read, after a fio write of the region with verify headers; "
                          "failed reads from fio's JSON (total_err less the verify failures)"
                          + ("" if ev.failed_reads is not None else ": fio's JSON gave no count (unknown)"),
                      figure="bytes read and checked", value=float(ev.read_bytes), unit="B"),
        ValidityCheck(name="fio finished", ok=ev.fio_exit_code == 0,
                      claim="the faulted read ran to its end (fio exited 0)",
                      how="the exit status of the spawned fio read: "
                          + ("not recorded" if ev.fio_exit_code is None else f"{ev.fio_exit_code}"),
                      figure="fio exit status", value=None if ev.fio_exit_code is None else float(ev.fio_exit_code),
                      unit=None),
    ]
    on_path = [f for f in ev.faults if felt_on_path(f)]
    if on_path:
        least = min((f.path_read_bytes_before for f in on_path if f.path_read_bytes_before is not None), default=None)
        idle = [f"fault {f.index} ({f.path}): " + ("unknown" if f.path_read_bytes_before is None else "0 B")
                for f in on_path if not f.path_read_bytes_before]
        checks.append(ValidityCheck(
            name="fault felt", ok=not idle, claim="each faulted path carried reads before its fault (a fault on an "
            "idle path proves nothing: native multipath with iopolicy numa keeps every read on one path)",
            how=f"/sys/block/<path>/stat of the faulted path, sampled, over the {PRE_WINDOW_S:g} s before the fault"
                + (f"; no reads: {', '.join(idle)}" if idle else ""),
            figure="least bytes a faulted path read before its fault", value=None if least is None else float(least),
            unit="B"))
    felt = slow_path_felt(ev)
    if felt is not None:
        checks.append(felt)
    failover = [f for f in ev.faults if f.kind in ("path-down", "ana") and f.path_read_bytes]
    if failover:
        carried = all(sum(v for v in f.path_read_bytes.values()) > 0 for f in failover)
        checks.append(ValidityCheck(
            name="paths counted", ok=carried, claim="the multipath head's reads are counted on its paths while a "
            "path is down (a 6.1 head counts none of its own)", how="/sys/block/<path>/stat of every path, sampled",
            figure="paths", value=float(len(ev.paths)), unit=None))
    return checks


def _faults_failures(ev: FioFaultsEvidence) -> list[str]:
    """Pure: why the gate FAILs: corrupted chunks, lost reads, a fault without recovery in time."""
    failed = []
    if ev.corrupted_chunks:
        failed.append(f"{ev.corrupted_chunks} corrupted chunk(s) read (offsets {ev.corrupted_offsets[:5]})")
    if ev.failed_reads:
        failed.append(f"{ev.failed_reads} read(s) failed (lost I/O)")
    for f in ev.faults:
        if f.kind == "slow-path":  # the read goes on through a slowed path: judged on what it kept, when asked
            kept = (f.in_force_rate_mb_s / f.pre_rate_mb_s if f.in_force_rate_mb_s is not None and f.pre_rate_mb_s
                    else None)
            if ev.slowed_min_fraction is not None and f.t_apply_s is not None and (
                    kept is None or kept < ev.slowed_min_fraction):
                failed.append(f"fault {f.index} ({f.detail}): the read kept "
                              + (f"{kept:.1%} of {f.pre_rate_mb_s:g} MB/s" if kept is not None else "an unknown rate")
                              + f" while the path was slowed, below slowed_min_fraction {ev.slowed_min_fraction:g}")
            continue
        if f.t_apply_s is not None and f.pre_rate_mb_s and (f.recovery_s is None or f.recovery_s >
                                                            ev.recovery_bound_s):
            failed.append(f"fault {f.index} ({f.detail}): no recovery to {ev.recover_fraction:.0%} of "
                          f"{f.pre_rate_mb_s:g} MB/s within {ev.recovery_bound_s:g} s"
                          + (f" (took {f.recovery_s:g} s)" if f.recovery_s is not None else ""))
    return failed


def evaluate_faults(ev: FioFaultsEvidence) -> WorkloadResult:
    """Pure: the gate's metrics, validity and FAIL reasons from the judged evidence (also what a bundle's
    re-evaluation reads)."""
    metrics = _faults_metrics(ev)
    ev.validity = checks = _faults_checks(ev)
    invalid = "; ".join(f"{c.name}: not proven ({c.how})" for c in checks if not c.ok) or None
    failed = _faults_failures(ev)
    return WorkloadResult(metrics, ev, invalid_reason=invalid, failed_check="; ".join(failed) or None)


# ------------------------------------------------------------------------------------------ commands


def fill_argv(dev: str, p: FioFaultsParams) -> tuple[str, ...]:
    """The region written once with crc32c verify headers (what the faulted read checks)."""
    return ("fio", "--name=kvgate-faults-fill", f"--filename={dev}", "--rw=write", f"--bs={p.bs_bytes}",
            f"--size={p.region_bytes}", "--ioengine=libaio", "--direct=1", "--iodepth=16", "--verify=crc32c",
            "--do_verify=0", "--verify_state_save=0", "--output-format=json")


def read_argv(dev: str, p: FioFaultsParams, log_prefix: str) -> tuple[str, ...]:
    """``jobs`` psync readers, each its slice of the region, time based, every block verified; one completion log
    per job (``PREFIX_clat.N.log``)."""
    slice_b = p.region_bytes // p.jobs
    return ("fio", "--name=kvgate-faults-read", f"--filename={dev}", "--rw=read", f"--bs={p.bs_bytes}",
            f"--size={slice_b}", f"--offset_increment={slice_b}", f"--numjobs={p.jobs}", "--group_reporting",
            "--ioengine=psync", "--direct=1", "--time_based=1", f"--runtime={p.runtime_s:g}", "--verify=crc32c", "--continue_on_error=all",
            f"--write_lat_log={log_prefix}", "--log_unix_epoch=1", "--output-format=json",
            f"--output={log_prefix}.json")


def fault_commands(node: Any, params: FioFaultsParams, f: FaultSpec) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """(what, apply, inverse) of one fault on the node's loopback target side (harness.rigs.faults)."""
    head = node.target(params.target)
    ports = [F.PortRef(str(int(node.target(p).trsvcid or "4420")), str(node.target(p).trsvcid or "4420"))
             for p in params.paths]
    port = ports[params.paths.index(f.path)] if f.path else None
    if f.kind == "operator":
        return (f"operator: {f.description}", tuple(f.command or ("true",)), tuple(f.undo or ("true",)))
    if f.kind == "path-down":
        return (f"path {f.path} down (port {port.port_id} unlinked)", *F.path_down(head.nqn, port))
    if f.kind == "ana":
        return (f"path {f.path} ANA {f.ana_state}", *F.ana_change(port, f.ana_state))
    if f.kind == "slow-path":
        return (f"path {f.path} slow ({f.delay_ms:g} ms on {f.interface})",
                *F.slow_path(f.interface, port, f.delay_ms, f.loss_pct))
    return ("target restart (every port unlinked, namespace disabled)",
            *F.target_restart(head.nqn, head.nsid or 1, ports))


def _at(address: str, target: Any) -> bool:
    """Whether a controller's address (``traddr=A,trsvcid=S[,src_addr=...]``) is the target's."""
    kv = dict(x.split("=", 1) for x in address.split(",") if "=" in x)
    return kv.get("traddr") == target.traddr and kv.get("trsvcid") == str(target.trsvcid or "4420")


RAW_FILES = {"json": "fio.json", "log": "fio.log", "clat": "fio-clat.log", "paths": "paths.log"}


def node_files(prefix: str) -> dict[str, str]:
    """The files the faulted read leaves on the node: fio's JSON, its output (verify failures), its completion
    log, and the path sampler's output."""
    return {"json": f"{prefix}.json", "log": f"{prefix}-fio.log", "clat": f"{prefix}_clat.*.log",
            "paths": f"{prefix}-paths.log"}


def cat_argv(path: str) -> tuple[str, ...]:
    """``cat`` of a node file; a ``*`` in its name (fio's one completion log per job) is the shell's to expand."""
    if "*" in path:
        head, tail = path.split("*", 1)
        return ("sh", "-c", 'cat "$1"*"$2"', "kvgate-cat", head, tail)
    return ("cat", path)


def remove_argv(prefix: str, files: dict[str, str]) -> tuple[str, ...]:
    return ("sh", "-c", 'p=$1; shift; rm -f -- "$@" "$p"_clat.*.log "$p"_lat.*.log "$p"_slat.*.log', "kvgate-rm",
            prefix, *(f for f in files.values() if "*" not in f))


def _wait(ctx: GateContext, proc: Any, limit_s: float) -> int | None:
    """A spawned command's exit status, waiting at most ``limit_s`` (then its group is killed: None); the gate's
    cancellation ends the wait."""
    deadline = ctx.clock.now() + limit_s
    while ctx.clock.now() < deadline:
        rc = proc.wait(0.5)
        if rc is not None:
            return rc
        ctx.cancel.check()
    proc.kill_group()
    return None


def _target_side(node: Any, nqn: str) -> Any:
    return next((t for t in node.targets if t.kind == "nvmeof-loopback" and t.nqn == nqn), None)


def rederive(gate_dir: Path, result: dict[str, Any], params: Any, ctx: dict[str, Any]):
    """fio-faults re-judged from the node's raw files (fio's completion log, output and JSON, the paths' samples)
    and each fault's recorded time on the node's clock, through the workload's own pure functions
    (harness.workloads.fio_faults.reevaluate_faults)."""
    ev = result.get("evidence") or {}
    nodes = sorted(p.parent.name for p in gate_dir.glob(f"*/{RAW_FILES['clat']}"))
    if len(nodes) != 1:
        raise HarnessError(f"{gate_dir.name}: expected one node's {RAW_FILES['clat']}, found {len(nodes)}")
    # fio's output (fio.log) is empty when no block failed its verify; the others never are
    raw = {k: raw_text(gate_dir, f"{nodes[0]}/{name}", f"the faulted read's {k}", empty_ok=k == "log")
           for k, name in RAW_FILES.items()}
    again = reevaluate_faults(ev, raw, params)
    return again.metrics, again.invalid_reason, again.failed_check


@register_workload("fio-faults")
class FioFaults(Workload):
    """G1 over a multipath NVMe-oF namespace while its paths fail and come back (docs/faults.md)."""
    rederive = staticmethod(rederive)  # the gate re-judged from the bundle's raw files

    Params = FioFaultsParams
    EvidenceModel = FioFaultsEvidence
    METRICS = {"max_stall_s": "s", "max_recovery_s": "s", "corrupted_chunks": "", "failed_reads": "",
               "read_mb_s": "MB/s"}

    def validate_against(self, params: FioFaultsParams, nodes: dict[str, Any]) -> list[tuple[tuple, str]]:
        errs = []
        for n in nodes.values():
            head = n.target(params.target)
            if head is None or head.kind != "nvmeof":
                errs.append((("target",), f"node {n.name}: {params.target!r} is not a kind nvmeof target"))
                continue
            for i, p in enumerate(params.paths):
                t = n.target(p)
                if t is None or t.kind != "nvmeof" or t.nqn != head.nqn:
                    errs.append((("paths", i), f"node {n.name}: {p!r} is not a kind nvmeof target of {head.nqn}"))
            if any(f.kind != "operator" for f in params.faults) and _target_side(n, head.nqn) is None:
                errs.append((("faults",), f"node {n.name}: the faults are made on kvgate's own target side: a kind "
                                          f"nvmeof-loopback target with nqn {head.nqn} (an array's faults: "
                                          "docs/faults.md)"))
        return errs

    def plan(self, ctx: GateContext) -> list[PlannedStep]:
        p: FioFaultsParams = ctx.params
        out = []
        for name, node in ctx.nodes.items():
            spec = NvmeofSpec.from_target(node.target(p.target))
            work = node.work_dir
            dev = "<the multipath head>"
            out += [PlannedStep(name, f"{p.target}: the namespace by NQN ({k})", argv)
                    for k, argv in nvmeof_probes(spec).items()]
            out.append(PlannedStep(name, "the subsystem's multipath I/O policy", iopolicy_argv(spec.nqn)))
            if p.iopolicy:
                out.append(PlannedStep(name, f"iopolicy {p.iopolicy} for the read (when the node's differs; put "
                                             "back after it, whatever ends the gate)",
                                       iopolicy_argv(spec.nqn, p.iopolicy), optional=True))
            out += [PlannedStep(name, what, argv, optional=opt) for what, argv, opt in
                    block_probe_plan(dev, "the multipath head")]
            out.append(PlannedStep(name, "write the region once with crc32c verify headers (write guard allowed)",
                                   fill_argv(dev, p)))
            devs = [f"<the device of path {t}>" for t in p.paths]
            out.append(PlannedStep(name, "every path's counters before", path_stats_argv(devs)))
            out.append(PlannedStep(name, "mkdir the work dir", ("mkdir", "-p", work)))
            files = node_files(prefix := posixpath.join(work, f"kvgate-faults-{ctx.gate.id}"))
            out.append(PlannedStep(name, "sample every path's counters every 0.5 s (spawned, beside the read)",
                                   path_sampler_argv(devs, p.runtime_s)))
            out.append(PlannedStep(name, f"the faulted read (spawned): {p.runtime_s:g} s, every block verified",
                                   read_argv(dev, p, prefix)))
            for i, f in enumerate(sorted(p.faults, key=lambda f: f.at_s)):
                what, apply, inverse = fault_commands(node, p, f)
                out.append(PlannedStep(name, f"fault {i} at {f.at_s:g} s: {what}", F.clocked(apply)))
                out.append(PlannedStep(name, f"fault {i} undone at {f.at_s + f.duration_s:g} s (whatever ends the "
                                             "gate: the runner runs it if the gate could not)", F.clocked(inverse)))
            for k, path in files.items():
                out.append(PlannedStep(name, f"the read's {k} file(s)", cat_argv(path)))
            out.append(PlannedStep(name, "remove the read's files", remove_argv(prefix, files)))
            out.append(PlannedStep(name, "every path's counters after", path_stats_argv(devs)))
            if p.iopolicy:
                out.append(PlannedStep(name, "the node's own iopolicy put back", iopolicy_argv(spec.nqn, "<before>"),
                                       optional=True))
        return out

    def run(self, ctx: GateContext) -> WorkloadResult:
        p: FioFaultsParams = ctx.params
        (name, node), = list(ctx.nodes.items())[:1]
        tr = ctx.transports[name]
        undo = ctx.undo if ctx.undo is not None else UndoLog()
        head = node.target(p.target)
        ev = FioFaultsEvidence(region_bytes=p.region_bytes, bs_bytes=p.bs_bytes, jobs=p.jobs,
                               runtime_s=p.runtime_s, recover_fraction=p.recover_fraction,
                               recovery_bound_s=p.recovery_bound_s, slowed_min_fraction=p.slowed_min_fraction)
        try:
            dev, record = nvmeof_device(ctx, node, head, tr)
        except WorkloadError as exc:
            return WorkloadResult({}, ev, error=str(exc))
        ev.device, ev.nvmeof = dev, record
        paths = []
        for pname in p.paths:
            t = node.target(pname)
            want = f"traddr={t.traddr},trsvcid={t.trsvcid or '4420'}"
            pr = next((x for x in record.get("paths", []) if _at(x.get("address") or "", t)), None)
            paths.append(PathRead(target=pname, controller=pr and pr.get("controller"), address=want,
                                  device=pr and pr.get("device")))
        ev.paths = paths
        missing = [x.target for x in paths if not x.device]
        if missing or record.get("multipath") != "native":
            return WorkloadResult({}, ev, error=f"{p.target}: not a native multipath head over every path "
                                  f"(multipath {record.get('multipath')}; no path device for {', '.join(missing)})")
        run = lambda step, argv, timeout_s: ctx.steps.run(tr, step, argv, timeout_s=timeout_s)  # noqa: E731
        pol = run("iopolicy", iopolicy_argv(head.nqn), STEP_TIMEOUT_S)
        ev.iopolicy = ev.iopolicy_before = parse_iopolicy(pol.stdout) if pol.ok else None
        if not p.iopolicy or p.iopolicy == ev.iopolicy_before:
            return self._faulted_read(ctx, ev, dev, paths, undo)
        if ev.iopolicy_before is None:  # what to put back is not known: nothing is changed
            return WorkloadResult({}, ev, error=f"{p.target}: the subsystem's iopolicy could not be read, so it is "
                                  f"not set to {p.iopolicy}: {pol.summary()}")
        entry = undo.register(name, "iopolicy", iopolicy_argv(head.nqn, ev.iopolicy_before), gate=ctx.gate.id)
        try:
            r = run("iopolicy-set", iopolicy_argv(head.nqn, p.iopolicy), STEP_TIMEOUT_S)
            if not r.ok:
                return WorkloadResult({}, ev, error=f"{p.target}: the kernel refused iopolicy {p.iopolicy} "
                                      f"(queue-depth needs Linux 6.11 or later): {r.summary()}")
            ev.iopolicy = parse_iopolicy(r.stdout)
            return self._faulted_read(ctx, ev, dev, paths, undo)
        finally:  # put back whatever ended the read; if this cannot run, the runner runs the inverse
            back = run("iopolicy-restore", entry.argv, STEP_TIMEOUT_S)
            undo.mark(entry, back.ok, None if back.ok else back.summary())

    def _faulted_read(self, ctx: GateContext, ev: FioFaultsEvidence, dev: str, paths: list[PathRead],
                      undo: UndoLog) -> WorkloadResult:
        """The write guard, the verify fill, then the read with the faults made and undone on schedule."""
        p: FioFaultsParams = ctx.params
        (name, node), = list(ctx.nodes.items())[:1]
        tr = ctx.transports[name]
        head = node.target(p.target)
        devs = [x.device for x in paths]
        run = lambda step, argv, timeout_s: ctx.steps.run(tr, step, argv, timeout_s=timeout_s)  # noqa: E731
        guard = check_write(run, dev, expect="block", node=name, purpose="fio writes the region with verify headers "
                            "before the faulted read", allow_destructive=head.allow_destructive, serial=head.serial)
        ev.write_guard = guard.as_dict()
        if not guard.allowed:
            return WorkloadResult({}, ev, error=f"the write guard refused {dev}: {guard.reason}")
        r = run("fio-fill-verify", fill_argv(dev, p), 600)
        if not r.ok:
            return WorkloadResult({}, ev, error=f"the verify fill failed: {r.summary()}")
        before = run("path-stats-before", path_stats_argv(devs), STEP_TIMEOUT_S)
        run("work-dir", ("mkdir", "-p", node.work_dir), STEP_TIMEOUT_S)
        prefix = posixpath.join(node.work_dir, f"kvgate-faults-{ctx.gate.id}")
        files = node_files(prefix)
        # spawned, not run: the sampler and the read go on while the faults are made (both stopped as process
        # groups when the gate ends)
        sampler, _ = ctx.steps.spawn(tr, "path-sampler", path_sampler_argv(devs, p.runtime_s), log_path=files["paths"])
        reader, _ = ctx.steps.spawn(tr, "fio-read-faulted", read_argv(dev, p, prefix), log_path=files["log"])
        t0 = ctx.clock.now()
        made: list[AppliedFault] = []
        wait_until = lambda t: ctx.cancel.sleep(max(0.0, t - ctx.clock.now()))  # noqa: E731
        for i, f in enumerate(sorted(p.faults, key=lambda f: f.at_s)):
            what, apply, inverse = fault_commands(node, p, f)
            wait_until(t0 + f.at_s)
            fault = ScheduledFault(i, f, what, F.clocked(apply), F.clocked(inverse))  # times read on the node
            made.append(make_fault(ctx, name, fault, undo, t0, wait_until, STEP_TIMEOUT_S))
        fio_rc = _wait(ctx, reader, p.runtime_s + 300)
        _wait(ctx, sampler, 120)
        out = {k: run(f"cat-{k}", cat_argv(path), STEP_TIMEOUT_S) for k, path in files.items()}
        run("remove-logs", remove_argv(prefix, files), STEP_TIMEOUT_S)
        after = run("path-stats-after", path_stats_argv(devs), STEP_TIMEOUT_S)
        if fio_rc is None or not out["json"].ok:
            return WorkloadResult({}, ev, error=f"the faulted read did not finish (fio exit {fio_rc}): "
                                  f"{out['log'].stdout.strip()[-300:]}")
        try:
            done = parse_clat_log(out["clat"].stdout) if out["clat"].ok else []
        except ValueError as exc:
            return WorkloadResult({}, ev, error=str(exc))
        samples = parse_path_samples(out["paths"].stdout) if out["paths"].ok else []
        sb, sa = parse_path_stats(before.stdout), parse_path_stats(after.stdout)
        ev.paths = [x.model_copy(update={"read_bytes": sa[x.device].read_bytes - sb[x.device].read_bytes
                                         if x.device in sa and x.device in sb else None}) for x in paths]
        ev.corrupted_offsets, ev.failed_reads = integrity_of(out["log"].stdout, out["json"].stdout)
        ev.corrupted_chunks = len(ev.corrupted_offsets)
        ev.fio_exit_code = fio_rc
        ndir = ctx.gate_dir / name  # the raw files the gate is judged from (and re-judged, gates/reevaluate.py)
        ndir.mkdir(parents=True, exist_ok=True)
        for k, r in out.items():
            write_gate_file(ndir / RAW_FILES[k], r.stdout)
        return self._judge(ctx, ev, done, samples, made, devs)

    @staticmethod
    def _judge(ctx: GateContext, ev: FioFaultsEvidence, done: list[Completion], samples, made, devs) -> WorkloadResult:
        p: FioFaultsParams = ctx.params
        recs = []
        for m in made:
            f, ra, entry = m.fault.spec, m.applied, m.undo_entry
            ta, in_force = F.parse_clocked(ra.stdout)
            tu = F.parse_clocked(m.undone.stdout)[0] if m.undone is not None else None
            recs.append(FaultRecord(index=m.fault.index, kind=f.kind, path=f.path, detail=m.fault.what,
                                    applied_ok=ra.ok, undone_ok=bool(entry.done), undone_by=entry.ran_by,
                                    apply_error=None if ra.ok else ra.summary(), undo_error=entry.error,
                                    t_apply_s=ta, t_undo_s=tu,
                                    t_in_force_s=in_force if ra.ok and f.kind != "operator" else None,
                                    delay_ms=f.delay_ms if f.kind == "slow-path" else None))
            if f.kind == "operator" and ta is not None:  # timed from the first lost I/O, not from the prompt
                lost = first_lost_io([c.t_s for c in done], ta, tu or (done[-1].t_s if done else ta))
                recs[-1] = recs[-1].model_copy(update={"t_apply_s": lost if lost is not None else ta,
                                                       "timed_from": "first lost I/O" if lost is not None
                                                       else "the prompt (no I/O was lost)"})
        res = judge_run(ev, done, samples, recs, p.recover_fraction)
        write_gate_file(ctx.gate_dir / "faults.json", json.dumps(res.as_dict(), indent=1, default=str))
        return res
