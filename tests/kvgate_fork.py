"""kvgate run many times for the price of one start-up, each run still a process of its own.

``python -m harness`` spends most of a short command importing kvgate. :class:`ForkServer` starts one plain
interpreter from the checkout's root (``python tests/kvgate_fork.py``, ``sys.path[0]`` set to the root as ``-m``
sets it), which imports the modules it is given and nothing else: no pytest, no logging set up, no command run.
For each command it forks a child that runs the module as ``python -m MODULE ARGS`` runs it (``runpy``, as
``__main__``), with stdin from /dev/null, stdout and stderr into files, the environment given, optionally as
another user (``setgid``/``setuid``, what ``setpriv`` does); the child ends as the interpreter would (exit code
from ``SystemExit``, a traceback and exit 1 for any other exception, ``atexit`` handlers and non-daemon threads
run). Each child starts from the server's pristine state and takes nothing back to it, so no cache, working
directory, environment variable or handler of one run reaches the next. What they do share is what the
interpreter fixed at the server's start: its hash seed and ``-X`` / ``PYTHON*`` start-up settings.

The server reports each child's exit code and peak RSS (``wait4``). The child resets its high-water mark
(``/proc/self/clear_refs`` 5) before the command, so the peak is that of the command on top of the imports the
server already made: compare it with the same command on a harmless input, run the same way. A child still
running after ``timeout_s`` is killed (exit code -9): a hang guard, not a timing assertion.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# For commands that draw charts (report, cost, library): pyplot imported once too, about a second a command on
# a busy 2-core machine. Each command still picks its backend itself (``matplotlib.use("Agg", force=True)``).
WITH_CHARTS = ("harness.cli.main", "matplotlib.pyplot")


@dataclass
class Ran:
    rc: int  # the exit code; -N when signal N ended it (-9: the hang guard)
    out: str  # stdout, and stderr too when run with merge=True
    err: str
    maxrss_bytes: int  # the child's peak RSS from its reset (see the module's docstring)


class ForkServer:
    """A server process that forks one child per :meth:`run`; use as a context manager, or :meth:`close`."""

    def __init__(self, preload: tuple[str, ...] = ("harness.cli.main",), env: dict[str, str] | None = None):
        self._tmp = tempfile.TemporaryDirectory(prefix="kvgate-fork-")
        self._proc = subprocess.Popen([sys.executable, __file__, *preload], cwd=ROOT, stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, env=env, text=True, bufsize=1)
        ready = self._proc.stdout.readline()
        if ready.strip() != "ready":
            self.close()
            raise RuntimeError(f"fork server did not start: {ready!r}")
        self._n = 0

    def run(self, module: str, *args, env: dict[str, str] | None = None, user: tuple[int, int] | None = None,
            merge: bool = True, timeout_s: float = 120, whole_env: bool = False) -> Ran:
        """``python -m MODULE ARGS`` in a forked child; ``env`` is added to the server's environment (with
        ``whole_env``, it is the environment), ``user`` is ``(uid, gid)`` to run as; ``merge`` sends stderr to the
        same file as stdout."""
        self._n += 1
        out = Path(self._tmp.name) / f"{self._n}.out"
        err = out if merge else Path(self._tmp.name) / f"{self._n}.err"
        req = {"module": module, "argv": [str(a) for a in args], "env": env or {}, "whole_env": whole_env,
               "user": user, "stdout": str(out), "stderr": str(err), "timeout_s": timeout_s}
        self._proc.stdin.write(json.dumps(req) + "\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"fork server ended (exit {self._proc.wait()})")
        res = json.loads(line)
        text = out.read_bytes().decode(errors="replace")
        etext = "" if merge else err.read_bytes().decode(errors="replace")
        out.unlink()
        if not merge:
            err.unlink()
        return Ran(res["rc"], text, etext, res["maxrss_bytes"])

    def kvgate(self, *args, home: Path | None = None, env: dict[str, str] | None = None,
               timeout: float = 600) -> subprocess.CompletedProcess:
        """tests/kvgate_cli.py's ``kvgate``, forked: ``kvgate ARGS`` in this process's environment as a
        subprocess inherits it, KVGATE_HOME ``home``, ``env`` added; stdout and stderr apart."""
        e = dict(os.environ)
        if home is not None:
            e["KVGATE_HOME"] = str(home)
        e.update(env or {})
        argv = ["kvgate", *map(str, args)]
        r = self.run("harness", *args, env=e, whole_env=True, merge=False, timeout_s=timeout)
        if r.rc == -9:
            raise subprocess.TimeoutExpired(argv, timeout, r.out, r.err)
        return subprocess.CompletedProcess(argv, r.rc, r.out, r.err)

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc.stdout.close()
        self._tmp.cleanup()

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---------------------------------------------------------------------------------------------- the server


def _exit_code(exc: SystemExit) -> int:
    """The exit status the interpreter gives ``SystemExit(code)``: None 0, an int itself, else printed, 1."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1


def _child(req: dict) -> None:
    """Run the command as a fresh ``python -m`` would, then leave with its exit code (never returns)."""
    code = 1
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        out = os.open(req["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        err = out if req["stderr"] == req["stdout"] else os.open(req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                                                                 0o644)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(err, 2)
        for fd in {null, out, err}:
            os.close(fd)
        if req["whole_env"]:
            os.environ.clear()
        os.environ.update(req["env"])
        try:  # the peak from here on: before setuid, which makes /proc/self root's
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass  # then the peak includes the server's own, the same for every child
        if req["user"]:
            uid, gid = req["user"]
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
        import runpy
        import threading

        sys.argv = [req["module"], *req["argv"]]
        try:
            runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            code = _exit_code(exc)
        except BaseException:  # noqa: BLE001 - what the interpreter prints: the traceback, exit 1
            import traceback

            traceback.print_exc()
            code = 1
        threading._shutdown()  # as the interpreter does at exit: wait for non-daemon threads
        import atexit

        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed stream: nothing left to write
                pass
        os._exit(code)


def _wait(pid: int, timeout_s: float) -> tuple[int, int]:
    """(exit code, peak RSS in bytes) of child ``pid``; killed after ``timeout_s`` (exit code -9)."""
    import select
    import time

    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # before Linux 5.3: poll
        deadline = time.monotonic() + timeout_s
        while True:
            done, status, usage = os.wait4(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status), usage.ru_maxrss * 1024
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                break
            time.sleep(0.005)
    else:
        try:
            if not select.select([fd], [], [], timeout_s)[0]:
                os.kill(pid, 9)
        finally:
            os.close(fd)
    _, status, usage = os.wait4(pid, 0)
    return os.waitstatus_to_exitcode(status), usage.ru_maxrss * 1024


def serve(preload: list[str]) -> None:
    """Import ``preload``, then read one JSON request a line on stdin, fork, answer ``{rc, maxrss_bytes}``."""
    import importlib

    sys.path[0] = os.getcwd()  # as `python -m` has it, not this file's folder
    for name in preload:
        importlib.import_module(name)
    print("ready", flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(req)
        rc, maxrss = _wait(pid, req["timeout_s"])
        print(json.dumps({"rc": rc, "maxrss_bytes": maxrss}), flush=True)


if __name__ == "__main__":
    serve(sys.argv[1:])
