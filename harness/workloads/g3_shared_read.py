"""G3: N nodes read back one shared KV copy at once, through one port; how close to its line rate?

The KV copy is a file set laid out as an LMCache fs:// pool would hold it (one file per chunk, named
`<fmt>@<model>@<world_size>@<worker>@<hash>.data`, each a 28-byte metadata header plus
chunk_tokens x kv_bytes_per_token bytes), created once in the shared pool by one node. Every reader node
reads the whole copy cold (page cache dropped, recorded; O_DIRECT where the mount allows, recorded),
started together with a measured skew, and reports a per-interval series. The aggregate is taken over the
time-aligned window in which all nodes were reading.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import shutil
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..errors import WorkloadError
from ..execute.clock import CLOCK_SESSION_ARGV, applied_offset_s, measure_clock_offsets
from ..execute.fanout import FailurePolicy, GroupResult, LaunchSpec, NodeOutcome, SynchronizedLaunch, fan_out
from ..execute.slurm import (SlurmCluster, SlurmJob, job_dir_for, parse_sinfo_nodes, sinfo_argv, srun_argv,
                             srun_command, unusable_nodes)
from ..transport.local import LocalTransport
from ..node import program_path
from ..parsers.g3series import (NodeSeries, PortRate, aggregate, cross_check_port_rate, nic_ceiling_ratio,
                                nodes_completed, parse_reader_output, rate_series, start_skew_s)
from ..units import parse_size_bytes
from .base import (DROP_CACHES_ARGV, CacheDrop, Evidence, GateContext, PlannedStep, SeriesEvidence, StrictModel,
                   ValidityCheck, Workload, WorkloadResult, drop_caches, register_workload, target_path, write_summary,
                   write_gate_file)

LMCACHE_HEADER_BYTES = 28  # LMCache's fs connector: RemoteMetadata before each chunk's bytes
MANIFEST = "kvgate-manifest.json"
# The reader's armed record as it prints it (compact JSON, type first): arming is seen in the stream.
ARMED_MARKER = b'{"type":"armed"'


class G3Params(StrictModel):
    port: str = Field(description="NODE:NIC whose declared line rate is the ceiling, e.g. storage:st0")
    readers: list[str] | None = None  # default: every gate node except the port's node
    pool_target: str = "kvpool"  # a directory target on every reader (the shared pool's mount)
    pool_subdir: str = "kvgate-g3"
    model: str = "kvgate/g3-synthetic"
    kv_bytes_per_token: int = Field(default=131072, gt=0)  # e.g. Llama-3.1-8B, bf16: 2 x 32 x 8 x 128 x 2
    chunk_tokens: int = Field(default=256, gt=0)
    chunks: int = Field(default=16, ge=1, le=1_000_000)
    create_on: str | None = None  # node that lays out the copy when missing (default: first reader)
    block_bytes: int = Field(default=4 << 20, alias="block")
    streams: int = Field(default=4, ge=1, le=256)
    direct: Literal["auto", "on", "off"] = "auto"
    drop_caches: bool = True
    interval_s: float = Field(default=0.1, gt=0, le=10)
    clock_samples: int = Field(default=5, ge=1, le=100)
    clock_probe_timeout_s: float = Field(default=5.0, gt=0)  # one timed-out probe fails the node
    clock_alignment: Literal["auto", "measured", "assume_synced"] = "auto"
    arm_timeout_s: float = Field(default=60, gt=0)
    read_timeout_s: float = Field(default=600, gt=0)
    # A reader prints a sample every interval_s; silence this long means its node is gone (link down, hung).
    stall_timeout_s: float = Field(default=15.0, gt=0)
    min_window_s: float = Field(default=1.0, ge=0)
    max_failed_share: float = Field(default=0.0, ge=0, le=1)
    on_node_failure: Literal["continue", "abort"] = "continue"
    # How the readers start on their nodes: one SSH session each (ssh), or one Slurm job step with a task per
    # node (slurm: the inventory's `slurm:` cluster; docs/launchers.md).
    launcher: Literal["ssh", "slurm"] = "ssh"

    @field_validator("block_bytes", mode="before")
    @classmethod
    def _block(cls, v: Any) -> int:
        return parse_size_bytes(v, multiple_of=4096, what="block")

    @field_validator("port")
    @classmethod
    def _port(cls, v: str) -> str:
        node, sep, nic = v.partition(":")
        if not sep or not node or not nic:
            raise ValueError(f"expected NODE:NIC (e.g. storage:st0), got {v!r}")
        return v

    @property
    def chunk_bytes(self) -> int:
        return self.chunk_tokens * self.kv_bytes_per_token

    @property
    def copy_bytes(self) -> int:
        return self.chunks * (LMCACHE_HEADER_BYTES + self.chunk_bytes)


def chunk_file_names(model: str, chunks: int) -> list[str]:
    """LMCache fs-connector style names: key string with '/' -> '-', plus '.data'."""
    names = []
    for i in range(chunks):
        h = hashlib.sha256(f"{model}:{i}".encode()).hexdigest()[:16]
        names.append(f"vllm@{model}@1@0@{h}".replace("/", "-") + ".data")
    return names


def manifest_for(p: G3Params) -> dict:
    return {"schema": "kvgate-g3-pool/1", "layout": "lmcache-fs", "model": p.model,
            "kv_bytes_per_token": p.kv_bytes_per_token, "chunk_tokens": p.chunk_tokens,
            "chunk_bytes": p.chunk_bytes, "header_bytes": LMCACHE_HEADER_BYTES,
            "files": chunk_file_names(p.model, p.chunks)}


def _pool_dir(node, p: G3Params) -> str:
    return posixpath.join(target_path(node, node.target(p.pool_target)), p.pool_subdir)


def _node_dir(node, gate_id: str) -> str:
    # Per node even when nodes share a filesystem (the rig's nodes share /tmp).
    return posixpath.join(node.work_dir, f"g3-{gate_id}-{node.name}")


def _reader_spec(node, p: G3Params, program: str, armed: str, go: str, out: str) -> LaunchSpec:
    """The armed reader of one node: its program, the shared copy, and its armed, go and series files."""
    pool = _pool_dir(node, p)
    argv = ("python3", program, "--manifest", posixpath.join(pool, MANIFEST), "--pool-dir", pool,
            "--node", node.name, "--block-bytes", str(p.block_bytes), "--streams", str(p.streams),
            "--direct", p.direct, "--interval-s", str(p.interval_s), "--armed-file", armed, "--go-file", go,
            "--out", out, "--deadline-s", str(p.arm_timeout_s + p.read_timeout_s + 60))
    return LaunchSpec(argv, armed, go, ARMED_MARKER)


class G3Pool(BaseModel):
    """The shared KV copy: found with a matching manifest (``created`` false, the manifest read) or laid out
    now by ``by`` (its create command's report)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    created: bool
    by: str
    dir: str
    manifest: dict[str, Any] | None = None
    report: str | None = None


class G3NodeRecord(BaseModel):
    """One reader node as the run saw it: its launched process (harness.execute.fanout.NodeRun: rc, pids, when
    it armed and was told to go), what its reader reported (O_DIRECT used or why not, bytes read, completion,
    samples), and the error that failed the node, if any. A node that never started has only ``error``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    node: str | None = None
    rc: int | None = None
    error: str | None = None
    stopped: bool | None = None
    armed_at_s: float | None = None
    go_node_s: float | None = None
    go_written_at_s: float | None = None
    pid: int | None = None
    pgid: int | None = None
    direct_used: bool | None = None
    direct_error: str | None = None
    start_priority: str | None = None
    bytes_read: float | None = None  # the reader's own total (g3series.NodeSeries.total_bytes)
    completed: bool | None = None
    truncated: bool | None = None
    samples: int | None = None
    reader_errors: list[str] = []
    parse_error: str | None = None


class G3Launch(BaseModel):
    """The synchronized start: the reference instant of the go (our clock) and every launch event."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    go_ref_s: float | None = None
    events: list[dict[str, Any]] = []


class G3Aggregate(BaseModel):
    """The aggregate over the common window of the included nodes (harness.parsers.g3series.Aggregate)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    aggregate_read_gb_s: float | None = None
    window_start_s: float | None = None
    window_end_s: float | None = None
    window_s: float = 0.0
    per_node_read_gb_s: dict[str, float] = {}
    fairness_min_max: float | None = None
    nodes: list[str] = []
    reason: str | None = None


class G3Evidence(Evidence, SeriesEvidence):
    """G3's evidence: the port and its line rate, the KV copy, clocks and cache drops, each reader's record,
    the launch, the aggregate over the common window, and every reader's rate over time (the report's
    per-node series chart, drawn against ``nic_line_rate_gb_s``)."""

    readers: list[str] = []
    port: str = ""
    copy_bytes: int = 0
    chunks: int = 0
    chunk_bytes: int = 0
    streams_per_node: int = 0
    block_bytes: int = 0
    policy: dict[str, Any] = {}
    port_rate: dict[str, Any] | None = None
    pool: G3Pool | None = None
    phase_failures: dict[str, dict[str, str]] = {}
    clock_offsets: dict[str, dict[str, Any]] = {}
    clock_alignment: str | None = None
    clock_offset_errors: dict[str, str] = {}
    page_cache_dropped: dict[str, CacheDrop] = {}
    nodes: dict[str, G3NodeRecord] = {}
    failed_nodes: dict[str, str] = {}
    launch: G3Launch | None = None
    aggregate: G3Aggregate | None = None
    start_skew_ms: float | None = None
    start_skew_uncertainty_ms: float | None = None
    start_times_node_clock_s: dict[str, float | None] = {}
    launcher: str = "ssh"
    slurm_job: dict[str, Any] | None = None  # harness.execute.slurm.SlurmJob.record(): job id, nodes, scontrol
    k8s_job: dict[str, Any] | None = None  # kvgate collect (harness.suite.k8s): the Job, its go.json, each pod's record


def evaluate_g3(ev: G3Evidence, series: dict[str, NodeSeries], port: PortRate, policy: FailurePolicy,
                min_window_s: float, offset_uncertainty_s: float, go_ref_s: float | None) -> WorkloadResult:
    """Pure: G3's metrics and validity from every reader's parsed series and the evidence gathered so far
    (``ev.nodes``, ``ev.failed_nodes``, ``ev.page_cache_dropped``); fills in the aggregate, the start skew
    and the per-node rate series the report draws."""
    failed = ev.failed_nodes
    ok_series = {n: s for n, s in series.items() if n not in failed}
    agg = aggregate(ok_series, min_window_s=min_window_s)
    ev.aggregate = G3Aggregate.model_validate(agg.as_dict())
    ev.series = rate_series(series, go_ref_s)
    ev.nic_line_rate_gb_s = port.effective_gbit_s / 8.0
    metrics: dict[str, float] = {"nodes_completed": float(nodes_completed(series))}
    skew = start_skew_s({n: s for n, s in series.items() if s.started_at_s is not None})
    if skew is not None:
        metrics["start_skew_s"] = skew
        ev.start_skew_ms = skew * 1e3
        # Aligned starts are exact only if the applied offsets are: the true skew can be larger by up to
        # twice the largest offset uncertainty (zero where all nodes share one clock, as in the rig).
        ev.start_skew_uncertainty_ms = 2e3 * offset_uncertainty_s
        ev.start_times_node_clock_s = {n: s.started_at_s for n, s in series.items()}
    if agg.aggregate_read_gb_s is not None:
        metrics["aggregate_read_gb_s"] = agg.aggregate_read_gb_s
        metrics["nic_ceiling_ratio"] = nic_ceiling_ratio(agg.aggregate_read_gb_s, port.effective_gbit_s)
    if agg.fairness_min_max is not None:
        metrics["fairness_min_max"] = agg.fairness_min_max
    group = GroupResult({n: NodeOutcome(n, n not in failed, None, failed.get(n)) for n in ev.readers})
    err = policy.verdict_error(group)
    drops = ev.page_cache_dropped
    not_cold = [n for n in ok_series if not _direct(ev, n) and not (n in drops and drops[n].dropped)]
    ev.validity = g3_validity(ev, list(ok_series), not_cold, err)
    if err:
        return WorkloadResult(metrics, ev, error=err)
    if agg.aggregate_read_gb_s is None:
        return WorkloadResult(metrics, ev, invalid_reason=f"no aggregate: {agg.reason}")
    if not_cold:
        return WorkloadResult(metrics, ev, invalid_reason=(
            f"not cold: no O_DIRECT and the page cache was not dropped on {', '.join(not_cold)}"))
    return WorkloadResult(metrics, ev)


def _direct(ev: G3Evidence, node: str) -> bool:
    rec = ev.nodes.get(node)
    return bool(rec is not None and rec.direct_used)


def g3_validity(ev: G3Evidence, included: list[str], not_cold: list[str], policy_error: str | None
                ) -> list[ValidityCheck]:
    """Pure: what G3's aggregate rests on, by :func:`evaluate_g3`'s rules: the readers the failure policy
    requires completed, a common window in which all of them read, and every included reader read cold
    (O_DIRECT, or its page cache dropped)."""
    agg = ev.aggregate
    done = sorted(n for n in ev.readers if n not in ev.failed_nodes)
    ways = []
    for n in sorted(included):
        d = ev.page_cache_dropped.get(n)
        ways.append(f"{n}: " + ("O_DIRECT" if _direct(ev, n) else "page cache dropped" if d is not None and d.dropped
                                else "NEITHER O_DIRECT NOR a dropped page cache"))
    return [
        ValidityCheck(name="nodes", ok=policy_error is None,
                      claim="the readers the failure policy requires read the whole copy",
                      how=policy_error or f"{len(done)} of {len(ev.readers)} reader(s) completed"
                      + (f" (failed: {', '.join(sorted(ev.failed_nodes))})" if ev.failed_nodes else ""),
                      figure="readers completed", value=float(len(done)), unit="count"),
        ValidityCheck(name="common window", ok=agg is not None and agg.aggregate_read_gb_s is not None,
                      claim="every included reader was reading during the window the aggregate is taken over",
                      how=(f"the time-aligned per-node series of {', '.join(agg.nodes) or 'no node'}"
                           + (f": {agg.reason}" if agg.reason else "")) if agg is not None else "no aggregate",
                      figure="common window", value=agg.window_s if agg is not None else None, unit="s"),
        ValidityCheck(name="cold", ok=bool(included) and not not_cold,
                      claim="every reader read the shared copy, not its page cache",
                      how="; ".join(ways) or "no reader's series")]


@register_workload("g3-shared-read")
class G3SharedRead(Workload):
    Params = G3Params
    EvidenceModel = G3Evidence
    METRICS = {
        "aggregate_read_gb_s": "GB/s",
        "nic_ceiling_ratio": "ratio",
        "fairness_min_max": "ratio",
        "nodes_completed": "count",
        "start_skew_s": "s",
    }

    # ---- config-time checks
    def _roles(self, p: G3Params, nodes: dict) -> tuple[str, str, list[str]]:
        port_node, _, nic = p.port.partition(":")
        readers = list(p.readers) if p.readers else [n for n in nodes if n != port_node]
        return port_node, nic, readers

    def validate_against(self, params, nodes):
        issues = []
        port_node, nic, readers = self._roles(params, nodes)
        node = nodes.get(port_node)
        if node is None:
            issues.append((("port",), f"port node {port_node!r} is not among the gate's nodes "
                           f"(expected one of {', '.join(nodes)})"))
        elif not any(n.name == nic for n in node.nics):
            issues.append((("port",), f"node {port_node!r} declares no NIC {nic!r} "
                           f"(declared: {', '.join(n.name for n in node.nics) or 'none'})"))
        if not readers:
            issues.append((("readers",), "no reader nodes (the gate's nodes minus the port node are empty)"))
        for i, r in enumerate(readers):
            rn = nodes.get(r)
            if rn is None:
                issues.append((("readers", i), f"reader {r!r} is not among the gate's nodes"))
                continue
            t = rn.target(params.pool_target)
            if t is None or t.kind != "directory":
                issues.append((("pool_target",), f"node {r!r} has no directory target {params.pool_target!r}"))
        if params.stall_timeout_s < 20 * params.interval_s:
            issues.append((("stall_timeout_s",), f"must be at least 20 x interval_s ({20 * params.interval_s:g} s): "
                           "a reader is silent between samples"))
        if params.create_on and params.create_on not in readers:
            issues.append((("create_on",), f"create_on {params.create_on!r} is not a reader"))
        return issues

    # ---- plan (pure)
    def _reader_argv(self, ctx: GateContext, node, p: G3Params) -> tuple[LaunchSpec, tuple[str, ...]]:
        nd = _node_dir(node, ctx.gate.id)
        spec = _reader_spec(node, p, posixpath.join(nd, "g3_reader.py"), posixpath.join(nd, "armed"),
                            posixpath.join(nd, "go"), posixpath.join(nd, "series.jsonl"))
        return spec, spec.argv

    def _create_argv(self, ctx: GateContext, node, p: G3Params) -> tuple[str, ...]:
        nd = _node_dir(node, ctx.gate.id)
        return ("python3", posixpath.join(nd, "g3_reader.py"), "create", "--pool-dir", _pool_dir(node, p),
                "--manifest-json", json.dumps(manifest_for(p), separators=(",", ":")),
                "--block-bytes", str(p.block_bytes))

    def plan(self, ctx: GateContext) -> list[PlannedStep]:
        p: G3Params = ctx.params
        if p.launcher == "slurm":
            return self._plan_slurm(ctx, p)
        port_node, nic, readers = self._roles(p, ctx.nodes)
        creator = ctx.nodes[p.create_on or readers[0]]
        out = [PlannedStep(port_node, f"line rate of {nic} (cross-check)", ("cat", f"/sys/class/net/{nic}/speed")),
               PlannedStep(port_node, f"shaping of {nic} (cross-check)", ("tc", "-j", "qdisc", "show", "dev", nic))]
        for r in readers:  # the reader program goes into this directory (a file copy, not a command)
            out.append(PlannedStep(r, "create the node's directory for kvgate's reader",
                                   ("mkdir", "-p", _node_dir(ctx.nodes[r], ctx.gate.id))))
        manifest = posixpath.join(_pool_dir(creator, p), MANIFEST)
        out.append(PlannedStep(creator.name, "the KV copy's manifest, if one is there", ("cat", manifest)))
        out.append(PlannedStep(creator.name, f"lay out the KV copy ({p.chunks} chunk files, {p.copy_bytes} bytes) "
                               f"in {_pool_dir(creator, p)} unless its manifest matches",
                               self._create_argv(ctx, creator, p), optional=True))
        for r in readers:
            node = ctx.nodes[r]
            out.append(PlannedStep(r, f"measure clock offset: one command, {p.clock_samples} round trips over its "
                                   "open stdin (a newline in, the node's time out)", CLOCK_SESSION_ARGV))
            if p.drop_caches:
                out.append(PlannedStep(r, "drop the page cache (recorded)", DROP_CACHES_ARGV))
            spec, _ = self._reader_argv(ctx, node, p)
            out.append(PlannedStep(r, "armed reader (a stale go/armed file removed first): opens every file, "
                                   "waits for the common start", spec.command()))
        return out

    # ---- the slurm launcher: nothing is sent to a node but through Slurm, from the control host
    def _cluster(self, ctx: GateContext) -> SlurmCluster:
        if ctx.slurm is None:
            raise WorkloadError("launcher slurm: the inventory names no `slurm:` cluster")
        return SlurmCluster.from_config(ctx.slurm)

    def _slurm_paths(self, ctx: GateContext, p: G3Params) -> tuple[SlurmCluster, str]:
        cluster = self._cluster(ctx)
        run_id = ctx.gate_dir.parent.parent.name or "<run>"  # a plan has no run directory yet
        return cluster, job_dir_for(cluster, run_id, ctx.gate.id)

    def _slurm_one(self, cluster: SlurmCluster, node: str, argv: tuple[str, ...], time_s: float) -> tuple[str, ...]:
        return srun_command(cluster, "kvgate-g3-pool", node, time_s, argv)

    def _slurm_reader_spec(self, job_dir: str, node, ctx: GateContext, p: G3Params) -> LaunchSpec:
        nd = posixpath.join(job_dir, node.name)
        return _reader_spec(node, p, posixpath.join(job_dir, "g3_reader.py"), nd + ".armed", nd + ".go",
                            nd + ".series.jsonl")

    def _plan_slurm(self, ctx: GateContext, p: G3Params) -> list[PlannedStep]:
        port_node, nic, readers = self._roles(p, ctx.nodes)
        cluster, job_dir = self._slurm_paths(ctx, p)
        creator = ctx.nodes[p.create_on or readers[0]]
        out = [PlannedStep(port_node, f"line rate of {nic} (cross-check)", ("cat", f"/sys/class/net/{nic}/speed")),
               PlannedStep(port_node, f"shaping of {nic} (cross-check)", ("tc", "-j", "qdisc", "show", "dev", nic))]
        out.append(PlannedStep("control", "the readers' node states (a drained, down or absent node fails there)",
                               sinfo_argv(readers)))
        manifest = posixpath.join(_pool_dir(creator, p), MANIFEST)
        out.append(PlannedStep("control", f"the KV copy's manifest on {creator.name}, if one is there (srun)",
                               self._slurm_one(cluster, creator.name, ("cat", manifest), 300)))
        create = self._create_argv(ctx, creator, p)
        create = create[:1] + (posixpath.join(job_dir, "g3_reader.py"),) + create[2:]
        out.append(PlannedStep("control", f"lay out the KV copy on {creator.name} unless its manifest matches (srun)",
                               self._slurm_one(cluster, creator.name, create, max(600.0, p.copy_bytes / 10e6)),
                               optional=True))
        out.append(PlannedStep("control", f"one job step, a task per reader ({', '.join(readers)}): each drops its "
                               "page cache (recorded), arms its reader, waits for the common start in the job's files",
                               srun_argv(cluster, f"kvgate-{ctx.gate.id}", readers,
                                         p.arm_timeout_s + p.read_timeout_s + cluster.time_margin_s, job_dir)))
        out.append(PlannedStep("control", "the job's record", ("scontrol", "show", "job", "<job id>")))
        out.append(PlannedStep("control", "cancel what still runs of the job (timeout, Ctrl-C, a stopped node)",
                               ("scancel", "<job id>"), optional=True))
        return out

    def _run_slurm(self, ctx: GateContext, p: G3Params, port_node: str, nic: str, readers: list[str],
                   policy: FailurePolicy, ev: G3Evidence) -> WorkloadResult:
        """G3 through Slurm: the same phases, the KV copy laid out by a one-task step, the readers armed and
        released by one job step (harness.execute.slurm), the same evaluation. Clocks: the cluster's nodes are
        taken as synchronized (no per-node session to measure an offset over); recorded."""
        nodes_dir = ctx.gate_dir / "nodes"
        nodes_dir.mkdir(parents=True, exist_ok=True)
        cluster, job_dir = self._slurm_paths(ctx, p)
        control = LocalTransport(name="control")
        ev.launcher = "slurm"
        port = self._port_rate(ctx, port_node, nic)

        env = dict(cluster.env) or None
        r = ctx.steps.run(control, "sinfo", sinfo_argv(readers), timeout_s=30, env=env)
        if not r.ok:
            raise WorkloadError(f"slurm: the readers' node states could not be read: {r.summary()}")
        bad = unusable_nodes(parse_sinfo_nodes(r.stdout), readers)
        self._check_policy(GroupResult({n: NodeOutcome(n, n not in bad, None, bad.get(n)) for n in readers}),
                           policy, "slurm node states", ev)
        readers = [n for n in readers if n not in bad]
        Path(job_dir).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(program_path("g3_reader.py"), posixpath.join(job_dir, "g3_reader.py"))
        creator = p.create_on or readers[0]
        node = ctx.nodes[creator]
        r = ctx.steps.run(control, "pool-manifest", self._slurm_one(
            cluster, creator, ("cat", posixpath.join(_pool_dir(node, p), MANIFEST)), 300), timeout_s=360, env=env)
        have = None
        if r.ok:
            try:
                have = json.loads(r.stdout)
            except json.JSONDecodeError:
                have = None
        want = manifest_for(p)
        if isinstance(have, dict) and all(have.get(k) == v for k, v in want.items()):
            ev.pool = G3Pool(created=False, by=creator, dir=_pool_dir(node, p), manifest=have)
        else:
            create = self._create_argv(ctx, node, p)
            create = create[:1] + (posixpath.join(job_dir, "g3_reader.py"),) + create[2:]
            t = max(600.0, p.copy_bytes / 10e6)
            r = ctx.steps.run(control, "pool-create", self._slurm_one(cluster, creator, create, t),
                              timeout_s=t + 60, env=env)
            if not r.ok:
                raise WorkloadError(f"creating the KV copy on {creator} through srun failed: {r.summary()}")
            ev.pool = G3Pool(created=True, by=creator, dir=_pool_dir(node, p), report=r.stdout.strip())

        applied = {n: 0.0 for n in readers}
        ev.clock_alignment = "assume_synced"
        ev.clock_offsets = {n: {"applied_s": 0.0, "how": "slurm: cluster clocks taken as synchronized"}
                            for n in readers}
        specs = {n: self._slurm_reader_spec(job_dir, ctx.nodes[n], ctx, p) for n in readers}
        job = SlurmJob(ctx.steps, control, cluster, job_dir, f"kvgate-{ctx.gate.id}", readers,
                       p.arm_timeout_s + p.read_timeout_s + cluster.time_margin_s, drop_caches=p.drop_caches,
                       cancel=ctx.cancel, progress=ctx.progress)
        launch = SynchronizedLaunch(job.transports(), specs, applied, policy, log_dir=ctx.gate_dir)
        with job:
            self._arm_release_wait(ctx, p, launch, policy, len(readers))
        ev.slurm_job = job.record()
        if p.drop_caches:
            ev.page_cache_dropped = {n: CacheDrop.model_validate(t["cache_drop"])
                                     for n, t in job.provenance().items() if t.get("cache_drop") is not None}
        return self._collect(ctx, p, ev.readers, launch, applied, bad, {}, 0.0, port, policy, ev)

    # ---- run
    def run(self, ctx: GateContext) -> WorkloadResult:
        p: G3Params = ctx.params
        port_node, nic, readers = self._roles(p, ctx.nodes)
        policy = FailurePolicy(p.max_failed_share, p.on_node_failure)
        ev = G3Evidence(readers=readers, port=p.port, copy_bytes=p.copy_bytes, chunks=p.chunks,
                        chunk_bytes=p.chunk_bytes, streams_per_node=p.streams, block_bytes=p.block_bytes,
                        policy=vars(policy))
        try:
            if p.launcher == "slurm":
                return self._run_slurm(ctx, p, port_node, nic, readers, policy, ev)
            return self._run(ctx, p, port_node, nic, readers, policy, ev)
        except WorkloadError as exc:  # a phase failed beyond the policy: what was gathered stays evidence
            return WorkloadResult(evidence=ev, error=str(exc))

    def _run(self, ctx: GateContext, p: G3Params, port_node: str, nic: str, readers: list[str],
             policy: FailurePolicy, ev: G3Evidence) -> WorkloadResult:
        nodes_dir = ctx.gate_dir / "nodes"
        nodes_dir.mkdir(parents=True, exist_ok=True)
        tr = {r: ctx.transports[r] for r in readers}

        # 1. The port's line rate: declared, cross-checked where the port's node lets us read it.
        port = self._port_rate(ctx, port_node, nic)
        ev.port_rate = vars(port) | {"notes": list(port.notes)}

        # 2. Reader script on every node (a node failing here is a node failure like any other).
        def prepare(name: str, t):
            nd = _node_dir(ctx.nodes[name], ctx.gate.id)
            r = ctx.steps.run(t, "mkdir", ("mkdir", "-p", nd), timeout_s=30)
            if not r.ok:
                raise WorkloadError(r.summary())
            t.put(program_path("g3_reader.py"), posixpath.join(nd, "g3_reader.py"))
            return nd

        prep = fan_out(tr, prepare)
        self._check_policy(prep, policy, "preparing nodes", ev)

        # 3. The KV copy, once.
        creator = p.create_on or next(r for r in readers if r in prep.succeeded)
        ev.pool = self._ensure_copy(ctx, creator, p)

        live = {r: tr[r] for r in prep.succeeded}
        # 4. Clock offsets, cold caches.
        t_phase = time.monotonic()
        offs = measure_clock_offsets(live, samples=p.clock_samples, timeout_s=p.clock_probe_timeout_s)
        ctx.progress(f"{ctx.gate.id}: clock offsets of {len(offs.succeeded)}/{len(live)} nodes in "
                     f"{time.monotonic() - t_phase:.1f} s")
        applied = {n: applied_offset_s(o, p.clock_alignment) for n, o in offs.succeeded.items()}
        ev.clock_offsets = {n: vars(o) | {"applied_s": applied[n]} for n, o in offs.succeeded.items()}
        ev.clock_alignment = p.clock_alignment
        ev.clock_offset_errors = offs.failed
        live = {r: live[r] for r in offs.succeeded}
        if p.drop_caches:
            t_phase = time.monotonic()
            drops = fan_out(live, lambda _n, t: drop_caches(ctx, t, timeout_s=120))
            ev.page_cache_dropped = {n: o.value if o.ok else CacheDrop(dropped=False, error=o.error)
                                     for n, o in drops.items()}
            ctx.progress(f"{ctx.gate.id}: page cache dropped on {len(drops.succeeded)}/{len(live)} nodes in "
                         f"{time.monotonic() - t_phase:.1f} s")

        # 5. Arm, release together, wait.
        specs = {r: self._reader_argv(ctx, ctx.nodes[r], p)[0] for r in live}
        launch = SynchronizedLaunch(live, specs, applied, policy, log_dir=ctx.gate_dir)
        self._arm_release_wait(ctx, p, launch, policy, len(live))
        uncertainty = max((o.uncertainty_s for o in offs.succeeded.values()), default=0.0)
        return self._collect(ctx, p, readers, launch, applied, prep.failed, offs.failed, uncertainty, port, policy,
                             ev)

    def _port_rate(self, ctx: GateContext, port_node: str, nic: str) -> PortRate:
        declared = next(n.line_rate_gbit_s for n in ctx.nodes[port_node].nics if n.name == nic)
        pt = ctx.transports.get(port_node)
        speed = tcj = None
        if pt is not None:
            r = ctx.steps.run(pt, "port-speed", ("cat", f"/sys/class/net/{nic}/speed"), timeout_s=30)
            speed = r.stdout if r.ok else None
            r = ctx.steps.run(pt, "port-qdisc", ("tc", "-j", "qdisc", "show", "dev", nic), timeout_s=30)
            tcj = r.stdout if r.ok else None
        return cross_check_port_rate(declared, speed, tcj)

    def _arm_release_wait(self, ctx: GateContext, p: G3Params, launch: SynchronizedLaunch, policy: FailurePolicy,
                          n: int) -> None:
        with launch:
            ctx.progress(f"{ctx.gate.id}: arming readers on {n} nodes")
            t_phase = time.monotonic()
            armed = launch.arm(timeout_s=p.arm_timeout_s)
            ctx.progress(f"{ctx.gate.id}: {len(armed.succeeded)}/{n} armed in {time.monotonic() - t_phase:.1f} s")
            if not policy.tolerates(armed) or not armed.succeeded:
                launch.stop_all("arming failed beyond the failure policy")
            else:
                go = launch.release()
                ctx.progress(f"{ctx.gate.id}: released at {go:.3f}; reading {p.copy_bytes / 1e9:.3f} GB per node")
                launch.wait(timeout_s=p.read_timeout_s, stall_timeout_s=p.stall_timeout_s)

    def _collect(self, ctx: GateContext, p: G3Params, readers: list[str], launch: SynchronizedLaunch,
                 applied: dict[str, float], prep_failed: dict[str, str], offs_failed: dict[str, str],
                 uncertainty: float, port: PortRate, policy: FailurePolicy, ev: G3Evidence) -> WorkloadResult:
        # 6. Per-node raw series (partial ones too), parsed.
        nodes_dir = ctx.gate_dir / "nodes"
        ev.port_rate = vars(port) | {"notes": list(port.notes)}
        series: dict[str, NodeSeries] = {}
        node_ev: dict[str, G3NodeRecord] = {}
        failed: dict[str, str] = {}
        for name in readers:
            run = launch.runs.get(name)
            if run is None:
                failed[name] = (prep_failed.get(name) or offs_failed.get(name) or "not started")
                node_ev[name] = G3NodeRecord(error=failed[name])
                continue
            ndir = nodes_dir / name
            ndir.mkdir(parents=True, exist_ok=True)
            write_gate_file(ndir / "reader.jsonl", run.stdout)
            write_gate_file(ndir / "reader.stderr", run.stderr)
            info: dict[str, Any] = run.as_dict()
            try:
                out = parse_reader_output(run.stdout, name, applied[name],
                                          source=str(ndir / "reader.jsonl"))
                info.update(direct_used=out.armed.get("direct_used"), direct_error=out.armed.get("direct_error"),
                            start_priority=out.start.get("start_priority"),
                            bytes_read=out.series.total_bytes, completed=out.series.completed,
                            truncated=out.truncated, samples=len(out.series.intervals), reader_errors=list(out.errors))
                series[name] = out.series
            except Exception as exc:  # noqa: BLE001 - unparseable output is that node's failure
                info["parse_error"] = str(exc)
                run.error = run.error or f"reader output unparseable: {exc}"
            if run.error is None and not info.get("completed"):
                run.error = "reader did not complete: " + "; ".join(info.get("reader_errors") or ["no end record"])
            if run.error:
                failed[name] = run.error
            info["error"] = run.error
            node_ev[name] = G3NodeRecord.model_validate(info)
        ev.nodes = node_ev
        ev.failed_nodes = failed
        ev.launch = G3Launch(go_ref_s=launch.go_ref_s, events=launch.events)
        result = evaluate_g3(ev, series, port, policy, p.min_window_s, uncertainty, launch.go_ref_s)
        write_summary(ctx.gate_dir, "g3.json", result)
        return result

    def _check_policy(self, group: GroupResult, policy: FailurePolicy, what: str, ev: G3Evidence) -> None:
        ev.phase_failures = {**ev.phase_failures, what: group.failed}
        err = policy.verdict_error(group)
        if err or not group.succeeded:
            raise WorkloadError(f"{what}: {err or group.summary()}")

    def _ensure_copy(self, ctx: GateContext, creator: str, p: G3Params) -> G3Pool:
        node = ctx.nodes[creator]
        t = ctx.transports[creator]
        pool = _pool_dir(node, p)
        want = manifest_for(p)
        r = ctx.steps.run(t, "pool-manifest", ("cat", posixpath.join(pool, MANIFEST)), timeout_s=60)
        if r.ok:
            try:
                have = json.loads(r.stdout)
                if all(have.get(k) == v for k, v in want.items()):
                    return G3Pool(created=False, by=creator, dir=pool, manifest=have)
            except json.JSONDecodeError:
                pass
        ctx.progress(f"{ctx.gate.id}: laying out the KV copy on {creator}: {p.chunks} x {p.chunk_bytes} bytes in {pool}")
        r = ctx.steps.run(t, "pool-create", self._create_argv(ctx, node, p),
                          timeout_s=max(600.0, p.copy_bytes / 10e6))
        if not r.ok:
            raise WorkloadError(f"creating the KV copy on {creator} failed: {r.summary()}")
        return G3Pool(created=True, by=creator, dir=pool, report=r.stdout.strip())

