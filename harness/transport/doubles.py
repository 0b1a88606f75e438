"""A scripted transport: a node whose commands a test answers, as httpx's ``MockTransport`` answers requests.

``ScriptedTransport(handler)`` calls ``handler(call)`` for every command a workload runs or spawns and turns
the returned :class:`Reply` into the process the driver (``Transport.run`` / ``spawn``) sees, so a workload's
``run()`` goes through the same driver as on a real node: timeouts, output collection, process-group kills.
Everything that happens is appended to ``events`` in order (commands, spawns, kills, file transfers), so a
test can assert what a workload did and in which order; ``files`` is the node's file system for ``put`` and
``get`` (remote path -> bytes).

A spawned command (an engine, a reader) keeps running until its group is killed or ``Reply.exit_after_s``
passes; ``Reply.rc`` is then its exit status.

With ``sessions=True`` the node also keeps a command's stdin open (``Transport.open_session``, e.g. the clock
probe): the session is one event (kind ``session``), and every ``send`` is handed to ``handler`` as a call with
that stdin, whose reply's stdout is what the session prints back.
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

from ..redact import scrub_file
from .base import KEEP_STDIN_OPEN, Process, Transport


@dataclass(frozen=True)
class Call:
    """One command as the node receives it."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    stdin: bytes | None
    log_path: str | None  # set for a spawned long-lived command

    @property
    def spawned(self) -> bool:
        return self.log_path is not None


@dataclass(frozen=True)
class Reply:
    """What the scripted node answers: exit status and output, or a failure to start."""

    rc: int | None = 0
    stdout: str = ""
    stderr: str = ""
    error: str | None = None  # the command could not be started (OSError text)
    hang: bool = False  # never exits by itself: Transport.run times out and kills its group
    exit_after_s: float | None = None  # a spawned (or any) command that ends by itself after this long


Handler = Callable[[Call], Reply]


@dataclass
class Event:
    """One thing that happened on the scripted node: ``kind`` is run, spawn, session, kill, put or get."""

    kind: str
    argv: tuple[str, ...] = ()
    path: str = ""
    pid: int | None = None
    t_s: float = field(default_factory=time.monotonic)


class _ScriptedProcess(Process):
    def __init__(self, node: "ScriptedTransport", pid: int, reply: Reply, spawned: bool):
        self.node, self.pid, self.pgid, self.reply = node, pid, pid, reply
        self._killed = threading.Event()
        self._started = time.monotonic()
        self._spawned = spawned
        self._out: list[bytes] = [reply.stdout.encode()]

    def _rc(self) -> int | None:
        if self._killed.is_set():
            return -15
        if self.reply.hang:
            return None
        if self._spawned or self.reply.exit_after_s is not None:  # a launch without a log file lives on too
            after = self.reply.exit_after_s
            if after is None or time.monotonic() - self._started < after:
                return None
        return self.reply.rc

    def poll(self) -> int | None:
        return self._rc()

    def wait(self, timeout_s: float | None = None) -> int | None:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while (rc := self._rc()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                return None
            time.sleep(0.005)
        return rc

    def kill_group(self, grace_s: float = 5.0) -> None:
        if self._rc() is None:
            self.node._event(Event("kill", pid=self.pid))
            self._killed.set()

    def output(self) -> tuple[bytes, bytes]:
        return self.reply.stdout.encode(), self.reply.stderr.encode()


class _ScriptedSession(_ScriptedProcess):
    """A command whose stdin stays open: each ``send`` is answered by the handler, until stdin is closed."""

    def __init__(self, node: "ScriptedTransport", pid: int, call: Call):
        super().__init__(node, pid, Reply(hang=True), spawned=False)
        self.call = call
        self._closed = False

    def send(self, data: bytes) -> None:
        if self._closed or self._killed.is_set():
            raise BrokenPipeError("the session's stdin is closed")
        reply = self.node.handler(Call(self.call.argv, self.call.env, data, None))
        self._out.append(reply.stdout.encode())

    def close_stdin(self) -> None:
        self._closed = True

    def _rc(self) -> int | None:
        if self._killed.is_set():
            return -15
        return 0 if self._closed else None

    def output(self) -> tuple[bytes, bytes]:
        return b"".join(self._out), b""


class ScriptedTransport(Transport):
    """A node answered by ``handler`` (default: every command succeeds with no output)."""

    def __init__(self, handler: Handler | None = None, name: str = "scripted",
                 events: list[Event] | None = None, files: dict[str, bytes] | None = None, sessions: bool = False):
        self.name = name
        self.supports_sessions = sessions
        self.handler = handler or (lambda call: Reply())
        self.events: list[Event] = events if events is not None else []
        self.files: dict[str, bytes] = files if files is not None else {}
        self._pids = itertools.count(1000)
        self._lock = threading.Lock()

    def _event(self, event: Event) -> None:
        with self._lock:
            self.events.append(event)

    @property
    def commands(self) -> list[tuple[str, ...]]:
        """argv of every command run, spawned or opened as a session, in order."""
        return [e.argv for e in self.events if e.kind in ("run", "spawn", "session")]

    def _start(self, argv, env, stdin, log_path) -> Process:
        pid = next(self._pids)
        if stdin is KEEP_STDIN_OPEN:
            session = Call(tuple(argv), dict(env), None, None)
            self._event(Event("session", session.argv, "", pid))
            return _ScriptedSession(self, pid, session)
        call = Call(tuple(argv), dict(env), stdin, log_path)
        self._event(Event("spawn" if call.spawned else "run", call.argv, log_path or "", pid))
        reply = self.handler(call)
        if reply.error is not None:
            raise OSError(reply.error)
        if call.spawned and (reply.stdout or reply.stderr):
            self.files[log_path] = self.files.get(log_path, b"") + (reply.stdout + reply.stderr).encode()
        return _ScriptedProcess(self, pid, reply, call.spawned)

    def put(self, local_path, remote_path) -> None:
        self._event(Event("put", path=str(remote_path)))
        self.files[str(remote_path)] = Path(local_path).read_bytes()

    def get(self, remote_path, local_path) -> None:
        self._event(Event("get", path=str(remote_path)))
        try:
            data = self.files[str(remote_path)]
        except KeyError:
            raise FileNotFoundError(f"{self.name}: no file {remote_path}") from None
        Path(local_path).parent.mkdir(parents=True, exist_ok=True)
        Path(local_path).write_bytes(data)
        scrub_file(local_path)  # as the real backends do: the copy is kvgate's record
