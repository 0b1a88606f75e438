"""Every command a run executes leaves argv, stdout, stderr, rc and status on disk, even on failure.

These are the writers of step records, so secrets are redacted here (harness.redact): the values of secret
environment variables and options in ``argv.json``, and every known secret value and URL userinfo in
``stdout``, ``stderr`` and the status. The command itself gets the real values."""

from __future__ import annotations

import copy
import itertools
import json
import os
import re
import threading
import time
from pathlib import Path
from typing import Callable, Mapping, Sequence

from ..redact import redact_argv, redact_env, redact_text
from ..safeio import dumps_indented
from .base import CommandResult, Process, Transport

_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


class StepLog:
    """Numbered step directories under ``run_dir/steps``; thread-safe numbering. ``guarded(check)`` is a view
    (one gate's) that calls ``check(path)`` before each directory or file it writes: once its gate ended the
    check raises, so a step of a gate never lands in the run after the gate's end."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self.root = self.run_dir / "steps"
        self.root.mkdir(parents=True, exist_ok=True)
        self._numbers = itertools.count(1)  # shared with every guarded view: one numbering per run
        self._lock = threading.Lock()
        self._check: Callable[[Path], None] = lambda _path: None

    def guarded(self, check: Callable[[Path], None]) -> "StepLog":
        """This log, numbering shared, with ``check(path)`` called before every write (it raises to refuse)."""
        view = copy.copy(self)
        view._check = check
        return view

    def new_dir(self, node: str, name: str) -> Path:
        with self._lock:
            n = next(self._numbers)
        d = self.root / f"{n:03d}-{_SAFE.sub('_', node)}-{_SAFE.sub('_', name)}"
        self._check(d)
        d.mkdir(parents=True, exist_ok=True)
        return d

    def run(self, transport: Transport, name: str, argv: Sequence[str], timeout_s: float | None = None,
            env: Mapping[str, str] | None = None, stdin: bytes | str | None = None) -> CommandResult:
        return self.run_in(self.new_dir(transport.name, name), transport, argv, timeout_s, env, stdin)

    def run_in(self, d: Path, transport: Transport, argv: Sequence[str], timeout_s: float | None = None,
               env: Mapping[str, str] | None = None, stdin: bytes | str | None = None) -> CommandResult:
        """``run`` into a step directory made beforehand with ``new_dir`` (for steps that refer to it)."""
        self._check(d)
        _write_argv(d, transport.name, argv, env, timeout_s)
        _write_status(d, {"status": "running", "started_unix_s": time.time()})
        result = transport.run(argv, timeout_s=timeout_s, env=env, stdin=stdin)
        self._check(d)  # a command its gate's end stopped: the step stays "running", its output is not kept
        record(d, result)
        return result

    def spawn(self, transport: Transport, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None,
              log_path: str | None = None) -> tuple[Process, Path]:
        """Start a long-lived command (``Transport.spawn``) as a step: its argv, environment (secrets redacted)
        and log path on disk before it starts, its pid after. Returns the process and the step directory."""
        d = self.new_dir(transport.name, name)
        _write_argv(d, transport.name, argv, env, None, log_path=log_path)
        proc = transport.spawn(argv, env=env, log_path=log_path)
        _write_status(d, {"status": "spawned", "pid": proc.pid})
        return proc, d

    def keep(self, node: str, name: str, result: CommandResult, timeout_s: float | None = None,
             part_of: str | None = None) -> Path:
        """Record a command that already ran as a step (e.g. the last look of a polling loop); ``part_of``
        names the step whose command ran it (one section of a composite command)."""
        d = self.new_dir(node, name)
        self._check(d)
        _write_argv(d, node, result.argv, None, timeout_s, part_of)
        record(d, result)
        return d


def _write_argv(d: Path, node: str, argv: Sequence[str], env: Mapping[str, str] | None, timeout_s: float | None,
                part_of: str | None = None, log_path: str | None = None) -> None:
    rec = {"node": node, "argv": redact_argv(argv), "env": redact_env(env), "timeout_s": timeout_s}
    if log_path is not None:
        rec = {"node": node, "argv": rec["argv"], "env": rec["env"], "log_path": log_path}
    if part_of is not None:
        rec["part_of"] = part_of
    _put(d, "argv.json", json.dumps(rec, indent=1))


def _write_status(d: Path, status: dict) -> None:
    _put(d, "status.json", dumps_indented(status))


_PUT_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC


def _put(d: Path, name: str, text: str) -> None:
    """One file of a step, as ``(d / name).write_text(text)`` writes it (UTF-8 here, mode 0o666 less the umask),
    in three system calls (open, write, close) and no file object: a run of a thousand nodes writes some ninety
    thousand of these, and ``open()`` adds an ``fstat``, an ``ioctl`` and a buffered layer to each."""
    data = text.encode()
    fd = os.open(f"{d}/{name}", _PUT_FLAGS, 0o666)
    try:
        view = memoryview(data)
        while view:  # a regular file takes the whole buffer at once; the loop is for the exception
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def record(d: Path, result: CommandResult) -> None:
    _put(d, "stdout", redact_text(result.stdout))
    _put(d, "stderr", redact_text(result.stderr))
    _put(d, "rc", "" if result.rc is None else f"{result.rc}\n")
    status = "ok" if result.ok else ("timeout" if result.timed_out else ("error" if result.error else "failed"))
    _write_status(d, {"status": status, "rc": result.rc, "timed_out": result.timed_out,
                      "error": redact_text(result.error) if result.error else result.error,
                      "duration_s": round(result.duration_s, 6)})
