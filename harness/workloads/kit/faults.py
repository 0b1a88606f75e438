"""What both fault workloads (fio-faults, g2-faults) share about a fault schedule: the operator's fields checked,
the rule that faults run one at a time, and each fault made and undone (:func:`make_fault`: the inverse registered
before the change is sent, run whatever ends the wait) into a typed record (:class:`AppliedFault`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ...execute.undo import UndoLog


def check_operator_fields(f: Any) -> bool:
    """A fault's operator fields checked (ValueError): an operator fault has a description and its command and undo
    together; any other kind has none of them. True for an operator fault (nothing else to check)."""
    if f.kind == "operator":
        if not f.description:
            raise ValueError("an operator fault needs description: what the operator does (shown, recorded)")
        if bool(f.command) != bool(f.undo):
            raise ValueError("an operator fault's command and undo go together (none: done by hand)")
        return True
    if f.command or f.undo or f.description:
        raise ValueError(f"command, undo, description: only for kind operator, not {f.kind}")
    return False


def one_at_a_time(faults: list[Any]) -> float:
    """The time (s) the last of ``faults`` (``at_s``, ``duration_s``) is undone; ValueError when one starts before
    the one before it is undone."""
    end = 0.0
    for i, f in enumerate(sorted(faults, key=lambda f: f.at_s)):
        if f.at_s < end:
            raise ValueError(f"faults[{i}] starts at {f.at_s:g} s, before the one before it is undone "
                             f"({end:g} s): faults run one at a time")
        end = f.at_s + f.duration_s
    return end


@dataclass(frozen=True)
class ScheduledFault:
    """One fault of a gate's schedule, ready to send: its place in the schedule, its spec (``kind``, ``at_s``,
    ``duration_s``, an operator's ``command``), what it does in words, and the exact argv that makes and undoes
    it."""

    index: int
    spec: Any
    what: str
    apply: tuple[str, ...]
    inverse: tuple[str, ...]

    @property
    def step(self) -> str:
        """The step log's name of the apply (its undo: ``step + "-undo"``), and of the undo log's entry."""
        return f"fault{self.index}-{self.spec.kind}"

    @property
    def by_hand(self) -> bool:
        """An operator fault without a command: the operator makes and undoes it when told."""
        return self.spec.kind == "operator" and not self.spec.command


@dataclass(frozen=True)
class AppliedFault:
    """A fault as it was made: the apply's and the undo's step results (None: not sent), the undo log's entry (who
    undid it, its error), and when the apply was sent and the undo returned, in s after the schedule's start on
    the control host's clock."""

    fault: ScheduledFault
    applied: Any
    undo_entry: Any
    undone: Any
    t_apply_s: float
    t_undo_s: float


def make_fault(ctx: Any, node: str, fault: ScheduledFault, undo: UndoLog, t0: float,
               wait_until: Callable[[float], None], timeout_s: float) -> AppliedFault:
    """One fault made on ``node`` and undone after its ``duration_s`` (``wait_until(t)`` waits to the time ``t``
    on the gate's clock). Its inverse is registered with ``undo`` before the fault is sent and run in a
    ``finally``: whatever ends the wait (a request that raised, the gate's cancellation), the node is put back,
    else the runner runs the inverse."""
    tr = ctx.transports[node]
    entry = undo.register(node, fault.step, fault.inverse, gate=ctx.gate.id)
    applied = undone = None
    t_apply = ctx.clock.now() - t0  # before the fault is sent
    try:
        ctx.progress(f"{node}: fault {fault.index}: {fault.what}"
                     + (f": NOW, for {fault.spec.duration_s:g} s" if fault.by_hand else ""))
        applied = ctx.steps.run(tr, fault.step, fault.apply, timeout_s=timeout_s)
        wait_until(t0 + fault.spec.at_s + fault.spec.duration_s)
    finally:  # whatever happened above; if this cannot run (the gate ended), the runner runs it
        undone = ctx.steps.run(tr, f"{fault.step}-undo", fault.inverse, timeout_s=timeout_s)
        t_undo = ctx.clock.now() - t0  # once the inverse returned: "during" spans the whole outage
        undo.mark(entry, undone.ok, None if undone.ok else undone.summary())
        ctx.progress(f"{node}: fault {fault.index} undone" + (": restore it NOW" if fault.by_hand else "")
                     if undone.ok else f"{node}: fault {fault.index} NOT undone: {undone.summary()} "
                     "(the runner tries again)")
    return AppliedFault(fault, applied, entry, undone, round(t_apply, 3), round(t_undo, 3))
