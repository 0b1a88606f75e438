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
from dataclasses import dataclass
from typing import Any

from .fio import parse_cpulist
from .probe import Probe


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


# One line per NUMA node, "N CPULIST" (/sys/devices/system/node/nodeN/cpulist); nothing on a kernel without NUMA.
NUMA_ARGV = ("sh", "-c", "for n in /sys/devices/system/node/node[0-9]*; do "
             "[ -r \"$n/cpulist\" ] && printf '%s %s\\n' \"${n##*node}\" \"$(cat \"$n/cpulist\")\"; done; true")


def parse_numa(text: str) -> dict[int, str]:
    """NUMA node -> its CPU list as the kernel writes it (``0-3,8-11``), from :data:`NUMA_ARGV`'s output."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit():
            out[int(parts[0])] = parts[1]
    return out


def parse_numa_cpulists(text: str) -> dict[int, str]:
    """The NUMA nodes a stream can be pinned to: :func:`parse_numa`, without the nodes whose CPU list is empty
    (a memory-only node) or not a CPU list."""
    out = {}
    for node, cpus in parse_numa(text).items():
        try:
            if parse_cpulist(cpus):
                out[node] = cpus
        except ValueError:
            continue
    return out


NUMA_PROBE = Probe("numa-cpulists", NUMA_ARGV, parse_numa_cpulists, "CPU list of every NUMA node")


# --------------------------------------------------------------------------- the one facts command, split back

# Every node's facts are gathered by one shell script (harness.execute.facts.facts_argv) that runs each fact's
# command in turn and frames its output on both streams:
#   stdout: MARK begin KEY t=START \n <the command's stdout> \n MARK end KEY rc=RC t=END \n
#   stderr: MARK begin KEY \n <the command's stderr> \n MARK end KEY \n
# (START / END: the node's `date +%s.%N`). The newline before each end marker is the script's, so a command
# whose output does not end in a newline is given back byte for byte.
SECTION_MARK = "--kvgate-fact-section--"

_BEGIN_RE = re.compile(r"^" + re.escape(SECTION_MARK) + r" begin (\S+)(?: t=(\S*))?\n", re.M)
_END_TAIL_RE = re.compile(r"(?: rc=(-?\d+))?(?: t=(\S*))?\n")


@dataclass(frozen=True)
class FactSection:
    """One fact command's share of the facts script's output, as if it had been run alone.

    ``complete`` is False when the script ended (killed, timed out, connection lost) after this section's
    begin marker and before its end marker: ``stdout``/``stderr`` then hold what it printed until then."""

    key: str
    stdout: str
    stderr: str = ""
    rc: int | None = None
    started_s: float | None = None  # node clock
    ended_s: float | None = None
    complete: bool = False

    @property
    def duration_s(self) -> float | None:
        if self.started_s is None or self.ended_s is None:
            return None
        return max(0.0, self.ended_s - self.started_s)


def _float_or_none(text: str | None) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:
        return None


def _split_stream(text: str) -> dict[str, tuple[str, bool, int | None, float | None, float | None]]:
    """KEY -> (body, complete, rc, t_begin, t_end) of every framed section in one stream; text outside
    the frames (a login shell's noise) is ignored. A key framed twice keeps its first section."""
    out: dict[str, tuple[str, bool, int | None, float | None, float | None]] = {}
    pos = 0
    while True:
        m = _BEGIN_RE.search(text, pos)
        if m is None:
            return out
        key, body_at = m.group(1), m.end()
        needle = "\n" + SECTION_MARK + " end " + key
        at = body_at  # the script prints a newline before every end marker, so an empty body is "\n"
        while True:
            at = text.find(needle, at)
            tail = _END_TAIL_RE.match(text, at + len(needle)) if at >= 0 else None
            if at < 0 or tail is not None:
                break
            at += 1  # "end KEYX" for another key that starts like this one: look further
        if at < 0 or tail is None:
            out.setdefault(key, (text[body_at:], False, None, _float_or_none(m.group(2)), None))
            return out
        body = text[body_at:at]
        rc = int(tail.group(1)) if tail.group(1) is not None else None
        out.setdefault(key, (body, True, rc, _float_or_none(m.group(2)), _float_or_none(tail.group(2))))
        pos = tail.end()


def parse_fact_sections(stdout: str, stderr: str) -> dict[str, FactSection]:
    """Split the facts script's output back into each fact command's stdout, stderr and exit status."""
    outs, errs = _split_stream(stdout), _split_stream(stderr)
    sections = {}
    for key, (body, complete, rc, t0, t1) in outs.items():
        err = errs.get(key, ("", False, None, None, None))[0]
        sections[key] = FactSection(key, body, err, rc if complete else None, t0, t1, complete and rc is not None)
    return sections
