"""A probe: one node command and the pure parser of what it prints, kept together (pyinfra's facts).

Every workload that needs the same fact about a node (its NUMA CPU lists, the pool's block device and its
counters, the engine's versions) sends the probe's ``argv`` as a logged step and reads its stdout with the
probe's ``parse``; the plan lists the same ``argv``. Each parser is tested against captured output
(tests/fixtures/), so a fact is measured one way wherever it is used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Probe(Generic[T]):
    """``argv`` run on a node; ``parse(stdout)`` gives the fact or raises ValueError when its output is not
    the shape expected. ``step`` names its logged step; ``description`` says what it reads (the plan's text)."""

    step: str
    argv: tuple[str, ...]
    parse: Callable[[str], T]
    description: str
    timeout_s: float = 30.0
