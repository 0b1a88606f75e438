"""Commands the rigs run on this machine (the host), written once: the qemu guest's image build and the
namespace rig's set-up and tear-down go through :func:`run_host`, which runs a command to completion with a
time limit, keeps argv, rc, stdout and stderr in the rig's command log (:class:`CommandLog`) when it has one,
and turns a missing tool, a timeout or (with ``check``) a failure into the rig's own error, with the package
that provides the tool. Long-lived rig processes (qemu, sshd, sshfs) are stopped with
``harness.transport.procgroup.terminate``.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from pathlib import Path
from typing import Callable, Sequence

from ..errors import HarnessError


class CommandLog:
    """Every host command of a rig leaves argv, rc, stdout and stderr (their last 4000 characters) in
    ``<log_dir>/commands.jsonl``; ``None``: not kept. :meth:`run` is :func:`run_host` with this log and the
    rig's error, install hint and text mode."""

    def __init__(self, log_dir: Path | None, error: Callable[[str], HarnessError] = HarnessError,
                 install_hint: Callable[[str], str] | None = None, text: bool = True):
        self.path = None
        self.error, self.install_hint, self.text = error, install_hint, text
        if log_dir is not None:
            log_dir.mkdir(parents=True, exist_ok=True)
            self.path = log_dir / "commands.jsonl"

    def run(self, argv: Sequence[str], check: bool = True, timeout_s: float = 30.0, **kw) -> subprocess.CompletedProcess:
        """Run ``argv`` on this machine through :func:`run_host`, logged here."""
        if self.install_hint is not None:
            kw.setdefault("install_hint", self.install_hint)
        return run_host(argv, check=check, timeout_s=timeout_s, text=self.text, log=self, error=self.error, **kw)

    def write(self, argv: Sequence[str], rc: int | None, stdout: str, stderr: str, duration_s: float) -> None:
        if self.path is None:
            return
        rec = {"argv": list(argv), "rc": rc, "stdout": stdout[-4000:], "stderr": stderr[-4000:],
               "duration_s": round(duration_s, 4)}
        with self.path.open("a") as fh:
            fh.write(json.dumps(rec) + "\n")


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def run_host(argv: Sequence[str], *, check: bool = True, timeout_s: float = 30.0, input_bytes: bytes | None = None,
             cwd: Path | None = None, text: bool = False, log: CommandLog | None = None,
             error: Callable[[str], HarnessError] = HarnessError,
             install_hint: Callable[[str], str] = lambda tool: f"install the package that provides {tool}",
             ) -> subprocess.CompletedProcess:
    """Run ``argv`` on this machine to completion (stdout and stderr captured, as str with ``text``).

    Raises ``error(message)``: the tool is not installed (``install_hint(tool)`` says which package), it ran past
    ``timeout_s`` (killed), or, with ``check``, it exited non-zero (its stderr's tail quoted)."""
    argv = [str(a) for a in argv]
    t0 = time.monotonic()
    try:
        cp = subprocess.run(argv, cwd=cwd, input=input_bytes, capture_output=True, timeout=timeout_s, text=text)
    except FileNotFoundError:
        tool = Path(argv[0]).name
        raise error(f"{tool} not found: {install_hint(tool)}") from None
    except subprocess.TimeoutExpired as exc:
        if log is not None:
            log.write(argv, None, _text(exc.stdout), _text(exc.stderr), time.monotonic() - t0)
        raise error(f"timed out after {timeout_s:g} s: {shlex.join(argv)}") from None
    if log is not None:
        log.write(argv, cp.returncode, _text(cp.stdout), _text(cp.stderr), time.monotonic() - t0)
    if check and cp.returncode != 0:
        raise error(f"`{shlex.join(argv)}` failed (rc={cp.returncode}): {_text(cp.stderr).strip()[-800:]}")
    return cp
