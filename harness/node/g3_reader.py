"""kvgate's G3 reader: put to every node and run there (stdlib only, Python >= 3.8).

Reads every file of a KV copy once, cold, with O_DIRECT where the filesystem allows it, from `streams`
threads, and prints a JSON-lines stream to stdout (one record per line, flushed):

  header  {schema, node, pid, pgid, direct_requested, ...}
  armed   {t_s, files, bytes_expected, direct_used, direct_error}   (files opened, buffers ready)
  start   {t_s, go_s, start_priority}                             (first read issued)
  sample  {t0_s, t1_s, bytes}                                     (every interval_s, bytes in (t0, t1])
  error   {message}
  end     {t_s, bytes, completed, files_done}

The same records go to `--out` on the node. Synchronized start: after arming, the reader creates
`--armed-file` and waits for `--go-file` to appear; it holds a Unix time (this node's clock) at which
to start. `--deadline-s` bounds the reader's whole life so no reader outlives a lost orchestrator.

`write` mode (G3's isolation writer, `g3_reader.py write ...`): the same records and the same armed/go start,
but from `streams` threads it writes files of `--file-bytes` into `--dir` (names cycled over `--files`, so the
disk used is bounded), each block fresh bytes, each file fsync'd, until `--stop-file` appears; `sample.bytes`
are bytes written. Its end record is `completed` when it stopped on the stop file without an error.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import socket
import sys
import threading
import time

SCHEMA = "kvgate-g3-reader/1"
ALIGN = 4096


class Emitter:
    def __init__(self, out_path):
        self.lock = threading.Lock()
        self.fh = open(out_path, "w") if out_path else None
        self.stdout_ok = True

    def emit(self, **rec):
        line = json.dumps(rec, separators=(",", ":"))
        with self.lock:
            if self.fh:
                self.fh.write(line + "\n")
                self.fh.flush()
            if self.stdout_ok:
                try:
                    sys.stdout.write(line + "\n")
                    sys.stdout.flush()
                except (BrokenPipeError, OSError):
                    # The orchestrator's channel is gone: stop reading rather than run on unobserved.
                    self.stdout_ok = False
                    os._exit(5)


def open_files(paths, direct_mode):
    """Open every file; returns (fds, sizes, direct_used, direct_error)."""
    want_direct = direct_mode in ("auto", "on") and hasattr(os, "O_DIRECT")
    direct_error = None
    fds, sizes = [], []
    flags = os.O_RDONLY
    if want_direct:
        try:
            fd = os.open(paths[0], os.O_RDONLY | os.O_DIRECT)
            os.close(fd)
            flags |= os.O_DIRECT
        except OSError as exc:
            direct_error = f"O_DIRECT open failed: {exc}"
            if direct_mode == "on":
                raise
    for p in paths:
        fd = os.open(p, flags)
        fds.append(fd)
        sizes.append(os.fstat(fd).st_size)
    return fds, sizes, bool(flags & getattr(os, "O_DIRECT", 0)), direct_error


def drop_file_cache(fds):
    for fd in fds:
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except (AttributeError, OSError):
            pass


def wait_for_go(go_file, deadline):
    while time.time() < deadline:
        try:
            with open(go_file) as fh:
                text = fh.read()
            if text.endswith("\n"):  # complete write only
                return float(text)
        except (FileNotFoundError, ValueError):
            pass
        time.sleep(0.002)
    return None


def sleep_until(t):
    # No busy-wait: with many readers on few cores, spinning readers starve each other at the start
    # instant. A plain sleep wakes within the timer slack (about 50 us).
    while True:
        left = t - time.time()
        if left <= 0:
            return
        time.sleep(left)


def set_start_priority(realtime):
    """Make this thread SCHED_FIFO (realtime=True) or SCHED_OTHER again; returns whether it took effect.

    Around the start instant only: a realtime waker preempts every normal task, so all readers on a busy
    node (or many readers on few cores, as in the rig) issue their first read within microseconds of the
    go time instead of queueing behind the data path. Needs root or CAP_SYS_NICE; otherwise a no-op."""
    if not hasattr(os, "sched_setscheduler"):
        return False
    try:
        if realtime:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        else:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        return True
    except (OSError, AttributeError):
        return False


class Worker(threading.Thread):
    def __init__(self, queue, qlock, fds, sizes, block_bytes, errors):
        super().__init__(daemon=True)
        self.queue, self.qlock = queue, qlock
        self.fds, self.sizes = fds, sizes
        self.buf = mmap.mmap(-1, block_bytes)  # page-aligned: good for O_DIRECT
        self.nbytes = 0  # read by the sampler without a lock: a monotonically growing int
        self.errors = errors
        self.files_done = 0

    def run(self):
        # Started by a realtime main thread (see set_start_priority): read at normal priority.
        set_start_priority(False)
        view = memoryview(self.buf)
        while True:
            with self.qlock:
                if not self.queue:
                    return
                i = self.queue.pop()
            fd, size, off = self.fds[i], self.sizes[i], 0
            try:
                while off < size:
                    n = os.preadv(fd, [view], off)
                    if n <= 0:
                        break
                    off += n
                    self.nbytes += n
                self.files_done += 1
            except OSError as exc:
                self.errors.append(f"read file #{i} at offset {off}: {exc}")
                return


def create(argv):
    """Lay out the KV copy once: `files` chunk files of `header_bytes` + `chunk_bytes`, then the manifest.

    The manifest is written last (atomic rename): its presence means the file set is complete.
    """
    ap = argparse.ArgumentParser(prog="g3_reader.py create")
    ap.add_argument("--pool-dir", required=True)
    ap.add_argument("--manifest-json", required=True, help="the manifest to write (layout + file names)")
    ap.add_argument("--block-bytes", type=int, default=4 << 20)
    a = ap.parse_args(argv)
    manifest = json.loads(a.manifest_json)
    os.makedirs(a.pool_dir, exist_ok=True)
    size = manifest["header_bytes"] + manifest["chunk_bytes"]
    t0 = time.time()
    for name in manifest["files"]:
        final = os.path.join(a.pool_dir, name)
        tmp = final + ".tmp"
        with open(tmp, "wb") as fh:
            left = size
            while left > 0:
                # fresh random bytes per block: nothing for an array to compress or deduplicate
                n = fh.write(os.urandom(min(left, a.block_bytes)))
                left -= n
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    manifest["created_s"] = time.time()
    manifest["create_duration_s"] = time.time() - t0
    path = os.path.join(a.pool_dir, "kvgate-manifest.json")
    with open(path + ".tmp", "w") as fh:
        json.dump(manifest, fh)
    os.replace(path + ".tmp", path)
    print(json.dumps({"created": len(manifest["files"]), "bytes": size * len(manifest["files"]),
                      "duration_s": manifest["create_duration_s"]}))
    return 0


def arm_and_start(em, armed_file, go_file, deadline, workers, realtime_wake):
    """Signal armed (the armed file, atomically), wait for the go file, start every worker at its instant (woken
    as SCHED_FIFO where permitted and ``realtime_wake``) and emit the start record. Returns the start time, or
    None (error and end emitted) when no go came before the deadline."""
    with open(armed_file + ".tmp", "w") as fh:
        fh.write(f"{time.time()}\n")
    os.replace(armed_file + ".tmp", armed_file)
    go = wait_for_go(go_file, deadline)
    if go is None:
        em.emit(type="error", message="no go signal before the deadline")
        em.emit(type="end", t_s=time.time(), bytes=0, completed=False, files_done=0)
        return None
    realtime = realtime_wake and set_start_priority(True)
    sleep_until(go)
    t0 = time.time()
    for w in workers:
        w.start()
    if realtime:
        set_start_priority(False)
    em.emit(type="start", t_s=t0, go_s=go, start_priority="fifo" if realtime else "normal")
    return t0


def sample_until_done(em, workers, t0, interval_s, deadline, deadline_s, errors, doing, tick=None):
    """Emit a sample every interval_s until every worker has ended (``tick`` runs before each sample); past the
    deadline, end the process (rc 6). The samples add up to the total returned (kvgate holds a self-reported
    reader to that). Emits the workers' errors; returns the bytes they moved."""
    last_t, last_b = t0, 0
    while any(w.is_alive() for w in workers):
        nxt = last_t + interval_s
        while time.time() < nxt and any(w.is_alive() for w in workers):
            time.sleep(min(0.01, max(0.0, nxt - time.time())))
        if tick is not None:
            tick()
        now = time.time()
        total = sum(w.nbytes for w in workers)
        em.emit(type="sample", t0_s=last_t, t1_s=now, bytes=total - last_b)
        last_t, last_b = now, total
        if now > deadline:
            em.emit(type="error", message=f"deadline of {deadline_s} s reached while {doing}")
            em.emit(type="end", t_s=now, bytes=total, completed=False, files_done=sum(w.files_done for w in workers))
            os._exit(6)
    total = sum(w.nbytes for w in workers)
    if total != last_b:  # a worker's last read counted after the last sample was taken: the samples add up
        now = time.time()
        em.emit(type="sample", t0_s=last_t, t1_s=now, bytes=total - last_b)
    for e in errors:
        em.emit(type="error", message=e)
    return total


class WriteWorker(threading.Thread):
    """Writes whole files (cycled names) until ``stop`` is set; counts the bytes each write call returned."""

    def __init__(self, next_file, paths, file_bytes, block_bytes, flags, stop, errors):
        super().__init__(daemon=True)
        self.next_file, self.paths = next_file, paths
        self.file_bytes, self.block_bytes, self.flags = file_bytes, block_bytes, flags
        self.stop, self.errors = stop, errors
        self.buf = mmap.mmap(-1, block_bytes)  # page-aligned: good for O_DIRECT
        self.buf.write(os.urandom(block_bytes))
        self.nbytes = 0
        self.files_done = 0

    def run(self):
        set_start_priority(False)
        view = memoryview(self.buf)
        block_no = 0
        while not self.stop.is_set():
            path = self.paths[self.next_file() % len(self.paths)]
            try:
                fd = os.open(path, self.flags, 0o644)
                try:
                    off = 0
                    while off < self.file_bytes and not self.stop.is_set():
                        # a fresh first 16 bytes per block: no two blocks alike for an array to deduplicate
                        block_no += 1
                        view[:16] = block_no.to_bytes(8, "little") + os.urandom(8)
                        n = os.pwritev(fd, [view[:min(self.block_bytes, self.file_bytes - off)]], off)
                        if n <= 0:
                            raise OSError(f"write returned {n}")
                        off += n
                        self.nbytes += n
                    os.fsync(fd)
                finally:
                    os.close(fd)
                self.files_done += 1
            except OSError as exc:
                self.errors.append(f"write {os.path.basename(path)}: {exc}")
                return


def _write_args(argv):
    """The ``write`` subcommand's parsed arguments."""
    ap = argparse.ArgumentParser(prog="g3_reader.py write")
    ap.add_argument("--dir", required=True, help="directory on the shared store to write into (created)")
    ap.add_argument("--node", default=socket.gethostname())
    ap.add_argument("--file-bytes", type=int, default=32 << 20)
    ap.add_argument("--files", type=int, default=8, help="file names cycled over: bounds the disk used")
    ap.add_argument("--block-bytes", type=int, default=4 << 20)
    ap.add_argument("--streams", type=int, default=2)
    ap.add_argument("--direct", choices=("auto", "on", "off"), default="auto")
    ap.add_argument("--interval-s", type=float, default=0.1)
    ap.add_argument("--armed-file", required=True)
    ap.add_argument("--go-file", required=True)
    ap.add_argument("--stop-file", required=True)
    ap.add_argument("--out", default=None)
    ap.add_argument("--deadline-s", type=float, default=600.0)
    return ap.parse_args(argv)


def _write_flags(directory, probe_path, direct):
    """Create the write directory; (flags, direct_used, direct_error): O_DIRECT where asked and a probe takes it."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    direct_used, direct_error = False, None
    os.makedirs(directory, exist_ok=True)
    if direct in ("auto", "on") and hasattr(os, "O_DIRECT"):
        try:
            os.close(os.open(probe_path, flags | os.O_DIRECT, 0o644))
            flags |= os.O_DIRECT
            direct_used = True
        except OSError as exc:
            direct_error = f"O_DIRECT open failed: {exc}"
            if direct == "on":
                raise
    return flags, direct_used, direct_error


def write(argv):
    """G3's isolation writer: armed, released at the common start, writes until the stop file appears."""
    a = _write_args(argv)
    t_begin = time.time()
    deadline = t_begin + a.deadline_s
    em = Emitter(a.out)
    em.emit(type="header", schema=SCHEMA, mode="write", node=a.node, pid=os.getpid(), pgid=os.getpgid(0),
            python=sys.version.split()[0], direct_requested=a.direct, block_bytes=a.block_bytes,
            streams=a.streams, interval_s=a.interval_s, t_s=t_begin)
    try:  # a stale stop file (a run before this one) would end the writing at once
        os.remove(a.stop_file)
    except FileNotFoundError:
        pass
    paths = [os.path.join(a.dir, f"kvgate-g3-write-{i}.data") for i in range(max(1, a.files))]
    try:
        flags, direct_used, direct_error = _write_flags(a.dir, paths[0], a.direct)
    except OSError as exc:
        em.emit(type="error", message=f"arming failed: {exc}")
        em.emit(type="end", t_s=time.time(), bytes=0, completed=False, files_done=0)
        return 3
    counter = iter(range(1 << 62))
    clock = threading.Lock()

    def next_file():
        with clock:
            return next(counter)

    stop = threading.Event()
    errors: list[str] = []
    workers = [WriteWorker(next_file, paths, a.file_bytes, a.block_bytes, flags, stop, errors)
               for _ in range(max(1, a.streams))]
    em.emit(type="armed", t_s=time.time(), files=len(paths), bytes_expected=None, direct_used=direct_used,
            direct_error=direct_error)
    t0 = arm_and_start(em, a.armed_file, a.go_file, deadline, workers, True)
    if t0 is None:
        return 4

    def check_stop():
        if not stop.is_set() and os.path.exists(a.stop_file):
            stop.set()

    total = sample_until_done(em, workers, t0, a.interval_s, deadline, a.deadline_s, errors, "writing", check_stop)
    stopped = stop.is_set()
    if not stopped:
        em.emit(type="error", message="every writer stream ended before the stop file appeared")
    completed = stopped and not errors
    em.emit(type="end", t_s=time.time(), bytes=total, completed=completed, stopped=stopped,
            files_done=sum(w.files_done for w in workers))
    return 0 if completed else 7


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "create":
        return create(argv[1:])
    if argv and argv[0] == "write":
        return write(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--manifest", required=True, help="JSON {files: [relative names], ...} in the pool")
    ap.add_argument("--pool-dir", required=True)
    ap.add_argument("--node", default=socket.gethostname())
    ap.add_argument("--block-bytes", type=int, default=4 << 20)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--direct", choices=("auto", "on", "off"), default="auto")
    ap.add_argument("--interval-s", type=float, default=0.1)
    ap.add_argument("--armed-file", required=True)
    ap.add_argument("--go-file", required=True)
    ap.add_argument("--out", default=None)
    ap.add_argument("--deadline-s", type=float, default=600.0, help="hard limit on the reader's life")
    ap.add_argument("--start-priority", choices=("auto", "normal"), default="auto",
                    help="auto: wake for the start as SCHED_FIFO where permitted (recorded), then normal")
    a = ap.parse_args(argv)
    t_begin = time.time()
    deadline = t_begin + a.deadline_s
    em = Emitter(a.out)
    em.emit(type="header", schema=SCHEMA, node=a.node, pid=os.getpid(), pgid=os.getpgid(0),
            python=sys.version.split()[0], direct_requested=a.direct, block_bytes=a.block_bytes,
            streams=a.streams, interval_s=a.interval_s, t_s=t_begin)
    try:
        with open(a.manifest) as fh:
            manifest = json.load(fh)
        paths = [os.path.join(a.pool_dir, f) for f in manifest["files"]]
        fds, sizes, direct_used, direct_error = open_files(paths, a.direct)
    except (OSError, ValueError, KeyError) as exc:
        em.emit(type="error", message=f"arming failed: {exc}")
        em.emit(type="end", t_s=time.time(), bytes=0, completed=False, files_done=0)
        return 3
    if not direct_used:
        drop_file_cache(fds)
    expected = sum(sizes)
    # Everything the start needs is ready before arming: at the go instant only threads are started.
    queue = list(range(len(fds)))[::-1]
    qlock = threading.Lock()
    errors: list[str] = []
    workers = [Worker(queue, qlock, fds, sizes, a.block_bytes, errors) for _ in range(max(1, a.streams))]
    em.emit(type="armed", t_s=time.time(), files=len(fds), bytes_expected=expected,
            direct_used=direct_used, direct_error=direct_error)
    t0 = arm_and_start(em, a.armed_file, a.go_file, deadline, workers, a.start_priority == "auto")
    if t0 is None:
        return 4
    total = sample_until_done(em, workers, t0, a.interval_s, deadline, a.deadline_s, errors, "reading")
    done = sum(w.files_done for w in workers)
    completed = not errors and total == expected and done == len(fds)
    em.emit(type="end", t_s=time.time(), bytes=total, completed=completed, files_done=done)
    return 0 if completed else 7


if __name__ == "__main__":
    sys.exit(main())
