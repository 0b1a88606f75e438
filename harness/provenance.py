"""Node facts for the report's provenance section that the snapshot does not hold: GPUs and driver
(nvidia-smi), NICs with speed, MTU, state and driver, NVMe controllers/namespaces (``nvme list -o json``),
NVMe-oF subsystems (``nvme list-subsys -o json``), and the versions of vLLM, LMCache, torch and Python.

Commands run as logged steps; each output goes through a pure parser tested on captured real output
(tests/fixtures/provenance/). A tool that is not installed is recorded as absent, not as an error.
"""

from __future__ import annotations

import csv
import io
import re
from typing import Any

NVIDIA_SMI_ARGV = ("nvidia-smi", "--query-gpu=index,name,driver_version,memory.total,pci.bus_id",
                   "--format=csv,nounits")
NVME_LIST_ARGV = ("nvme", "list", "-o", "json")
NVME_LIST_SUBSYS_ARGV = ("nvme", "list-subsys", "-o", "json")
NICS_ARGV = ("sh", "-c", "for i in /sys/class/net/*; do n=${i##*/}; "
             "d=$(readlink \"$i/device/driver\" 2>/dev/null); "
             "printf '%s %s %s %s %s\\n' \"$n\" \"$(cat \"$i/speed\" 2>/dev/null || echo -)\" "
             "\"$(cat \"$i/mtu\" 2>/dev/null || echo -)\" \"$(cat \"$i/operstate\" 2>/dev/null || echo -)\" "
             "\"${d##*/}\"; done")
VERSION_PACKAGES = ("vllm", "lmcache", "torch", "nixl")
VERSIONS_ARGV = ("python3", "-c",
                 "import json, platform, importlib.metadata as m\n"
                 "out = {'python': platform.python_version()}\n"
                 f"for p in {list(VERSION_PACKAGES)!r}:\n"
                 "    try:\n        out[p] = m.version(p)\n"
                 "    except m.PackageNotFoundError:\n        out[p] = None\n"
                 "print(json.dumps(out, sort_keys=True))")

PROVENANCE_COMMANDS: dict[str, tuple[str, ...]] = {
    "nvidia_smi": NVIDIA_SMI_ARGV,
    "nvme_list": NVME_LIST_ARGV,
    "nvme_list_subsys": NVME_LIST_SUBSYS_ARGV,
    "nics": NICS_ARGV,
    "versions": VERSIONS_ARGV,
}


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
    from .parsers.nvme import ParseError, load_json

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
    from .parsers.nvme import ParseError, parse_list_subsys

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


# --------------------------------------------------------------------------- collection


def _absent(r) -> bool:
    """The tool is not installed (shell 127, or the local spawn failed with 'No such file')."""
    return r.rc == 127 or (r.rc is None and "No such file" in (r.error or ""))


def provenance_commands(engine_python: str | None = None) -> dict[str, tuple[str, ...]]:
    """The commands, with the engine versions read by the node's engine interpreter when it has one."""
    cmds = dict(PROVENANCE_COMMANDS)
    if engine_python:
        cmds["versions"] = (engine_python,) + VERSIONS_ARGV[1:]
    return cmds


def collect_provenance(transport, steps, engine_python: str | None = None) -> dict[str, Any]:
    """Run the provenance commands as logged steps and parse what they printed; failures become data."""
    prov: dict[str, Any] = {"node": transport.name, "errors": {}, "absent": []}
    for key, argv in provenance_commands(engine_python).items():
        r = steps.run(transport, f"provenance-{key}", argv, timeout_s=60)
        if _absent(r):
            prov["absent"].append(argv[0])
            continue
        if key.startswith("nvme_list") and not r.ok and not r.stdout.strip():
            # nvme-cli 2.3 exits 1 with no output when the host has no NVMe device at all.
            prov["nvme_controllers" if key == "nvme_list" else "nvme_subsystems"] = []
            prov.setdefault("notes", {})[key] = (r.stderr.strip().splitlines() or [f"rc {r.rc}"])[-1]
            continue
        if not r.ok:
            prov["errors"][key] = r.summary()
            continue
        try:
            if key == "nvidia_smi":
                prov["gpus"] = parse_nvidia_smi_csv(r.stdout)
            elif key == "nvme_list":
                prov["nvme_controllers"] = parse_nvme_list(r.stdout)
            elif key == "nvme_list_subsys":
                prov["nvme_subsystems"] = parse_nvme_list_subsys(r.stdout)
            elif key == "nics":
                prov["nics"] = parse_nics(r.stdout)
            elif key == "versions":
                prov["versions"] = parse_versions(r.stdout)
        except ProvenanceParseError as exc:
            prov["errors"][key] = f"unparseable output: {exc}"
    return prov
