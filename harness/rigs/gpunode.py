"""A GPU node as ``scripts/gpu-check.sh`` sets it up and reports it: the inventory written from the node's probes
(pure), and the figures read back from the verified bundle and the H2D probe (pure).

The suite the script runs is ``gates/gpu-node.yaml``; :data:`GATE_IDS` names its gates as the figures read
them (a test holds the two together).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..parsers.gpu import H2dResult, SmiReport

NODE_NAME = "gpunode"
TARGET_NAME = "gpudisk"
TARGET_FILE = "kvgate-gpu-target.bin"
GATE_IDS = {"fio": "G1", "kv_read": "G1C-gpu", "g2": "G2"}
NOT_MEASURED = ("ERROR", "SKIPPED")


def gpu_inventory(smi: SmiReport, numa: dict[str, int | None], *, work_dir: str, engine_python: str,
                  target_size: str = "8 GiB") -> dict[str, Any]:
    """Pure: the one-node inventory for this node: its GPUs (nvidia-smi's indices, which are torch's when
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID``) with each one's NUMA node, the engine's interpreter, and a file target in
    ``work_dir`` (on the local disk the pool is made on)."""
    gpus = []
    for g in smi.gpus:
        entry: dict[str, Any] = {"index": g.index}
        if numa.get(g.pci_address) is not None:
            entry["numa_node"] = numa[g.pci_address]
        if g.name:
            entry["model"] = g.name
        gpus.append(entry)
    return {"nodes": [{
        "name": NODE_NAME, "transport": "local", "work_dir": work_dir, "engine_python": engine_python,
        "gpus": gpus,
        "targets": [{"name": TARGET_NAME, "kind": "file", "path": TARGET_FILE, "size": target_size}],
    }]}


@dataclass(frozen=True)
class Figure:
    """One figure the script prints: its value (None: not measured) with unit, and where it came from."""

    name: str
    value: float | None
    unit: str
    source: str


def _verdict(verdicts: dict[str, Any], gate_id: str) -> dict[str, Any] | None:
    return next((v for v in verdicts.get("verdicts", []) if v.get("gate_id") == gate_id), None)


def _metric(v: dict[str, Any] | None, name: str) -> float | None:
    """A gate's metric; None when the gate did not measure (ERROR, SKIPPED: whatever it holds is no figure)."""
    if v is None or v.get("outcome") in NOT_MEASURED:
        return None
    m = (v.get("metrics") or {}).get(name)
    return float(m) if isinstance(m, (int, float)) else None


def _src(v: dict[str, Any] | None, gate_id: str) -> str:
    return f"{gate_id}: not in the bundle" if v is None else f"{gate_id} {v.get('outcome')}"


def gate_notes(verdicts: dict[str, Any]) -> list[str]:
    """Pure: one line per gate that did not pass, with its reason (the figures name only the outcome)."""
    return [f"{v.get('gate_id')} {v.get('outcome')}: {v.get('reason')}" for v in verdicts.get("verdicts", [])
            if v.get("outcome") not in ("PASS", "INFO")]


def gpu_figures(verdicts: dict[str, Any], h2d: tuple[H2dResult, ...], smi: SmiReport | None) -> list[Figure]:
    """Pure: the figures of a GPU node check, from the bundle's ``verdicts.json``, the H2D probe and
    ``nvidia-smi -q``: the connector's GB/s into GPU memory (min and mean over GPUs), fio's over the same files
    and the efficiency, fio-read's per-GPU GB/s, the H2D copy rate against the PCIe ceiling, and TTFT re-compute
    against read-back. Each figure names its gate and that gate's outcome; an unmeasured one (no such gate, or
    one that ended ERROR or SKIPPED) is None."""
    fio, kv, g2 = (_verdict(verdicts, GATE_IDS[k]) for k in ("fio", "kv_read", "g2"))
    out = [
        Figure("connector_read_gb_s (min over GPUs, into GPU memory)", _metric(kv, "connector_read_gb_s"), "GB/s",
               _src(kv, GATE_IDS["kv_read"])),
        Figure("connector_read_gb_s_mean", _metric(kv, "connector_read_gb_s_mean"), "GB/s", _src(kv, GATE_IDS["kv_read"])),
        Figure("fio_read_gb_s (same chunk files, min)", _metric(kv, "fio_read_gb_s"), "GB/s", _src(kv, GATE_IDS["kv_read"])),
        Figure("connector_efficiency (connector / fio)", _metric(kv, "connector_efficiency"), "ratio",
               _src(kv, GATE_IDS["kv_read"])),
        Figure("per_gpu_read_gb_s (fio-read, min over GPUs)", _metric(fio, "per_gpu_read_gb_s"), "GB/s",
               _src(fio, GATE_IDS["fio"])),
    ]
    ceilings = [g.pcie_ceiling_gb_s for g in smi.gpus] if smi else []
    h2d_min = min((r.best_gb_s for r in h2d), default=None)
    ceiling = min((c for c in ceilings if c is not None), default=None)
    link = ""
    if smi and smi.gpus:
        g0 = smi.gpus[0]
        link = "NVLink-C2C: no PCIe ceiling" if g0.c2c else f"PCIe gen {g0.pcie_gen_max} x{g0.pcie_width_max}"
    out += [
        Figure("h2d_gb_s (pinned host -> GPU, best copy, min over GPUs)", h2d_min, "GB/s", "gpu_probe.py h2d"),
        Figure("pcie_ceiling_gb_s (per direction)", ceiling, "GB/s", f"nvidia-smi -q: {link}" if link else "nvidia-smi -q"),
        Figure("h2d_of_pcie_ceiling", h2d_min / ceiling if h2d_min is not None and ceiling else None, "ratio",
               "h2d_gb_s / pcie_ceiling_gb_s"),
        Figure("ttft_recompute_p50_s", _metric(g2, "ttft_recompute_p50_s"), "s", _src(g2, GATE_IDS["g2"])),
        Figure("ttft_readback_p50_s", _metric(g2, "ttft_readback_p50_s"), "s", _src(g2, GATE_IDS["g2"])),
        Figure("readback_speedup_p50 (re-compute / read-back)", _metric(g2, "readback_speedup_p50"), "x",
               _src(g2, GATE_IDS["g2"])),
    ]
    return out


def figures_text(figures: list[Figure]) -> str:
    """The figures as the script prints them, one a line; an unmeasured one says so."""
    lines = []
    for f in figures:
        value = "not measured" if f.value is None else f"{f.value:.4g} {f.unit}"
        lines.append(f"{f.name:58} {value:>16}   ({f.source})")
    return "\n".join(lines) + "\n"
