"""G1: per-GPU cold read bandwidth with fio.

Per node, one fio reporting group per GPU (or per declared read stream) reads a disjoint region of the
target with O_DIRECT, pinned to the CPUs of the GPU's NUMA node when known. The page cache is dropped
first where permitted, and whether it was is recorded.
"""

from __future__ import annotations

import json
import posixpath
import threading
from typing import Any, Callable, Literal

from pydantic import Field, field_validator

from ..blockdev import LSBLK_ARGV, find_device, parse_lsblk
from ..errors import WorkloadError
from ..fio import StreamSpec, job_file, parse_cpulist, parse_fio_json, split_regions
from ..verdict import WorkloadResult
from ..writeguard import CREATED_SUFFIX, check_write, probe_path
from .base import GateContext, PlannedStep, StrictModel, Workload, register_workload

DROP_CACHES_ARGV = ("sh", "-c", "sync && echo 3 > /proc/sys/vm/drop_caches")

# kind -> fn(transport, steps, target) -> device path; other modules register NVMe-oF resolvers here.
TARGET_RESOLVERS: dict[str, Callable[[Any, Any, Any], str]] = {}


def _size(v: Any) -> int:
    from ..config import _size_bytes
    return _size_bytes(v)


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
        n = _size(v)
        if n % 512:
            raise ValueError(f"block size must be a multiple of 512 bytes for O_DIRECT, got {v!r}")
        return n


def target_path(node, target) -> str:
    p = target.path or ""
    return p if p.startswith("/") else posixpath.join(node.work_dir, p)


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


@register_workload("fio-read")
class FioRead(Workload):
    Params = FioReadParams
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
        return job_file(path, streams, rw=p.rw, bs_bytes=p.bs_bytes, ioengine=p.ioengine, iodepth=p.iodepth,
                        numjobs=p.numjobs, runtime_s=p.runtime_s, ramp_s=p.ramp_s, direct=p.direct)

    def plan(self, ctx: GateContext) -> list[PlannedStep]:
        p = ctx.params
        out = []
        for node in ctx.nodes.values():
            t = node.target(p.target)
            path = target_path(node, t) if t.path else f"<{t.kind} device resolved by NQN {t.nqn}>"
            remote_job = posixpath.join(node.work_dir, f"kvgate-{ctx.gate.id}-{node.name}.fio")
            if t.kind == "file":
                out.append(PlannedStep(node.name, f"create and fill {path} ({t.size_bytes} bytes) when it is missing "
                                       "or smaller and kvgate created it (write guard; other files are never written)",
                                       fill_argv(path, t.size_bytes)))
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
        results: dict[str, dict] = {}
        errors: dict[str, str] = {}

        def one(node):
            try:
                results[node.name] = self._run_node(ctx, node)
            except WorkloadError as exc:
                errors[node.name] = str(exc)
            except Exception as exc:  # noqa: BLE001 - a node failure is data, not a crash of the run
                errors[node.name] = f"{type(exc).__name__}: {exc}"

        threads = [threading.Thread(target=one, args=(n,), name=f"g1-{n.name}") for n in ctx.nodes.values()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        streams = [s for r in results.values() for s in r["streams"]]
        evidence: dict[str, Any] = {
            "ioengine": p.ioengine, "direct": p.direct, "rw": p.rw, "bs_bytes": p.bs_bytes, "iodepth": p.iodepth,
            "numjobs": p.numjobs, "runtime_s": p.runtime_s, "ramp_s": p.ramp_s,
            "nodes": {n: {k: v for k, v in r.items() if k != "streams"} for n, r in results.items()},
            "streams": streams, "node_errors": errors,
        }
        metrics: dict[str, float] = {}
        if streams:
            gbs = [s["read_gb_s"] for s in streams]
            metrics["per_gpu_read_gb_s"] = min(gbs)
            metrics["per_gpu_read_gb_s_mean"] = sum(gbs) / len(gbs)
            node_tot = [r["node_read_gb_s"] for r in results.values()]
            metrics["node_read_gb_s_min"] = min(node_tot)
            metrics["total_read_gb_s"] = sum(node_tot)
        (ctx.gate_dir / "streams.json").write_text(json.dumps(streams, indent=1))
        if errors:
            first = sorted(errors.items())[0]
            return WorkloadResult(metrics, evidence, error=f"node {first[0]}: {first[1]}")
        not_cold = [n for n, r in results.items() if not r["page_cache_dropped"]]
        if not_cold and not p.direct:
            return WorkloadResult(metrics, evidence, invalid_reason=(
                f"not cold: page cache could not be dropped on {', '.join(not_cold)} and O_DIRECT was off"))
        return WorkloadResult(metrics, evidence)

    def _run_node(self, ctx: GateContext, node) -> dict:
        p: FioReadParams = ctx.params
        tr = ctx.transports[node.name]
        steps = ctx.steps
        ndir = ctx.gate_dir / node.name
        ndir.mkdir(parents=True, exist_ok=True)
        t = node.target(p.target)
        info: dict[str, Any] = {"target": t.name, "kind": t.kind}
        if t.kind in TARGET_RESOLVERS and not t.path:
            path = TARGET_RESOLVERS[t.kind](tr, steps, t)
        else:
            path = target_path(node, t)
        info["path"] = path
        r = steps.run(tr, "mkdir-work", ("mkdir", "-p", node.work_dir), timeout_s=30)
        if not r.ok:
            raise WorkloadError(f"cannot create work dir: {r.summary()}")
        if t.kind == "file":
            total = t.size_bytes
            info["created_by_kvgate"] = self._ensure_file(ctx, tr, path, total, info)
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
                info["device"] = {"serial": dev.serial, "model": dev.model, "fstype": dev.fstype,
                                  "pttype": dev.pttype} if dev else None
        info["region_total_bytes"] = total
        cpulists = None
        if p.pin_numa and any(g.numa_node is not None for g in node.gpus):
            r = steps.run(tr, "numa-cpulists", ("sh", "-c", "for n in /sys/devices/system/node/node[0-9]*; do "
                          "printf '%s %s\\n' \"${n##*node}\" \"$(cat \"$n/cpulist\")\"; done"), timeout_s=30)
            if r.ok:
                from ..snapshot import parse_numa
                cpulists = {k: v for k, v in parse_numa(r.stdout).items() if parse_cpulist(v)}
            info["numa_cpulists"] = cpulists
        dropped = False
        if p.drop_caches:
            r = steps.run(tr, "drop-caches", DROP_CACHES_ARGV, timeout_s=120)
            dropped = r.ok
            if not r.ok:
                info["drop_caches_error"] = r.summary()
        info["page_cache_dropped"] = dropped
        job = self._job(p, node, path, total, cpulists)
        local_job = ndir / "job.fio"
        local_job.write_text(job)
        remote_job = posixpath.join(node.work_dir, f"kvgate-{ctx.gate.id}-{node.name}.fio")
        tr.put(local_job, remote_job)
        ctx.progress(f"{ctx.gate.id} {node.name}: fio {node.stream_count} stream(s) x {p.numjobs} job(s) on {path}, "
                     f"{p.ramp_s:g}+{p.runtime_s:g} s")
        r = steps.run(tr, "fio", ("fio", "--output-format=json", remote_job),
                      timeout_s=p.ramp_s + p.runtime_s + 120)
        (ndir / "fio.json").write_text(r.stdout)
        (ndir / "fio.stderr").write_text(r.stderr)
        if not r.ok:
            raise WorkloadError(f"fio failed: {r.summary()}")
        run = parse_fio_json(r.stdout)
        info["fio_version"] = run.version
        bad = [g.label for g in run.groups if g.errors]
        if bad:
            raise WorkloadError(f"fio reported I/O errors in {', '.join(bad)}")
        if not run.groups:
            raise WorkloadError("fio reported no jobs")
        gpu_of = {f"gpu{g.index}": g.index for g in node.gpus}
        info["streams"] = [{"node": node.name, "label": g.label, "gpu": gpu_of.get(g.label),
                            "read_gb_s": g.read_gb_s, "read_bytes": g.read_bytes, "runtime_ms": g.runtime_ms,
                            "iops": g.read_iops, "lat_p50_us": g.lat_p50_us, "lat_p99_us": g.lat_p99_us}
                           for g in run.groups]
        info["node_read_gb_s"] = sum(g.read_gb_s for g in run.groups)
        return info

    def _ensure_file(self, ctx, tr, path: str, size_bytes: int, info: dict[str, Any]) -> bool:
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
        info["write_guard"] = decision.as_dict()
        ndir = ctx.gate_dir / tr.name
        ndir.mkdir(parents=True, exist_ok=True)
        (ndir / "write-guard.json").write_text(decision.to_json())
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
