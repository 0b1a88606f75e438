"""What both fault workloads (fio-faults, g2-faults) share about a fault schedule: the operator's fields checked
and the rule that faults run one at a time."""

from __future__ import annotations

from typing import Any


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
