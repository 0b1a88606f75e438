"""A GPU node's facts for ``scripts/gpu-check.sh``: the probes it sends and their pure parsers, and the pure
check of the node's pairing (driver, torch, LMCache's CUDA ops) with what the node needs when it fails.

- ``nvidia-smi -q``: the driver and the CUDA version it supports, and per GPU (in nvidia-smi's index order,
  which is PCI bus order) its name, PCI bus id, memory and PCIe link (generation and width, the maximum the GPU
  and the host agree on), and whether the GPU is reached over NVLink-C2C (GH200) rather than PCIe.
- ``/sys/bus/pci/devices/*/numa_node``: each PCI device's NUMA node, so the inventory pins each GPU's reader.
- ``harness/node/gpu_probe.py`` (run by the engine's interpreter): torch's version and CUDA build, what CUDA
  sees, LMCache's version and whether its compiled CUDA ops import (the exact error when not), the CUDA and
  torch libraries those ops link, vLLM's version; with ``h2d``, the pinned host-to-device copy rate per GPU.

Nothing here runs a command; the script runs them and files their output (tests/fixtures/gpu/ holds captured
output with its source).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from .probe import Probe

# Per-lane rate of a PCIe link, per direction, after line encoding, in decimal GB/s: gen 1-2 8b/10b, gen 3-5
# 128b/130b, gen 6 PAM4 in FLIT mode (242 of every 256 bytes carry data). A link's ceiling is this x width;
# transfers reach less (TLP headers, flow control).
PCIE_LANE_GB_S = {1: 0.25, 2: 0.5, 3: 8 * 128 / 130 / 8, 4: 16 * 128 / 130 / 8, 5: 32 * 128 / 130 / 8,
                  6: 64 * 242 / 256 / 8}
PROBE_MARK = "kvgate-gpu-probe"


@dataclass(frozen=True)
class SmiGpu:
    """One GPU as ``nvidia-smi -q`` describes it; ``index`` is nvidia-smi's (its PCI bus order)."""

    index: int
    bus_id: str                 # as nvidia-smi prints it: 00000000:18:00.0
    name: str | None
    memory_total_mib: int | None
    pcie_gen_max: int | None
    pcie_width_max: int | None
    pcie_gen_current: int | None
    pcie_width_current: int | None
    c2c: bool                   # reached over NVLink-C2C (GH200): the PCIe link is not its host path

    @property
    def pci_address(self) -> str:
        """The bus id as sysfs names the device (4-digit domain, lower case): 0000:18:00.0."""
        domain, _, rest = self.bus_id.partition(":")
        return f"{int(domain, 16):04x}:{rest.lower()}"

    @property
    def pcie_ceiling_gb_s(self) -> float | None:
        """The PCIe link's ceiling per direction (None over C2C, or when the link is unknown)."""
        if self.c2c:
            return None
        return pcie_ceiling_gb_s(self.pcie_gen_max, self.pcie_width_max)


@dataclass(frozen=True)
class SmiReport:
    driver_version: str | None
    cuda_version: str | None    # the newest CUDA the driver supports
    gpus: tuple[SmiGpu, ...]


def pcie_ceiling_gb_s(gen: int | None, width: int | None) -> float | None:
    """A PCIe link's ceiling per direction in GB/s (decimal), or None for an unknown generation or width."""
    if gen is None or width is None or gen not in PCIE_LANE_GB_S:
        return None
    return PCIE_LANE_GB_S[gen] * width


def _int_prefix(value: str | None) -> int | None:
    m = re.match(r"\s*(\d+)", value or "")
    return int(m.group(1)) if m else None


def _tree(lines: list[str]) -> dict[str, str]:
    """``key : value`` lines nested under section lines by indentation, as ``Section/Sub/key -> value``."""
    out: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    for line in lines:
        body = line.strip()
        if not body:
            continue
        indent = len(line) - len(line.lstrip(" "))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        m = re.match(r"^(.*?)\s+:(?:\s(.*))?$", body)
        if m:
            out["/".join([s for _, s in stack] + [m.group(1)])] = (m.group(2) or "").strip()
        else:
            stack.append((indent, body))
    return out


def parse_nvidia_smi_q(text: str) -> SmiReport:
    """``nvidia-smi -q``'s report. ValueError when it is not one (no ``Driver Version`` line)."""
    head: list[str] = []
    blocks: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        m = re.match(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$", line)
        if m:
            blocks.append((m.group(1), []))
        elif blocks:
            blocks[-1][1].append(line)
        else:
            head.append(line)
    top = _tree(head)
    if "Driver Version" not in top:
        raise ValueError("not nvidia-smi -q output (no 'Driver Version' line)")
    gpus = []
    for index, (bus_id, lines) in enumerate(blocks):
        t = _tree(lines)
        link = "PCI/GPU Link Info"
        gpus.append(SmiGpu(
            index=index, bus_id=t.get("PCI/Bus Id", bus_id), name=t.get("Product Name"),
            memory_total_mib=_int_prefix(t.get("FB Memory Usage/Total")),
            pcie_gen_max=_int_prefix(t.get(f"{link}/PCIe Generation/Max")),
            pcie_width_max=_int_prefix(t.get(f"{link}/Link Width/Max")),
            pcie_gen_current=_int_prefix(t.get(f"{link}/PCIe Generation/Current")),
            pcie_width_current=_int_prefix(t.get(f"{link}/Link Width/Current")),
            c2c=t.get("GPU C2C Mode", "").strip().lower() == "enabled"))
    attached = _int_prefix(top.get("Attached GPUs"))
    if attached is not None and attached != len(gpus):
        raise ValueError(f"nvidia-smi -q says {attached} GPU(s) are attached but describes {len(gpus)}")
    return SmiReport(driver_version=top.get("Driver Version"), cuda_version=top.get("CUDA Version"),
                     gpus=tuple(gpus))


def parse_pci_numa(text: str) -> dict[str, int | None]:
    """``grep -H . /sys/bus/pci/devices/*/numa_node``: PCI address -> NUMA node (None where the kernel says -1:
    one node, or no affinity known)."""
    out: dict[str, int | None] = {}
    for line in text.splitlines():
        m = re.match(r"^/sys/bus/pci/devices/([0-9a-fA-F:.]+)/numa_node:(-?\d+)\s*$", line)
        if m:
            node = int(m.group(2))
            out[m.group(1).lower()] = node if node >= 0 else None
    return out


NVIDIA_SMI_Q = Probe("nvidia-smi-q", ("nvidia-smi", "-q"), parse_nvidia_smi_q,
                     "the driver, its CUDA version, each GPU's bus id, memory and PCIe link")
PCI_NUMA = Probe("pci-numa", ("sh", "-c", "grep -H . /sys/bus/pci/devices/*/numa_node"), parse_pci_numa,
                 "each PCI device's NUMA node")


# ------------------------------------------------------------------------------------ the engine's side


@dataclass(frozen=True)
class TorchDevice:
    index: int
    name: str
    capability: str             # "9.0"
    total_memory_bytes: int


@dataclass(frozen=True)
class TorchProbe:
    """What ``harness/node/gpu_probe.py`` found in the engine's interpreter; an ``*_error`` is the exception's
    type and text as raised."""

    python: str
    torch_version: str | None
    torch_error: str | None
    torch_cuda: str | None      # torch.version.cuda: None for a CPU build
    cuda_available: bool
    cuda_error: str | None
    devices: tuple[TorchDevice, ...]
    arch_list: tuple[str, ...]
    lmcache_version: str | None
    lmcache_error: str | None
    ops_module: str | None      # the compiled CUDA ops module found (lmcache.cuda_ops; lmcache.c_ops before 0.4)
    ops_error: str | None
    ops_libs: tuple[str, ...]   # the CUDA and torch libraries the ops module names (libcudart.so.13, ...)
    vllm_version: str | None
    vllm_error: str | None


def _probe_doc(text: str) -> dict[str, Any]:
    for line in reversed(text.splitlines()):
        if line.startswith(PROBE_MARK + " "):
            doc = json.loads(line[len(PROBE_MARK) + 1:])
            if not isinstance(doc, dict):
                raise ValueError("the probe's document is not a JSON object")
            return doc
    raise ValueError(f"no '{PROBE_MARK}' line in the probe's output")


def parse_torch_probe(text: str) -> TorchProbe:
    """The probe's ``kvgate-gpu-probe {...}`` line. ValueError when there is none."""
    d = _probe_doc(text)
    devices = tuple(TorchDevice(int(x["index"]), str(x["name"]), str(x["capability"]), int(x["total_memory_bytes"]))
                    for x in d.get("devices") or [])
    return TorchProbe(
        python=str(d.get("python", "")), torch_version=d.get("torch_version"), torch_error=d.get("torch_error"),
        torch_cuda=d.get("torch_cuda"), cuda_available=bool(d.get("cuda_available")), cuda_error=d.get("cuda_error"),
        devices=devices, arch_list=tuple(d.get("arch_list") or ()), lmcache_version=d.get("lmcache_version"),
        lmcache_error=d.get("lmcache_error"), ops_module=d.get("ops_module"), ops_error=d.get("ops_error"),
        ops_libs=tuple(d.get("ops_libs") or ()), vllm_version=d.get("vllm_version"), vllm_error=d.get("vllm_error"))


@dataclass(frozen=True)
class H2dResult:
    """Pinned host memory -> one GPU, ``bytes`` per copy, each copy's time."""

    index: int
    bytes: int
    seconds: tuple[float, ...]

    @property
    def best_gb_s(self) -> float:
        return self.bytes / min(self.seconds) / 1e9

    @property
    def median_gb_s(self) -> float:
        s = sorted(self.seconds)
        mid = s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2
        return self.bytes / mid / 1e9


def parse_h2d(text: str) -> tuple[tuple[H2dResult, ...], str | None]:
    """The probe's ``h2d`` document: each GPU's copies, and the error when it could not measure."""
    d = _probe_doc(text)
    results = tuple(H2dResult(int(x["index"]), int(x["bytes"]), tuple(float(s) for s in x["seconds"]))
                    for x in d.get("h2d") or [] if x.get("seconds"))
    return results, d.get("error")


# ------------------------------------------------------------------------------------------ the pairing


@dataclass(frozen=True)
class Pairing:
    """Whether the node can run kvgate's GPU gates, every problem found (each names what was seen), and what
    the node needs (one line per requirement the problems broke)."""

    ok: bool
    problems: tuple[str, ...]
    needs: tuple[str, ...]
    facts: dict[str, Any] = field(default_factory=dict)


def _major_minor(v: str | None) -> tuple[int, int] | None:
    m = re.match(r"\s*(\d+)\.(\d+)", v or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def ops_cuda_major(libs: tuple[str, ...]) -> int | None:
    """The CUDA major version LMCache's ops were built for: the ``libcudart.so.N`` they link."""
    for lib in libs:
        m = re.fullmatch(r"libcudart\.so\.(\d+)", lib)
        if m:
            return int(m.group(1))
    return None


def _explain_ops_error(err: str, cuda_major: int | None) -> str:
    built = f"CUDA {cuda_major}" if cuda_major else "CUDA"
    if "libc10_cuda" in err or "libtorch_cuda" in err:
        return f"they link torch's CUDA libraries, which a CPU build of torch lacks: they need a {built} build of torch"
    if "libcudart" in err:
        return f"the {built} runtime (libcudart) is not found: they need a torch built for {built}, which brings it"
    if "undefined symbol" in err:
        return "a symbol of torch is missing: LMCache's wheel was built against another torch version"
    return "the error above is the loader's or LMCache's own"


def check_pairing(smi: SmiReport | None, smi_error: str | None, probe: TorchProbe | None,
                  probe_error: str | None) -> Pairing:
    """Pure: can this node's driver, torch and LMCache run kvgate's GPU gates? Every problem, each with what was
    seen, and what the node needs."""
    problems: list[str] = []
    needs: list[str] = []
    cuda_major = ops_cuda_major(probe.ops_libs) if probe else None
    want_cuda = f"CUDA {cuda_major}.x" if cuda_major else "CUDA"
    lm = f"LMCache {probe.lmcache_version}" if probe and probe.lmcache_version else "LMCache"
    why_cuda = (f" ({lm}'s {probe.ops_module or 'CUDA ops'} link libcudart.so.{cuda_major})"
                if probe and cuda_major else "")
    if smi is None or not smi.gpus:
        problems.append(f"no NVIDIA GPU: nvidia-smi -q: {smi_error or 'no GPU attached'}")
        needs.append("an NVIDIA GPU with its driver loaded (nvidia-smi -q lists it)"
                     + (f", a driver whose CUDA Version is {cuda_major}.0 or later" if cuda_major else ""))
    if probe is None:
        problems.append(f"the engine's interpreter could not be probed: {probe_error}")
        return Pairing(False, tuple(problems), tuple(needs))
    facts = {"python": probe.python, "torch": probe.torch_version, "torch_cuda": probe.torch_cuda,
             "driver": smi.driver_version if smi else None, "driver_cuda": smi.cuda_version if smi else None,
             "lmcache": probe.lmcache_version, "ops_module": probe.ops_module, "ops_cuda_major": cuda_major,
             "vllm": probe.vllm_version}
    if probe.torch_error:
        problems.append(f"torch does not import in {probe.python}: {probe.torch_error}")
        needs.append(f"torch, a {want_cuda} build{why_cuda}")
    elif probe.torch_cuda is None:
        problems.append(f"torch {probe.torch_version} in {probe.python} is a CPU build (torch.version.cuda is None)")
        needs.append(f"a {want_cuda} build of torch{why_cuda}")
    else:
        tc = _major_minor(probe.torch_cuda)
        if cuda_major and tc and tc[0] != cuda_major:
            problems.append(f"torch {probe.torch_version} is built for CUDA {probe.torch_cuda}, {lm}'s "
                            f"{probe.ops_module} for CUDA {cuda_major} (libcudart.so.{cuda_major})")
            needs.append(f"a {want_cuda} build of torch, or {lm.split()[0]} built for CUDA {tc[0]}")
        dc = _major_minor(smi.cuda_version) if smi else None
        if tc and dc and dc < tc:
            problems.append(f"the driver {smi.driver_version} supports CUDA up to {smi.cuda_version}; torch "
                            f"{probe.torch_version} is built for CUDA {probe.torch_cuda}")
            needs.append(f"an NVIDIA driver whose CUDA Version is {probe.torch_cuda} or later, or a torch built for "
                         f"CUDA {smi.cuda_version} or earlier")
        if not probe.cuda_available:
            problems.append(f"torch {probe.torch_version} sees no CUDA device"
                            + (f": {probe.cuda_error}" if probe.cuda_error else ""))
    if probe.lmcache_error:
        problems.append(f"LMCache does not import in {probe.python}: {probe.lmcache_error}")
        needs.append("LMCache 0.5.6 in the engine's interpreter (scripts/gpu-check.sh installs it from --wheels)")
    elif probe.ops_error:
        problems.append(f"{lm}'s CUDA ops ({probe.ops_module or 'lmcache.cuda_ops'}) do not load: {probe.ops_error}: "
                        + _explain_ops_error(probe.ops_error, cuda_major))
    if smi and smi.gpus and probe.cuda_available and len(probe.devices) != len(smi.gpus):
        problems.append(f"torch sees {len(probe.devices)} GPU(s), nvidia-smi {len(smi.gpus)} "
                        "(CUDA_VISIBLE_DEVICES?): kvgate's inventory would name GPUs torch cannot reach")
    for dev in probe.devices:
        sm = "sm_" + dev.capability.replace(".", "")
        if probe.arch_list and sm not in probe.arch_list and not any(
                a.startswith("compute_") and int(a[8:]) <= int(sm[3:]) for a in probe.arch_list if a[8:].isdigit()):
            problems.append(f"GPU {dev.index} ({dev.name}, {sm}) is not among torch's architectures "
                            f"({' '.join(probe.arch_list)})")
    return Pairing(not problems, tuple(problems), tuple(dict.fromkeys(needs)), facts)
