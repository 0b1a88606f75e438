"""The local backend: commands on this machine through subprocess, each in a new session."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
from pathlib import Path

from ..errors import TransportError
from ..redact import scrub_file
from .base import KEEP_STDIN_OPEN, Process, Transport
from .procgroup import group_exists, terminate


class _LocalProcess(Process):
    def __init__(self, popen: subprocess.Popen, capture: bool):
        self.popen = popen
        self.pid = popen.pid
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._out_cond = threading.Condition()
        self._drained = 0  # streams read to their end
        self._err: list[bytes] = []
        self._threads = []
        if capture:
            for stream, sink in ((popen.stdout, self._out), (popen.stderr, self._err)):
                t = threading.Thread(target=self._drain, args=(stream, sink), daemon=True)
                t.start()
                self._threads.append(t)

    def _drain(self, stream, sink):
        # read1: whatever the pipe holds now, so output streams in as the command prints it (a launched
        # reader's records, progress that stall detection watches) instead of in 64 KiB blocks.
        for chunk in iter(lambda: stream.read1(65536), b""):
            with self._out_cond:
                sink.append(chunk)
                if sink is self._out:
                    self._out_bytes += len(chunk)
                    self._out_cond.notify_all()
        stream.close()
        with self._out_cond:
            self._drained += 1
            self._out_cond.notify_all()

    def send(self, data: bytes) -> None:
        try:
            self.popen.stdin.write(data)
            self.popen.stdin.flush()
        except (AttributeError, OSError, ValueError) as exc:
            raise TransportError(f"cannot write to the command's stdin: {exc}") from None

    def close_stdin(self) -> None:
        try:
            self.popen.stdin.close()
        except (AttributeError, OSError):
            pass

    def wait_stdout_bytes(self, n: int, timeout_s: float) -> bool:
        with self._out_cond:
            return self._out_cond.wait_for(lambda: self._out_bytes >= n or self._drained == 2, timeout_s) \
                and self._out_bytes >= n

    def poll(self):
        return self.popen.poll()

    def wait(self, timeout_s=None):
        try:
            return self.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def kill_group(self, grace_s=5.0):
        terminate([self.pid], group=True, grace_s=grace_s, alive=self._group_alive)

    def _group_alive(self, pgid: int) -> bool:
        self.popen.poll()  # reaps the leader through Popen, so its exit status is kept
        return group_exists(pgid)

    def output(self):
        for t in self._threads:
            t.join(timeout=10)
        return b"".join(self._out), b"".join(self._err)


class LocalTransport(Transport):
    """Runs commands on this machine with subprocess, each in a new session (process group)."""

    supports_sessions = True

    def __init__(self, name: str = "local"):
        self.name = name

    def _start(self, argv, env, stdin, log_path):
        full_env = dict(os.environ)
        full_env.update(env)
        if log_path is not None:
            Path(log_path).parent.mkdir(parents=True, exist_ok=True)
            log = open(log_path, "ab")
            try:
                p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                     env=full_env, start_new_session=True)
            finally:
                log.close()
            return _LocalProcess(p, capture=False)
        p = subprocess.Popen(argv, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=full_env,
                             start_new_session=True)
        proc = _LocalProcess(p, capture=True)
        if stdin is not None and stdin is not KEEP_STDIN_OPEN:
            def feed():
                try:
                    p.stdin.write(stdin)
                    p.stdin.close()
                except (BrokenPipeError, OSError):
                    pass
            threading.Thread(target=feed, daemon=True).start()
        return proc

    def put(self, local_path, remote_path):
        Path(remote_path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(local_path, remote_path)

    def get(self, remote_path, local_path):
        """Copy a file; known secret values in the copy are redacted (the copy is kvgate's record)."""
        Path(local_path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(remote_path, local_path)
        scrub_file(local_path)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on this machine that nothing listens on right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
