"""G3: N nodes read back one shared KV copy at once, through one port; how close to its line rate?

The KV copy is a file set laid out as an LMCache fs:// pool would hold it (one file per chunk, named
`<fmt>@<model>@<world_size>@<worker>@<hash>.data`, each a 28-byte metadata header plus
chunk_tokens x kv_bytes_per_token bytes), created once in the shared pool by one node. Every reader node
reads the whole copy cold (page cache dropped, recorded; O_DIRECT where the mount allows, recorded),
started together with a measured skew, and reports a per-interval series. The aggregate is taken over the
time-aligned window in which all nodes were reading.

Isolation (``writer:``): the same readers read the copy twice, alone and then while one further node writes to
the shared store through the same port for the whole of their read (the reader program in write mode, its
bytes counted per interval); the gate reports both aggregates and the readers' loss (docs/g3.md, "Isolation").
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..errors import HarnessError
from .kit.rederive import one_step_output
from ..parsers.g3series import port_rate
from ..safeio import read_text
from ..errors import WorkloadError
from ..execute.clock import CLOCK_SESSION_ARGV, applied_offset_s, measure_clock_offsets
from ..execute.fanout import FailurePolicy, GroupResult, LaunchSpec, NodeOutcome, SynchronizedLaunch, fan_out
from ..execute.slurm import (SlurmCluster, SlurmJob, job_dir_for, parse_sinfo_nodes, sinfo_argv, srun_argv,
                             srun_command, time_limit_arg, unusable_nodes)
from ..transport.local import LocalTransport
from ..node import program_path
from ..parsers.g3series import (GB, NodeSeries, PortRate, TimeFrame, active_span, aggregate, bytes_in_window,
                                cross_check_port_rate, longest_idle_s, nic_ceiling_ratio, nodes_completed,
                                parse_reader_output, rate_series, self_report_problems, start_skew_s)
from ..units import parse_size_bytes
from .kit.base import (DROP_CACHES_ARGV, CacheDrop, Evidence, GateContext, PlannedStep, SeriesEvidence, StrictModel,
                   ValidityCheck, Workload, WorkloadResult, drop_caches, register_workload, target_path, write_summary,
                   write_gate_file)

LMCACHE_HEADER_BYTES = 28  # LMCache's fs connector: RemoteMetadata before each chunk's bytes
MANIFEST = "kvgate-manifest.json"
WITH_WRITER = "-with-writer"  # the suffix of the readers' files in the isolation read
# The reader's armed record as it prints it (compact JSON, type first): arming is seen in the stream.
ARMED_MARKER = b'{"type":"armed"'


class G3Writer(StrictModel):
    """G3's isolation writer: one gate node, not a reader, that writes files to the shared store (through the
    same port) from the readers' common start until they are done; its bytes are counted per interval."""

    node: str
    block_bytes: int = Field(default=4 << 20, alias="block")
    file_bytes: int = Field(default=32 << 20, alias="file")
    files: int = Field(default=8, ge=1, le=100_000)  # names cycled: the disk used is at most files x file
    streams: int = Field(default=2, ge=1, le=256)
    direct: Literal["auto", "on", "off"] = "auto"
    subdir: str = "kvgate-g3-writes"  # under the writer's pool target; removed after the run
    # The readers' window may hold no stretch this long without a written byte (else INVALID).
    max_idle_s: float = Field(default=2.0, gt=0)
    # The writer must write at least this share of the port's ceiling inside the readers' window, else the
    # readers' loss is not judged (INVALID): 4 KiB every 1.9 s is not a writer contending for the port.
    min_write_share: float = Field(default=0.05, gt=0, le=1)

    @field_validator("block_bytes", mode="before")
    @classmethod
    def _block(cls, v: Any) -> int:
        return parse_size_bytes(v, multiple_of=4096, what="block")

    @field_validator("file_bytes", mode="before")
    @classmethod
    def _file(cls, v: Any) -> int:
        return parse_size_bytes(v, multiple_of=4096, what="file")


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
    # Isolation: the readers read alone, then again while this node writes through the same port.
    writer: G3Writer | None = None
    # Physics: the declared line rate and the one the port's node reports (sysfs, a root tbf) may differ by
    # this share (else INVALID); the aggregate may exceed the port's ceiling by this share, for counter timing
    # (a sample's edges, a shaper's burst), and no more (else INVALID: no port carries more than its rate).
    port_rate_tolerance: float = Field(default=0.02, ge=0, le=0.5)
    line_rate_tolerance: float = Field(default=0.02, ge=0, le=0.5)
    # Self-reported runs (k8s, slurm): the readers' times may lie this far outside the frame kvgate knows
    # (render or submission .. collect or the job's end), for the clocks assumed in sync.
    clock_slack_s: float = Field(default=60.0, ge=0)

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


@dataclass(frozen=True)
class G3Bounds:
    """The physical bounds G3's evaluator holds a run to (G3Params: ``line_rate_tolerance``,
    ``writer.min_write_share``); the same from a bundle's config/gates.yaml when ``kvgate report`` re-derives."""

    line_rate_tolerance: float = 0.02
    min_write_share: float = 0.05

    @classmethod
    def of(cls, p: "G3Params") -> "G3Bounds":
        return cls(p.line_rate_tolerance, p.writer.min_write_share if p.writer else 0.05)


def _pool_dir(node, p: G3Params) -> str:
    return posixpath.join(target_path(node, node.target(p.pool_target)), p.pool_subdir)


def _node_dir(node, gate_id: str) -> str:
    # Per node even when nodes share a filesystem (the rig's nodes share /tmp).
    return posixpath.join(node.work_dir, f"g3-{gate_id}-{node.name}")


def _writes_dir(node, p: G3Params) -> str:
    return posixpath.join(target_path(node, node.target(p.pool_target)), p.writer.subdir, node.name)


def _writer_spec(node, p: G3Params, program: str, nd: str) -> tuple[LaunchSpec, str]:
    """The armed writer of the isolation phase, and the node-side stop file that ends its writing."""
    w = p.writer
    armed, go, stop = (posixpath.join(nd, f) for f in ("armed-writer", "go-writer", "stop-writer"))
    argv = ("python3", program, "write", "--dir", _writes_dir(node, p), "--node", node.name,
            "--file-bytes", str(w.file_bytes), "--files", str(w.files), "--block-bytes", str(w.block_bytes),
            "--streams", str(w.streams), "--direct", w.direct, "--interval-s", str(p.interval_s),
            "--armed-file", armed, "--go-file", go, "--stop-file", stop,
            "--out", posixpath.join(nd, "writer.jsonl"), "--deadline-s", str(p.arm_timeout_s + p.read_timeout_s + 60))
    return LaunchSpec(argv, armed, go, ARMED_MARKER), stop


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


class G3Process(BaseModel):
    """A launched G3 program as the run saw it (harness.execute.fanout.NodeRun: rc, pids, when it armed and was
    told to go) and the error that failed its node, if any. A node that never started has only ``error``."""

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


class G3NodeRecord(G3Process):
    """One reader node as the run saw it: its process, and what its reader reported (O_DIRECT used or why not,
    bytes read, completion, samples)."""

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


class G3WriterRecord(G3Process):
    """The isolation writer as the run saw it: its process, what it wrote, and what of that fell inside the
    readers' common window of the with-writer read (reference clock)."""

    dir: str | None = None
    direct_used: bool | None = None
    direct_error: str | None = None
    bytes_written: float | None = None  # the writer's own total
    completed: bool | None = None  # stopped on the stop file, no write failed
    truncated: bool | None = None
    samples: int | None = None
    writer_errors: list[str] = []
    parse_error: str | None = None
    active_s: float | None = None  # first to last byte-carrying interval
    write_gb_s: float | None = None  # bytes_written over active_s
    window_bytes: float | None = None  # written inside the readers' common window
    window_write_gb_s: float | None = None
    longest_idle_s: float | None = None  # inside the readers' window


class G3Isolation(BaseModel):
    """The isolation run: the readers' second read with the writer, compared with their first, alone; both
    aggregates over the readers that completed both reads."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    writer: str
    order: list[str] = ["alone", "with_writer"]
    alone: G3Aggregate | None = None
    with_writer: G3Aggregate | None = None
    readers_loss: float | None = None  # 1 - with_writer / alone, aggregate
    per_node_loss: dict[str, float] = {}
    compared: list[str] = []
    reason: str | None = None  # why there is no loss
    nodes: dict[str, G3NodeRecord] = {}  # the readers in the with-writer read
    failed_nodes: dict[str, str] = {}
    page_cache_dropped: dict[str, CacheDrop] = {}
    writer_record: G3WriterRecord | None = None
    launch: G3Launch | None = None
    series: dict[str, list[tuple[float, float]]] = {}  # readers' and writer's rate (GB/s) over time, from the go


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
    # Self-reported runs (k8s, slurm): when the run can have happened, by clocks kvgate trusts (parsers.g3series
    # .TimeFrame: not_before_s, not_after_s, max_duration_s, slack_s)
    time_frame: dict[str, float] | None = None
    isolation: G3Isolation | None = None


def evaluate_g3(ev: G3Evidence, series: dict[str, NodeSeries], port: PortRate, policy: FailurePolicy,
                min_window_s: float, offset_uncertainty_s: float, go_ref_s: float | None,
                with_writer: dict[str, NodeSeries] | None = None, writer: NodeSeries | None = None,
                max_idle_s: float = 2.0, bounds: G3Bounds = G3Bounds()) -> WorkloadResult:
    """Pure: G3's metrics and validity from every reader's parsed series and the evidence gathered so far
    (``ev.nodes``, ``ev.failed_nodes``, ``ev.page_cache_dropped``); fills in the aggregate, the start skew
    and the per-node rate series the report draws. With ``ev.isolation`` (a writer): also the readers' second
    read (``with_writer``) and the writer's series, judged by :func:`evaluate_isolation`. Physics (``bounds``):
    INVALID when the port's declared and measured rates differ beyond their tolerance, when the aggregate
    exceeds the port's ceiling (min(declared, measured)) by more than ``line_rate_tolerance``, when a
    self-reported run (k8s, slurm) holds an impossible time or byte count, and, with a writer, when the writer
    wrote less than ``min_write_share`` of the port's ceiling."""
    res = _evaluate_alone(ev, series, port, policy, min_window_s, offset_uncertainty_s, go_ref_s, bounds)
    if ev.isolation is None:
        return res
    metrics, checks, error, invalid = evaluate_isolation(ev, series, with_writer or {}, writer, policy,
                                                         min_window_s, max_idle_s, bounds.min_write_share)
    ev.validity = [*ev.validity, *checks]
    return WorkloadResult({**res.metrics, **metrics}, ev, error=res.error or error,
                          invalid_reason=None if res.error or error else res.invalid_reason or invalid)


def _readers_loss(a: Any, w: Any, both: list[str]) -> tuple[float | None, dict[str, float] | None, str | None]:
    """Pure: (the readers' loss with the writer against alone, per node, or why there is none) from the two
    aggregates over the same readers."""
    if a.aggregate_read_gb_s is None or w.aggregate_read_gb_s is None:
        return None, None, (f"no {'alone' if a.aggregate_read_gb_s is None else 'with-writer'} aggregate: "
                            f"{(a if a.aggregate_read_gb_s is None else w).reason}")
    if a.aggregate_read_gb_s <= 0:
        return None, None, "the readers read nothing alone"
    per_node = {n: 1.0 - w.per_node_read_gb_s[n] / a.per_node_read_gb_s[n] for n in both if a.per_node_read_gb_s.get(n)}
    return 1.0 - w.aggregate_read_gb_s / a.aggregate_read_gb_s, per_node, None


def _writer_in_window(rec: G3WriterRecord, writer: NodeSeries | None, w: Any, max_idle_s: float
                      ) -> tuple[G3WriterRecord, bool | None]:
    """Pure: the writer's record with what it wrote inside the readers' with-writer window ``w`` (bytes, rate,
    longest idle stretch), and whether it wrote through it (None: nothing to check against)."""
    if writer is None or w.window_start_s is None or w.window_end_s is None:
        return rec, None
    ivs = writer.aligned()
    span = active_span(ivs)
    wb = bytes_in_window(ivs, w.window_start_s, w.window_end_s)
    idle = longest_idle_s(ivs, w.window_start_s, w.window_end_s)
    active = span[1] - span[0] if span else 0.0
    rec = rec.model_copy(update=dict(
        active_s=active, write_gb_s=(writer.total_bytes or 0.0) / active / GB if active > 0 else None,
        window_bytes=wb, window_write_gb_s=wb / w.window_s / GB if w.window_s > 0 else None, longest_idle_s=idle))
    return rec, wb > 0 and idle <= max_idle_s


def evaluate_isolation(ev: G3Evidence, alone: dict[str, NodeSeries], with_writer: dict[str, NodeSeries],
                       writer: NodeSeries | None, policy: FailurePolicy, min_window_s: float, max_idle_s: float,
                       min_write_share: float = 0.05
                       ) -> tuple[dict[str, float], list[ValidityCheck], str | None, str | None]:
    """Pure: the isolation run's metrics, validity, error and invalid reason. The readers' loss compares the two
    reads over the readers that completed both (each read's own common window); the writer must have written
    inside the with-writer window with no idle stretch over ``max_idle_s`` and at least ``min_write_share`` of
    the port's ceiling (``ev.nic_line_rate_gb_s``), else the comparison is INVALID."""
    iso = ev.isolation
    failed = {**ev.failed_nodes, **iso.failed_nodes}
    both = [n for n in ev.readers if n not in failed and n in alone and n in with_writer]
    a = aggregate({n: alone[n] for n in both}, min_window_s=min_window_s)
    w = aggregate({n: with_writer[n] for n in both}, min_window_s=min_window_s)
    metrics: dict[str, float] = {"nodes_completed_with_writer": float(nodes_completed(with_writer))}
    if w.aggregate_read_gb_s is not None:
        metrics["aggregate_read_gb_s_with_writer"] = w.aggregate_read_gb_s
    loss, per_node, reason = _readers_loss(a, w, both)
    if loss is not None:
        metrics["readers_loss"] = loss
    rec, wrote = _writer_in_window(iso.writer_record or G3WriterRecord(node=iso.writer, error="not started"),
                                   writer, w, max_idle_s)
    if wrote is not None and rec.window_write_gb_s is not None:  # measured in this window
        metrics["writer_write_gb_s"] = rec.window_write_gb_s
    series = dict(with_writer)
    if writer is not None:
        series[f"{iso.writer} (writer)"] = writer
    ev.isolation = iso.model_copy(update=dict(
        alone=G3Aggregate.model_validate(a.as_dict()), with_writer=G3Aggregate.model_validate(w.as_dict()),
        readers_loss=loss, per_node_loss=per_node or {}, compared=both, reason=reason, writer_record=rec,
        series=rate_series(series, iso.launch.go_ref_s if iso.launch else None)))
    group = GroupResult({n: NodeOutcome(n, n not in failed, None, failed.get(n)) for n in ev.readers})
    error = policy.verdict_error(group)
    drops = iso.page_cache_dropped
    not_cold = [n for n in with_writer if n not in failed and not (iso.nodes.get(n) and iso.nodes[n].direct_used)
                and not (n in drops and drops[n].dropped)]
    why, wrote_check = _writer_check(iso.writer, rec, wrote, w.window_s, max_idle_s, min_write_share,
                                     ev.nic_line_rate_gb_s)
    checks = [
        wrote_check,
        ValidityCheck(name="comparison", ok=loss is not None,
                      claim="the same readers read alone and with the writer, each in a common window",
                      how=reason or (f"{', '.join(both)}: {a.aggregate_read_gb_s:.4f} GB/s alone over {a.window_s:.2f} s,"
                                     f" {w.aggregate_read_gb_s:.4f} GB/s with the writer over {w.window_s:.2f} s"),
                      figure="readers' loss", value=loss, unit="ratio"),
        ValidityCheck(name="cold (with writer)", ok=bool(with_writer) and not not_cold,
                      claim="every reader's second read came from the shared copy, not its page cache",
                      how=("not cold on " + ", ".join(not_cold)) if not_cold else
                      "O_DIRECT or the page cache dropped again on every reader")]
    reported_error, invalid = _isolation_verdict(error, why, loss, reason, not_cold)
    return metrics, checks, reported_error, invalid


def _writer_check(writer: str, rec: G3WriterRecord, wrote: bool | None, window_s: float, max_idle_s: float,
                  min_write_share: float, nic_line_rate_gb_s: float | None) -> tuple[str | None, ValidityCheck]:
    """Pure: why the writer does not make the isolation run a comparison (failed, wrote nothing checkable, not
    through the readers' window, or below ``min_write_share`` of the port's line rate), None when it does, and
    the validity check saying so."""
    min_gb_s = min_write_share * nic_line_rate_gb_s if nic_line_rate_gb_s else None
    slow = (wrote and min_gb_s is not None and (rec.window_write_gb_s or 0.0) < min_gb_s)
    if rec.error:
        why = f"the writer {writer} failed: {rec.error}"
    elif wrote is None:
        why = f"the writer {writer} wrote nothing the readers' window can be checked against"
    elif not wrote:
        why = (f"the writer {writer} did not write through the readers' window: {rec.window_bytes:.0f} bytes in "
               f"its {window_s:.2f} s, longest idle stretch {rec.longest_idle_s:.2f} s (bound {max_idle_s:g} s)")
    elif slow:
        why = (f"the writer {writer} wrote {rec.window_write_gb_s:.6f} GB/s in the readers' window, below its "
               f"stated minimum {min_gb_s:.6f} GB/s (min_write_share {min_write_share:g} of the port's "
               f"{nic_line_rate_gb_s:.6g} GB/s): not a writer contending for the port, its loss is not judged")
    else:
        why = None
    return why, ValidityCheck(
        name="writer wrote", ok=why is None,
        claim=f"the writer {writer} wrote through the same port for the whole with-writer window",
        how=why or (f"{rec.window_bytes / 1e6:.1f} MB written in the readers' {window_s:.2f} s window "
                    f"({rec.window_write_gb_s:.3f} GB/s"
                    + (f", at least {min_gb_s:.4f} GB/s stated" if min_gb_s is not None else "")
                    + f"), longest idle stretch {rec.longest_idle_s:.2f} s (bound {max_idle_s:g} s)"),
        figure="longest writer idle", value=rec.longest_idle_s, unit="s")


def _isolation_verdict(error: str | None, why: str | None, loss: float | None, reason: str | None,
                       not_cold: list[str]) -> tuple[str | None, str | None]:
    """Pure: the isolation run's (error, invalid reason), first that applies: the readers' failure beyond the
    policy, the writer's reason, no loss to report, a reader not cold."""
    if error:
        return f"with the writer: {error}", None
    if why:
        return None, why
    if loss is None:
        return None, f"no readers' loss: {reason}"
    if not_cold:
        return None, f"not cold with the writer: {', '.join(not_cold)}"
    return None, None


def _evaluate_alone(ev: G3Evidence, series: dict[str, NodeSeries], port: PortRate, policy: FailurePolicy,
                    min_window_s: float, offset_uncertainty_s: float, go_ref_s: float | None,
                    bounds: G3Bounds = G3Bounds()) -> WorkloadResult:
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
    ratio = None
    if agg.aggregate_read_gb_s is not None:
        metrics["aggregate_read_gb_s"] = agg.aggregate_read_gb_s
        ratio = metrics["nic_ceiling_ratio"] = nic_ceiling_ratio(agg.aggregate_read_gb_s, port.effective_gbit_s)
    if agg.fairness_min_max is not None:
        metrics["fairness_min_max"] = agg.fairness_min_max
    group = GroupResult({n: NodeOutcome(n, n not in failed, None, failed.get(n)) for n in ev.readers})
    err = policy.verdict_error(group)
    drops = ev.page_cache_dropped
    not_cold = [n for n in ok_series if not _direct(ev, n) and not (n in drops and drops[n].dropped)]
    over = (f"the aggregate {agg.aggregate_read_gb_s:.4f} GB/s is {ratio:.3f} x the port's ceiling "
            f"{port.effective_gbit_s:g} Gbit/s ({port.effective_gbit_s / 8:.4f} GB/s), beyond the "
            f"{bounds.line_rate_tolerance:g} allowed for counter timing: more than the port can carry (a page "
            "cache, another path, or readers that over-count)") \
        if ratio is not None and ratio > 1.0 + bounds.line_rate_tolerance else None
    impossible = _self_report_problems(ev, series) if ev.launcher in SELF_REPORTED else []
    ev.validity = [*g3_validity(ev, list(ok_series), not_cold, err), *_physics_checks(ev, port, ratio, over, bounds),
                   *_self_report_checks(ev, impossible)]
    if err:
        return WorkloadResult(metrics, ev, error=err)
    if agg.aggregate_read_gb_s is None:
        return WorkloadResult(metrics, ev, invalid_reason=f"no aggregate: {agg.reason}")
    if port.mismatch:
        return WorkloadResult(metrics, ev, invalid_reason=f"port rate: {port.mismatch}")
    if over:
        return WorkloadResult(metrics, ev, invalid_reason=over)
    if impossible:
        return WorkloadResult(metrics, ev, invalid_reason=(
            f"self-reported figures that cannot be: {'; '.join(impossible[:4])}"
            + (f" (and {len(impossible) - 4} more)" if len(impossible) > 4 else "")))
    if not_cold:
        return WorkloadResult(metrics, ev, invalid_reason=(
            f"not cold: no O_DIRECT and the page cache was not dropped on {', '.join(not_cold)}"))
    return WorkloadResult(metrics, ev)


# Launchers whose readers' figures reach kvgate only as files the nodes wrote (a results volume, a job
# directory), not over a session kvgate held and timed.
SELF_REPORTED = ("k8s", "slurm")


def _self_report_problems(ev: G3Evidence, series: dict[str, NodeSeries]) -> list[str]:
    """Pure: the impossible in a self-reported run (harness.parsers.g3series.self_report_problems), its
    go time and its tasks' start times held to the run's frame too."""
    frame = TimeFrame(**ev.time_frame) if ev.time_frame else None
    extra: dict[str, float] = {}
    if ev.launch is not None and isinstance(ev.launch.go_ref_s, (int, float)):
        extra["the common start (go)"] = float(ev.launch.go_ref_s)
    job = ev.k8s_job or ev.slurm_job or {}
    spec = job.get("spec_sha256")  # the job spec kvgate wrote (slurm); each task records the one it read
    wrong = []
    for node, task in sorted((job.get("tasks") or {}).items()):
        t = task.get("started_at_s") if isinstance(task, dict) else None
        if isinstance(t, (int, float)) and not isinstance(t, bool):
            extra[f"{node}'s task start"] = float(t)
        if spec and isinstance(task, dict) and task.get("spec_sha256") != spec:
            wrong.append(f"{node}'s task ran a spec with sha256 {str(task.get('spec_sha256'))[:16]}, not the one "
                         f"kvgate wrote ({spec[:16]})")
    return wrong + self_report_problems(series, ev.copy_bytes, frame, extra)


def _physics_checks(ev: G3Evidence, port: PortRate, ratio: float | None, over: str | None,
                    bounds: G3Bounds) -> list[ValidityCheck]:
    """Pure: the port's rate (declared against measured) and the aggregate against the port's ceiling."""
    if port.measured_gbit_s is None:
        how = f"declared {port.declared_gbit_s:g} Gbit/s; not measured (nothing read from the port's node)"
    else:
        how = (port.mismatch or f"declared {port.declared_gbit_s:g} Gbit/s, measured {port.measured_gbit_s:g} Gbit/s "
               f"({port.measured_by}; within {port.tolerance:g})")
        how += f"; judged against {port.effective_gbit_s:g} Gbit/s"
    return [
        ValidityCheck(name="port rate", ok=port.mismatch is None,
                      claim="the port is the one the inventory declares: its declared rate and the rate its node "
                            "reports agree", how=how, figure="port ceiling", value=port.effective_gbit_s,
                      unit="Gbit/s"),
        ValidityCheck(name="within line rate", ok=over is None,
                      claim="the aggregate is no more than the port can carry",
                      how=over or ("no aggregate" if ratio is None else
                                   f"{ratio:.3f} x the port's ceiling (at most 1 + {bounds.line_rate_tolerance:g})"),
                      figure="nic ceiling ratio", value=ratio, unit="ratio")]


def _self_report_checks(ev: G3Evidence, impossible: list[str]) -> list[ValidityCheck]:
    if ev.launcher not in SELF_REPORTED:
        return []
    frame = ev.time_frame
    return [ValidityCheck(
        name="self-reported figures", ok=not impossible,
        claim="the readers' own times and byte counts are possible: inside the run's frame, no longer than the "
              "job allows, no more bytes than the copy holds",
        how="; ".join(impossible) or (f"times within the frame ({frame['max_duration_s']:.0f} s at most) and bytes "
                                      f"within the copy's {ev.copy_bytes}" if frame else
                                      f"bytes within the copy's {ev.copy_bytes}; no time frame recorded"))]


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


# The errors a node's own output makes (parse_stream), as against the run's (rc, silence, never started).
STREAM_ERRORS = ("reader output unparseable", "reader did not complete", "writer output unparseable",
                 "writer did not end on its stop file")


def parse_stream(name: str, text: str, offset_s: float, info: dict[str, Any], source: str, kind: str = "reader"
                 ) -> tuple[NodeSeries | None, dict[str, Any]]:
    """Pure: one reader's (or the writer's) raw JSON-lines stream parsed into its series (None if unparseable)
    and its record: ``info`` (the run's record of the process: rc, error, ...) with what the stream says (O_DIRECT,
    bytes, completion, samples, errors) and the node's error: the run's, else an unparseable or incomplete
    stream. The run and ``kvgate report``'s re-derivation (:func:`reevaluate_g3`) both use it."""
    info = dict(info)
    error = info.get("error")
    series = None
    try:
        out = parse_reader_output(text, name, offset_s, source=source)
        info.update(direct_used=out.armed.get("direct_used"), direct_error=out.armed.get("direct_error"),
                    completed=out.series.completed, truncated=out.truncated, samples=len(out.series.intervals))
        if kind == "writer":
            info.update(bytes_written=out.series.total_bytes, writer_errors=list(out.errors))
        else:
            info.update(start_priority=out.start.get("start_priority"), bytes_read=out.series.total_bytes,
                        reader_errors=list(out.errors))
        series = out.series
    except Exception as exc:  # noqa: BLE001 - unparseable output is that node's failure
        info["parse_error"] = str(exc)
        error = error or f"{kind} output unparseable: {exc}"
    if error is None and not info.get("completed"):
        errs = info.get(f"{kind}_errors")
        error = ("writer did not end on its stop file: " if kind == "writer" else "reader did not complete: ") \
            + "; ".join(errs or ["no end record"])
    info["error"] = error
    return series, info


PROCESS_KEYS = ("node", "rc", "error", "stopped", "armed_at_s", "go_node_s", "go_written_at_s", "pid", "pgid")


def _run_record(rec: G3Process | None) -> dict[str, Any]:
    """What the run itself recorded of a node's process (not what its stream said): the re-derivation's input."""
    info = {k: getattr(rec, k, None) for k in PROCESS_KEYS} if rec is not None else {}
    if isinstance(info.get("error"), str) and info["error"].startswith(STREAM_ERRORS):
        info["error"] = None  # made from the stream: made again from it
    return info


def _rederive_streams(names: list[str], recs: dict[str, G3NodeRecord], raw: dict[str, str | None], stem: str,
                      offsets: dict[str, float], gate: str
                      ) -> tuple[dict[str, NodeSeries], dict[str, G3NodeRecord], dict[str, str]]:
    """Pure: every reader's stream ``nodes/<node>/<stem>.jsonl`` parsed again, as the run's ``_gather`` did. A node
    the run saw fail without output (never started, unreachable) has none; any other node's missing or empty
    file is an error of the re-derivation (WorkloadError), never a figure taken from result.json."""
    series: dict[str, NodeSeries] = {}
    node_ev: dict[str, G3NodeRecord] = {}
    failed: dict[str, str] = {}
    for name in names:
        info = _run_record(recs.get(name))
        rel = f"nodes/{name}/{stem}.jsonl"
        text = raw.get(rel)
        if text is None or (not text.strip() and info.get("error") is None):
            if info.get("error") is None:
                raise WorkloadError(f"gates/{gate}/{rel} is {'missing' if text is None else 'empty'}: the run says "
                                    f"{name} read, and its raw stream is not there to re-derive it from")
            failed[name] = info["error"]
            node_ev[name] = G3NodeRecord.model_validate(info)
            continue
        one, info = parse_stream(name, text, offsets.get(name, 0.0), info, rel)
        if one is not None:
            series[name] = one
        if info["error"]:
            failed[name] = info["error"]
        node_ev[name] = G3NodeRecord.model_validate(info)
    return series, node_ev, failed


def reevaluate_g3(signed: dict[str, Any], raw: dict[str, str | None], p: G3Params, port: PortRate,
                  gate: str = "G3") -> WorkloadResult:
    """Pure: G3 re-derived from a bundle's raw streams (``raw``: path under the gate directory -> text, None when
    the file is missing) and the bounds of its own config/gates.yaml (``p``), with what only the run can know
    taken from the signed evidence (the launch, clock offsets, cache drops, each process's exit and error, the
    self-reported run's time frame). The same evaluator as the run (:func:`evaluate_g3`); a missing or empty raw
    stream raises WorkloadError."""
    ev = G3Evidence.model_validate(signed)
    policy = FailurePolicy(p.max_failed_share, p.on_node_failure)
    offsets = {n: float(o.get("applied_s") or 0.0) for n, o in ev.clock_offsets.items() if isinstance(o, dict)}
    fresh = G3Evidence(readers=ev.readers, port=p.port, copy_bytes=p.copy_bytes, chunks=p.chunks,
                       chunk_bytes=p.chunk_bytes, streams_per_node=p.streams, block_bytes=p.block_bytes,
                       policy=vars(policy), pool=ev.pool, phase_failures=ev.phase_failures,
                       clock_offsets=ev.clock_offsets, clock_alignment=ev.clock_alignment,
                       clock_offset_errors=ev.clock_offset_errors, page_cache_dropped=ev.page_cache_dropped,
                       launch=ev.launch, launcher=ev.launcher, slurm_job=ev.slurm_job, k8s_job=ev.k8s_job,
                       time_frame=ev.time_frame, port_rate=vars(port) | {"notes": list(port.notes)})
    series, fresh.nodes, fresh.failed_nodes = _rederive_streams(ev.readers, ev.nodes, raw, "reader", offsets, gate)
    with_writer = writer = None
    if ev.isolation is not None:
        iso = ev.isolation
        with_writer, nodes, failed = _rederive_streams(list(iso.nodes), iso.nodes, raw, "reader" + WITH_WRITER,
                                                       offsets, gate)
        winfo = _run_record(iso.writer_record) | {"dir": iso.writer_record.dir if iso.writer_record else None}
        text = raw.get(f"nodes/{iso.writer}/writer.jsonl")
        if (text is None or not text.strip()) and winfo.get("error") is None:
            raise WorkloadError(f"gates/{gate}/nodes/{iso.writer}/writer.jsonl is "
                                f"{'missing' if text is None else 'empty'}: the run says the writer {iso.writer} "
                                "wrote, and its raw stream is not there to re-derive it from")
        if text is not None:
            writer, winfo = parse_stream(iso.writer, text, offsets.get(iso.writer, 0.0), winfo,
                                         f"nodes/{iso.writer}/writer.jsonl", "writer")
        fresh.isolation = G3Isolation(writer=iso.writer, nodes=nodes, failed_nodes=failed,
                                      page_cache_dropped=iso.page_cache_dropped, launch=iso.launch,
                                      writer_record=G3WriterRecord.model_validate(winfo))
    uncertainty = max((float(o.get("uncertainty_s") or 0.0) for o in ev.clock_offsets.values()
                       if isinstance(o, dict)), default=0.0)
    return evaluate_g3(fresh, series, port, policy, p.min_window_s, uncertainty,
                       ev.launch.go_ref_s if ev.launch else None, with_writer, writer,
                       p.writer.max_idle_s if p.writer else 2.0, G3Bounds.of(p))


def rederive(gate_dir: Path, result: dict[str, Any], params: Any, ctx: dict[str, Any]):
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
    speed, qdisc = (one_step_output(steps_dir, port_node, n) for n in ("port-speed", "port-qdisc"))
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


@register_workload("g3-shared-read")
class G3SharedRead(Workload):
    rederive = staticmethod(rederive)  # the gate re-judged from the bundle's raw files
    Params = G3Params
    EvidenceModel = G3Evidence
    METRICS = {
        "aggregate_read_gb_s": "GB/s",
        "nic_ceiling_ratio": "ratio",
        "fairness_min_max": "ratio",
        "nodes_completed": "count",
        "start_skew_s": "s",
        # isolation (writer:) only
        "readers_loss": "ratio",
        "aggregate_read_gb_s_with_writer": "GB/s",
        "writer_write_gb_s": "GB/s",
        "nodes_completed_with_writer": "count",
    }

    # ---- config-time checks
    def _roles(self, p: G3Params, nodes: dict) -> tuple[str, str, list[str]]:
        port_node, _, nic = p.port.partition(":")
        writer = p.writer.node if p.writer else None
        readers = list(p.readers) if p.readers else [n for n in nodes if n not in (port_node, writer)]
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
        w = params.writer
        if w is not None:
            wn = nodes.get(w.node)
            if params.launcher != "ssh":
                issues.append((("writer",), f"a writer (isolation) runs with launcher ssh only, not {params.launcher}"))
            if wn is None:
                issues.append((("writer", "node"), f"writer {w.node!r} is not among the gate's nodes "
                               f"(expected one of {', '.join(nodes)})"))
            elif w.node == port_node:
                issues.append((("writer", "node"), f"writer {w.node!r} is the port's node: it must write through "
                               "the port, from another node"))
            elif w.node in readers:
                issues.append((("writer", "node"), f"writer {w.node!r} is also a reader: the writer is a further node"))
            else:
                t = wn.target(params.pool_target)
                if t is None or t.kind != "directory":
                    issues.append((("writer", "node"), f"writer {w.node!r} has no directory target "
                                   f"{params.pool_target!r} to write to"))
        return issues

    # ---- plan (pure)
    def _reader_argv(self, ctx: GateContext, node, p: G3Params, phase: str = ""
                     ) -> tuple[LaunchSpec, tuple[str, ...]]:
        nd = _node_dir(node, ctx.gate.id)
        spec = _reader_spec(node, p, posixpath.join(nd, "g3_reader.py"), posixpath.join(nd, "armed" + phase),
                            posixpath.join(nd, "go" + phase), posixpath.join(nd, f"series{phase}.jsonl"))
        return spec, spec.argv

    def _writer_argv(self, ctx: GateContext, node, p: G3Params) -> tuple[LaunchSpec, str]:
        nd = _node_dir(node, ctx.gate.id)
        return _writer_spec(node, p, posixpath.join(nd, "g3_reader.py"), nd)

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
        writer = p.writer.node if p.writer else None
        for r in readers + ([writer] if writer else []):  # the program goes here (a file copy, not a command)
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
            if writer:
                if p.drop_caches:
                    out.append(PlannedStep(r, "drop the page cache again before the read with the writer (recorded)",
                                           DROP_CACHES_ARGV))
                out.append(PlannedStep(r, f"armed reader, second read: released together with the writer {writer}",
                                       self._reader_argv(ctx, node, p, WITH_WRITER)[0].command()))
        if writer:
            wnode = ctx.nodes[writer]
            out.append(PlannedStep(writer, f"measure clock offset: one command, {p.clock_samples} round trips over "
                                   "its open stdin (a newline in, the node's time out)", CLOCK_SESSION_ARGV))
            spec, _ = self._writer_argv(ctx, wnode, p)
            out.append(PlannedStep(writer, f"armed writer: released with the readers' second read, writes into "
                                   f"{_writes_dir(wnode, p)} until its stop file is put there (a file copy) once "
                                   "the readers are done", spec.command()))
            out.append(PlannedStep(writer, "remove what the writer wrote", ("rm", "-rf", "--", _writes_dir(wnode, p))))
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
        out.append(PlannedStep("control", "the job's record (read again, up to 30 s, while Slurm reports it COMPLETING: "
                               "its NodeList then names only the nodes still completing)",
                               ("scontrol", "show", "job", "<job id>")))
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
        port = self._port_rate(ctx, port_node, nic, p.port_rate_tolerance)

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
        ev.pool = self._slurm_copy(ctx, p, cluster, job_dir, control, env, p.create_on or readers[0])

        applied = {n: 0.0 for n in readers}
        ev.clock_alignment = "assume_synced"
        ev.clock_offsets = {n: {"applied_s": 0.0, "how": "slurm: cluster clocks taken as synchronized"}
                            for n in readers}
        specs = {n: self._slurm_reader_spec(job_dir, ctx.nodes[n], ctx, p) for n in readers}
        job = SlurmJob(ctx.steps, control, cluster, job_dir, f"kvgate-{ctx.gate.id}", readers,
                       p.arm_timeout_s + p.read_timeout_s + cluster.time_margin_s, drop_caches=p.drop_caches,
                       cancel=ctx.cancel, progress=ctx.progress)
        launch = SynchronizedLaunch(job.transports(), specs, applied, policy, log_dir=ctx.gate_dir)
        submitted_s = time.time()
        with job:
            self._arm_release_wait(ctx, p, launch, policy, len(readers))
        # The tasks' files are what the nodes wrote into the job directory: held to the job's frame on our clock.
        ev.time_frame = {"not_before_s": submitted_s, "not_after_s": time.time(),
                         "max_duration_s": 60.0 * int(time_limit_arg(job.time_limit_s)), "slack_s": p.clock_slack_s}
        ev.slurm_job = job.record()
        if p.drop_caches:
            ev.page_cache_dropped = {n: CacheDrop.model_validate(t["cache_drop"])
                                     for n, t in job.provenance().items() if t.get("cache_drop") is not None}
        return self._collect(ctx, p, ev.readers, launch, applied, bad, {}, 0.0, port, policy, ev)

    def _slurm_copy(self, ctx: GateContext, p: G3Params, cluster: SlurmCluster, job_dir: str,
                    control: LocalTransport, env: dict[str, str] | None, creator: str) -> G3Pool:
        """The KV copy through srun on ``creator``: kept when its manifest matches the gate's, else laid out by a
        one-task step running the reader script from the job directory."""
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
            return G3Pool(created=False, by=creator, dir=_pool_dir(node, p), manifest=have)
        create = self._create_argv(ctx, node, p)
        create = create[:1] + (posixpath.join(job_dir, "g3_reader.py"),) + create[2:]
        t = max(600.0, p.copy_bytes / 10e6)
        r = ctx.steps.run(control, "pool-create", self._slurm_one(cluster, creator, create, t),
                          timeout_s=t + 60, env=env)
        if not r.ok:
            raise WorkloadError(f"creating the KV copy on {creator} through srun failed: {r.summary()}")
        return G3Pool(created=True, by=creator, dir=_pool_dir(node, p), report=r.stdout.strip())

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
        writer = p.writer.node if p.writer else None

        # 1. The port's line rate: declared, cross-checked where the port's node lets us read it.
        port = self._port_rate(ctx, port_node, nic, p.port_rate_tolerance)
        ev.port_rate = vars(port) | {"notes": list(port.notes)}

        # 2. Reader script on every node (a node failing here is a node failure like any other).
        prep = self._prepare_nodes(ctx, tr, writer, policy, ev)

        # 3. The KV copy, once.
        creator = p.create_on or next(r for r in readers if r in prep.succeeded)
        ev.pool = self._ensure_copy(ctx, creator, p)

        # 4. Clock offsets (the writer's too: it is released with the readers), cold caches.
        offs, applied, live = self._offsets_and_cold(ctx, p, {r: tr[r] for r in prep.succeeded}, writer, ev)

        # 5. Arm, release together, wait.
        specs = {r: self._reader_argv(ctx, ctx.nodes[r], p)[0] for r in live}
        launch = SynchronizedLaunch(live, specs, applied, policy, log_dir=ctx.gate_dir)
        self._arm_release_wait(ctx, p, launch, policy, len(live))
        uncertainty = max((o.uncertainty_s for o in offs.succeeded.values()), default=0.0)
        if not writer:
            return self._collect(ctx, p, readers, launch, applied, prep.failed, offs.failed, uncertainty, port,
                                 policy, ev)
        # 6. Isolation: the readers that read alone read again, released together with the writer; not when
        # the first read already failed beyond the policy (its error is the verdict).
        again = {r: live[r] for r in live if launch.runs[r].error is None}
        first = GroupResult({r: NodeOutcome(r, r in again, None, None if r in again else "failed") for r in readers})
        if not again or policy.verdict_error(first):
            return self._collect(ctx, p, readers, launch, applied, prep.failed, offs.failed, uncertainty, port,
                                 policy, ev)
        try:
            launch2 = self._with_writer(ctx, p, again, writer, applied, policy, ev)
        finally:
            wnode = ctx.nodes[writer]
            r = ctx.steps.run(ctx.transports[writer], "writer-cleanup", ("rm", "-rf", "--", _writes_dir(wnode, p)),
                              timeout_s=120)
            if not r.ok:
                ctx.progress(f"{ctx.gate.id}: what the writer wrote was not removed: {r.summary()}")
        return self._collect(ctx, p, readers, launch, applied, prep.failed, offs.failed, uncertainty, port, policy,
                             ev, launch2)

    def _prepare_nodes(self, ctx: GateContext, tr: dict, writer: str | None, policy: FailurePolicy,
                       ev: G3Evidence) -> GroupResult:
        """The reader script put on every reader (judged by the policy) and on the writer (its failing is the
        gate's error: no writer, no isolation to measure); returns the readers' outcomes."""
        def prepare(name: str, t):
            nd = _node_dir(ctx.nodes[name], ctx.gate.id)
            r = ctx.steps.run(t, "mkdir", ("mkdir", "-p", nd), timeout_s=30)
            if not r.ok:
                raise WorkloadError(r.summary())
            t.put(program_path("g3_reader.py"), posixpath.join(nd, "g3_reader.py"))
            return nd

        prep = fan_out(tr, prepare)
        self._check_policy(prep, policy, "preparing nodes", ev)
        if writer:
            ev.isolation = G3Isolation(writer=writer)
            wprep = fan_out({writer: ctx.transports[writer]}, prepare)
            if wprep.failed:
                raise WorkloadError(f"preparing the writer {writer}: {wprep.failed[writer]}")
        return prep

    def _offsets_and_cold(self, ctx: GateContext, p: G3Params, live: dict, writer: str | None, ev: G3Evidence
                          ) -> tuple[GroupResult, dict[str, float], dict]:
        """Every live node's clock offset (the writer's too: it is released with the readers; its failing is the
        gate's error), then the page cache dropped on the readers whose offset is known. Returns the offsets'
        outcomes, the offsets applied and the readers still live."""
        t_phase = time.monotonic()
        offs = measure_clock_offsets({**live, **({writer: ctx.transports[writer]} if writer else {})},
                                     samples=p.clock_samples, timeout_s=p.clock_probe_timeout_s)
        if writer and writer not in offs.succeeded:
            raise WorkloadError(f"the writer {writer}'s clock offset: {offs.failed.get(writer)}")
        ctx.progress(f"{ctx.gate.id}: clock offsets of {len(offs.succeeded)}/{len(offs)} nodes in "
                     f"{time.monotonic() - t_phase:.1f} s")
        applied = {n: applied_offset_s(o, p.clock_alignment) for n, o in offs.succeeded.items()}
        ev.clock_offsets = {n: vars(o) | {"applied_s": applied[n]} for n, o in offs.succeeded.items()}
        ev.clock_alignment = p.clock_alignment
        ev.clock_offset_errors = offs.failed
        live = {r: live[r] for r in offs.succeeded if r in live}
        if p.drop_caches:
            t_phase = time.monotonic()
            drops = fan_out(live, lambda _n, t: drop_caches(ctx, t, timeout_s=120))
            ev.page_cache_dropped = {n: o.value if o.ok else CacheDrop(dropped=False, error=o.error)
                                     for n, o in drops.items()}
            ctx.progress(f"{ctx.gate.id}: page cache dropped on {len(drops.succeeded)}/{len(live)} nodes in "
                         f"{time.monotonic() - t_phase:.1f} s")
        return offs, applied, live

    def _with_writer(self, ctx: GateContext, p: G3Params, readers: dict, writer: str, applied: dict[str, float],
                     policy: FailurePolicy, ev: G3Evidence) -> SynchronizedLaunch:
        """The readers' second read with the writer: caches dropped again, readers and writer armed and released
        at one instant, the readers waited for, then the writer told to stop (its stop file put) and waited for."""
        if p.drop_caches:
            drops = fan_out(readers, lambda _n, t: drop_caches(ctx, t, timeout_s=120))
            ev.isolation = ev.isolation.model_copy(update={"page_cache_dropped": {
                n: o.value if o.ok else CacheDrop(dropped=False, error=o.error) for n, o in drops.items()}})
        wspec, stop_path = self._writer_argv(ctx, ctx.nodes[writer], p)
        specs = {r: self._reader_argv(ctx, ctx.nodes[r], p, WITH_WRITER)[0] for r in readers}
        specs[writer] = wspec
        transports = {**readers, writer: ctx.transports[writer]}
        launch = SynchronizedLaunch(transports, specs, applied, policy, log_dir=ctx.gate_dir / "with-writer")
        with launch:
            ctx.progress(f"{ctx.gate.id}: arming {len(readers)} readers and the writer {writer}")
            armed = launch.arm(timeout_s=p.arm_timeout_s)
            rgroup = GroupResult({n: armed[n] for n in readers})
            if writer not in armed.succeeded or not policy.tolerates(rgroup) or not rgroup.succeeded:
                launch.stop_all("arming failed (the writer, or readers beyond the failure policy)")
                return launch
            go = launch.release()
            ctx.progress(f"{ctx.gate.id}: released at {go:.3f} with the writer {writer}")
            launch.wait(timeout_s=p.read_timeout_s, stall_timeout_s=p.stall_timeout_s, nodes=list(readers))
            with tempfile.TemporaryDirectory(prefix="kvgate-stop-") as tmp:
                stop = Path(tmp) / "stop"
                stop.write_text("stop\n")
                try:
                    ctx.transports[writer].put(stop, stop_path)
                except Exception as exc:  # noqa: BLE001 - an unreachable writer is stopped by its group instead
                    launch.stop_all(f"the writer's stop file could not be put: {exc}")
            launch.wait(timeout_s=max(30.0, 20 * p.interval_s), stall_timeout_s=p.stall_timeout_s, nodes=[writer])
        return launch

    def _port_rate(self, ctx: GateContext, port_node: str, nic: str, tolerance: float = 0.02) -> PortRate:
        declared = next(n.line_rate_gbit_s for n in ctx.nodes[port_node].nics if n.name == nic)
        pt = ctx.transports.get(port_node)
        speed = tcj = None
        if pt is not None:
            r = ctx.steps.run(pt, "port-speed", ("cat", f"/sys/class/net/{nic}/speed"), timeout_s=30)
            speed = r.stdout if r.ok else None
            r = ctx.steps.run(pt, "port-qdisc", ("tc", "-j", "qdisc", "show", "dev", nic), timeout_s=30)
            tcj = r.stdout if r.ok else None
        return cross_check_port_rate(declared, speed, tcj, tolerance)

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
                 uncertainty: float, port: PortRate, policy: FailurePolicy, ev: G3Evidence,
                 launch2: SynchronizedLaunch | None = None) -> WorkloadResult:
        # 7. Per-node raw series (partial ones too), parsed.
        ev.port_rate = vars(port) | {"notes": list(port.notes)}
        series, node_ev, failed = self._gather(ctx, readers, launch, applied, prep_failed, offs_failed, "reader")
        ev.nodes = node_ev
        ev.failed_nodes = failed
        ev.launch = G3Launch(go_ref_s=launch.go_ref_s, events=launch.events)
        with_writer = writer = None
        if launch2 is not None:
            iso = ev.isolation
            later = [r for r in readers if r not in failed]
            if launch2.runs[iso.writer].armed_at_s is None:  # the readers were stopped for the writer's sake
                later = []
            with_writer, iso_nodes, iso_failed = self._gather(ctx, later, launch2, applied, {}, {},
                                                              "reader" + WITH_WRITER)
            writer, wrec = self._gather_writer(ctx, p, iso.writer, launch2, applied)
            ev.isolation = iso.model_copy(update=dict(
                nodes=iso_nodes, failed_nodes=iso_failed, writer_record=wrec,
                launch=G3Launch(go_ref_s=launch2.go_ref_s, events=launch2.events)))
        result = evaluate_g3(ev, series, port, policy, p.min_window_s, uncertainty, launch.go_ref_s, with_writer,
                             writer, p.writer.max_idle_s if p.writer else 2.0, G3Bounds.of(p))
        write_summary(ctx.gate_dir, "g3.json", result)
        return result

    def _gather_writer(self, ctx: GateContext, p: G3Params, name: str, launch: SynchronizedLaunch,
                       applied: dict[str, float]) -> tuple[NodeSeries | None, G3WriterRecord]:
        """The writer's raw stream kept and parsed: its series (bytes written per interval) and its record."""
        run = launch.runs.get(name)
        if run is None or run.process is None:
            return None, G3WriterRecord(node=name, error=(run.error if run else None) or "not started")
        ndir = ctx.gate_dir / "nodes" / name
        ndir.mkdir(parents=True, exist_ok=True)
        write_gate_file(ndir / "writer.jsonl", run.stdout)
        write_gate_file(ndir / "writer.stderr", run.stderr)
        info: dict[str, Any] = run.as_dict() | {"dir": _writes_dir(ctx.nodes[name], p)}
        series, info = parse_stream(name, run.stdout, applied[name], info, f"nodes/{name}/writer.jsonl", "writer")
        run.error = info["error"]
        return series, G3WriterRecord.model_validate(info)

    def _gather(self, ctx: GateContext, readers: list[str], launch: SynchronizedLaunch, applied: dict[str, float],
                prep_failed: dict[str, str], offs_failed: dict[str, str], stem: str
                ) -> tuple[dict[str, NodeSeries], dict[str, G3NodeRecord], dict[str, str]]:
        """Every reader's raw stream kept (``nodes/<node>/<stem>.jsonl``) and parsed: series, records, failures."""
        nodes_dir = ctx.gate_dir / "nodes"
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
            write_gate_file(ndir / f"{stem}.jsonl", run.stdout)
            write_gate_file(ndir / f"{stem}.stderr", run.stderr)
            one, info = parse_stream(name, run.stdout, applied[name], run.as_dict(), f"nodes/{name}/{stem}.jsonl")
            if one is not None:
                series[name] = one
            run.error = info["error"]
            if run.error:
                failed[name] = run.error
            node_ev[name] = G3NodeRecord.model_validate(info)
        return series, node_ev, failed

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

