"""Node probes as logged steps, and what the streaming-read workloads (fio-read, kv-read) share.

A probe (``harness.parsers.probe.Probe``: a command and its pure parser) runs here as one logged step of the
gate; its plan step lists the same argv. fio-read and kv-read pin each stream to its GPU's NUMA node the same
way (:func:`pins_numa`, :func:`numa_step`, :func:`numa_cpulists`), check fio's result the same way
(:func:`fio_json`, :func:`check_fio_groups`) and turn fio's reporting groups into the same stream rows (:func:`fio_stream_rows`).
"""

from __future__ import annotations

from typing import Any, TypeVar

from ...errors import WorkloadError
from ...parsers.facts import NUMA_PROBE
from ...parsers.fio import FioRun, parse_fio_json
from ...parsers.probe import Probe
from .base import GateContext, PlannedStep, StreamRow

T = TypeVar("T")


def run_probe(ctx: GateContext, transport: Any, probe: Probe[T], step: str | None = None) -> tuple[T | None, Any]:
    """Run ``probe`` on a node as one logged step (named ``step``, default the probe's): (its parsed fact, or
    None when the command failed or printed something the parser refuses; the command's result)."""
    r = ctx.steps.run(transport, step or probe.step, probe.argv, timeout_s=probe.timeout_s)
    if not r.ok:
        return None, r
    try:
        return probe.parse(r.stdout), r
    except ValueError:
        return None, r


def pins_numa(pin_numa: bool, node) -> bool:
    """Streams are pinned when the gate asks for it and the node says which NUMA node a GPU sits on."""
    return pin_numa and any(g.numa_node is not None for g in node.gpus)


def numa_step(node_name: str, who: str) -> PlannedStep:
    """The plan's step of :func:`numa_cpulists` (``who``: what is pinned, e.g. "streams")."""
    return PlannedStep(node_name, f"{NUMA_PROBE.description} ({who} pinned to their GPU's)", NUMA_PROBE.argv)


def numa_cpulists(ctx: GateContext, transport: Any) -> dict[int, str] | None:
    """The node's CPU list per NUMA node (only nodes with CPUs), or None when it could not be read."""
    cpulists, _ = run_probe(ctx, transport, NUMA_PROBE)
    return cpulists


def fio_json(r: Any) -> FioRun:
    """fio's JSON from its command result ``r``; WorkloadError when fio failed."""
    if not r.ok:
        raise WorkloadError(f"fio failed: {r.summary()}")
    return parse_fio_json(r.stdout)


def check_fio_groups(run: FioRun) -> None:
    """WorkloadError when fio reported I/O errors in a reporting group or ran no job."""
    bad = [g.label for g in run.groups if g.errors]
    if bad:
        raise WorkloadError(f"fio reported I/O errors in {', '.join(bad)}")
    if not run.groups:
        raise WorkloadError("fio reported no jobs")


def fio_stream_rows(node: str, run: FioRun, gpu_of: dict[str, int]) -> list[StreamRow]:
    """Pure: one row per fio reporting group (one GPU or read stream) of a node's fio JSON."""
    return [StreamRow(node=node, label=g.label, gpu=gpu_of.get(g.label), read_gb_s=g.read_gb_s,
                      read_bytes=g.read_bytes, runtime_ms=g.runtime_ms, iops=g.read_iops, lat_p50_us=g.lat_p50_us,
                      lat_p99_us=g.lat_p99_us) for g in run.groups]
