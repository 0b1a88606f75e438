"""Node facts: what a run records about every node before the gates run.

One list, :data:`FACTS`, is both what a run sends to each node and what ``kvgate plan`` prints: each fact is
a command, the pure parser of its output (``harness.parsers``) and the file it lands in under
``nodes/NAME/``: ``snapshot.json`` (kernel, OS, CPU, memory, fio version, block devices, NUMA CPU lists,
NICs) or ``provenance.json`` (GPUs and driver, NVMe controllers and NVMe-oF subsystems, vLLM / LMCache /
torch / Python versions). Every command runs as a logged step; a failure or an unparseable output is
recorded in the file's ``errors``; a provenance tool that is not installed is recorded as ``absent``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

from ..parsers.blockdev import LSBLK_ARGV, parse_lsblk
from ..parsers.facts import (parse_cpuinfo, parse_meminfo, parse_nics, parse_numa, parse_nvidia_smi_csv,
                             parse_nvme_list, parse_nvme_list_subsys, parse_os_release, parse_versions)

NUMA_ARGV = ("sh", "-c", "for n in /sys/devices/system/node/node[0-9]*; do "
             "[ -r \"$n/cpulist\" ] && printf '%s %s\\n' \"${n##*node}\" \"$(cat \"$n/cpulist\")\"; done; true")
NICS_ARGV = ("sh", "-c", "for i in /sys/class/net/*; do n=${i##*/}; "
             "d=$(readlink \"$i/device/driver\" 2>/dev/null); "
             "printf '%s %s %s %s %s\\n' \"$n\" \"$(cat \"$i/speed\" 2>/dev/null || echo -)\" "
             "\"$(cat \"$i/mtu\" 2>/dev/null || echo -)\" \"$(cat \"$i/operstate\" 2>/dev/null || echo -)\" "
             "\"${d##*/}\"; done")
NVIDIA_SMI_ARGV = ("nvidia-smi", "--query-gpu=index,name,driver_version,memory.total,pci.bus_id",
                   "--format=csv,nounits")
NVME_LIST_ARGV = ("nvme", "list", "-o", "json")
NVME_LIST_SUBSYS_ARGV = ("nvme", "list-subsys", "-o", "json")
VERSION_PACKAGES = ("vllm", "lmcache", "torch", "nixl")
VERSIONS_ARGV = ("python3", "-c",
                 "import json, platform, importlib.metadata as m\n"
                 "out = {'python': platform.python_version()}\n"
                 f"for p in {list(VERSION_PACKAGES)!r}:\n"
                 "    try:\n        out[p] = m.version(p)\n"
                 "    except m.PackageNotFoundError:\n        out[p] = None\n"
                 "print(json.dumps(out, sort_keys=True))")


@dataclass(frozen=True)
class Fact:
    """One command of the node facts: ``parse(stdout)`` gives the fields it adds to its file."""

    key: str
    argv: tuple[str, ...]
    file: str  # "snapshot" or "provenance" (nodes/NAME/<file>.json)
    parse: Callable[[str], dict[str, Any]]
    description: str
    optional_tool: bool = False  # not installed: recorded as absent, not as an error
    timeout_s: float = 30.0


def _block_devices(text: str) -> dict[str, Any]:
    return {"block_devices": [d.__dict__ | {"children": [c.name for c in d.children]} for d in parse_lsblk(text)]}


FACTS: tuple[Fact, ...] = (
    Fact("uname", ("uname", "-srvmo"), "snapshot", lambda t: {"kernel": t.strip()}, "kernel"),
    Fact("os_release", ("cat", "/etc/os-release"), "snapshot", parse_os_release, "OS release"),
    Fact("cpuinfo", ("cat", "/proc/cpuinfo"), "snapshot", parse_cpuinfo, "CPU model and count"),
    Fact("meminfo", ("cat", "/proc/meminfo"), "snapshot", parse_meminfo, "memory"),
    Fact("fio_version", ("fio", "--version"), "snapshot", lambda t: {"fio_version": t.strip()}, "fio version"),
    Fact("lsblk", LSBLK_ARGV, "snapshot", _block_devices, "block devices"),
    Fact("numa_nodes", NUMA_ARGV, "snapshot", lambda t: {"numa_cpulists": parse_numa(t)}, "NUMA CPU lists"),
    Fact("nics", NICS_ARGV, "snapshot", lambda t: {"nics": parse_nics(t)}, "NICs: speed, MTU, state, driver"),
    Fact("nvidia_smi", NVIDIA_SMI_ARGV, "provenance", lambda t: {"gpus": parse_nvidia_smi_csv(t)},
         "GPUs and driver", optional_tool=True, timeout_s=60),
    Fact("nvme_list", NVME_LIST_ARGV, "provenance", lambda t: {"nvme_controllers": parse_nvme_list(t)},
         "NVMe controllers and namespaces", optional_tool=True, timeout_s=60),
    Fact("nvme_list_subsys", NVME_LIST_SUBSYS_ARGV, "provenance",
         lambda t: {"nvme_subsystems": parse_nvme_list_subsys(t)}, "NVMe-oF subsystems", optional_tool=True,
         timeout_s=60),
    Fact("versions", VERSIONS_ARGV, "provenance", lambda t: {"versions": parse_versions(t)},
         "Python, vLLM, LMCache, torch, NIXL versions", optional_tool=True, timeout_s=60),
)

# nvme-cli 2.3 exits 1 with no output when the host has no NVMe device at all: no device, not an error.
_EMPTY_WHEN_NONE = {"nvme_list": "nvme_controllers", "nvme_list_subsys": "nvme_subsystems"}


def _absent(r) -> bool:
    """The tool is not installed (shell 127, or the local spawn failed with 'No such file')."""
    return r.rc == 127 or (r.rc is None and "No such file" in (r.error or ""))


def node_facts(engine_python: str | None = None) -> tuple[Fact, ...]:
    """The facts of one node: :data:`FACTS`, with the engine versions read by the node's engine interpreter
    (inventory ``engine_python``) when it has one."""
    if not engine_python:
        return FACTS
    return tuple(replace(f, argv=(engine_python,) + VERSIONS_ARGV[1:]) if f.key == "versions" else f for f in FACTS)


def collect_node_facts(transport, steps, engine_python: str | None = None) -> dict[str, dict[str, Any]]:
    """Run every fact's command as a logged step and parse what it printed; failures become data.

    Returns ``{"snapshot": {...}, "provenance": {...}}``, the two files of ``nodes/NAME/``."""
    out: dict[str, dict[str, Any]] = {"snapshot": {"node": transport.name, "errors": {}},
                                      "provenance": {"node": transport.name, "errors": {}, "absent": []}}
    for fact in node_facts(engine_python):
        rec = out[fact.file]
        r = steps.run(transport, f"{fact.file}-{fact.key}", fact.argv, timeout_s=fact.timeout_s)
        if fact.optional_tool and _absent(r):
            rec["absent"].append(fact.argv[0])
            continue
        if fact.key in _EMPTY_WHEN_NONE and not r.ok and not r.stdout.strip():
            rec[_EMPTY_WHEN_NONE[fact.key]] = []
            rec.setdefault("notes", {})[fact.key] = (r.stderr.strip().splitlines() or [f"rc {r.rc}"])[-1]
            continue
        if not r.ok:
            rec["errors"][fact.key] = r.summary()
            continue
        try:
            rec.update(fact.parse(r.stdout))
        except (ValueError, KeyError, TypeError) as exc:  # JSONDecodeError and the parsers' errors are ValueErrors
            rec["errors"][fact.key] = f"unparseable output: {exc}"
    return out
