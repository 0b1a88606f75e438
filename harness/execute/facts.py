"""A snapshot of each node: kernel, CPU, memory, fio version, block devices. Commands + pure parsers."""

from __future__ import annotations

import json
from typing import Any

from .blockdev import LSBLK_ARGV, parse_lsblk

SNAPSHOT_COMMANDS: dict[str, tuple[str, ...]] = {
    "uname": ("uname", "-srvmo"),
    "os_release": ("cat", "/etc/os-release"),
    "cpuinfo": ("cat", "/proc/cpuinfo"),
    "meminfo": ("cat", "/proc/meminfo"),
    "fio_version": ("fio", "--version"),
    "lsblk": LSBLK_ARGV,
    "numa_nodes": ("sh", "-c", "for n in /sys/devices/system/node/node[0-9]*; do "
                   "[ -r \"$n/cpulist\" ] && printf '%s %s\\n' \"${n##*node}\" \"$(cat \"$n/cpulist\")\"; done; true"),
    "nics": ("sh", "-c", "for i in /sys/class/net/*; do printf '%s %s %s\\n' \"${i##*/}\" "
             "\"$(cat \"$i/speed\" 2>/dev/null || echo -)\" \"$(cat \"$i/mtu\" 2>/dev/null || echo -)\"; done"),
}


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


def parse_nics(text: str) -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 3:
            continue
        name, speed, mtu = parts
        out.append({"name": name, "speed_mbit_s": int(speed) if speed.lstrip("-").isdigit() and int(speed) > 0 else None,
                    "mtu": int(mtu) if mtu.isdigit() else None})
    return out


def take_snapshot(transport, steps) -> dict[str, Any]:
    """Run the snapshot commands (each a logged step) and parse what succeeded; failures are recorded."""
    snap: dict[str, Any] = {"node": transport.name, "errors": {}}
    for key, argv in SNAPSHOT_COMMANDS.items():
        r = steps.run(transport, f"snapshot-{key}", argv, timeout_s=30)
        if not r.ok:
            snap["errors"][key] = r.summary()
            continue
        out = r.stdout
        try:
            if key == "uname":
                snap["kernel"] = out.strip()
            elif key == "os_release":
                snap.update(parse_os_release(out))
            elif key == "cpuinfo":
                snap.update(parse_cpuinfo(out))
            elif key == "meminfo":
                snap.update(parse_meminfo(out))
            elif key == "fio_version":
                snap["fio_version"] = out.strip()
            elif key == "lsblk":
                snap["block_devices"] = [d.__dict__ | {"children": [c.name for c in d.children]}
                                         for d in parse_lsblk(out)]
            elif key == "numa_nodes":
                snap["numa_cpulists"] = parse_numa(out)
            elif key == "nics":
                snap["nics"] = parse_nics(out)
        except (ValueError, KeyError, json.JSONDecodeError) as exc:
            snap["errors"][key] = f"unparseable output: {exc}"
    return snap
