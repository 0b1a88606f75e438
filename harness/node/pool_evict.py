"""The cold regime of a pool read through the page cache: drop each pool file's pages as soon as a store of it
lands, and again after each read of it, so every read-back of the tier reaches the pool's device.

Runs on the engine's node beside the engine (Python standard library only; Linux: inotify and posix_fadvise),
started and stopped by kvgate as a process group: ``python3 pool_evict.py POOL_DIR [--pattern GLOB]``. It watches
``POOL_DIR`` and every directory created under it. A file closed after writing (a store landed) is written back
(sync_file_range: its pages on the device, no journal commit or cache flush) and its pages dropped (POSIX_FADV_DONTNEED); a file closed after reading is dropped again, at once and
after ``--settle-s`` (a reader that maps the file may keep pages mapped for a moment after closing it). Each
eviction is one JSON line on standard output with the bytes that were resident before it (mincore); on SIGTERM
(or SIGINT) it prints a summary line and exits 0. kvgate parses the log with
``harness.parsers.poolloop.parse_evict_log``.

The regime is asynchronous: a store is dropped only once the watcher has seen it, so a read of the file that comes
first finds its pages in memory. The watcher says so: a read of a file (closed by its reader) seen while that
file's store is still to drop is a ``breach`` line (the read finished before the eviction began: the page
cache, not the device, may have served it). A read that overlaps the eviction's own few system calls is not
caught here; the pool device's read bytes still are. A file named ``.kvgate-mark-NAME`` written into the pool (by
kvgate, after a load point's last request) is a ``mark`` line, logged in the order the kernel queued its event,
so every breach of the reads before it is logged before it; the file is then removed.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import fnmatch
import heapq
import json
import os
import select
import signal
import struct
import sys
import time

IN_CLOSE_WRITE, IN_CLOSE_NOWRITE, IN_MOVED_TO, IN_CREATE, IN_ISDIR = 0x8, 0x10, 0x80, 0x100, 0x40000000
IN_NONBLOCK = os.O_NONBLOCK
MARK_PREFIX = ".kvgate-mark-"
_EVENT = struct.Struct("iIII")
PROT_READ, MAP_SHARED = 1, 1

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
_PAGE = os.sysconf("SC_PAGE_SIZE")
# sync_file_range(2): write the file's dirty pages back and wait, without fdatasync's journal commit and device cache
# flush (a loop device passes a flush on as an fsync of its backing file: every store would wait on the disk)
SYNC_FILE_RANGE = 1 | 2 | 4  # WAIT_BEFORE | WRITE | WAIT_AFTER
_libc.sync_file_range.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]


def write_back(fd: int) -> None:
    """The file's dirty pages written to its device (a clean page can be dropped; a dirty one cannot)."""
    if _libc.sync_file_range(fd, 0, 0, SYNC_FILE_RANGE) != 0:
        os.fdatasync(fd)  # a filesystem without it


def emit(rec: dict) -> None:
    sys.stdout.write(json.dumps(rec) + "\n")
    sys.stdout.flush()


def resident_bytes(fd: int, size: int) -> int:
    """Bytes of the file's pages in the page cache now (mincore over a read-only mapping); -1 when unknown."""
    if size <= 0:
        return 0
    addr = _libc.mmap(None, size, PROT_READ, MAP_SHARED, fd, 0)
    if addr in (None, ctypes.c_void_p(-1).value):
        return -1
    try:
        pages = (size + _PAGE - 1) // _PAGE
        vec = ctypes.create_string_buffer(pages)
        if _libc.mincore(addr, size, vec) != 0:
            return -1
        return sum(b & 1 for b in vec.raw) * _PAGE
    finally:
        _libc.munmap(addr, size)


def evict(path: str, after: str, own_closes: dict[str, int]) -> None:
    """Write the file back and drop its pages; one log line (or an error line). Its own close of the file is
    counted in ``own_closes`` (the watcher sees it as a read and must not evict again for it)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return  # renamed or removed since: its new name has an event of its own
    except OSError as exc:
        emit({"type": "error", "file": path, "error": f"{type(exc).__name__}: {exc}"})
        return
    try:
        size = os.fstat(fd).st_size
        before = resident_bytes(fd, size)
        write_back(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        emit({"type": "evict", "t": time.time(), "file": path, "bytes": size, "resident_bytes": max(before, 0),
              "after": after})
    except OSError as exc:
        emit({"type": "error", "file": path, "error": f"{type(exc).__name__}: {exc}"})
    finally:
        own_closes[path] = own_closes.get(path, 0) + 1
        os.close(fd)


class Watcher:
    """inotify over a directory tree (directories created later are added as they appear)."""

    def __init__(self, root: str):
        self.fd = _libc.inotify_init1(IN_NONBLOCK)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self.dirs: dict[int, str] = {}
        self.add_tree(root)

    def add(self, path: str) -> None:
        wd = _libc.inotify_add_watch(self.fd, path.encode(), IN_CLOSE_WRITE | IN_CLOSE_NOWRITE | IN_MOVED_TO
                                     | IN_CREATE)
        if wd >= 0:
            self.dirs[wd] = path

    def add_tree(self, root: str) -> list[str]:
        """Watch ``root`` and the directories below it; returns the files already there (made before the watch)."""
        found = []
        for d, subdirs, files in os.walk(root):
            self.add(d)
            found += [os.path.join(d, f) for f in files]
        return found

    def events(self):
        try:
            buf = os.read(self.fd, 65536)
        except BlockingIOError:
            return
        i = 0
        while i + _EVENT.size <= len(buf):
            wd, mask, _cookie, length = _EVENT.unpack_from(buf, i)
            name = buf[i + _EVENT.size:i + _EVENT.size + length].rstrip(b"\0").decode(errors="replace")
            i += _EVENT.size + length
            if wd in self.dirs and name:
                yield mask, os.path.join(self.dirs[wd], name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pool_dir")
    ap.add_argument("--pattern", default="*", help="file names to evict (glob); others are left alone")
    ap.add_argument("--settle-s", type=float, default=0.5, help="second eviction after a read, this much later")
    a = ap.parse_args(argv)
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(1))
    w = Watcher(a.pool_dir)
    due: list[tuple[float, str, str, bool]] = []  # (when, path, after, at once)
    counts = {"store": 0, "read": 0, "breach": 0}
    own_closes: dict[str, int] = {}
    pending: dict[str, float] = {}  # a store whose at-once eviction is still to do: when it was seen
    emit({"type": "start", "t": time.time(), "pool_dir": a.pool_dir, "pattern": a.pattern, "pid": os.getpid()})

    def schedule(path: str, after: str) -> None:
        if not fnmatch.fnmatch(os.path.basename(path), a.pattern):
            return
        now = time.monotonic()
        counts[after] += 1
        if after == "store":
            pending.setdefault(path, time.time())
        heapq.heappush(due, (now, path, after, True))
        heapq.heappush(due, (now + a.settle_s, path, after, False))

    def read_seen(path: str) -> None:
        """A reader closed ``path``: a breach when the at-once eviction of its store is still to do (a read of a
        file just read is not one: the first read took its pages from the device); then drop it again."""
        if path in pending:  # (only a pool file's store is pending: schedule matched the pattern)
            counts["breach"] += 1
            emit({"type": "breach", "t": time.time(), "file": path, "pending": "store", "seen_t": pending[path]})
        schedule(path, "read")

    def mark(path: str) -> None:
        emit({"type": "mark", "t": time.time(), "name": os.path.basename(path)[len(MARK_PREFIX):],
              "pending": len(pending)})
        with contextlib.suppress(OSError):
            os.unlink(path)

    while not stop:
        timeout = max(0.0, min(0.5, due[0][0] - time.monotonic())) if due else 0.5
        try:
            ready, _, _ = select.select([w.fd], [], [], timeout)
        except InterruptedError:
            continue
        if ready:
            for mask, path in w.events():
                if mask & IN_ISDIR:
                    if mask & (IN_CREATE | IN_MOVED_TO):
                        for f in w.add_tree(path):  # files made before its watch was added
                            schedule(f, "store")
                elif os.path.basename(path).startswith(MARK_PREFIX):
                    if mask & (IN_CLOSE_WRITE | IN_MOVED_TO):
                        mark(path)
                elif mask & (IN_CLOSE_WRITE | IN_MOVED_TO):
                    schedule(path, "store")
                elif mask & IN_CLOSE_NOWRITE:
                    if own_closes.get(path):
                        own_closes[path] -= 1  # our own eviction's close, not a reader's
                    else:
                        read_seen(path)
        now = time.monotonic()
        while due and due[0][0] <= now:
            _, path, after, at_once = heapq.heappop(due)
            evict(path, after, own_closes)
            if at_once and after == "store":
                pending.pop(path, None)
    emit({"type": "summary", "t": time.time(), "stores_seen": counts["store"], "reads_seen": counts["read"],
          "breaches": counts["breach"]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
