"""The KV pool's block device and its I/O counters: one probe (a node command and its pure parser) that every
workload proving cold reads uses (kv-read around fio, G2 around the read-back, launched or attached).

The device is found by the MAJ:MIN of the filesystem holding the pool (``findmnt --target``), and its counters
read from ``/sys/dev/block/MAJ:MIN/stat``: that names loop devices, whole disks, partitions, device-mapper
volumes (LVM, dm-crypt, dm-multipath heads, whose ``SOURCE`` is ``/dev/mapper/NAME`` while sysfs calls them
``dm-N``) and NVMe namespaces alike. A filesystem whose MAJ:MIN is anonymous (major 0: btrfs) is mapped to the
block device its ``SOURCE`` names (``stat -L``, hex major/minor). Nothing behind the pool (tmpfs, overlay, a
network filesystem) means no counters: the caller cannot prove a cold read, which it reports, never guesses.

The native NVMe multipath head (``nvmeSnN`` over hidden ``nvmeScCnN`` paths) counts no I/O of its own on a 6.1
kernel (kernels from 6.3 on count it on the head too): when the device is such a head, every path's counters are
printed after the head's and the pool's counters are their sum (each I/O is counted once, on the path that
carried it, whichever kernel). ``PoolDeviceStat.paths`` names the paths summed.

Not covered: a filesystem spanning several devices (only the one ``SOURCE`` names is counted: fewer bytes, an
INVALID at worst, never a wrong PASS), and a partition of a multipath head (its paths have no partitions: its
own counters only, zero on 6.1, so an INVALID, never a wrong PASS).
"""

from __future__ import annotations

from dataclasses import dataclass

from .blockdev import BlockStat, parse_block_stat
from .probe import Probe

MARK = "kvgate-pool-device"
PATH_MARK = "kvgate-pool-path"

# $1: the pool directory. Prints "kvgate-pool-device MAJ:MIN SOURCE", then the device's stat line. A pool directory
# the connector has not made yet (it makes it on its first store) is on the filesystem of its nearest existing
# ancestor: findmnt --target fails on a path that does not exist.
_SCRIPT = (
    't=$1; while [ ! -e "$t" ] && [ "$t" != / ] && [ "$t" != . ]; do t=$(dirname "$t"); done; '
    'set -- $(findmnt -n -o MAJ:MIN,SOURCE --target "$t") && d=$1 && s=${2%%[*} && '
    'case $d in 0:*) if [ -b "$s" ]; then d=$(printf "%d:%d" 0x$(stat -L -c %t "$s") 0x$(stat -L -c %T "$s")); fi;; esac; '
    f'echo "{MARK} $d $s" && cat "/sys/dev/block/$d/stat" && '
    # a native multipath head nvmeSnN: its paths nvmeScCnN, each path's counters after the head's
    'h=$(basename "$(readlink -f "/sys/dev/block/$d")") && case $h in nvme*c*|nvme*p*) ;; nvme*n*) '
    'i=${h#nvme}; i=${i%%n*}; n=${h##*n}; for p in /sys/block/nvme${i}c*n$n; do '
    f'[ -r "$p/stat" ] && echo "{PATH_MARK} ${{p##*/}}" && cat "$p/stat"; done;; esac; true'
)


def pool_blockstat_argv(pool_dir: str) -> tuple[str, ...]:
    """The node command: which block device holds ``pool_dir``, and its counters now (one command, so a
    before/after pair reads the same device or says it did not)."""
    return ("sh", "-c", _SCRIPT, "kvgate-pool-blockstat", pool_dir)


@dataclass(frozen=True)
class PoolDeviceStat:
    """The pool's device (``maj_min`` of the block device counted, ``source`` as findmnt names it) and its
    counters."""

    maj_min: str
    source: str
    stat: BlockStat
    paths: tuple[str, ...] = ()  # a multipath head's paths, whose counters ``stat`` sums


def parse_pool_blockstat(text: str) -> PoolDeviceStat:
    """Pure: the probe's output. Raises ValueError when it names no device or no stat line follows."""
    lines = [line for line in text.splitlines() if line.strip()]
    for i, line in enumerate(lines):
        parts = line.split()
        if parts[:1] == [MARK] and len(parts) >= 2:
            mm = parts[1].split(":")
            if len(mm) != 2 or not all(x.isdigit() for x in mm):
                break
            if mm[0] == "0":
                raise ValueError(f"the pool is on {' '.join(parts[2:]) or 'a filesystem'} ({parts[1]}), which has no "
                                 "block device of its own")
            if i + 1 >= len(lines):
                raise ValueError(f"no stat line for device {parts[1]}")
            head = parse_block_stat(lines[i + 1])
            paths = [(rest[1], parse_block_stat(lines[j + 1])) for j, rest in
                     ((j, lines[j].split()) for j in range(i + 2, len(lines) - 1))
                     if rest[:1] == [PATH_MARK] and len(rest) == 2]
            if not paths:
                return PoolDeviceStat(parts[1], " ".join(parts[2:]), head)
            total = BlockStat(*(sum(getattr(st, f) for _, st in paths) for f in
                                ("read_ios", "read_sectors", "write_ios", "write_sectors")))
            return PoolDeviceStat(parts[1], " ".join(parts[2:]), total, tuple(name for name, _ in paths))
    raise ValueError(f"the pool's block device could not be found: {text.strip()[:200]!r}")


def pool_device_probe(pool_dir: str) -> Probe[PoolDeviceStat]:
    """The probe (command and parser) of the pool's block device and its counters, for ``pool_dir``."""
    return Probe("pool-blockstat", pool_blockstat_argv(pool_dir), parse_pool_blockstat,
                 "the pool's block device (by MAJ:MIN) and its read counters")


def read_bytes_between(before: PoolDeviceStat | None, after: PoolDeviceStat | None) -> int | None:
    """Pure: bytes the pool's device read between two probes; None unless both name the same device."""
    if before is None or after is None or before.maj_min != after.maj_min:
        return None
    return after.stat.read_bytes - before.stat.read_bytes


def write_bytes_between(before: PoolDeviceStat | None, after: PoolDeviceStat | None) -> int | None:
    """Pure: bytes written to the pool's device between two probes; None unless both name the same device."""
    if before is None or after is None or before.maj_min != after.maj_min:
        return None
    return after.stat.write_bytes - before.stat.write_bytes
