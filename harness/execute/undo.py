"""Commands that put a node back (a fault's inverse), kept where the run can run them whatever ends the gate.

A workload that changes a node for a while (takes an NVMe-oF path down, sets an ANA state, slows a link)
registers the inverse with the run's :class:`UndoLog` *before* it sends the change, and marks it done once the
inverse ran. Whatever ends the gate, the runner runs what is still pending: after the gate's workload returned
(normal end, an error, a workload that raised), after the gate timed out (its own commands killed, its
directory closed to writes), on Ctrl-C / SIGTERM and before the run's ``connect: managed`` disconnects. The
inverses the runner runs are steps of the run (``steps/NNN-NODE-undo-...``), never of the ended gate, and each is
recorded in ``undo.json`` with its outcome. An inverse must be idempotent: it may run after a change that never
landed (the change was cut short).
"""

from __future__ import annotations

import json
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

UNDO_TIMEOUT_S = 60.0


@dataclass
class UndoEntry:
    """One pending inverse: on which node, what it undoes, the argv; how it ended once it ran."""

    node: str
    name: str
    argv: tuple[str, ...]
    gate: str = ""
    done: bool = False
    ran_by: str | None = None  # "workload" or "runner" (whatever ended the gate)
    ok: bool | None = None
    error: str | None = None


@dataclass
class UndoLog:
    """The run's pending inverses; thread-safe (a gate's worker registers, the runner's main thread runs)."""

    path: Path | None = None
    entries: list[UndoEntry] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def register(self, node: str, name: str, argv: Sequence[str], gate: str = "") -> UndoEntry:
        """Keep ``argv`` (the inverse) before the change is sent; returns the entry to mark done."""
        entry = UndoEntry(node=node, name=name, argv=tuple(argv), gate=gate)
        with self._lock:
            self.entries.append(entry)
        self._save()
        return entry

    def mark(self, entry: UndoEntry, ok: bool, error: str | None = None, by: str = "workload") -> None:
        """The inverse ran (``ok`` or not). A failed inverse stays pending: the runner tries it again."""
        with self._lock:
            entry.ok, entry.error, entry.ran_by = ok, error, by
            entry.done = ok
        self._save()

    def pending(self) -> list[UndoEntry]:
        """Inverses not (successfully) run yet, newest first (the order that undoes stacked changes)."""
        with self._lock:
            return [e for e in reversed(self.entries) if not e.done]

    def run_pending(self, transports: dict[str, Any], steps: Any,
                    progress: Callable[[str], None] = lambda msg: None) -> list[UndoEntry]:
        """Run every pending inverse as a step of the run (never raises); returns the entries it ran."""
        ran = []
        for e in self.pending():
            tr = transports.get(e.node)
            if tr is None:
                self.mark(e, False, f"node {e.node} has no open connection", by="runner")
                progress(f"{e.node}: could not undo {e.name}: not connected")
                continue
            try:
                r = steps.run(tr, f"undo-{e.name}", e.argv, timeout_s=UNDO_TIMEOUT_S)
                self.mark(e, r.ok, None if r.ok else r.summary(), by="runner")
            except Exception as exc:  # noqa: BLE001 - recorded; the other inverses still run
                self.mark(e, False, f"{type(exc).__name__}: {exc}", by="runner")
            progress(f"{e.node}: undid {e.name} after its gate ended" if e.ok else
                     f"{e.node}: UNDO FAILED for {e.name}: {e.error}")
            ran.append(e)
        return ran

    def _save(self) -> None:
        if self.path is None:
            return
        with self._lock:
            data = [dict(asdict(e), argv=list(e.argv)) for e in self.entries]
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps(data, indent=1))
        except OSError:
            pass
