"""Block-device facts from lsblk, blkid and /sys/block/DEV/stat (parsed, pure) and the rule for writing to a
device.

kvgate never writes to a block device that holds a partition table or a filesystem unless the target
says ``allow_destructive: true`` and its ``serial`` matches the device's serial.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

LSBLK_ARGV = ("lsblk", "-J", "-b", "-o", "NAME,PATH,TYPE,SIZE,RO,FSTYPE,PTTYPE,SERIAL,MODEL,MOUNTPOINT")


@dataclass(frozen=True)
class BlockDevice:
    name: str
    path: str
    type: str
    size_bytes: int
    ro: bool
    fstype: str | None
    pttype: str | None
    serial: str | None
    model: str | None
    mountpoint: str | None
    children: tuple["BlockDevice", ...] = ()


def _dev(d: dict) -> BlockDevice:
    def s(k):
        v = d.get(k)
        return v.strip() if isinstance(v, str) and v.strip() else None
    return BlockDevice(
        name=d.get("name", ""), path=d.get("path") or f"/dev/{d.get('name', '')}", type=d.get("type", ""),
        size_bytes=int(d.get("size") or 0), ro=bool(int(d.get("ro") or 0)) if not isinstance(d.get("ro"), bool) else d["ro"],
        fstype=s("fstype"), pttype=s("pttype"), serial=s("serial"), model=s("model"), mountpoint=s("mountpoint"),
        children=tuple(_dev(c) for c in d.get("children", []) or []),
    )


def parse_lsblk(text: str) -> list[BlockDevice]:
    """Parse ``lsblk -J -b -o ...`` output into a device tree."""
    return [_dev(d) for d in json.loads(text).get("blockdevices", [])]


def find_device(devices: list[BlockDevice], path: str) -> BlockDevice | None:
    for d in devices:
        if d.path == path:
            return d
        hit = find_device(list(d.children), path)
        if hit:
            return hit
    return None


def blkid_argv(path: str) -> tuple[str, ...]:
    """Low-level probe of the device itself (works without udev); rc 2 means nothing was found."""
    return ("blkid", "-p", "-o", "export", path)


def parse_blkid_export(text: str) -> dict[str, str]:
    """Parse ``blkid -p -o export`` (KEY=VALUE lines); empty when blkid found no signature."""
    out = {}
    for line in text.splitlines():
        if "=" in line:
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip()
    return out


def never_writable(device: BlockDevice) -> str | None:
    """Pure: why kvgate never writes to this device whatever a target allows (read-only, or it or one of its
    partitions is mounted), or None."""
    if device.ro:
        return f"{device.path} is read-only"
    mounted = _mounted(device)
    return f"{mounted}; kvgate never writes to a mounted device" if mounted else None


def _mounted(device: BlockDevice) -> str | None:
    if device.mountpoint:
        return f"{device.path} is mounted at {device.mountpoint}"
    for child in device.children:
        hit = _mounted(child)
        if hit:
            return hit
    return None


def holdings(device: BlockDevice, probe: dict[str, str]) -> list[str]:
    """What the device holds: filesystem, partition table (lsblk, else blkid -p), partitions or holders."""
    fstype = device.fstype or probe.get("TYPE")
    pttype = device.pttype or probe.get("PTTYPE")
    out = []
    if fstype:
        out.append(f"filesystem {fstype}")
    if pttype:
        out.append(f"partition table {pttype}")
    if device.children:
        out.append("partitions or holders (" + ", ".join(c.name for c in device.children) + ")")
    return out


def write_allowed(device: BlockDevice | None, probe: dict[str, str], allow_destructive: bool,
                  serial: str | None) -> tuple[bool, str]:
    """May kvgate write to this device? ``probe`` is the parsed blkid output; ``device.serial`` is the
    device's serial as kvgate resolved it. Returns (allowed, reason naming the device and what it holds).

    Never a read-only or mounted device; never a device whose serial differs from a serial the target
    names; a device that holds a filesystem, partition table, partitions or holders only with
    ``allow_destructive`` and the matching serial."""
    if device is None:
        return False, "device not found in lsblk output"
    never = never_writable(device)
    if never:
        return False, never
    held = holdings(device, probe)
    what = ", ".join(held)
    if serial and serial != device.serial:
        has = f"serial {device.serial!r}" if device.serial else "no serial"
        return False, (f"{device.path} ({'holds ' + what if held else 'blank'}) has {has}, not the target's "
                       f"serial {serial!r}: the target does not name this device")
    if not held:
        return True, f"{device.path} holds no partition table, filesystem, partitions or mount"
    if not allow_destructive:
        return False, f"{device.path} holds {what}; set allow_destructive: true and serial to overwrite it"
    if not serial:
        return False, f"{device.path} holds {what}; allow_destructive needs the device's serial as well"
    return True, f"{device.path} holds {what}; allowed by allow_destructive with matching serial {serial}"


@dataclass(frozen=True)
class BlockStat:
    """``/sys/block/DEV/stat`` (Documentation/block/stat.rst); sectors are 512 bytes whatever the device."""

    read_ios: int
    read_sectors: int
    write_ios: int
    write_sectors: int

    @property
    def read_bytes(self) -> int:
        return self.read_sectors * 512

    @property
    def write_bytes(self) -> int:
        return self.write_sectors * 512


def parse_block_stat(text: str) -> BlockStat:
    f = text.split()
    if len(f) < 11 or not all(x.isdigit() for x in f):
        raise ValueError(f"not a /sys/block/DEV/stat line: {text.strip()[:200]!r}")
    return BlockStat(int(f[0]), int(f[2]), int(f[4]), int(f[6]))
