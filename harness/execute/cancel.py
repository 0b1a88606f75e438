"""A gate's cancellation: the one token every wait, poll and request loop of a gate checks, and the guard that
refuses writes into a gate's directory once the gate ended.

The runner gives each gate a :class:`Cancellation` (``GateContext.cancel``) holding the gate's deadline on the
gate's clock (:class:`harness.execute.clock.Clock`). It is set when the gate reaches its ``timeout_s`` or the run
is stopped (Ctrl-C, SIGTERM, SIGHUP); from then on ``sleep`` and ``check`` raise :class:`Cancelled`, the HTTP
client sends nothing more and drops what is in flight, and a write into the gate's directory raises
:class:`GateEnded` and is recorded in ``refused_writes`` instead of landing after the gate's verdict (or in a
bundle, unsigned).
"""

from __future__ import annotations

import threading
import weakref
from pathlib import Path
from typing import Any

from ..errors import HarnessError, WorkloadError
from .clock import Clock


class Cancelled(WorkloadError):
    """The gate was stopped (its ``timeout_s``, Ctrl-C, SIGTERM): the wait or request that raised it ends here."""


class GateEnded(HarnessError):
    """A write into a gate's directory after the gate ended: refused (and recorded by the gate's token)."""


class Cancellation:
    """One gate's cancellation token: ``cancel(reason)`` from any thread; the deadline (``timeout_s`` after it was
    made, on ``clock``) cancels it too. ``is_set`` makes it usable where a ``threading.Event`` is expected."""

    def __init__(self, clock: Clock | None = None, timeout_s: float | None = None, what: str = "the gate"):
        self.clock = clock or Clock()
        self.what = what
        self.timeout_s = timeout_s
        self.deadline = None if timeout_s is None else self.clock.now() + timeout_s
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._reason: str | None = None
        self.refused_writes: list[dict[str, Any]] = []

    def cancel(self, reason: str) -> None:
        """Stop the gate's work from now on; the first reason is the one kept."""
        with self._lock:
            if self._reason is None:
                self._reason = reason
        self._event.set()

    @property
    def reason(self) -> str | None:
        """Why the gate was cancelled, or None while it runs."""
        self.is_set()
        return self._reason

    def is_set(self) -> bool:
        """Whether the gate is cancelled (past its deadline counts)."""
        if not self._event.is_set() and self.deadline is not None and self.clock.now() >= self.deadline:
            self.cancel(f"{self.what} timed out after {self.timeout_s:g} s")
        return self._event.is_set()

    def check(self) -> None:
        """Raise :class:`Cancelled` when the gate is cancelled: call it before each request, poll or command."""
        if self.is_set():
            raise Cancelled(f"{self.what}: stopped: {self._reason}")

    def remaining_s(self, cap_s: float | None = None) -> float | None:
        """Seconds to the deadline (never below 0), capped by ``cap_s``; ``cap_s`` when there is no deadline."""
        if self.deadline is None:
            return cap_s
        left = max(0.0, self.deadline - self.clock.now())
        return left if cap_s is None else min(cap_s, left)

    def bound_timeout_s(self, timeout_s: float | None) -> float | None:
        """A per-request timeout that ends by the deadline (an in-flight request never outlives the gate)."""
        left = self.remaining_s(timeout_s)
        return None if left is None else max(left, 0.001)

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` on the gate's clock, ending at once when the gate is cancelled (raises Cancelled)."""
        self.check()
        left = self.remaining_s(seconds)
        self.clock.wait(self._event, seconds if left is None else left)
        self.check()

    def guard_write(self, path: str | Path) -> None:
        """Refuse a write into the gate's directory once the gate ended: raise :class:`GateEnded`, recorded in
        ``refused_writes`` (what the runner keeps as evidence)."""
        if self.is_set():
            self.refused_writes.append({"path": str(path), "reason": self._reason})
            raise GateEnded(f"{path}: not written: {self.what} ended ({self._reason})")


# Gate directory -> its token. Writers that are handed only a directory (``write_summary(gate_dir, ...)``) find
# the gate's guard here, so a workload cannot write past its gate's end by holding on to a plain Path. Weak:
# a token lives as long as its gate context.
_GUARDED: "weakref.WeakValueDictionary[Path, Cancellation]" = weakref.WeakValueDictionary()
_GUARDED_LOCK = threading.Lock()


def guard_directory(directory: Path, token: Cancellation) -> None:
    """Every write under ``directory`` through :func:`check_write` is refused once ``token`` is cancelled."""
    with _GUARDED_LOCK:
        _GUARDED[Path(directory).resolve()] = token


def check_write(path: str | Path) -> None:
    """Raise :class:`GateEnded` when ``path`` lies in the directory of a gate that ended (see guard_directory)."""
    p = Path(path).resolve()
    with _GUARDED_LOCK:
        tokens = [t for d, t in _GUARDED.items() if p == d or d in p.parents]
    for t in tokens:
        t.guard_write(path)


def write_text(path: str | Path, text: str) -> None:
    """Write a file in a gate's directory, through the gate's guard (refused after the gate ended)."""
    check_write(path)
    Path(path).write_text(text)
