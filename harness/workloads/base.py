"""The workload contract: validated params, a pure plan, and a run that returns data.

A workload module defines a class decorated with ``@register_workload("name")`` holding:
- ``Params``: a pydantic model (extra="forbid") for the gate's ``params:`` block;
- ``METRICS``: metric name -> unit (the unit the metric is reported in, e.g. ``"GB/s"``);
- ``plan(ctx) -> list[PlannedStep]``: what would run where, with exact argv; runs nothing;
- ``run(ctx) -> WorkloadResult``: runs, leaves raw files under ``ctx.gate_dir``; failures become data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar

from pydantic import BaseModel, ConfigDict

from ..verdict import WorkloadResult

WORKLOADS: dict[str, type["Workload"]] = {}


def register_workload(name: str):
    def deco(cls):
        cls.name = name
        WORKLOADS[name] = cls
        return cls
    return deco


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True)
class PlannedStep:
    node: str
    description: str
    argv: tuple[str, ...] = ()
    files: dict[str, str] = field(default_factory=dict)  # name -> content, written before the step


@dataclass
class GateContext:
    gate: Any
    params: Any
    nodes: dict[str, Any]
    transports: dict[str, Any]
    steps: Any
    gate_dir: Path
    work_dir: Path
    progress: Callable[[str], None] = lambda msg: None
    options: dict[str, Any] = field(default_factory=dict)


class Workload:
    name: ClassVar[str] = ""
    Params: ClassVar[type[BaseModel]] = StrictModel
    METRICS: ClassVar[dict[str, str]] = {}

    def validate_against(self, params: Any, nodes: dict[str, Any]) -> list[tuple[tuple, str]]:
        """Cross-checks against the inventory: list of (path inside params, message)."""
        return []

    def plan(self, ctx: GateContext) -> list[PlannedStep]:
        raise NotImplementedError

    def run(self, ctx: GateContext) -> WorkloadResult:
        raise NotImplementedError
