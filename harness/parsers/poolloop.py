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
The regime is asynchronous: a read that comes before the evictor dropped its file's store is a ``breach`` line,
and kvgate closes each load point with a mark (:func:`mark_argv`: a file the evictor logs in event order and
removes), so :func:`evict_window` gives the breaches of the reads before it.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Iterator
from dataclasses import dataclass

LOOP_MARK = "kvgate-pool-loop"
EVICT_MARK_PREFIX = ".kvgate-mark-"   # harness/node/pool_evict.py's MARK_PREFIX

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
    breaches: int = 0      # reads it saw before it had dropped their file's store

    def to_dict(self) -> dict:
        return {"evictions": self.evictions, "files": self.files, "stores": self.stores,
                "dropped_bytes": self.dropped_bytes, "errors": self.errors, "ended": self.ended,
                "first_error": self.first_error, "breaches": self.breaches}


def mark_argv(pool_dir: str, name: str) -> tuple[str, ...]:
    """The node command that closes a load point for the evictor: prints the node's clock (s since the epoch), then
    writes the mark file ``.kvgate-mark-NAME`` into the pool (the evictor logs it and removes it)."""
    return ("sh", "-c", 'date +%s.%N && : > "$1"', "kvgate-pool-mark",
            posixpath.join(pool_dir, EVICT_MARK_PREFIX + name))


def parse_mark_made(text: str) -> float:
    """Pure: the node's clock :func:`mark_argv` printed; ValueError when there is none."""
    for line in text.splitlines():
        try:
            return float(line.strip())
        except ValueError:
            continue
    raise ValueError("no clock line in the mark command's output")


@dataclass(frozen=True)
class EvictWindow:
    """The cold regime over one load point: the reads the evictor saw before it had dropped their file's store
    (``breaches``), from the mark before the point to the point's own mark ``name``. ``made_unix_s``: when kvgate
    wrote the mark (the node's clock); ``seen_unix_s``: when the evictor logged it (``lag_s`` the difference: how
    far behind the evictor was at the point's end); ``pending_at_mark``: stores it had yet to drop then;
    ``error``: why there is no answer (the mark not made, or not logged in time). The evictor sees a store only
    when it runs, so how long a store waited is the mark's lag, not a breach's own times."""

    name: str
    made_unix_s: float | None = None
    seen_unix_s: float | None = None
    breaches: int = 0
    first_breach: str | None = None
    pending_at_mark: int = 0
    error: str | None = None

    @property
    def lag_s(self) -> float | None:
        if self.made_unix_s is None or self.seen_unix_s is None:
            return None
        return max(0.0, self.seen_unix_s - self.made_unix_s)


def _records(text: str) -> Iterator[dict]:
    """The evictor's JSON lines as dicts (a torn or foreign line skipped: the evictor killed mid-write)."""
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            yield rec


def evict_window(text: str, name: str, made_unix_s: float | None = None) -> EvictWindow | None:
    """Pure: the breaches logged after the mark before ``name``'s (or the log's start) up to the mark ``name``;
    None when the evictor has not logged that mark (yet)."""
    breaches: list[dict] = []
    for rec in _records(text):
        kind = rec.get("type")
        if kind == "breach":
            breaches.append(rec)
        elif kind == "mark":
            if rec.get("name") == name:
                return EvictWindow(name=name, made_unix_s=made_unix_s, seen_unix_s=float(rec.get("t") or 0),
                                   breaches=len(breaches), first_breach=str(breaches[0].get("file")) if breaches
                                   else None, pending_at_mark=int(rec.get("pending") or 0))
            breaches = []
    return None


def cold_window_issue(w: EvictWindow | None) -> str | None:
    """Pure: why a point's tier reads may not have reached the device because the cold regime fell behind (None:
    no read came before its store was dropped, or nothing is known)."""
    if w is None or not w.breaches:
        return None
    lag = f"; it logged the point's mark {w.lag_s:.1f} s after it was written" if w.lag_s is not None else ""
    return (f"the cold regime fell behind: {w.breaches} read(s) of pool files came before the evictor had dropped "
            f"their store (first: {posixpath.basename(w.first_breach or '')}{lag}): the page cache, not the tier's "
            "device, may have served them")


def parse_evict_log(text: str) -> EvictSummary:
    """Pure: the evictor's JSON-lines log summed (a torn last line is skipped: the evictor was killed mid-write)."""
    evictions = stores = dropped = errors = breaches = 0
    files: set[str] = set()
    ended, first_error = False, None
    for rec in _records(text):
        kind = rec.get("type")
        if kind == "evict":
            evictions += 1
            files.add(str(rec.get("file")))
            dropped += int(rec.get("resident_bytes") or 0)
            stores += 1 if rec.get("after") == "store" else 0
        elif kind == "breach":
            breaches += 1
        elif kind == "error":
            errors += 1
            first_error = first_error or str(rec.get("error"))
        elif kind == "summary":
            ended = True
    return EvictSummary(evictions=evictions, files=len(files), stores=stores, dropped_bytes=dropped, errors=errors,
                        ended=ended, first_error=first_error, breaches=breaches)
