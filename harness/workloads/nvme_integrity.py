"""Data integrity through NVMe-oF: what is read through /dev/nvmeXnY equals what was written.

A ``kind: nvmeof-loopback`` target: per node, a known pattern is written on the backing device and read
back through the NVMe-oF namespace, and another written through the namespace and read on the backing
device. Every one of those writes asks the write guard first (harness.writeguard), whatever made the device:
the backing, then the namespace reaching the same storage; a device that is mounted (a namespace carrying
kv-read's ext4), holds a filesystem, partition table or signature, or that kvgate did not make and the target
does not offer (``allow_destructive``) is only read on both paths and compared.

A ``kind: nvmeof`` target (an array's namespace, found by NQN and checked: harness.execute.nvmeof): the
namespace is not kvgate's, so the write guard decides first (a namespace holding a filesystem or partition
table is written only with ``allow_destructive`` and its serial; refused, nothing is written and the gate is
ERROR). Then a pattern goes through the fabric with O_DIRECT and back; where the node also provisions that
NQN as a loopback (the target side), the check is the two-way one against its backing store instead.

The metric is the number of bytes that differ; every read-back is kept in the evidence.
"""

from __future__ import annotations

from pathlib import Path

import hashlib
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ..errors import HarnessError
from ..safeio import MAX_JSON_BYTES
from .kit.rederive import raw_text
from ..errors import WorkloadError
from ..execute.nvmeof import NvmeofSpec, probe_commands as nvmeof_probes
from ..rigs.loopback import (INTEGRITY_LEN_BYTES, Loopback, LoopbackError, LoopbackSpec, backing_device, nvme_device,
                             probe_commands)
from ..writeguard import block_probe_plan, check_write
from .kit.base import (Evidence, GateContext, PlannedStep, StrictModel, ValidityCheck, Workload, WorkloadResult, nvmeof_device,
                   register_workload, write_gate_file)
from .kit.integrity import (IntegrityResult, pattern_bytes, integrity_cleanup_argv, integrity_commands, loopback_integrity,
                        roundtrip_commands, roundtrip_integrity)


class NvmeIntegrityParams(StrictModel):
    target: str
    length_bytes: int = Field(default=INTEGRITY_LEN_BYTES, ge=65536, le=64 * 1024 * 1024)


class IntegrityCheckRecord(BaseModel):
    """One read-back as checked (harness.rigs.loopback.IntegrityCheck): the direction (``backing->nvme``,
    ``nvme->backing``, ``nvme->nvme``, or ``compare``: both paths only read), the bytes compared and those
    that differ, both digests."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    direction: str
    offset_bytes: int
    length_bytes: int
    mismatched_bytes: int
    expected_sha256: str
    actual_sha256: str
    error: str | None = None
    ok: bool


class IntegrityRecord(BaseModel):
    """One node's integrity check: the device read (and its backing, for a loopback), every read-back, the
    write guard's decisions, and for a ``kind: nvmeof`` target the namespace found by NQN."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ok: bool
    device: str
    backing_device: str
    mismatched_bytes: int
    checked_bytes: int
    checks: list[IntegrityCheckRecord] = []
    write_guard: dict[str, Any] | None = None
    device_write_guard: dict[str, Any] | None = None
    nvmeof: dict[str, Any] | None = None  # kind nvmeof: harness.execute.nvmeof's resolution record
    namespace_write_guard: dict[str, Any] | None = None

    @classmethod
    def of(cls, res: IntegrityResult, **extra: Any) -> "IntegrityRecord":
        return cls.model_validate({**res.as_dict(), **extra})


class NvmeIntegrityEvidence(Evidence):
    """Per node: every read-back (direction, bytes compared, bytes that differ, digests) as checked."""

    nodes: dict[str, IntegrityRecord] = {}


def evaluate_integrity(ev: NvmeIntegrityEvidence, errors: list[str]) -> WorkloadResult:
    """Pure: the metrics (bytes compared, bytes that differ) over every node's checks, and what they prove."""
    mismatched = sum(d.mismatched_bytes for d in ev.nodes.values())
    checked = sum(d.checked_bytes for d in ev.nodes.values())
    metrics = {"mismatched_bytes": float(mismatched), "checked_bytes": float(checked)}
    ev = ev.model_copy(update={"validity": integrity_validity(ev, errors)})
    return WorkloadResult(metrics, ev, error="; ".join(errors) if errors else None)


def integrity_validity(ev: NvmeIntegrityEvidence, errors: list[str]) -> list[ValidityCheck]:
    """Pure: what the read-backs prove: every node checked, every byte compared equal; how (the directions per
    node: written on one path and read on the other, or only read on both when nothing could be written)."""
    ways = []
    for name, d in sorted(ev.nodes.items()):
        dirs = ", ".join(c.direction for c in d.checks) or "none"
        ways.append(f"{name}: {dirs} through {d.device or '?'}"
                    + (" (read-only compare: nothing written)" if all(c.direction == "compare" for c in d.checks)
                       and d.checks else ""))
    checked = sum(d.checked_bytes for d in ev.nodes.values())
    mismatched = sum(d.mismatched_bytes for d in ev.nodes.values())
    how = ("a pattern written with O_DIRECT on one path, read back on the other and compared byte by byte "
           "here; " + "; ".join(ways)) if ways else "no node was checked"
    return [
        ValidityCheck(name="data", ok=bool(ev.nodes) and not errors and checked > 0 and mismatched == 0
                      and all(d.ok for d in ev.nodes.values()),
                      claim="what was read through the NVMe-oF namespace equals what was written",
                      how=how + (f"; errors: {'; '.join(errors)}" if errors else ""),
                      figure="bytes compared", value=float(checked), unit="B"),
        ValidityCheck(name="no mismatch", ok=bool(ev.nodes) and mismatched == 0,
                      claim="no byte read back differs from the pattern",
                      how="sha256 and a byte-by-byte comparison of each read-back with the pattern",
                      figure="bytes that differ", value=float(mismatched), unit="B")]


def pattern_sha256(direction: str, length_bytes: int, nqn: str | None, device: str, seed: str = "kvgate"
                   ) -> str | None:
    """Pure: the digest of the pattern a check of ``direction`` wrote (the seeds of harness.workloads.kit.integrity:
    a loopback's ``SEED:NQN:DIRECTION``, a round trip's ``SEED:DEVICE:roundtrip``); None for a read-only compare
    (its reference is the backing's own bytes) or an unknown NQN."""
    if direction == "nvme->nvme":
        return hashlib.sha256(pattern_bytes(f"{seed}:{device}:roundtrip", length_bytes)).hexdigest()
    if direction in ("backing->nvme", "nvme->backing") and nqn:
        return hashlib.sha256(pattern_bytes(f"{seed}:{nqn}:{direction}", length_bytes)).hexdigest()
    return None


def reevaluate_integrity(records: dict[str, str], nqn: dict[str, str | None]) -> WorkloadResult:
    """Pure: a bundle's nvme-integrity result again from every node's raw ``NODE-integrity.json`` (``records``:
    node -> text; ``nqn``: node -> the target's NQN, from the bundle's inventory): each check's pattern digest
    computed again, each check's verdict from its digests and byte count (ValueError when they contradict each
    other: a check that says 0 bytes differ where the digests differ, or a digest that is not the pattern's), the
    node's figures summed again, then :func:`evaluate_integrity`."""
    ev = NvmeIntegrityEvidence()
    errors = []
    for name in sorted(records):
        d = IntegrityRecord.model_validate_json(records[name])
        checks = []
        for c in d.checks:
            want = pattern_sha256(c.direction, c.length_bytes, nqn.get(name), d.device)
            where = f"{name}-integrity.json: {c.direction}"
            if c.error is None and want is not None and c.expected_sha256 != want:
                raise ValueError(f"{where}: expected digest {c.expected_sha256[:16]}... is not the pattern's "
                                 f"({want[:16]}...)")
            if c.error is None and (c.expected_sha256 == c.actual_sha256) != (c.mismatched_bytes == 0):
                raise ValueError(f"{where}: {c.mismatched_bytes} bytes differ, yet the digests "
                                 f"{'agree' if c.expected_sha256 == c.actual_sha256 else 'differ'}")
            checks.append(c.model_copy(update={"ok": c.error is None and c.mismatched_bytes == 0}))
            if c.error:
                errors.append(f"{name}: {c.direction}: {c.error}")
        ev.nodes = {**ev.nodes, name: d.model_copy(update=dict(
            checks=checks, ok=bool(checks) and all(c.ok for c in checks),
            mismatched_bytes=sum(c.mismatched_bytes for c in checks),
            checked_bytes=sum(c.length_bytes for c in checks if c.error is None)))}
    return evaluate_integrity(ev, errors)


def rederive(gate_dir: Path, result: dict[str, Any], params: Any, ctx: dict[str, Any]):
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


@register_workload("nvme-integrity")
class NvmeIntegrity(Workload):
    rederive = staticmethod(rederive)  # the gate re-judged from the bundle's raw files
    Params = NvmeIntegrityParams
    EvidenceModel = NvmeIntegrityEvidence
    METRICS = {"mismatched_bytes": "B", "checked_bytes": "B"}

    def validate_against(self, params: Any, nodes: dict[str, Any]) -> list[tuple[tuple, str]]:
        issues = []
        for name, node in nodes.items():
            t = node.target(params.target)
            if t is None:
                issues.append((("target",), f"node {name!r} has no target {params.target!r}"))
            elif t.kind not in ("nvmeof-loopback", "nvmeof"):
                issues.append((("target",), f"target {params.target!r} on node {name!r} has kind {t.kind!r}; "
                               "nvme-integrity needs kind nvmeof or nvmeof-loopback"))
            elif params.length_bytes % 65536:
                issues.append((("length_bytes",), "length_bytes must be a multiple of 64 KiB"))
        return issues

    def plan(self, ctx: GateContext) -> list[PlannedStep]:
        out = []
        for name, node in ctx.nodes.items():
            t = node.target(ctx.params.target)
            if t.kind == "nvmeof":
                out += self._plan_nvmeof(ctx, name, node, t)
                continue
            spec = LoopbackSpec.from_target(t, name, node)
            for probe, argv in probe_commands(spec).items():
                out.append(PlannedStep(name, f"probe {probe}", tuple(argv)))
            writes = "write pattern on backing, read via NVMe/TCP; write via NVMe/TCP, read on backing"
            if spec.backing == "block" and not spec.allow_destructive:
                mode = "read-only compare"
            else:
                offered = ("" if spec.backing in ("block", "file") or spec.allow_destructive else
                           f"the {spec.backing} device kvgate made (its loopback state on the node; another: "
                           "read-only compare), and ")
                mode = (f"{writes}, if {offered}the write guard allows it on the backing (lsblk, blkid -p and "
                        "its serial on the node) and on the namespace (not mounted, not read-only); refused: "
                        f"{'the check fails' if spec.backing == 'block' else 'read-only compare'}")
            out.append(PlannedStep(name, f"integrity ({mode}) of {ctx.params.length_bytes} bytes per "
                                         f"direction on {spec.nqn} (dd with O_DIRECT, compared here)"))
            out += _integrity_steps(name, spec, ctx.params.length_bytes)
        return out

    @staticmethod
    def _plan_nvmeof(ctx: GateContext, name: str, node, t) -> list[PlannedStep]:
        spec = NvmeofSpec.from_target(t)
        dev = f"<the namespace of {t.nqn}>"
        out = [PlannedStep(name, f"find the namespace of {t.nqn} and check it is {spec.address}, live ({probe})", argv)
               for probe, argv in nvmeof_probes(spec).items()]
        out += [PlannedStep(name, what, argv, optional=optional)
                for what, argv, optional in block_probe_plan(dev, "the namespace")]
        loop = _loopback_of(node, t)
        length = ctx.params.length_bytes
        if loop is not None:
            lspec = LoopbackSpec.from_target(loop, name, node)
            for probe, argv in probe_commands(lspec).items():
                out.append(PlannedStep(name, f"the loopback serving it ({loop.name}): probe {probe}", tuple(argv)))
            mode = (f"write a pattern on the backing of {loop.name}, read it through the namespace; write one "
                    "through the namespace, read it on the backing")
            out.append(PlannedStep(name, f"if the write guard allows it: {mode} ({length} bytes each, dd with "
                                         "O_DIRECT, compared here); refused: nothing is written, ERROR"))
            out += _integrity_steps(name, lspec, length, device=dev, guard_device=False)
        else:
            out.append(PlannedStep(name, f"if the write guard allows it: write a pattern through the namespace and "
                                         f"read it back through it ({length} bytes, dd with O_DIRECT, compared "
                                         "here); refused: nothing is written, ERROR"))
            out += [PlannedStep(name, f"if allowed: {what}", argv, optional=True)
                    for what, argv in roundtrip_commands(t.name, dev, length)]
            out.append(PlannedStep(name, "remove the pattern and read-back files", integrity_cleanup_argv(t.name),
                                   optional=True))
        return out

    def run(self, ctx: GateContext) -> WorkloadResult:
        ev = NvmeIntegrityEvidence()
        errors = []
        for name, node in ctx.nodes.items():
            tr = ctx.transports[name]
            t = node.target(ctx.params.target)
            if t.kind == "nvmeof":
                try:
                    d, err = _run_nvmeof(ctx, name, node, t, tr)
                except (WorkloadError, LoopbackError) as exc:
                    errors.append(f"{name}: {exc}")
                    continue
                ev.nodes = {**ev.nodes, name: d}
                write_gate_file(ctx.gate_dir / f"{name}-integrity.json", d.model_dump_json(indent=1))
                if err:
                    errors.append(f"{name}: {err}")
                continue
            spec = LoopbackSpec.from_target(t, name, node)
            lb = Loopback(tr, spec, run=lambda n, argv, t, tr=tr: ctx.steps.run(tr, n, argv, timeout_s=t),
                          progress=ctx.progress)
            st = lb.probe()
            if nvme_device(spec, st) is None or backing_device(spec, st) is None:
                errors.append(f"{name}: loopback target {spec.name} is not up (run 'kvgate loopback up')")
                continue
            try:
                res = loopback_integrity(lb, st, length_bytes=ctx.params.length_bytes)
            except LoopbackError as exc:
                errors.append(f"{name}: {exc}")
                continue
            d = IntegrityRecord.of(res)
            ev.nodes = {**ev.nodes, name: d}
            write_gate_file(ctx.gate_dir / f"{name}-integrity.json", d.model_dump_json(indent=1))
            failed = [c for c in res.checks if c.error]
            if failed:
                errors.append(f"{name}: " + "; ".join(f"{c.direction}: {c.error}" for c in failed))
            ctx.progress(f"{name}: {res.checked_bytes} bytes read back through {res.device}, "
                         f"{res.mismatched_bytes} differ")
        return evaluate_integrity(ev, errors)


def _integrity_steps(name: str, spec: LoopbackSpec, length_bytes: int, device: str = "<the namespace's /dev/nvmeXnY>",
                     guard_device: bool = True) -> list[PlannedStep]:
    """The commands of a loopback's integrity check, as planned: the write guard on the backing and (unless it
    was asked already, ``guard_device``) on the namespace, when offered; then either the two-way write and
    read-back or the read-only compare; then the clean-up."""
    backing = "<the backing device>"
    guards = block_probe_plan(backing, "the backing") + (block_probe_plan(device, "the namespace") if guard_device
                                                         else [])
    out = [PlannedStep(name, f"if offered: {what}", argv, optional=True) for what, argv, _ in guards]
    for writable, mode in ((True, "the write guard allowed both"), (False, "not allowed: read-only compare")):
        out += [PlannedStep(name, f"{mode}: {what} (the data comes here to be compared)", argv, optional=True)
                for what, argv in integrity_commands(spec.name, backing, device, length_bytes,
                                                     spec.backing != "file", writable)]
    out.append(PlannedStep(name, "remove the pattern and read-back files", integrity_cleanup_argv(spec.name)))
    return out


def _loopback_of(node, target):
    """The node's own loopback target serving ``target``'s NQN (the target side), if it has one."""
    return next((x for x in node.targets if x.kind == "nvmeof-loopback" and x.nqn == target.nqn), None)


def _run_nvmeof(ctx: GateContext, name: str, node, t, tr) -> tuple[IntegrityRecord, str | None]:
    """One node's check through a ``kind: nvmeof`` target: (the evidence record, an error or None)."""
    dev, nvmeof = nvmeof_device(ctx, node, t, tr)
    run = lambda n, argv, timeout_s: ctx.steps.run(tr, n, argv, timeout_s=timeout_s)  # noqa: E731
    decision = check_write(run, dev, expect="block", node=name, allow_destructive=t.allow_destructive,
                           serial=t.serial, purpose=f"integrity pattern through NVMe-oF target {t.name} ({t.nqn})")
    ndir = ctx.gate_dir / name
    ndir.mkdir(parents=True, exist_ok=True)
    write_gate_file(ndir / "write-guard.json", decision.to_json())
    if not decision.allowed:
        res = IntegrityResult((), dev, "", decision)
        d = IntegrityRecord.of(res, ok=False, nvmeof=nvmeof, namespace_write_guard=decision.as_dict())
        return d, decision.refusal() + "; nothing was written"
    loop = _loopback_of(node, t)
    if loop is not None:
        spec = LoopbackSpec.from_target(loop, name, node)
        lb = Loopback(tr, spec, run=run, progress=ctx.progress)
        st = lb.probe()
        if backing_device(spec, st) is None:
            raise WorkloadError(f"the loopback {loop.name} serving {t.nqn} has no backing device (run "
                                "'kvgate loopback up')")
        res = loopback_integrity(lb, st, length_bytes=ctx.params.length_bytes, device=dev,
                                 device_decision=decision)
    else:
        res = roundtrip_integrity(tr, run, dev, ctx.params.length_bytes, label=t.name, decision=decision)
    d = IntegrityRecord.of(res, nvmeof=nvmeof, namespace_write_guard=decision.as_dict())
    failed = [c for c in res.checks if c.error]
    ctx.progress(f"{name}: {res.checked_bytes} bytes read back through {dev} ({nvmeof.get('transport')}), "
                 f"{res.mismatched_bytes} differ")
    return d, ("; ".join(f"{c.direction}: {c.error}" for c in failed) or None)
