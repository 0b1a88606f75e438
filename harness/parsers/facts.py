"""Pure parsers of the facts kvgate records about every node (the commands: harness.execute.facts).

/proc and /etc reads (kernel, OS, CPU, memory, NUMA CPU lists), NICs from /sys/class/net (speed, MTU,
state, driver), GPUs and driver (nvidia-smi), NVMe controllers/namespaces (``nvme list -o json``), NVMe-oF
subsystems (``nvme list-subsys -o json``), and the versions of vLLM, LMCache, torch and Python. Each
parser is tested on captured output (tests/fixtures/provenance/).
"""

from __future__ import annotations

import csv
import io
import re
from typing import Any


class ProvenanceParseError(ValueError):
    """A command printed something that is not the shape its parser expects."""


# --------------------------------------------------------------------------- nvidia-smi


def _num(text: str) -> float | None:
    m = re.match(r"^\s*([-+]?\d+(?:\.\d+)?)", text or "")
    return float(m.group(1)) if m else None


def parse_nvidia_smi_csv(text: str) -> list[dict[str, Any]]:
    """``nvidia-smi --query-gpu=index,name,driver_version,memory.total,pci.bus_id --format=csv[,nounits]``.

    Columns are found by their header (``memory.total [MiB]`` and ``81559 MiB`` both parse), so a query with
    fewer or reordered fields works too.
    """
    rows = [r for r in csv.reader(io.StringIO(text.strip()), skipinitialspace=True) if r]
    if not rows:
        return []
    header = [re.sub(r"\s*\[.*\]$", "", h.strip()) for h in rows[0]]
    if "name" not in header:
        raise ProvenanceParseError(f"nvidia-smi: no header with 'name' (got {rows[0]!r})")
    out = []
    for r in rows[1:]:
        if len(r) != len(header):
            raise ProvenanceParseError(f"nvidia-smi: row has {len(r)} fields, header {len(header)}: {r!r}")
        d = {h: v.strip() for h, v in zip(header, r)}
        mem = _num(d.get("memory.total", ""))
        idx = _num(d.get("index", ""))
        out.append({"index": int(idx) if idx is not None else len(out), "name": d.get("name"),
                    "driver_version": d.get("driver_version"),
                    "memory_total_mib": int(mem) if mem is not None else None,
                    "pci_bus_id": d.get("pci.bus_id")})
    return out


# --------------------------------------------------------------------------- nvme-cli


def _load(text: str, what: str) -> Any:
    """JSON output of a command (None when empty), with the loopback parsers' reading of it."""
    from .nvme import ParseError, load_json

    try:
        return load_json(text, what)
    except ParseError as exc:
        raise ProvenanceParseError(str(exc)) from None


def parse_nvme_list(text: str) -> list[dict[str, Any]]:
    """``nvme list -o json``: one record per controller/namespace device with model, serial and firmware.

    Reads the flat shape (nvme-cli 1.x and 2.x without -v: ``Devices[]`` with ``DevicePath``) and the
    verbose 2.x shape (``Devices[].Subsystems[].Controllers[]`` with the subsystem's ``Namespaces``).
    Empty output (nvme-cli 2.3 prints nothing and exits 1 when there is no NVMe device) is no device.
    """
    data = _load(text, "nvme list")
    if data is None:
        return []
    if not isinstance(data, dict) or not isinstance(data.get("Devices"), list):
        raise ProvenanceParseError("nvme list: expected an object with a 'Devices' list")
    out: list[dict[str, Any]] = []
    for dev in data["Devices"]:
        if not isinstance(dev, dict):
            raise ProvenanceParseError("nvme list: a device entry is not an object")
        if "Subsystems" in dev:
            for sub in dev.get("Subsystems") or []:
                ns = [{"name": n.get("NameSpace"), "nsid": n.get("NSID"), "size_bytes": n.get("PhysicalSize")}
                      for n in sub.get("Namespaces") or []]
                for ctrl in sub.get("Controllers") or []:
                    own = [{"name": n.get("NameSpace"), "nsid": n.get("NSID"), "size_bytes": n.get("PhysicalSize")}
                           for n in ctrl.get("Namespaces") or []]
                    spaces = own or ns
                    out.append({
                        "device": ctrl.get("Controller"), "model": (ctrl.get("ModelNumber") or "").strip(),
                        "serial": (ctrl.get("SerialNumber") or "").strip(),
                        "firmware": (ctrl.get("Firmware") or "").strip(), "transport": ctrl.get("Transport"),
                        "address": ctrl.get("Address") or None, "subsystem_nqn": sub.get("SubsystemNQN"),
                        "namespaces": spaces,
                        "size_bytes": sum(int(n["size_bytes"] or 0) for n in spaces) if spaces else None,
                    })
        else:
            out.append({
                "device": dev.get("DevicePath"), "model": (dev.get("ModelNumber") or "").strip(),
                "serial": (dev.get("SerialNumber") or "").strip(), "firmware": (dev.get("Firmware") or "").strip(),
                "transport": None, "address": None, "subsystem_nqn": None,
                "namespaces": [{"name": dev.get("DevicePath"), "nsid": dev.get("NameSpace"),
                                "size_bytes": dev.get("PhysicalSize")}],
                "size_bytes": dev.get("PhysicalSize"),
            })
    return out


def parse_nvme_list_subsys(text: str) -> list[dict[str, Any]]:
    """``nvme list-subsys -o json`` as report rows: subsystems (NQN) and their controller paths (transport,
    address, state). The parsing itself is the loopback's parser (harness.parsers.nvme)."""
    from .nvme import ParseError, parse_list_subsys

    try:
        subsystems = parse_list_subsys(text)
    except ParseError as exc:
        raise ProvenanceParseError(str(exc)) from None
    return [{"name": s.name or None, "nqn": s.nqn, "host_nqn": s.host_nqn or None,
             "paths": [{"controller": p.controller or None, "transport": p.transport or None,
                        "address": ",".join(f"{k}={v}" for k, v in p.address.items()) or None,
                        "state": p.state or None} for p in s.paths]}
            for s in subsystems]


# --------------------------------------------------------------------------- NICs, versions


def parse_nics(text: str) -> list[dict[str, Any]]:
    """Lines ``name speed_mbit_s mtu operstate driver`` from /sys/class/net (speed -1 or '-' is unknown)."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        name, speed, mtu = parts[:3]
        state = parts[3] if len(parts) > 3 and parts[3] != "-" else None
        driver = parts[4] if len(parts) > 4 else None
        sp = int(speed) if speed.lstrip("-").isdigit() and int(speed) > 0 else None
        out.append({"name": name, "speed_mbit_s": sp, "mtu": int(mtu) if mtu.isdigit() else None,
                    "operstate": state, "driver": driver})
    return out


def parse_versions(text: str) -> dict[str, str | None]:
    data = _load(text, "versions")
    if not isinstance(data, dict):
        raise ProvenanceParseError("versions: expected a JSON object")
    return {str(k): (str(v) if v is not None else None) for k, v in data.items()}


# --------------------------------------------------------------------------- /proc, /etc, NUMA


def parse_cpuinfo(text: str) -> dict[str, Any]:
    models = [l.split(":", 1)[1].strip() for l in text.splitlines() if l.startswith("model name")]
    return {"cpu_model": models[0] if models else None, "logical_cpus": len(models) or
            sum(1 for l in text.splitlines() if l.startswith("processor"))}


def parse_meminfo(text: str) -> dict[str, Any]:
    for line in text.splitlines():
        if line.startswith("MemTotal:"):
            return {"mem_total_bytes": int(line.split()[1]) * 1024}
    return {"mem_total_bytes": None}


def parse_os_release(text: str) -> dict[str, Any]:
    kv = dict(l.split("=", 1) for l in text.splitlines() if "=" in l)
    return {"os": kv.get("PRETTY_NAME", "").strip('"') or None}


def parse_numa(text: str) -> dict[int, str]:
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit():
            out[int(parts[0])] = parts[1]
    return out
