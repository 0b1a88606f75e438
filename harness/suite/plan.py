"""What a run would do, without running it: every command each node gets, in order, with the job files.

The node facts come from the same list the runner sends (:data:`harness.execute.facts.FACTS`), each gate's
steps from its workload's ``plan``, so the plan and the run cannot drift apart.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from ..config import Config
from ..execute.facts import node_facts
from ..workloads.base import GateContext, PlannedStep


def facts_plan(nodes: list) -> list[PlannedStep]:
    """The node-facts commands of a run, for every inventory node (they run in parallel across nodes)."""
    return [PlannedStep(n.name, f"{f.file}: {f.description}", f.argv) for n in nodes
            for f in node_facts(getattr(n, "engine_python", None))]


def gate_plan(cfg: Config, gate) -> list[PlannedStep]:
    """One gate's steps, from its workload's pure ``plan``."""
    ctx = GateContext(gate=gate, params=cfg.params[gate.id], nodes={n.name: n for n in cfg.gate_nodes(gate)},
                      transports={}, steps=None, gate_dir=Path("."))
    return cfg.workload(gate)().plan(ctx)


def _step_lines(step: PlannedStep) -> list[str]:
    out = [f"  [{step.node}] {step.description}"]
    for path, content in step.files.items():
        out.append(f"    file {path}:")
        out += [f"      {line}" for line in content.rstrip().splitlines()]
    if step.argv:
        out.append(f"    $ {shlex.join(step.argv)}")
    return out


def plan_text(cfg: Config) -> str:
    """The plan as people read it: the node facts, then every gate's steps with exact argv and job files."""
    lines = [f"suite {cfg.suite.suite.name} v{cfg.suite.suite.version}: {len(cfg.suite.gates)} gate(s), nothing runs",
             "", "every node, before the gates (in parallel across nodes):"]
    lines += [line for s in facts_plan(cfg.inventory.nodes) for line in _step_lines(s)]
    for gate in cfg.suite.gates:
        stop = f", stop-loss {gate.stop_loss}" if gate.stop_loss else ""
        lines += ["", f"{gate.id} {gate.title} [{gate.workload}] metric {gate.metric}: pass {gate.pass_}{stop}"
                  + (" (informational)" if gate.informational else "")]
        for step in gate_plan(cfg, gate):
            lines += _step_lines(step)
        if gate.stop_loss:
            lines.append(f"  if {gate.metric} {gate.stop_loss}: STOP, later gates SKIPPED")
    return "\n".join(lines) + "\n"
