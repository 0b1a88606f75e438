"""Data integrity through an NVMe-oF loopback: what is read through /dev/nvmeXnY equals the backing store.

Per node, a known pattern is written on the backing device and read back through the NVMe/TCP
namespace, and another written through the namespace and read on the backing device (a user's
block device not marked ``allow_destructive`` is only read on both paths and compared; every write
to a backing kvgate did not make asks the write guard first, harness.writeguard). The
metric is the number of bytes that differ; every read-back is kept in the evidence.

Importing this module also registers the ``nvmeof-loopback`` device resolver for fio-read, so G1
can name a loopback target and read the /dev/nvmeXnY found by its NQN.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import Field

from ..rigs.loopback import (INTEGRITY_LEN_BYTES, Loopback, LoopbackError, LoopbackSpec, backing_device,
                             nvme_device, probe_commands, resolve_loopback_device)
from .base import Evidence, GateContext, PlannedStep, StrictModel, Workload, WorkloadResult, register_workload
from .fio_read import TARGET_RESOLVERS

TARGET_RESOLVERS.setdefault("nvmeof-loopback", resolve_loopback_device)


class NvmeIntegrityParams(StrictModel):
    target: str
    length_bytes: int = Field(default=INTEGRITY_LEN_BYTES, ge=65536, le=64 * 1024 * 1024)


class NvmeIntegrityEvidence(Evidence):
    """Per node: every read-back (direction, bytes compared, bytes that differ, digests) as checked."""

    nodes: dict[str, dict[str, Any]] = {}


def evaluate_integrity(ev: NvmeIntegrityEvidence, errors: list[str]) -> WorkloadResult:
    """Pure: the metrics (bytes compared, bytes that differ) over every node's checks."""
    mismatched = sum(int(d["mismatched_bytes"]) for d in ev.nodes.values())
    checked = sum(int(d["checked_bytes"]) for d in ev.nodes.values())
    metrics = {"mismatched_bytes": float(mismatched), "checked_bytes": float(checked)}
    return WorkloadResult(metrics, ev, error="; ".join(errors) if errors else None)


@register_workload("nvme-integrity")
class NvmeIntegrity(Workload):
    Params = NvmeIntegrityParams
    EvidenceModel = NvmeIntegrityEvidence
    METRICS = {"mismatched_bytes": "B", "checked_bytes": "B"}

    def validate_against(self, params: Any, nodes: dict[str, Any]) -> list[tuple[tuple, str]]:
        issues = []
        for name, node in nodes.items():
            t = node.target(params.target)
            if t is None:
                issues.append((("target",), f"node {name!r} has no target {params.target!r}"))
            elif t.kind != "nvmeof-loopback":
                issues.append((("target",), f"target {params.target!r} on node {name!r} has kind {t.kind!r}; "
                               "nvme-integrity needs kind nvmeof-loopback"))
            elif params.length_bytes % 65536:
                issues.append((("length_bytes",), "length_bytes must be a multiple of 64 KiB"))
        return issues

    def plan(self, ctx: GateContext) -> list[PlannedStep]:
        out = []
        for name, node in ctx.nodes.items():
            spec = LoopbackSpec.from_target(node.target(ctx.params.target), name)
            for probe, argv in probe_commands(spec).items():
                out.append(PlannedStep(name, f"probe {probe}", tuple(argv)))
            writes = "write pattern on backing, read via NVMe/TCP; write via NVMe/TCP, read on backing"
            if spec.backing == "block" and not spec.allow_destructive:
                mode = "read-only compare"
            elif spec.backing == "null_blk":
                mode = writes
            else:
                mode = (f"{writes}, if the write guard allows it (lsblk, blkid -p and the serial of the backing "
                        f"on the node; refused: {'the check fails' if spec.backing == 'block' else 'read-only compare'})")
            out.append(PlannedStep(name, f"integrity ({mode}) of {ctx.params.length_bytes} bytes per "
                                         f"direction on {spec.nqn} (dd with O_DIRECT, compared here)"))
        return out

    def run(self, ctx: GateContext) -> WorkloadResult:
        ev = NvmeIntegrityEvidence()
        errors = []
        for name, node in ctx.nodes.items():
            tr = ctx.transports[name]
            spec = LoopbackSpec.from_target(node.target(ctx.params.target), name)
            lb = Loopback(tr, spec, run=lambda n, argv, t, tr=tr: ctx.steps.run(tr, n, argv, timeout_s=t),
                          progress=ctx.progress)
            st = lb.probe()
            if nvme_device(spec, st) is None or backing_device(spec, st) is None:
                errors.append(f"{name}: loopback target {spec.name} is not up (run 'kvgate loopback up')")
                continue
            try:
                res = lb.check_integrity(st, length_bytes=ctx.params.length_bytes)
            except LoopbackError as exc:
                errors.append(f"{name}: {exc}")
                continue
            d = res.as_dict()
            ev.nodes = {**ev.nodes, name: d}
            (ctx.gate_dir / f"{name}-integrity.json").write_text(json.dumps(d, indent=1))
            failed = [c for c in res.checks if c.error]
            if failed:
                errors.append(f"{name}: " + "; ".join(f"{c.direction}: {c.error}" for c in failed))
            ctx.progress(f"{name}: {res.checked_bytes} bytes read back through {res.device}, "
                         f"{res.mismatched_bytes} differ")
        return evaluate_integrity(ev, errors)
