"""G3's params, the KV copy's layout and manifest, the launch specs of readers and writer, and the evidence
it records."""

from __future__ import annotations

import hashlib
import posixpath
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ...execute.fanout import LaunchSpec
from ...units import parse_size_bytes
from ..kit.base import CacheDrop, Evidence, SeriesEvidence, StrictModel, target_path


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


