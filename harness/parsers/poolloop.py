"""A pool on a block device of its own, and the cold regime that keeps its stored KV off the node's page cache: the
node commands and their pure parsers.

``loop`` pool: kvgate makes a backing file in the engine's run directory, attaches it to a free loop device (with
``--direct-io=on`` where asked and the backing filesystem takes O_DIRECT, so the backing file's own page cache does
not serve the device either; off, the backing file's pages stand for a device as fast as the node's memory), formats
it ext4 (inode tables and journal initialised at once, so no lazy-init writer runs
beside the gate) and mounts it on the pool directory. Every byte the engine's connector reads from the pool is then
counted on that loop device and on nothing else: the device's counters are the tier's alone. The inverse (unmount,
detach, remove the backing file) is idempotent: it may run after a make that never finished.

Cold regime ``evict``: ``harness/node/pool_evict.py`` runs beside an engine whose connector reads through the page
cache (vLLM's ExampleConnector: safetensors files), and drops each pool file's pages (written back with
sync_file_range, then posix_fadvise DONTNEED) as soon as a store of it lands and again after each read of it,
standing for a tier far larger than the node's memory. Its log is JSON lines; :func:`parse_evict_log` sums it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

LOOP_MARK = "kvgate-pool-loop"

# $1 backing file, $2 size in bytes, $3 mount point, $4 on|off (direct I/O to the backing file), $5 the device's
# read-ahead in KiB. Prints "kvgate-pool-loop /dev/loopN MAJ:MIN DIO".
_MAKE = (
    'set -e; rm -f "$1"; truncate -s "$2" "$1"; '
    'd=$(losetup --find --show --direct-io="$4" "$1" 2>/dev/null || losetup --find --show "$1"); '
    'mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$d"; '
    'echo "$5" > "/sys/block/${d#/dev/}/queue/read_ahead_kb"; '
    'mkdir -p "$3"; mount "$d" "$3"; '
    'n=${d#/dev/}; '
    f'echo "{LOOP_MARK} $d $(cat /sys/block/$n/dev) $(cat /sys/block/$n/loop/dio 2>/dev/null || echo 0)"'
)
# $1 backing file, $2 mount point: unmount (whatever is mounted there from that file), detach, remove.
_UNDO = (
    'umount "$2" 2>/dev/null; '
    'for d in $(losetup -n -O NAME -j "$1" 2>/dev/null); do losetup -d "$d" 2>/dev/null; done; '
    'rm -f "$1"; true'
)


def loop_pool_argv(backing: str, size_bytes: int, mount_point: str, direct_io: bool = True,
                   read_ahead_kb: int = 128) -> tuple[str, ...]:
    """The node command that makes the pool: ext4 on a new loop device of ``backing`` mounted at ``mount_point``
    (``direct_io``: the loop device reads its backing file with O_DIRECT where that file's filesystem allows;
    ``read_ahead_kb``: the device's read-ahead, as an array's namespace would be tuned)."""
    return ("sh", "-c", _MAKE, "kvgate-pool-loop", backing, str(int(size_bytes)), mount_point,
            "on" if direct_io else "off", str(int(read_ahead_kb)))


def loop_pool_undo_argv(backing: str, mount_point: str) -> tuple[str, ...]:
    """Its inverse (idempotent): unmount, detach the loop device(s) of ``backing``, remove it."""
    return ("sh", "-c", _UNDO, "kvgate-pool-loop-undo", backing, mount_point)


@dataclass(frozen=True)
class LoopPool:
    """The loop device the pool was made on (``/dev/loopN``), its MAJ:MIN, and whether it reads its backing file
    with direct I/O."""

    device: str
    maj_min: str
    direct_io: bool


def parse_loop_pool(text: str) -> LoopPool:
    """Pure: the mark line of :func:`loop_pool_argv`'s output; ValueError when it is missing or malformed."""
    for line in text.splitlines():
        parts = line.split()
        if parts[:1] == [LOOP_MARK]:
            if len(parts) != 4 or not parts[1].startswith("/dev/loop") or ":" not in parts[2]:
                raise ValueError(f"malformed pool line: {line!r}")
            return LoopPool(device=parts[1], maj_min=parts[2], direct_io=parts[3] == "1")
    raise ValueError(f"no {LOOP_MARK} line in the output")


@dataclass(frozen=True)
class EvictSummary:
    """What the cold regime did: evictions (each a write-back + DONTNEED of one file), the files it watched, the
    bytes of page cache it found resident and dropped, the stores it saw land, and its errors."""

    evictions: int
    files: int
    stores: int
    dropped_bytes: int
    errors: int
    ended: bool            # its summary line is there: it ran until it was stopped
    first_error: str | None = None

    def to_dict(self) -> dict:
        return {"evictions": self.evictions, "files": self.files, "stores": self.stores,
                "dropped_bytes": self.dropped_bytes, "errors": self.errors, "ended": self.ended,
                "first_error": self.first_error}


def parse_evict_log(text: str) -> EvictSummary:
    """Pure: the evictor's JSON-lines log summed (a torn last line is skipped: the evictor was killed mid-write)."""
    evictions = stores = dropped = errors = 0
    files: set[str] = set()
    ended, first_error = False, None
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if not isinstance(rec, dict):
            continue
        kind = rec.get("type")
        if kind == "evict":
            evictions += 1
            files.add(str(rec.get("file")))
            dropped += int(rec.get("resident_bytes") or 0)
            stores += 1 if rec.get("after") == "store" else 0
        elif kind == "error":
            errors += 1
            first_error = first_error or str(rec.get("error"))
        elif kind == "summary":
            ended = True
    return EvictSummary(evictions=evictions, files=len(files), stores=stores, dropped_bytes=dropped, errors=errors,
                        ended=ended, first_error=first_error)
