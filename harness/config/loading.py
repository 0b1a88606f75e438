"""Loading an inventory and a gate suite: every error in both files at once, each mapped to file:line.

The workload registry is handed in (``load_config(..., workloads=WORKLOADS)``), so configuration does not
import the workloads it validates: a registry maps a workload name to a class with ``Params`` (a pydantic
model for ``params:``), ``METRICS`` (metric -> unit) and ``validate_against(params, nodes)``; optionally
``metric_issue(params, metric)``, why a metric it has is not one these params produce (or None).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from ..errors import ConfigError, ConfigIssue
from ..stats import min_trials_for_interval
from ..units import parse_quantity, unit_info
from .models import Gate, GateSuite, Inventory, Node
from .yamlload import LineIndex, load_yaml, validate


class Config:
    """A validated inventory + gate suite, with the parsed params of every gate."""

    def __init__(self, inventory: Inventory, suite: GateSuite, params: dict[str, Any],
                 inventory_path: Path, gates_path: Path, workloads: Mapping[str, Any]):
        self.inventory = inventory
        self.suite = suite
        self.params = params  # gate id -> validated params model
        self.inventory_path = inventory_path
        self.gates_path = gates_path
        self.workloads = workloads  # the registry the suite was validated against

    def workload(self, gate: Gate) -> Any:
        """The workload class of a gate."""
        return self.workloads[gate.workload]

    def gate_nodes(self, gate: Gate) -> list[Node]:
        if gate.nodes:
            return [self.inventory.node(n) for n in gate.nodes]  # type: ignore[misc]
        return list(self.inventory.nodes)


def load_inventory(path: str | Path) -> Inventory:
    data, index = load_yaml(path)
    inv = validate(Inventory, data, index)
    issues, first = [], {}
    for i, node in enumerate(inv.nodes):
        if node.name in first:
            issues.append(index.issue(("nodes", i, "name"),
                                      f"duplicate node name {node.name!r} (first at nodes[{first[node.name]}])"))
        first.setdefault(node.name, i)
    if issues:
        raise ConfigError(issues)
    return _local_paths_from(inv, Path(path).absolute().parent)


def _local_paths_from(inv: Inventory, base: Path) -> Inventory:
    """A local node's relative ``engine_python`` (with a ``/``; a bare name is looked up on PATH) is relative
    to the inventory file, so an inventory shipped beside an engine environment works from any directory.
    Not resolved through symbolic links: a venv's interpreter is one, and it must stay the venv's."""
    nodes = []
    for node in inv.nodes:
        ep = node.engine_python
        if node.transport == "local" and ep and "/" in ep and not ep.startswith("/"):
            node = node.model_copy(update={"engine_python": os.path.normpath(base / ep)})
        nodes.append(node)
    return inv.model_copy(update={"nodes": nodes})


def _check_gates(suite: GateSuite, index: LineIndex, inventory: Inventory | None,
                 params_out: dict[str, Any], workloads: Mapping[str, Any], check_files: bool = False,
                 trials_rule: bool = True) -> list[ConfigIssue]:
    issues: list[ConfigIssue] = []
    seen: dict[str, int] = {}
    for i, gate in enumerate(suite.gates):
        at = ("gates", i)
        if gate.id in seen:
            issues.append(index.issue(at + ("id",), f"duplicate gate id {gate.id!r} (first at gates[{seen[gate.id]}])"))
        seen.setdefault(gate.id, i)
        wl = workloads.get(gate.workload)
        if wl is None:
            issues.append(index.issue(at + ("workload",),
                                      f"unknown workload {gate.workload!r} (expected one of {', '.join(sorted(workloads))})"))
            continue
        unit = wl.metric_unit(gate.metric)
        if unit is None:
            issues.append(index.issue(at + ("metric",), f"workload {gate.workload!r} has no metric {gate.metric!r} "
                                      f"(expected one of {', '.join(sorted(wl.METRICS))})"))
        else:
            issues.extend(_dimension_issues(gate, unit, index, at))
        try:
            params = validate(wl.Params, gate.params, index, prefix=at + ("params",))
        except ConfigError as exc:
            issues.extend(exc.issues)
            continue
        params_out[gate.id] = params
        mrf = getattr(params, "min_read_fraction", None)
        # (a bundle's own suite re-read, trials_rule False, is judged as it was signed: this is a rule for new runs)
        if trials_rule and isinstance(mrf, (int, float)) and mrf < MIN_READ_FRACTION and not gate.informational:
            issues.append(index.issue(at + ("params", "min_read_fraction"), (
                f"{mrf} is below {MIN_READ_FRACTION}: the tier's hits would not be proven reads of the pool's device "
                f"(the node's memory could serve them); make the tier cold instead (pool_device: {{kind: loop}}, the "
                f"engine profile's cold_regime), or mark the gate informational: true")))
        file_issues = getattr(wl(), "file_issues", None)
        if check_files and file_issues is not None:
            issues.extend(index.issue(at + ("params",) + tuple(path), msg) for path, msg in file_issues(params))
        metric_issue = getattr(wl, "metric_issue", None)  # a metric the workload has, but not in this mode
        why = metric_issue(params, gate.metric) if metric_issue is not None and unit is not None else None
        if why:
            issues.append(index.issue(at + ("metric",), why))
        if trials_rule and unit is not None and not gate.informational:
            issues.extend(_trials_issues(wl, params, gate.metric, index, at))
        if inventory is not None:
            issues.extend(_inventory_issues(gate, wl, params, inventory, index, at))
    return issues


def _dimension_issues(gate: Gate, unit: str, index: LineIndex, at: tuple) -> list[ConfigIssue]:
    """The gate's thresholds (pass, stop_loss) and reference that are not quantities of its metric's dimension."""
    issues: list[ConfigIssue] = []
    dim, _ = unit_info(unit)
    for key, thr in (("pass", gate.pass_), ("stop_loss", gate.stop_loss)):
        if thr is not None and thr.dimension != dim:
            issues.append(index.issue(at + (key,), f"{thr} is a {thr.dimension} but metric {gate.metric} "
                                      f"is a {dim} (expected a threshold in e.g. {unit})"))
    if gate.reference is not None:
        ref = parse_quantity(gate.reference.value)
        if ref.dimension != dim:
            issues.append(index.issue(at + ("reference", "value"), f"reference {ref} is a {ref.dimension} but "
                                      f"metric {gate.metric} is a {dim} (expected e.g. {unit})"))
    return issues


def _inventory_issues(gate: Gate, wl: Any, params: Any, inventory: Inventory, index: LineIndex,
                      at: tuple) -> list[ConfigIssue]:
    """The gate against the inventory: nodes it names that are not there, a slurm launcher without a ``slurm:``
    block, and what the workload's ``validate_against`` finds wrong with its params on its nodes."""
    issues: list[ConfigIssue] = []
    nodes = []
    for j, n in enumerate(gate.nodes or []):
        node = inventory.node(n)
        if node is None:
            issues.append(index.issue(at + ("nodes", j), f"node {n!r} is not in the inventory "
                                      f"(expected one of {', '.join(x.name for x in inventory.nodes)})"))
        else:
            nodes.append(node)
    if not gate.nodes:
        nodes = list(inventory.nodes)
    if getattr(params, "launcher", None) == "slurm" and inventory.slurm is None:
        issues.append(index.issue(at + ("params", "launcher"), "launcher slurm needs a `slurm:` block "
                                  "in the inventory (partition, job_dir, ...; docs/launchers.md)"))
    for path, msg in wl().validate_against(params, {n.name: n for n in nodes}):
        issues.append(index.issue(at + ("params",) + tuple(path), msg))
    return issues


# The least share of the KV a gate's tier hits claim that the pool's device must have read: below it a gate could
# credit the node's memory (an engine's RAM level, the page cache) to the tier. Only an informational gate (one
# that reports, never decides) may ask for less.
MIN_READ_FRACTION = 0.5


def _trials_issues(wl: Any, params: Any, metric: str, index: LineIndex, at: tuple) -> list[ConfigIssue]:
    """A gate judged on an interval over trials (the workload's ``interval_trials(params, metric)``: the trials it
    asks for, None when the metric is not judged on one) whose trials can never give a conclusive PASS: fewer than
    a 95 % interval for the median needs (harness.stats.min_trials_for_interval)."""
    interval_trials = getattr(wl, "interval_trials", None)
    n = interval_trials(params, metric) if interval_trials is not None else None
    need = min_trials_for_interval()
    if n is None or n >= need:
        return []
    return [index.issue(at + ("params", "trials"), f"trials {n} can never give a conclusive PASS: a 95 % interval "
                        f"for the median of {metric} needs at least {need} trials (raise trials, or mark the gate "
                        "informational: true, which reports the value and never decides)")]


def load_config(inventory_path: str | Path, gates_path: str | Path, workloads: Mapping[str, Any],
                check_files: bool = False, trials_rule: bool = True) -> Config:
    """Load and cross-check both files against the workload registry ``workloads`` (name -> workload class);
    raise ConfigError listing every issue in both. ``check_files``: also every control-host file a gate names (a
    trace, a model config) must be there, a regular file, and parse (``kvgate validate`` and ``run``; a bundle's
    suite re-loaded elsewhere need not have them). ``trials_rule`` False: a bundle's own suite re-read to re-judge
    it (a gate of an older kvgate with too few trials still loads; its verdict then says it has no interval)."""
    issues: list[ConfigIssue] = []
    inventory = suite = None
    try:
        inventory = load_inventory(inventory_path)
    except ConfigError as exc:
        issues.extend(exc.issues)
    params: dict[str, Any] = {}
    try:
        data, index = load_yaml(gates_path)
        suite = validate(GateSuite, data, index)
        issues.extend(_check_gates(suite, index, inventory, params, workloads, check_files, trials_rule))
    except ConfigError as exc:
        issues.extend(exc.issues)
    if issues:
        raise ConfigError(sorted(issues, key=lambda i: (i.file != str(inventory_path), i.file, i.line or 0)))
    assert inventory is not None and suite is not None
    return Config(inventory, suite, params, Path(inventory_path), Path(gates_path), workloads)
