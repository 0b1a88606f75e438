"""The workload contract: validated params, a pure plan, and a run that returns typed data.

A workload module defines a class decorated with ``@register_workload("name")`` holding:
- ``Params``: a pydantic model (extra="forbid") for the gate's ``params:`` block;
- ``METRICS``: metric name -> unit (the unit the metric is reported in, e.g. ``"GB/s"``);
- ``EvidenceModel``: the pydantic model of what it hands the report (a subclass of :class:`Evidence`);
- ``plan(ctx) -> list[PlannedStep]``: what would run where, with exact argv; runs nothing;
- ``run(ctx) -> WorkloadResult``: runs through ``ctx.transports`` (every command a logged step), leaves raw
  files under ``ctx.gate_dir``; failures become data (``error`` / ``invalid_reason``), never a crash.

The helpers every workload shares live here once: where a target is on its node, dropping the page cache,
writing a gate's summary file.
"""

from __future__ import annotations

import json
import os
import posixpath
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar

from pydantic import BaseModel, ConfigDict

from ...endurance import DriveRating
from ...errors import ConfigError, WorkloadError
from ...execute.cancel import Cancellation, check_write
from ...execute.cancel import write_text as write_gate_file
from ...execute.clock import Clock
from ...execute.nvmeof import NvmeofError, NvmeofHost, NvmeofSpec
from ...safeio import InputFileError, dumps_indented
from ...stats import Interval
from ...units import format_quantity

WORKLOADS: dict[str, type["Workload"]] = {}


def register_workload(name: str):
    """Class decorator: add a workload to :data:`WORKLOADS` under ``name``."""
    def deco(cls):
        cls.name = name
        WORKLOADS[name] = cls
        return cls
    return deco


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True)
class PlannedStep:
    """One thing a gate does on one node: what, and the exact argv when it is a command. An argument written
    ``<...>`` stands for what the run finds on the node (a device, a run tag): :func:`harness.suite.plan.plan_mismatch`
    matches it to any text there."""

    node: str
    description: str
    argv: tuple[str, ...] = ()
    files: dict[str, str] = field(default_factory=dict)  # name -> content, written before the step
    # Sent only when the condition its description states holds (a fill when the file is short, one of two modes).
    optional: bool = False
    # Sent again, in a row, until it answers (a poll; a probe whose answer was lost on the way).
    repeats: bool = False


@dataclass
class GateContext:
    """What a workload's plan and run see: the gate, its validated params, its nodes and their transports,
    the step log, its directory in the run, a progress callback, the HTTP seam to engines (``http``:
    an httpx transport such as ``httpx.MockTransport`` in tests; None is the network), the run's
    ``connect: managed`` NVMe-oF connections (``nvmeof``: harness.execute.nvmeof.ManagedTargets, or None), the
    clock every wait and poll runs on (``clock``; a ScriptedClock in tests) and the gate's cancellation
    (``cancel``: harness.execute.cancel.Cancellation, made on ``clock`` when not given): every wait, poll and
    request loop checks it, and once it is set nothing more is written into ``gate_dir``."""

    gate: Any
    params: Any
    nodes: dict[str, Any]
    transports: dict[str, Any]
    steps: Any
    gate_dir: Path
    progress: Callable[[str], None] = lambda msg: None
    http: Any = None
    nvmeof: Any = None
    clock: Clock = field(default_factory=Clock)
    cancel: Cancellation | None = None
    undo: Any = None  # the run's harness.execute.undo.UndoLog: inverses run whatever ends the gate (faults)
    # The inventory's `slurm:` block (harness.config.models.SlurmConfig) for gates with `launcher: slurm`.
    slurm: Any = None

    def __post_init__(self) -> None:
        if self.cancel is None:
            self.cancel = Cancellation(self.clock, what=f"gate {getattr(self.gate, 'id', '?')}")


# ------------------------------------------------------------------------------------------- evidence


class StreamRow(BaseModel):
    """One GPU's (or read stream's) read, as the report draws it in the per-GPU bar chart."""

    model_config = ConfigDict(extra="forbid")

    node: str
    label: str
    read_gb_s: float
    gpu: int | None = None
    read_bytes: int | None = None
    runtime_ms: int | None = None
    iops: float | None = None
    lat_p50_us: float | None = None
    lat_p99_us: float | None = None
    # The same stream's fio figure where a workload measures both (kv-read): the report draws the two bars
    # side by side.
    fio_read_gb_s: float | None = None


class StreamsEvidence(BaseModel):
    """Evidence with per-stream reads: the report draws ``<gate>-streams.svg`` and writes its CSV."""

    streams: list[StreamRow] = []


class SeriesEvidence(BaseModel):
    """Evidence with per-node time series: the report draws ``<gate>-series.svg`` (every node, their aggregate,
    the NIC line rate) and writes ``<gate>-series.csv``."""

    series: dict[str, list[tuple[float, float]]] = {}  # node -> [(t_s since the common start, read_gb_s)]
    series_marks: list[tuple[float, str]] = []  # events on the same time line (a fault, its inverse): (t_s, label)
    nic_line_rate_gb_s: float | None = None


class TtftEvidence(BaseModel):
    """Evidence with TTFT lists (s): the report draws their distributions (G2 keeps per-request records in
    ``requests-<phase>.jsonl`` instead, which the report reads too)."""

    ttft_recompute_s: list[float] | None = None
    ttft_readback_s: list[float] | None = None


class ValidityCheck(BaseModel):
    """One thing a gate's figure relies on, as its evaluator judged it: what it proves (``claim``), how it was
    checked (``how``: the method and what was seen), the figure it rests on with its unit (``figure``,
    ``value``, ``unit``: a unit of harness.units, e.g. ``"B"``), and whether it holds (``ok``). The report's
    "Evidence validity" shows these and nothing else."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    ok: bool
    claim: str
    how: str
    figure: str | None = None
    value: float | None = None
    unit: str | None = None
    # False: a proof the gate turned off (e.g. min_read_fraction: 0, a profile without device reads): shown
    # NOT CHECKED, and the verdict's reason says the claim is unproven (``ok`` then says only that nothing failed)
    checked: bool = True

    def figure_text(self) -> str | None:
        """``figure: value`` with its unit in a readable form (harness.units.format_quantity), or None."""
        if self.figure is None:
            return None
        return f"{self.figure}: {format_quantity(self.value, self.unit)}"


class PoolSnapshot(BaseModel):
    """The finished KV chunk files of a pool directory as one node saw them (harness.workloads.kit.engine.
    pool_contents): how many, their bytes, the bytes expected; ``bytes_added``: what a phase added to a pool
    that already held chunks (an attached engine's), None where the pool started empty."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    node: str
    dir: str
    bytes: int
    files: int
    expected_kv_bytes: int
    error: str | None = None
    bytes_added: int | None = None


class Evidence(BaseModel):
    """Base of every workload's evidence model: strict (a key the model does not declare is a bug), dumped
    to JSON for ``result.json``, the verdict and the report. ``validity``: what the evaluator proved (or
    could not), filled by the workload's evaluator; the report reads it and nothing else for validity."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    validity: list[ValidityCheck] = []
    # a serving gate's: what serving cost the pool's drive (harness.endurance.Endurance.to_dict(), docs/endurance.md)
    # and the drive the inventory declares for the pool's node (pool_drive), if it declares one
    endurance: dict[str, Any] | None = None
    pool_drive: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


class RecordedEvidence(Evidence):
    """Evidence as a bundle recorded it (``result.json``), read back for re-evaluation: every key kept as is,
    ``validity`` too, whatever its shape (a bundle of an older kvgate has none, or another shape: the report
    says "not recorded"); dumped with exactly the keys it was read with."""

    model_config = ConfigDict(extra="allow")

    validity: Any = None

    def as_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_unset=True)


class ChartInputs(StreamsEvidence, SeriesEvidence, TtftEvidence):
    """What the report reads from any gate's evidence to draw it: the same fields the workloads write
    through :class:`StreamsEvidence`, :class:`SeriesEvidence` and :class:`TtftEvidence`."""

    model_config = ConfigDict(extra="ignore")


@dataclass
class WorkloadResult:
    """What a workload hands back: metrics in the units its METRICS table declares, plus typed evidence.
    ``failed_check`` names a check the system under test failed whatever the metric (e.g. KV read back
    different from what was stored): the gate is FAIL with it as the reason."""

    metrics: dict[str, float] = field(default_factory=dict)
    evidence: Evidence | None = None
    invalid_reason: str | None = None
    error: str | None = None
    failed_check: str | None = None
    # a degraded answer the gate reports whatever its outcome (e.g. requests the engine re-computed because the
    # tier failed: never hits): the verdict's reason carries it, marked DEGRADED
    degraded: str | None = None
    # figures measured over trials, typed: metric name -> its median and confidence interval (harness.stats
    # .Interval); ``metrics[name]`` holds the median, the verdict judges the interval
    intervals: dict[str, Interval] = field(default_factory=dict)

    def evidence_dict(self) -> dict[str, Any]:
        return {} if self.evidence is None else self.evidence.as_dict()

    def as_dict(self) -> dict[str, Any]:
        out = {"metrics": self.metrics, "evidence": self.evidence_dict(), "invalid_reason": self.invalid_reason,
               "error": self.error}
        if self.failed_check is not None:  # only then, so results without one keep their shape
            out["failed_check"] = self.failed_check
        if self.degraded is not None:
            out["degraded"] = self.degraded
        if self.intervals:  # only then, so results measured once keep their shape
            out["intervals"] = {k: iv.model_dump(mode="json") for k, iv in self.intervals.items()}
        return out


@dataclass(frozen=True)
class ControlFile:
    """A file on the control host that a gate's params name (a trace, a model config): where in the params, what
    it is, its path, and how it is read (``parse(path)`` raises ConfigError, InputFileError or ValueError when the
    file cannot be used)."""

    at: tuple
    what: str
    path: str
    parse: Callable[[str], Any]


def control_file_issue(f: ControlFile) -> str | None:
    """Why a control-host file cannot be used, on one line naming its path once (None when it can): missing, not a
    regular file, or not parsing (the file's own line where the parser names one)."""
    try:
        st = os.stat(f.path)
    except FileNotFoundError:
        return f"{f.what} {f.path}: no such file"
    except OSError as exc:
        return f"{f.what} {f.path}: {exc.strerror or exc}"
    if not stat.S_ISREG(st.st_mode):
        return f"{f.what} {f.path}: not a regular file"
    try:
        f.parse(f.path)
    except (ConfigError, InputFileError, OSError, ValueError) as exc:
        return file_error_text(f.what, f.path, exc)
    return None


def file_error_text(what: str, path: str, exc: Exception) -> str:
    """Pure: why a file could not be read or parsed, on one line naming its path once (a ConfigError's or an
    InputFileError's own file and line where they give one)."""
    if isinstance(exc, ConfigError) and len(exc.issues) == 1 and not exc.issues[0].line and not exc.issues[0].path:
        return f"{what} {exc.issues[0].file}: {exc.issues[0].message}"   # the file as a whole (missing, too big)
    if isinstance(exc, ConfigError):
        shown = [f"{i.file}{f':{i.line}' if i.line else ''}: {i.path + ': ' if i.path else ''}{i.message}"
                 for i in exc.issues[:3]]
        more = f" (and {len(exc.issues) - 3} more)" if len(exc.issues) > 3 else ""
        return f"{what}: {'; '.join(shown)}{more}"
    if isinstance(exc, InputFileError):
        return f"{what}: {exc}"
    return f"{what} {path}: {' '.join(str(exc).split())}"


class Workload:
    name: ClassVar[str] = ""
    Params: ClassVar[type[BaseModel]] = StrictModel
    EvidenceModel: ClassVar[type[Evidence]] = Evidence
    METRICS: ClassVar[dict[str, str]] = {}
    # a workload that stores KV on the pool: which window its endurance prices (docs/endurance.md); None: none
    ENDURANCE: ClassVar[str | None] = None
    # its gate re-judged from a signed bundle's raw files: rederive(gate_dir, result, params, ctx)
    # (harness/gates/reevaluate.py); None: its metrics are taken from result.json, and the report says so
    rederive: ClassVar[Callable[..., Any] | None] = None

    @classmethod
    def metric_unit(cls, name: str) -> str | None:
        """The unit of metric ``name`` this workload reports, None when it reports no such metric: its METRICS
        table's, or (a workload with figures per point, ``FIGURE@POINT``) the figure's."""
        return cls.METRICS.get(name)

    def validate_against(self, params: Any, nodes: dict[str, Any]) -> list[tuple[tuple, str]]:
        """Cross-checks against the inventory: list of (path inside params, message)."""
        return []

    def control_files(self, params: Any) -> list[ControlFile]:
        """The control-host files the params name (read by the run before anything starts on a node)."""
        return []

    def file_issues(self, params: Any) -> list[tuple[tuple, str]]:
        """Every control-host file the params name that is missing, not a regular file or does not parse:
        (path inside params, message). ``kvgate validate`` and ``run`` check them; loading a bundle's suite does
        not (its run recorded the files' digests)."""
        return [(f.at, why) for f in self.control_files(params) if (why := control_file_issue(f)) is not None]

    def plan(self, ctx: GateContext) -> list[PlannedStep]:
        raise NotImplementedError

    def run(self, ctx: GateContext) -> WorkloadResult:
        raise NotImplementedError


# -------------------------------------------------------------------------------------- shared helpers


def target_path(node: Any, target: Any) -> str:
    """A target's path on its node: absolute as written, else relative to the node's work_dir."""
    p = target.path or ""
    return p if p.startswith("/") else posixpath.join(node.work_dir, p)


# ``echo 3``: page cache plus dentries and inodes, so a cold read also misses cached metadata of the files.
DROP_CACHES_ARGV = ("sh", "-c", "sync && echo 3 > /proc/sys/vm/drop_caches")


class CacheDrop(BaseModel):
    """Whether the kernel let us drop the page cache on a node (and why not); kept as is in the evidence."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dropped: bool
    error: str | None = None


def drop_caches(ctx: GateContext, transport: Any, step: str = "drop-caches", timeout_s: float = 300) -> CacheDrop:
    """``sync`` and drop the page cache on the node as a logged step; a refusal is recorded, not raised."""
    r = ctx.steps.run(transport, step, DROP_CACHES_ARGV, timeout_s=timeout_s)
    return CacheDrop(dropped=r.ok, error=None if r.ok else r.summary())


def write_summary(gate_dir: Path, name: str, result: WorkloadResult) -> None:
    """The gate's summary beside its raw files (``gate_dir/name``): metrics, evidence, invalid_reason, error."""
    write_gate_file(gate_dir / name, dumps_indented(result.as_dict(), indent=1, default=str))


def nvmeof_device(ctx: GateContext, node: Any, target: Any, transport: Any) -> tuple[str, dict[str, Any]]:
    """The /dev/nvmeXnY of a ``kind: nvmeof`` target on ``node``, found by NQN and checked against the inventory
    (harness.execute.nvmeof.resolve), with the record of the check for the evidence. What the node showed is
    kept in ``gate_dir/NODE/`` (``nvme-list-subsys.json`` and the other probes) whatever the outcome; a
    mismatch, or a managed connect that failed, raises WorkloadError before anything reads the device."""
    rec = ctx.nvmeof.record(node.name, target.name) if ctx.nvmeof is not None else None
    if rec is not None and not rec.ok:
        raise WorkloadError(f"target {target.name} ({target.nqn}): connect: managed failed: {rec.error}")
    host = NvmeofHost(lambda name, argv, t: ctx.steps.run(transport, name, argv, timeout_s=t),
                      NvmeofSpec.from_target(target), node=node.name)
    try:
        res, st = host.resolve()
    except NvmeofError as exc:
        raise WorkloadError(f"target {target.name}: {exc}") from None
    ndir = ctx.gate_dir / node.name
    check_write(ndir)
    ndir.mkdir(parents=True, exist_ok=True)
    for name, (rc, out) in st.raw.items():
        write_gate_file(ndir / (f"nvme-{name}.json" if name.startswith("list") else f"nvmeof-{name}.txt"), out)
    record = res.as_dict()
    if rec is not None:
        record["managed"] = {"connected_by_kvgate": rec.issued, "controllers": rec.controllers,
                             "connect_s": rec.connect_s}
    write_gate_file(ndir / "nvmeof-resolution.json", json.dumps(record, indent=1, default=str))
    if not res.ok:
        raise WorkloadError(f"target {target.name}: {res.error}")
    return res.device, record


def pool_drive_of(ctx: GateContext, pool_node: str | None = None) -> dict[str, Any] | None:
    """The drive the inventory declares (``pool_drive``) for the node holding the pool (``pool_node``, or the
    gate's first node), as the evidence keeps it; None where it declares none."""
    name = pool_node or next(iter(ctx.nodes), None)
    drive = getattr(ctx.nodes.get(name), "pool_drive", None) if name is not None else None
    return None if drive is None else drive.rating().to_dict()


def drive_rating(recorded: dict[str, Any] | None) -> DriveRating | None:
    """Pure: the evidence's ``pool_drive`` back as a rating (a bundle re-evaluated offline prices the same drive)."""
    if not recorded:
        return None
    return DriveRating(int(recorded["capacity_bytes"]), float(recorded["rated_dwpd"]),
                       float(recorded.get("warranty_years") or 5.0), recorded.get("name"))
