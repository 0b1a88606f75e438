"""What a run would do, without running it: every command each node gets, in order, with the job files.

The node facts come from the same command the runner sends (:func:`harness.execute.facts.facts_argv` over
:data:`harness.execute.facts.FACTS`: one command per node), each gate's steps from its workload's ``plan``,
so the plan and the run cannot drift apart.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from ..config import Config
from ..execute.facts import facts_argv, node_facts
from ..execute.nvmeof import managed_plan
from ..workloads.kit.base import GateContext, PlannedStep


def facts_plan(nodes: list) -> list[PlannedStep]:
    """The node-facts command of a run, one per inventory node (they run in parallel across nodes)."""
    out = []
    for n in nodes:
        facts = node_facts(getattr(n, "engine_python", None))
        out.append(PlannedStep(n.name, "snapshot + provenance, one command: "
                               + ", ".join(f"{f.file} {f.key}" for f in facts), facts_argv(facts)))
    return out


def _facts_lines(nodes: list) -> list[str]:
    """The facts command once for every group of nodes that gets the same one, with what it runs."""
    groups: dict[tuple[str, ...], list[str]] = {}
    facts_of: dict[tuple[str, ...], tuple] = {}
    for n in nodes:
        facts = node_facts(getattr(n, "engine_python", None))
        argv = facts_argv(facts)
        groups.setdefault(argv, []).append(n.name)
        facts_of[argv] = facts
    lines = []
    for argv, names in groups.items():
        lines.append(f"  [{', '.join(names)}] one command; its framed output is split back into each fact's "
                     "stdout, stderr and exit status:")
        lines += [f"      {f.file}: {f.description}: {shlex.join(f.argv)}" for f in facts_of[argv]]
        lines.append(f"    $ {shlex.join(argv)}")
    return lines


def gate_plan(cfg: Config, gate) -> list[PlannedStep]:
    """One gate's steps, from its workload's pure ``plan``."""
    ctx = GateContext(gate=gate, params=cfg.params[gate.id], nodes={n.name: n for n in cfg.gate_nodes(gate)},
                      transports={}, steps=None, gate_dir=Path("."), slurm=cfg.inventory.slurm)
    return cfg.workload(gate)().plan(ctx)


def _arg_pattern(arg: str) -> re.Pattern:
    parts = re.split(r"(<[^<>]+>)", arg)
    return re.compile("".join(".+" if p.startswith("<") and p.endswith(">") else re.escape(p) for p in parts),
                      re.DOTALL)


def _matches(step: PlannedStep, argv: tuple[str, ...]) -> bool:
    return len(step.argv) == len(argv) and all(_arg_pattern(p).fullmatch(a) for p, a in zip(step.argv, argv))


def plan_mismatch(planned: list[PlannedStep], sent: list[tuple[str, ...]]) -> str | None:
    """Pure: None when the commands one node was sent (``sent``, in order) are what its planned steps with an
    argv say, in order: each planned command sent once (a ``repeats`` step once or more in a row), an
    ``optional`` one sent or not, nothing else; else what differs first."""
    steps = [s for s in planned if s.argv]
    i = 0
    for n, argv in enumerate(sent):
        if i > 0 and steps[i - 1].repeats and _matches(steps[i - 1], argv):
            continue
        while i < len(steps) and not _matches(steps[i], argv) and steps[i].optional:
            i += 1
        if i >= len(steps) or not _matches(steps[i], argv):
            want = shlex.join(steps[i].argv) if i < len(steps) else "nothing more"
            return f"command {n + 1} sent was not planned there: {shlex.join(argv)[:300]} (planned: {want[:300]})"
        i += 1
    left = [s for s in steps[i:] if not s.optional]
    if left:
        return f"planned but never sent: {shlex.join(left[0].argv)[:300]} ({left[0].description[:120]})"
    return None


def managed_nvmeof_plan(cfg: Config) -> tuple[list[PlannedStep], list[PlannedStep]]:
    """(before the facts, after the gates): the ``connect: managed`` NVMe-oF connects and disconnects."""
    attach, detach = managed_plan(cfg)
    return ([PlannedStep(n, d, a) for n, d, a in attach], [PlannedStep(n, d, a) for n, d, a in detach])


def _step_lines(step: PlannedStep) -> list[str]:
    out = [f"  [{step.node}] {step.description}"]
    for path, content in step.files.items():
        out.append(f"    file {path}:")
        out += [f"      {line}" for line in content.rstrip().splitlines()]
    if step.argv:
        out.append(f"    $ {shlex.join(step.argv)}")
    return out


def endurance_lines(prices: str | None, nodes: list) -> list[str]:
    """Pure: what a storing gate's endurance prices (its workload's ``ENDURANCE``), from which counters, and the
    drive each node declares (``pool_drive``) for its days to rating, or that none is declared."""
    if not prices:
        return []
    drives = [f"{n.name}: {n.pool_drive.capacity_bytes / 1e12:g} TB, {n.pool_drive.rated_dwpd:g} DWPD over "
              f"{n.pool_drive.warranty_years:g} years" for n in nodes if getattr(n, "pool_drive", None)]
    return [f"  endurance (docs/endurance.md): {prices}; counters: the pool device's /sys/dev/block/MAJ:MIN/stat "
            "(sectors written)",
            "    drive: " + ("; ".join(drives) + " (days to its rating at the measured rate)" if drives else
                             "none declared (inventory pool_drive): bytes per million tokens, no days to rating")]


def plan_text(cfg: Config) -> str:
    """The plan as people read it: the node facts, then every gate's steps with exact argv and job files."""
    lines = [f"suite {cfg.suite.suite.name} v{cfg.suite.suite.version}: {len(cfg.suite.gates)} gate(s), nothing runs",
             "", "every node, before the gates (in parallel across nodes):"]
    attach, detach = managed_nvmeof_plan(cfg)
    if attach:
        lines.append("  NVMe-oF targets with connect: managed, first:")
        lines += [line for s in attach for line in _step_lines(s)]
    lines += _facts_lines(cfg.inventory.nodes)
    for gate in cfg.suite.gates:
        stop = f", stop-loss {gate.stop_loss}" if gate.stop_loss else ""
        lines += ["", f"{gate.id} {gate.title} [{gate.workload}] metric {gate.metric}: pass {gate.pass_}{stop}"
                  + (" (informational)" if gate.informational else "")]
        for step in gate_plan(cfg, gate):
            lines += _step_lines(step)
        lines += endurance_lines(cfg.workload(gate).ENDURANCE, cfg.gate_nodes(gate))
        if gate.stop_loss:
            lines.append(f"  if {gate.metric} {gate.stop_loss}: STOP, later gates SKIPPED")
    if detach:
        lines += ["", "every node, after the gates (also after a failed gate or Ctrl-C):"]
        lines += [line for s in detach for line in _step_lines(s)]
    return "\n".join(lines) + "\n"
