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
import posixpath
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar

from pydantic import BaseModel, ConfigDict

from ..errors import WorkloadError
from ..execute.cancel import Cancellation, check_write
from ..execute.cancel import write_text as write_gate_file
from ..execute.clock import Clock
from ..execute.nvmeof import NvmeofError, NvmeofHost, NvmeofSpec
from ..safeio import dumps_indented
from ..units import format_quantity

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

    def figure_text(self) -> str | None:
        """``figure: value`` with its unit in a readable form (harness.units.format_quantity), or None."""
        if self.figure is None:
            return None
        return f"{self.figure}: {format_quantity(self.value, self.unit)}"


class PoolSnapshot(BaseModel):
    """The finished KV chunk files of a pool directory as one node saw them (harness.workloads.engine.
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

    def evidence_dict(self) -> dict[str, Any]:
        return {} if self.evidence is None else self.evidence.as_dict()

    def as_dict(self) -> dict[str, Any]:
        out = {"metrics": self.metrics, "evidence": self.evidence_dict(), "invalid_reason": self.invalid_reason,
               "error": self.error}
        if self.failed_check is not None:  # only then, so results without one keep their shape
            out["failed_check"] = self.failed_check
        if self.degraded is not None:
            out["degraded"] = self.degraded
        return out


class Workload:
    name: ClassVar[str] = ""
    Params: ClassVar[type[BaseModel]] = StrictModel
    EvidenceModel: ClassVar[type[Evidence]] = Evidence
    METRICS: ClassVar[dict[str, str]] = {}

    def validate_against(self, params: Any, nodes: dict[str, Any]) -> list[tuple[tuple, str]]:
        """Cross-checks against the inventory: list of (path inside params, message)."""
        return []

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
