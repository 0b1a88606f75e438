"""Node facts: what a run records about every node before the gates run.

One list, :data:`FACTS`, says what is recorded: each fact is a command, the pure parser of its output
(``harness.parsers``) and the file it lands in under ``nodes/NAME/``: ``snapshot.json`` (kernel, OS, CPU,
memory, fio version, block devices, NUMA CPU lists, NICs) or ``provenance.json`` (GPUs and driver, NVMe
controllers and NVMe-oF subsystems, vLLM / LMCache / torch / Python versions).

A node gets all of them as ONE command (:func:`facts_argv`: a shell script that runs each fact's argv in
turn, each under its own time limit where the node has GNU ``timeout``, and frames its stdout, stderr and
exit status), so a run costs one SSH round per node instead of one per fact; that command is also what
``kvgate plan`` prints. The framed output is split back (``parsers.facts.parse_fact_sections``) into each
fact's own stdout/stderr/rc, read by the same parser as before, and each section is kept as its own step
(``steps/NNN-NODE-snapshot-KEY``: its argv, stdout, stderr, rc) beside the whole command's step
(``steps/NNN-NODE-facts``). A failure or an unparseable output is recorded in the file's ``errors``; a
provenance tool that is not installed is recorded as ``absent``.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, replace
from typing import Any, Callable

from ..parsers.blockdev import LSBLK_ARGV, parse_lsblk
from ..parsers.nvme import NVME_SYSFS_ARGV, fabric_view, parse_nvme_sysfs
from ..parsers.rdma import IB_SYSFS_ARGV, RDMA_LINK_ARGV, parse_ib_sysfs, parse_rdma_links
from ..parsers.facts import (NUMA_ARGV, SECTION_MARK, FactSection, parse_cpuinfo, parse_fact_sections, parse_meminfo,
                             parse_nics, parse_numa, parse_nvidia_smi_csv, parse_nvme_list, parse_nvme_list_subsys,
                             parse_os_release, parse_versions)
from ..transport.base import CommandResult

# One line per interface. The sysfs values are read with the shell's `read`, and the driver link only where
# there is one, so a node forks no process per value (a virtual NIC, none at all): on 32 nodes sharing one
# machine's cores, as on the rig, every fork counts.
NICS_ARGV = ("sh", "-c", "for i in /sys/class/net/*; do n=${i##*/}; "
             "d=; [ -e \"$i/device/driver\" ] && d=$(readlink \"$i/device/driver\" 2>/dev/null); "
             "s=-; read -r s 2>/dev/null < \"$i/speed\" || s=-; m=-; read -r m 2>/dev/null < \"$i/mtu\" || m=-; "
             "o=-; read -r o 2>/dev/null < \"$i/operstate\" || o=-; "
             "printf '%s %s %s %s %s\\n' \"$n\" \"$s\" \"$m\" \"$o\" \"${d##*/}\"; done")
NVIDIA_SMI_ARGV = ("nvidia-smi", "--query-gpu=index,name,driver_version,memory.total,pci.bus_id",
                   "--format=csv,nounits")
NVME_LIST_ARGV = ("nvme", "list", "-o", "json")
NVME_LIST_SUBSYS_ARGV = ("nvme", "list-subsys", "-o", "json")
VERSION_PACKAGES = ("vllm", "lmcache", "torch", "nixl")
# The first installed distribution of each package along sys.path, as importlib.metadata.version() finds it
# (a `*.dist-info` or `*.egg-info` entry whose name part normalizes to the package's; its METADATA or PKG-INFO
# `Version:`), read without importing importlib.metadata: that import (email, zipfile, csv, ...) costs a node
# about 35 ms of CPU, more than the rest of the facts put together. Zipped eggs are not looked into.
VERSIONS_ARGV = ("python3", "-c",
                 "import json, os, platform, re, sys\n"
                 "out = {'python': platform.python_version()}\n"
                 f"left = set({list(VERSION_PACKAGES)!r})\n"
                 "out.update(dict.fromkeys(left))\n"
                 "for d in sys.path:\n"
                 "    try:\n        names = os.listdir(d or '.')\n"
                 "    except OSError:\n        continue\n"
                 "    for e in names:\n"
                 "        base, _, ext = e.lower().rpartition('.')\n"
                 "        k = re.sub(r'[-_.]+', '_', base.partition('-')[0])\n"
                 "        if ext not in ('dist-info', 'egg-info') or k not in left:\n            continue\n"
                 "        left.discard(k)\n"
                 "        p = os.path.join(d or '.', e)\n"
                 "        if os.path.isdir(p):\n"
                 "            p = os.path.join(p, 'METADATA' if ext == 'dist-info' else 'PKG-INFO')\n"
                 "        try:\n"
                 "            with open(p, encoding='utf-8', errors='replace') as f:\n"
                 "                for line in f:\n"
                 "                    if not line.strip():\n                        break\n"
                 "                    if line.startswith('Version:'):\n"
                 "                        out[k] = line.split(':', 1)[1].strip()\n                        break\n"
                 "        except OSError:\n            pass\n"
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
    Fact("nvme_sysfs", NVME_SYSFS_ARGV, "snapshot", lambda t: fabric_view(parse_nvme_sysfs(t)),
         "NVMe(-oF) controllers (transport, address, state, queue count) and namespaces (ANA state), from sysfs"),
    Fact("rdma_links", RDMA_LINK_ARGV, "snapshot", lambda t: {"rdma_links": [l.__dict__ for l in parse_rdma_links(t)]},
         "RDMA links: state and the NIC under each (rdma link)", optional_tool=True),
    Fact("rdma_sysfs", IB_SYSFS_ARGV, "snapshot", lambda t: {"rdma_devices": [d.as_dict() for d in parse_ib_sysfs(t)]},
         "RDMA devices: port state, link layer, GID types, the NIC under each GID (/sys/class/infiniband)"),
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
# iproute2's rdma tool on a kernel without RDMA netlink (no RDMA core loaded): no RDMA link, not an error.
_NO_RDMA_STDERR = "Failed to open NETLINK_RDMA socket"


def _absent(r) -> bool:
    """The tool is not installed (shell 127, or the local spawn failed with 'No such file')."""
    return r.rc == 127 or (r.rc is None and "No such file" in (r.error or ""))


def node_facts(engine_python: str | None = None) -> tuple[Fact, ...]:
    """The facts of one node: :data:`FACTS`, with the engine versions read by the node's engine interpreter
    (inventory ``engine_python``) when it has one."""
    if not engine_python:
        return FACTS
    return tuple(replace(f, argv=(engine_python,) + VERSIONS_ARGV[1:]) if f.key == "versions" else f for f in FACTS)


# The facts script. `_f KEY LIMIT_S ARGV...` runs one fact's argv with stdin from /dev/null, framed as
# parsers.facts describes. GNU timeout --foreground keeps the command in the script's process group, so
# stopping the one command (Transport.abort, a gate timeout) stops whatever fact is running; where the node
# has no such timeout (busybox), the facts command's own limit is the only one.
_SCRIPT_HEAD = (
    f"_m={SECTION_MARK}\n"
    "if timeout --foreground -k 5 10 true </dev/null >/dev/null 2>&1; then _to=1; else _to=; fi\n"
    "_t=$(date +%s.%N 2>/dev/null)\n"
    "_f() {\n"
    "  _k=$1; _s=$2; shift 2\n"
    "  printf '%s begin %s t=%s\\n' \"$_m\" \"$_k\" \"$_t\"; printf '%s begin %s\\n' \"$_m\" \"$_k\" >&2\n"
    "  if [ -n \"$_to\" ]; then timeout --foreground -k 5 \"$_s\" \"$@\" </dev/null; else \"$@\" </dev/null; fi\n"
    "  _rc=$?; _t=$(date +%s.%N 2>/dev/null)\n"
    "  printf '\\n%s end %s rc=%s t=%s\\n' \"$_m\" \"$_k\" \"$_rc\" \"$_t\"; printf '\\n%s end %s\\n' \"$_m\" \"$_k\" >&2\n"
    "}\n"
)


def facts_argv(facts: tuple[Fact, ...]) -> tuple[str, ...]:
    """The one command that gathers ``facts`` on a node: ``sh -c SCRIPT``, one ``_f`` line per fact."""
    lines = [f"_f {f.key} {f.timeout_s:g} {shlex.join(f.argv)}" for f in facts]
    return ("sh", "-c", _SCRIPT_HEAD + "\n".join(lines) + "\n")


def facts_timeout_s(facts: tuple[Fact, ...]) -> float:
    """The facts command's own limit: every fact's limit plus its kill grace, and slack for the framing."""
    return sum(f.timeout_s + 5.0 for f in facts) + 30.0


def section_result(fact: Fact, section: FactSection | None, whole: CommandResult) -> CommandResult:
    """A fact's own command result, cut from the facts command's result ``whole``."""
    if section is None:
        why = ("the facts command could not start" if whole.error and whole.rc is None and not whole.stdout
               else "the facts command ended before this fact ran")
        return CommandResult(fact.argv, None, "", "", 0.0, whole.timed_out, f"{why}: {whole.summary()}",
                             whole.node)
    duration = section.duration_s or 0.0
    if not section.complete:
        return CommandResult(fact.argv, None, section.stdout, section.stderr, duration, whole.timed_out,
                             None if whole.timed_out else f"the facts command ended inside this fact: "
                             f"{whole.summary()}", whole.node)
    # GNU timeout exits 124 (137 after -k) when the fact's own limit passed.
    timed_out = section.rc in (124, 137) and duration >= fact.timeout_s - 0.5
    return CommandResult(fact.argv, section.rc, section.stdout, section.stderr, duration, timed_out, None,
                         whole.node)


def collect_node_facts(transport, steps, engine_python: str | None = None) -> dict[str, dict[str, Any]]:
    """Run the facts command on one node as a logged step, split it into every fact's own result (each kept
    as a step too) and parse what each printed; failures become data.

    Returns ``{"snapshot": {...}, "provenance": {...}}``, the two files of ``nodes/NAME/``."""
    out: dict[str, dict[str, Any]] = {"snapshot": {"node": transport.name, "errors": {}},
                                      "provenance": {"node": transport.name, "errors": {}, "absent": []}}
    facts = node_facts(engine_python)
    whole_dir = steps.new_dir(transport.name, "facts")
    whole = steps.run_in(whole_dir, transport, facts_argv(facts), timeout_s=facts_timeout_s(facts))
    sections = parse_fact_sections(whole.stdout, whole.stderr)
    for fact in facts:
        rec = out[fact.file]
        r = section_result(fact, sections.get(fact.key), whole)
        steps.keep(transport.name, f"{fact.file}-{fact.key}", r, timeout_s=fact.timeout_s, part_of=whole_dir.name)
        if fact.optional_tool and _absent(r):
            rec.setdefault("absent", []).append(fact.argv[0])
            continue
        if fact.key == "rdma_links" and not r.ok and _NO_RDMA_STDERR in (r.stderr or ""):
            rec["rdma_links"] = []
            rec.setdefault("notes", {})[fact.key] = _NO_RDMA_STDERR + " (no RDMA core in this kernel)"
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
