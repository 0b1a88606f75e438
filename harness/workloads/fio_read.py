"""G1: per-GPU cold read bandwidth with fio.

Per node, one fio reporting group per GPU (or per declared read stream) reads a disjoint region of the
target with O_DIRECT, pinned to the CPUs of the GPU's NUMA node when known. The page cache is dropped
first where permitted, and whether it was is recorded.

A buffered read (``direct: false``) is cold only while every byte it reads comes off the device once: a time
based job whose region is smaller than (ramp + runtime) x bandwidth wraps around and re-reads its region from
the page cache. So a buffered job is written without ``time_based`` (fio stops at the end of each region, the
ramp counted in), the evidence records every stream's bytes read against its region's size
(``FioNodeEvidence.stream_reads``), and the evaluator (:func:`evaluate_fio_read`, reused by
``gates/reevaluate.py``) makes a buffered run that read more than its region INVALID.
"""

from __future__ import annotations

from pathlib import Path

import json
import posixpath
from typing import Any, Literal

from pydantic import Field, field_validator

from ..errors import HarnessError
from ..safeio import MAX_JSON_BYTES, read_text
from ..parsers.fio import parse_fio_json
from ..errors import WorkloadError
from ..execute.fanout import fan_out
from ..parsers.blockdev import LSBLK_ARGV, find_device, parse_lsblk
from ..parsers.fio import FioRun, StreamSpec, job_file, split_regions
from ..units import parse_size_bytes
from ..execute.nvmeof import NvmeofSpec, probe_commands as nvmeof_probes
from ..writeguard import CREATED_SUFFIX, check_write, path_probe_argv, probe_path
from .kit.base import (DROP_CACHES_ARGV, Evidence, GateContext, PlannedStep, StreamRow, StreamsEvidence, StrictModel,
                   ValidityCheck, Workload, WorkloadResult, drop_caches, register_workload, target_path,
                   write_gate_file)
from .kit.targets import target_device
from .kit.probes import check_fio_groups, fio_json, fio_stream_rows, numa_cpulists, numa_step, pins_numa



class FioReadParams(StrictModel):
    target: str
    ioengine: Literal["io_uring", "libaio", "psync", "libcufile"] = "io_uring"
    rw: Literal["read", "randread"] = "read"
    bs_bytes: int = Field(default=1 << 20, alias="bs")
    iodepth: int = Field(default=32, ge=1, le=4096)
    numjobs: int = Field(default=1, ge=1, le=256)
    runtime_s: float = Field(default=10.0, gt=0, le=86400)
    ramp_s: float = Field(default=2.0, ge=0, le=3600)
    direct: bool = True
    drop_caches: bool = True
    pin_numa: bool = True

    @field_validator("bs_bytes", mode="before")
    @classmethod
    def _bs(cls, v: Any) -> int:
        return parse_size_bytes(v, multiple_of=512, what="block size")


def streams_for(node, region_total_bytes: int, bs_bytes: int, numjobs: int,
                cpulists: dict[int, str] | None, pin: bool) -> list[StreamSpec]:
    """One stream per GPU (pinned to its NUMA node's CPUs when known), else ``read_streams``."""
    count = node.stream_count
    regions = split_regions(region_total_bytes, count, bs_bytes * numjobs)
    out = []
    if node.gpus:
        for gpu, (off, size) in zip(sorted(node.gpus, key=lambda g: g.index), regions):
            cpus = None
            if pin and gpu.numa_node is not None and cpulists and gpu.numa_node in cpulists:
                cpus = cpulists[gpu.numa_node]
            out.append(StreamSpec(f"gpu{gpu.index}", off, size, cpus, gpu.index))
    else:
        out = [StreamSpec(f"stream{i}", off, size) for i, (off, size) in enumerate(regions)]
    return out


def fill_argv(path: str, size_bytes: int) -> tuple[str, ...]:
    """fio writes the whole file once with incompressible data (only files kvgate created)."""
    return ("fio", "--name=kvgate-fill", f"--filename={path}", "--rw=write", "--bs=1M", f"--size={size_bytes}",
            "--ioengine=psync", "--direct=1", "--refill_buffers=1", "--end_fsync=1", "--output-format=json")


class FioNodeEvidence(Evidence):
    """What one node's G1 read was: the target, how it was made cold, fio's figures."""

    target: str
    kind: str
    path: str | None = None
    created_by_kvgate: bool | None = None
    device: dict[str, str | None] | None = None
    region_total_bytes: int | None = None
    numa_cpulists: dict[int, str] | None = None
    page_cache_dropped: bool = False
    drop_caches_error: str | None = None
    stream_region_bytes: dict[str, int] | None = None  # each stream's (reporting group's) region, as fio was told
    stream_reads: list[dict[str, Any]] | None = None  # bytes read against the region, per stream (stream_reads())
    write_guard: dict[str, Any] | None = None  # the guard's decision when the file had to be (re)filled
    nvmeof: dict[str, Any] | None = None  # kind nvmeof: the namespace found by NQN, its paths, the RDMA device
    fio_version: str | None = None
    node_read_gb_s: float | None = None


class FioReadEvidence(Evidence, StreamsEvidence):
    """G1's evidence: the job as run, each node's record, every stream's read, the nodes that failed."""

    ioengine: str
    direct: bool
    rw: str
    bs_bytes: int
    iodepth: int
    numjobs: int
    runtime_s: float
    ramp_s: float
    # the job ran for runtime_s whatever it had read (None: recorded before kvgate said; such jobs were)
    time_based: bool | None = None
    nodes: dict[str, FioNodeEvidence] = {}
    node_errors: dict[str, str] = {}


def read_metrics(per_node_gb_s: dict[str, list[float]]) -> dict[str, float]:
    """Pure: G1's metrics from every node's per-stream read rates (GB/s); empty without a stream."""
    streams = [x for xs in per_node_gb_s.values() for x in xs]
    if not streams:
        return {}
    node_tot = [sum(xs) for xs in per_node_gb_s.values() if xs]
    return {"per_gpu_read_gb_s": min(streams), "per_gpu_read_gb_s_mean": sum(streams) / len(streams),
            "node_read_gb_s_min": min(node_tot), "total_read_gb_s": sum(node_tot)}


def cold_invalid_reason(dropped: dict[str, bool], direct: bool) -> str | None:
    """Pure: G1 is cold when O_DIRECT was on or the page cache was dropped on every node."""
    not_cold = sorted(n for n, ok in dropped.items() if not ok)
    if not_cold and not direct:
        return f"not cold: page cache could not be dropped on {', '.join(not_cold)} and O_DIRECT was off"
    return None


def stream_regions(region_total_bytes: int, labels: list[str], bs_bytes: int, numjobs: int) -> dict[str, int]:
    """Pure: each stream's region as the job gave it (``split_regions``, in stream order)."""
    regions = split_regions(region_total_bytes, len(labels), bs_bytes * numjobs)
    return {label: size for label, (_, size) in zip(labels, regions)}


def stream_reads(reads: list[tuple[str, int, float]], regions: dict[str, int] | None, *, time_based: bool,
                 ramp_s: float, numjobs: int) -> list[dict[str, Any]]:
    """Pure: per stream (label, bytes read after the ramp, bandwidth in bytes/s), the bytes it read against its
    region's size, and whether it can have read any byte twice (``wrapped``; None when the region is unknown).

    fio reports the bytes read after the ramp only. A job that is not time based stops at the end of its region,
    the ramp counted in, so it cannot read more than the region. A time based job reads for ramp + runtime: the
    ramp's bytes are estimated at the measured bandwidth, and as fio sums a stream's ``numjobs`` clones (each
    reading its own slice of the region), no byte was read twice only while the whole stream's bytes fit in one
    clone's slice."""
    out = []
    for label, read_bytes, bw_bytes_s in reads:
        region = (regions or {}).get(label)
        ramp_est = int(round(ramp_s * bw_bytes_s)) if time_based else 0
        row: dict[str, Any] = {"label": label, "read_bytes": int(read_bytes), "region_bytes": region,
                               "time_based": time_based, "ramp_bytes_estimate": ramp_est if time_based else None}
        if not isinstance(region, int) or region <= 0:
            row["wrapped"] = None
        elif time_based:
            row["wrapped"] = read_bytes + ramp_est > region // max(numjobs, 1)
        else:
            row["wrapped"] = read_bytes > region
        out.append(row)
    return out


def reread_invalid_reason(rows: dict[str, list[dict[str, Any]]], direct: bool) -> str | None:
    """Pure: a buffered (``direct`` off) read is INVALID when a stream read more bytes than its region holds
    (the rest came from the page cache, re-read) or when its region is not known; ``rows``: node -> the rows of
    :func:`stream_reads`."""
    if direct:
        return None
    bad = []
    for node in sorted(rows):
        for r in rows[node]:
            if r["wrapped"] is None:
                bad.append(f"{node} {r['label']}: region size not recorded, {r['read_bytes']} bytes read")
            elif r["wrapped"]:
                ramp = f" + ~{r['ramp_bytes_estimate']} estimated during the ramp" if r["ramp_bytes_estimate"] else ""
                bad.append(f"{node} {r['label']}: read {r['read_bytes']} bytes{ramp} from a region of "
                           f"{r['region_bytes']} bytes")
    if not bad:
        return None
    return ("not cold: a buffered read (O_DIRECT off) read more than its region, so it re-read the region from "
            "the page cache: " + "; ".join(bad))


def _rows_from_evidence(ev: FioReadEvidence) -> dict[str, list[dict[str, Any]]]:
    time_based = True if ev.time_based is None else ev.time_based
    reads: dict[str, list[tuple[str, int, float]]] = {n: [] for n in ev.nodes}
    for s in ev.streams:
        reads.setdefault(s.node, []).append((s.label, s.read_bytes or 0, s.read_gb_s * 1e9))
    rows = {}
    for node, rs in reads.items():
        rec = ev.nodes.get(node)
        regions = rec.stream_region_bytes if rec else None
        if regions is None and rec is not None and rec.region_total_bytes:
            regions = _derived_regions(rec.region_total_bytes, [r[0] for r in rs], ev.bs_bytes, ev.numjobs)
        rows[node] = stream_reads(rs, regions, time_based=time_based, ramp_s=ev.ramp_s, numjobs=ev.numjobs)
    return rows


def _derived_regions(total: int, labels: list[str], bs_bytes: int, numjobs: int) -> dict[str, int] | None:
    try:
        return stream_regions(total, labels, bs_bytes, numjobs)
    except WorkloadError:
        return None


def evaluate_fio_read(ev: FioReadEvidence) -> WorkloadResult:
    """Pure: G1's metrics and validity from the evidence of every node: cold when O_DIRECT was on or the page
    cache was dropped on every node, and, for a buffered read, no stream read more than its region."""
    per_node: dict[str, list[float]] = {n: [] for n in ev.nodes}
    for s in ev.streams:
        per_node.setdefault(s.node, []).append(s.read_gb_s)
    metrics = read_metrics(per_node)
    rows = _rows_from_evidence(ev)
    ev = ev.model_copy(update={"validity": fio_validity(ev, rows)})
    if ev.node_errors:
        first = sorted(ev.node_errors.items())[0]
        return WorkloadResult(metrics, ev, error=f"node {first[0]}: {first[1]}")
    reasons = [cold_invalid_reason({n: r.page_cache_dropped for n, r in ev.nodes.items()}, ev.direct),
               reread_invalid_reason(rows, ev.direct)]
    invalid = "; ".join(r for r in reasons if r) or None
    return WorkloadResult(metrics, ev, invalid_reason=invalid)


def fio_validity(ev: FioReadEvidence, rows: dict[str, list[dict[str, Any]]]) -> list[ValidityCheck]:
    """Pure: what G1's figure rests on, by the rules of :func:`cold_invalid_reason` and
    :func:`reread_invalid_reason`: the reads came from the device (O_DIRECT, or the page cache dropped on every
    node), and, for a buffered read, no stream read a byte twice."""
    dropped = sorted(n for n, r in ev.nodes.items() if r.page_cache_dropped)
    kept = sorted(n for n, r in ev.nodes.items() if not r.page_cache_dropped)
    how = [f"O_DIRECT {'on' if ev.direct else 'off'}"]
    if dropped:
        how.append("page cache dropped on " + ", ".join(dropped))
    if kept:
        how.append("page cache NOT dropped on " + ", ".join(kept))
    checks = [ValidityCheck(name="cold", ok=bool(ev.nodes) and cold_invalid_reason(
        {n: r.page_cache_dropped for n, r in ev.nodes.items()}, ev.direct) is None,
        claim="fio read the device, not the page cache", how="; ".join(how))]
    if not ev.direct:
        shares = [(r["read_bytes"] + (r["ramp_bytes_estimate"] or 0)) / r["region_bytes"]
                  for rs in rows.values() for r in rs if isinstance(r["region_bytes"], int) and r["region_bytes"] > 0]
        checks.append(ValidityCheck(
            name="no re-read", ok=bool(rows) and reread_invalid_reason(rows, ev.direct) is None,
            claim="no buffered stream read a byte twice (a second read would come from the page cache)",
            how="each stream's bytes read (fio, plus the ramp's estimated at the measured rate) against its "
                "region's size", figure="largest share of a region read", value=max(shares) if shares else None,
            unit="ratio"))
    return checks


def reevaluate_fio_read(runs: dict[str, FioRun], ev: dict[str, Any], dropped: dict[str, bool], params: Any
                        ) -> tuple[dict[str, float], str | None]:
    """Pure: G1's metrics and validity again, from every node's raw fio output (``runs``), the recorded evidence
    (``ev``, result.json's, as a dict), whether each node's page cache was proven dropped and the gate's params:
    the same rules as :func:`evaluate_fio_read`."""
    metrics = read_metrics({n: [g.read_gb_s for g in r.groups] for n, r in runs.items()})
    direct = bool(getattr(params, "direct", ev.get("direct", True)))
    time_based = ev.get("time_based")
    time_based = True if time_based is None else bool(time_based)
    ramp_s = float(getattr(params, "ramp_s", ev.get("ramp_s") or 0.0))
    numjobs = int(getattr(params, "numjobs", ev.get("numjobs") or 1))
    bs_bytes = int(getattr(params, "bs_bytes", ev.get("bs_bytes") or 1))
    rows = {}
    for node, run in runs.items():
        rec = (ev.get("nodes") or {}).get(node)
        rec = rec if isinstance(rec, dict) else {}
        regions = rec.get("stream_region_bytes")
        if not (isinstance(regions, dict) and all(isinstance(v, int) for v in regions.values())):
            total = rec.get("region_total_bytes")
            regions = _derived_regions(total, [g.label for g in run.groups], bs_bytes, numjobs) \
                if isinstance(total, int) and total > 0 else None
        rows[node] = stream_reads([(g.label, g.read_bytes, g.read_bw_bytes_s) for g in run.groups], regions,
                                  time_based=time_based, ramp_s=ramp_s, numjobs=numjobs)
    reasons = [cold_invalid_reason(dropped, direct), reread_invalid_reason(rows, direct)]
    return metrics, "; ".join(r for r in reasons if r) or None


def _time_based(p: FioReadParams) -> bool:
    """Only an O_DIRECT read runs for its whole runtime: re-reading its region reads the device again."""
    return p.direct


def _job_path(node, gate_id: str) -> str:
    return posixpath.join(node.work_dir, f"kvgate-{gate_id}-{node.name}.fio")


def rederive(gate_dir: Path, result: dict[str, Any], params: Any, ctx: dict[str, Any]):
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


@register_workload("fio-read")
class FioRead(Workload):
    rederive = staticmethod(rederive)  # the gate re-judged from the bundle's raw files
    Params = FioReadParams
    EvidenceModel = FioReadEvidence
    METRICS = {
        "per_gpu_read_gb_s": "GB/s",
        "per_gpu_read_gb_s_mean": "GB/s",
        "node_read_gb_s_min": "GB/s",
        "total_read_gb_s": "GB/s",
    }

    def validate_against(self, params, nodes):
        issues = []
        for name, node in nodes.items():
            t = node.target(params.target)
            if t is None:
                issues.append((("target",), f"node {name!r} has no target {params.target!r} "
                               f"(expected one of {', '.join(x.name for x in node.targets) or 'none declared'})"))
            elif t.path and any(c in t.path for c in ":;\n"):
                issues.append((("target",), f"target {params.target!r} on node {name!r}: fio cannot take a path "
                               f"containing ':' or ';' ({t.path!r}); rename or link it"))
            elif t.kind == "directory":
                issues.append((("target",), f"target {params.target!r} on node {name!r} is a directory; "
                               "fio-read needs a file or block device"))
            if params.ioengine == "libcufile" and not node.gpus:
                issues.append((("ioengine",), f"libcufile needs GPUs, node {name!r} declares none"))
        return issues

    def _job(self, p: FioReadParams, node, path: str, total: int, cpulists) -> str:
        streams = streams_for(node, total, p.bs_bytes, p.numjobs, cpulists, p.pin_numa)
        # buffered: not time based, so fio stops at the end of each region and never re-reads it from the cache
        return job_file(path, streams, rw=p.rw, bs_bytes=p.bs_bytes, ioengine=p.ioengine, iodepth=p.iodepth,
                        numjobs=p.numjobs, runtime_s=p.runtime_s, ramp_s=p.ramp_s, direct=p.direct,
                        time_based=_time_based(p))

    def plan(self, ctx: GateContext) -> list[PlannedStep]:
        """Every command the run sends to each node, in order (file targets: the fill only when needed)."""
        p = ctx.params
        out = []
        for node in ctx.nodes.values():
            t = node.target(p.target)
            # fio refuses ':' in a file name, and an NQN holds one: the placeholder names the target instead
            path = target_path(node, t) if t.path else f"</dev/nvmeXnY of {t.kind} target {t.name}, found by NQN>"
            remote_job = _job_path(node, ctx.gate.id)
            if t.kind == "nvmeof":
                spec = NvmeofSpec.from_target(t)
                for name, argv in nvmeof_probes(spec).items():
                    out.append(PlannedStep(node.name, f"find the namespace of {t.nqn} and check it is {spec.address}, "
                                                      f"live ({name})", argv))
            out.append(PlannedStep(node.name, "create the work directory", ("mkdir", "-p", node.work_dir)))
            if t.kind == "file":
                out.append(PlannedStep(node.name, f"what {path} is, its size and whether kvgate created it "
                                       "(the write guard's probe)", path_probe_argv(path)))
                why = ("if missing, or kvgate's and short (the write guard allows it; a file kvgate did not create "
                       "is never written)")
                out.append(PlannedStep(node.name, f"{why}: its directory", ("mkdir", "-p", posixpath.dirname(path) or "/")))
                out.append(PlannedStep(node.name, f"{why}: mark it as kvgate's", ("touch", path + CREATED_SUFFIX)))
                out.append(PlannedStep(node.name, f"{why}: fill {path} ({t.size_bytes} bytes)",
                                       fill_argv(path, t.size_bytes)))
            else:
                out.append(PlannedStep(node.name, f"size of {path}", ("blockdev", "--getsize64", path)))
                out.append(PlannedStep(node.name, "the device's serial, model and what it holds", LSBLK_ARGV + (path,)))
            if pins_numa(p.pin_numa, node):
                out.append(numa_step(node.name, "streams"))
            if p.drop_caches:
                out.append(PlannedStep(node.name, "drop the page cache (recorded whether permitted)", DROP_CACHES_ARGV))
            total = t.size_bytes or 0
            desc = f"fio: {node.stream_count} stream(s) reading disjoint regions of {path}"
            if not total:
                desc += " (region sizes from `blockdev --getsize64` at run time)"
                total = node.stream_count * p.bs_bytes * p.numjobs * 1024
            out.append(PlannedStep(node.name, desc, ("fio", "--output-format=json", remote_job),
                                   files={remote_job: self._job(p, node, path, total, None)}))
        return out

    def run(self, ctx: GateContext) -> WorkloadResult:
        p: FioReadParams = ctx.params
        group = fan_out(ctx.nodes, lambda _name, node: self._run_node(ctx, node))
        nodes = {n: rec for n, (rec, _) in group.succeeded.items()}
        streams = [s for _, rows in group.succeeded.values() for s in rows]
        ev = FioReadEvidence(ioengine=p.ioengine, direct=p.direct, rw=p.rw, bs_bytes=p.bs_bytes, iodepth=p.iodepth,
                             numjobs=p.numjobs, runtime_s=p.runtime_s, ramp_s=p.ramp_s, time_based=_time_based(p),
                             nodes=nodes, streams=streams, node_errors=group.failed)
        write_gate_file(ctx.gate_dir / "streams.json", json.dumps([s.model_dump(mode="json") for s in streams], indent=1))
        return evaluate_fio_read(ev)

    def _run_node(self, ctx: GateContext, node) -> tuple[FioNodeEvidence, list[StreamRow]]:
        p: FioReadParams = ctx.params
        tr = ctx.transports[node.name]
        steps = ctx.steps
        ndir = ctx.gate_dir / node.name
        ndir.mkdir(parents=True, exist_ok=True)
        t = node.target(p.target)
        path, nvmeof = target_device(ctx, node, t, tr)
        rec = FioNodeEvidence(target=t.name, kind=t.kind, path=path, nvmeof=nvmeof)
        r = steps.run(tr, "mkdir-work", ("mkdir", "-p", node.work_dir), timeout_s=30)
        if not r.ok:
            raise WorkloadError(f"cannot create work dir: {r.summary()}")
        if t.kind == "file":
            total = t.size_bytes
            rec.created_by_kvgate = self._ensure_file(ctx, tr, path, total, rec)
        else:
            r = steps.run(tr, "blockdev-size", ("blockdev", "--getsize64", path), timeout_s=30)
            if not r.ok:
                raise WorkloadError(f"cannot read size of {path}: {r.summary()}")
            total = int(r.stdout.strip())
            if t.size_bytes:
                total = min(total, t.size_bytes)
            r = steps.run(tr, "lsblk", LSBLK_ARGV + (path,), timeout_s=30)
            if r.ok:
                dev = find_device(parse_lsblk(r.stdout), path)
                rec.device = {"serial": dev.serial, "model": dev.model, "fstype": dev.fstype,
                              "pttype": dev.pttype} if dev else None
        rec.region_total_bytes = total
        cpulists = None
        if pins_numa(p.pin_numa, node):
            rec.numa_cpulists = cpulists = numa_cpulists(ctx, tr)
        if p.drop_caches:
            drop = drop_caches(ctx, tr, timeout_s=120)
            rec.page_cache_dropped, rec.drop_caches_error = drop.dropped, drop.error
        job = self._job(p, node, path, total, cpulists)
        local_job = ndir / "job.fio"
        write_gate_file(local_job, job)
        remote_job = _job_path(node, ctx.gate.id)
        tr.put(local_job, remote_job)
        ctx.progress(f"{ctx.gate.id} {node.name}: fio {node.stream_count} stream(s) x {p.numjobs} job(s) on {path}, "
                     f"{p.ramp_s:g}+{p.runtime_s:g} s")
        r = steps.run(tr, "fio", ("fio", "--output-format=json", remote_job),
                      timeout_s=p.ramp_s + p.runtime_s + 120)
        write_gate_file(ndir / "fio.json", r.stdout)
        write_gate_file(ndir / "fio.stderr", r.stderr)
        run = fio_json(r)
        rec.fio_version = run.version
        check_fio_groups(run)
        rows = fio_stream_rows(node.name, run, {f"gpu{g.index}": g.index for g in node.gpus})
        rec.node_read_gb_s = sum(g.read_gb_s for g in run.groups)
        rec.stream_region_bytes = {s.label: s.size_bytes // p.numjobs * p.numjobs
                                   for s in streams_for(node, total, p.bs_bytes, p.numjobs, cpulists, p.pin_numa)}
        rec.stream_reads = stream_reads([(g.label, g.read_bytes, g.read_bw_bytes_s) for g in run.groups],
                                        rec.stream_region_bytes, time_based=_time_based(p), ramp_s=p.ramp_s,
                                        numjobs=p.numjobs)
        return rec, rows

    def _ensure_file(self, ctx, tr, path: str, size_bytes: int, rec: FioNodeEvidence) -> bool:
        """Create and fill the file when missing (or refill one kvgate created); never touch other files.
        Reading a big enough file writes nothing; any fill goes through the write guard first."""
        steps = ctx.steps
        run = lambda name, argv, timeout_s: steps.run(tr, name, argv, timeout_s=timeout_s)  # noqa: E731
        facts, err = probe_path(run, path)
        if facts is None:
            raise WorkloadError(f"cannot stat {path}: {err}")
        if facts.kind == "file" and (facts.size_bytes or 0) >= size_bytes:
            return facts.created_by_kvgate
        decision = check_write(run, path, expect="file", purpose="fio fill", node=tr.name, facts=facts)
        rec.write_guard = decision.as_dict()
        ndir = ctx.gate_dir / tr.name
        ndir.mkdir(parents=True, exist_ok=True)
        write_gate_file(ndir / "write-guard.json", decision.to_json())
        if not decision.allowed:
            raise WorkloadError(decision.refusal())
        marker = path + CREATED_SUFFIX
        r = steps.run(tr, "mkdir-target", ("mkdir", "-p", posixpath.dirname(path) or "/"), timeout_s=30)
        r = steps.run(tr, "touch-marker", ("touch", marker), timeout_s=30)
        if not r.ok:
            raise WorkloadError(f"cannot create {marker}: {r.summary()}")
        ctx.progress(f"{ctx.gate.id} {tr.name}: filling {path} ({size_bytes / 1e9:.2f} GB)")
        r = steps.run(tr, "fill-target", fill_argv(path, size_bytes), timeout_s=max(600, size_bytes / 20e6))
        if not r.ok:
            raise WorkloadError(f"filling {path} failed: {r.summary()}")
        return True
