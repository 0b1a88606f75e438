"""The command contract every node backend fulfils, and its driver.

The driver (``Transport.run``: timeout, output collection, process-group kill, error capture) is written
once here. Backends (``local``, ``ssh``, the test double in ``doubles``) implement primitives only:
``_start`` (spawn in its own process group and return a ``Process``), ``put``, ``get``, ``close``.
Commands are argv lists; where the remote side needs a shell string it is built once with ``shlex.join``.
"""

from __future__ import annotations

import abc
import re
import shlex
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from ..errors import TransportError
from ..redact import redact_argv, redact_text, register_env

ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class _KeepStdinOpen:
    """``_start``'s stdin for a session: the command's stdin stays open for ``Process.send``."""

    def __repr__(self) -> str:
        return "KEEP_STDIN_OPEN"


KEEP_STDIN_OPEN = _KeepStdinOpen()


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    rc: int | None
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False
    error: str | None = None
    node: str = ""

    @property
    def ok(self) -> bool:
        return self.rc == 0 and not self.timed_out and self.error is None

    def summary(self) -> str:
        """One line for errors and evidence: the command (secrets redacted) and how it ended."""
        cmd = shlex.join(redact_argv(self.argv))
        if self.error:
            return f"{cmd}: {redact_text(self.error)}"
        if self.timed_out:
            return f"{cmd}: timed out after {self.duration_s:.1f} s"
        tail = redact_text((self.stderr.strip().splitlines() or [""])[-1][:300])
        return f"{cmd}: exit {self.rc}" + (f": {tail}" if tail else "")


class Process(abc.ABC):
    """A started command in its own process group."""

    pid: int | None = None

    @abc.abstractmethod
    def poll(self) -> int | None: ...

    @abc.abstractmethod
    def wait(self, timeout_s: float | None = None) -> int | None:
        """Wait for exit; return rc, or None when the timeout passed first."""

    @abc.abstractmethod
    def kill_group(self, grace_s: float = 5.0) -> None:
        """SIGTERM the whole process group, then SIGKILL after ``grace_s``."""

    @abc.abstractmethod
    def output(self) -> tuple[bytes, bytes]:
        """Captured stdout and stderr (after exit); empty when logging to a file."""

    def stdout_bytes_so_far(self) -> int | None:
        """Bytes of stdout delivered so far while running (None when not captured in memory)."""
        counted = getattr(self, "_out_bytes", None)  # kept up to date by backends that stream
        if counted is not None:
            return counted
        chunks = getattr(self, "_out", None)
        return sum(len(c) for c in list(chunks)) if isinstance(chunks, list) else None

    def send(self, data: bytes) -> None:
        """Write to the stdin of a command started with ``Transport.open_session``."""
        raise NotImplementedError(f"{type(self).__name__} has no open stdin")

    def close_stdin(self) -> None:
        """End a session's stdin (the command sees EOF)."""
        raise NotImplementedError(f"{type(self).__name__} has no open stdin")

    def wait_stdout_bytes(self, n: int, timeout_s: float) -> bool:
        """Wait until at least ``n`` bytes of stdout have come back (or the command ended); True if so."""
        deadline = time.monotonic() + timeout_s
        while True:
            got = self.stdout_bytes_so_far()
            if got is not None and got >= n:
                return True
            if self.poll() is not None or time.monotonic() >= deadline:
                got = self.stdout_bytes_so_far()
                return got is not None and got >= n
            time.sleep(0.0005)

    def stdout_so_far(self) -> bytes | None:
        """Stdout delivered so far while running (None when not captured in memory); for short outputs,
        such as a launched program's first records."""
        chunks = getattr(self, "_out", None)
        return b"".join(list(chunks)) if isinstance(chunks, list) else None


def _check_env(env: Mapping[str, str] | None) -> dict[str, str]:
    env = dict(env or {})
    for k in env:
        if not ENV_NAME_RE.match(k):
            raise TransportError(f"invalid environment variable name {k!r}")
    # Every command's environment passes here: its secret values are known to every writer from now on.
    register_env(env)
    return env


class Transport(abc.ABC):
    """The contract every node backend fulfils. ``run`` never raises for a failing command."""

    name: str = ""

    @abc.abstractmethod
    def _start(self, argv: Sequence[str], env: dict[str, str], stdin: bytes | None,
               log_path: str | None) -> Process: ...

    def _active(self) -> set:
        # created lazily so backends need not call a base __init__
        if not hasattr(self, "_active_procs"):
            self._active_procs: set = set()
            self._active_lock = threading.Lock()
        return self._active_procs

    def _track(self, proc: Process | None, add: bool) -> None:
        active = self._active()
        with self._active_lock:
            if add:
                active.add(proc)
            else:
                active.discard(proc)

    def abort(self, grace_s: float = 2.0) -> int:
        """Kill the process group of every command still running through this transport; return how many."""
        active = self._active()
        with self._active_lock:
            procs = list(active)
        killed = 0
        for p in procs:
            if p.poll() is None:
                p.kill_group(grace_s=grace_s)
                killed += 1
            self._track(p, False)
        return killed

    @abc.abstractmethod
    def put(self, local_path: str | Path, remote_path: str) -> None: ...

    @abc.abstractmethod
    def get(self, remote_path: str, local_path: str | Path) -> None: ...

    def close(self) -> None:
        pass

    def forward_port(self, remote_host: str, remote_port: int) -> tuple[str, int]:
        """An address on this machine that reaches ``remote_host:remote_port`` as seen from the node.
        Local nodes are this machine, so it is the address itself."""
        return remote_host, remote_port

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # Backends whose commands can keep stdin open (open_session); the test double does not.
    supports_sessions: bool = False

    def open_session(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> Process:
        """Start a command in its own process group whose stdin stays open: ``send`` writes to it,
        ``close_stdin`` ends it, and its stdout streams back as it prints. One command serves many request
        and answer rounds over the open connection, with no session or process started per round."""
        if not self.supports_sessions:
            raise TransportError(f"{self.name}: this transport cannot keep a command's stdin open")
        proc = self._start([str(a) for a in argv], _check_env(env), KEEP_STDIN_OPEN, None)
        self._track(proc, True)
        return proc

    def spawn(self, argv: Sequence[str], env: Mapping[str, str] | None = None,
              log_path: str | None = None) -> Process:
        """Start a long-lived command in its own process group; output goes to ``log_path`` (on the node)."""
        argv = [str(a) for a in argv]
        proc = self._start(argv, _check_env(env), None, log_path)
        self._track(proc, True)
        return proc

    def run(self, argv: Sequence[str], timeout_s: float | None = None, env: Mapping[str, str] | None = None,
            stdin: bytes | str | None = None) -> CommandResult:
        """Run to completion. On timeout the whole process group is killed and ``timed_out`` is set."""
        argv_t = tuple(str(a) for a in argv)
        if isinstance(stdin, str):
            stdin = stdin.encode()
        t0 = time.monotonic()
        try:
            proc = self._start(list(argv_t), _check_env(env), stdin, None)
        except (TransportError, OSError) as exc:
            return CommandResult(argv_t, None, "", "", time.monotonic() - t0, False,
                                 f"could not start: {exc}", self.name)
        self._track(proc, True)
        try:
            rc = proc.wait(timeout_s)
            timed_out = False
            if rc is None:
                timed_out = True
                proc.kill_group()
                rc = proc.wait(10.0)
        finally:
            self._track(proc, False)
        out, err = proc.output()
        return CommandResult(argv_t, rc, out.decode(errors="replace"), err.decode(errors="replace"),
                             time.monotonic() - t0, timed_out, None, self.name)


class ScopedTransport(Transport):
    """One gate's view of a node's transport: every command started through it can be stopped at once,
    and once cancelled it starts nothing more (``run`` returns an error result, ``spawn``/``put``/``get``
    raise TransportError). The connection underneath stays open for the gates after it; ``close`` is a
    no-op because the runner owns the connection. Attributes the view lacks come from the node's transport.
    """

    def __init__(self, inner: Transport):
        self.inner = inner
        self.name = inner.name
        self._active_procs = set()  # this view's own commands, not the node transport's
        self._active_lock = threading.Lock()
        self._cancel_reason: str | None = None

    def __getattr__(self, attr):
        # Public attributes only (host, port, ...): private state must never resolve to the inner transport's.
        if attr.startswith("_") or attr == "inner":
            raise AttributeError(attr)
        return getattr(self.inner, attr)

    @property
    def cancelled(self) -> str | None:
        """Why the view was cancelled, or None."""
        return self._cancel_reason

    def _refuse(self, what: str) -> None:
        if self._cancel_reason is not None:
            raise TransportError(f"{self.name}: {self._cancel_reason}; not starting {what[:200]}")

    def _start(self, argv, env, stdin, log_path):
        # Start and track under the lock cancel() takes, so no command slips between the check and abort().
        with self._active_lock:
            self._refuse(shlex.join(redact_argv(argv)))
            proc = self.inner._start(argv, env, stdin, log_path)
            self._active_procs.add(proc)
        return proc

    def cancel(self, reason: str, grace_s: float = 2.0) -> int:
        """Refuse new commands from now on and kill the process group of each one still running (on the
        node, local or over SSH); return how many had to be stopped."""
        with self._active_lock:
            self._cancel_reason = reason
        return self.abort(grace_s=grace_s)

    def put(self, local_path, remote_path):
        self._refuse(f"put {remote_path}")
        self.inner.put(local_path, remote_path)

    def get(self, remote_path, local_path):
        self._refuse(f"get {remote_path}")
        self.inner.get(remote_path, local_path)

    def forward_port(self, remote_host, remote_port):
        return self.inner.forward_port(remote_host, remote_port)

    @property
    def supports_sessions(self) -> bool:  # the node's backend decides
        return self.inner.supports_sessions

    def close(self):
        pass
