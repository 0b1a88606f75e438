"""Stopping processes the one way kvgate does: SIGTERM, a grace period, SIGKILL for what is left, a last wait.

Used for every process group kvgate started on this machine (a local transport's command, the test sshd, the
loopback guest's qemu) and for the rig's processes found by PID in its namespaces. The caller says what it
stops (process groups or single PIDs) and, where it knows better than the kernel, when one counts as gone (a
Popen reaped, a PID that no longer belongs to our qemu); it never signals anything else.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Callable, Sequence

KILL_WAIT_S = 5.0
POLL_S = 0.05


def pid_alive(pid: int) -> bool:
    """A process with this PID exists and is not a zombie (a zombie child of ours is reaped here)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    except ChildProcessError:
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def group_exists(pgid: int) -> bool:
    """Some process of group ``pgid`` exists (a zombie counts: its parent has not reaped it yet)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def group_alive(pgid: int) -> bool:
    """:func:`group_exists`, after reaping the group's leader when it is a child of ours that exited (a caller
    holding a ``subprocess.Popen`` for it polls that instead, so its exit status is not lost)."""
    try:
        os.waitpid(pgid, os.WNOHANG)
    except ChildProcessError:
        pass
    return group_exists(pgid)


def terminate(ids: Sequence[int], *, group: bool, grace_s: float, kill_wait_s: float = KILL_WAIT_S,
              alive: Callable[[int], bool] | None = None) -> list[int]:
    """SIGTERM every process group (``group``) or process in ``ids``, wait up to ``grace_s`` for all to be gone,
    SIGKILL the survivors and wait up to ``kill_wait_s`` more. ``alive(id)`` says whether one is still there
    (default: :func:`group_alive` / :func:`pid_alive`). Returns the ids that were signalled (those that existed)."""
    send = os.killpg if group else os.kill
    alive = alive or (group_alive if group else pid_alive)
    signalled = []
    for i in ids:
        try:
            send(i, signal.SIGTERM)
            signalled.append(i)
        except ProcessLookupError:
            pass
    for sig, wait_s in ((None, grace_s), (signal.SIGKILL, kill_wait_s)):
        if sig is not None:
            for i in signalled:
                if alive(i):
                    try:
                        send(i, sig)
                    except ProcessLookupError:
                        pass
        deadline = time.monotonic() + wait_s
        while any(alive(i) for i in signalled):
            if time.monotonic() >= deadline:
                break
            time.sleep(POLL_S)
        else:
            return signalled
    return signalled
