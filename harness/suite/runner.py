"""The run: open nodes, snapshot them, run the gates in order, evaluate, and write the signed bundle.

Everything a run does lands in its run directory first (steps, raw output, verdicts); the bundle is made
from that directory at the end. A gate that cannot run is ERROR; after a STOP the remaining gates are
SKIPPED; a run with any gate not PASS never ends PASS.
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .. import __version__
from ..config import Config
from ..errors import HarnessError
from ..execute.cancel import Cancellation, GateEnded, guard_directory
from ..execute.undo import UndoLog
from ..execute.cancel import write_text as write_gate_file
from ..execute.clock import Clock
from ..execute.facts import collect_node_facts
from ..execute.fanout import fan_out
from ..execute.nvmeof import ManagedTargets, managed_targets
from ..gates.verdict import Outcome, Verdict, evaluate, overall_outcome, skipped
from ..paths import git_commit
from ..redact import redact_line, redact_obj, redact_text, scrub_read, scrub_tree
from ..report.bundle import BundleInfo, key_fingerprint, write_bundle
from ..report.render import bundle_renderer
from ..safeio import dumps_indented
from ..transport import ScopedTransport, Transport, open_transport
from ..transport.steps import StepLog
from ..workloads.kit.base import Evidence, GateContext, WorkloadResult


# After a gate's commands were stopped (timeout, Ctrl-C), how long its workload gets to return before the
# run goes on without it.
STOP_GRACE_S = 30.0


@dataclass
class RunOutcome:
    run_dir: Path
    verdicts: list[Verdict]
    overall: Outcome
    bundle: BundleInfo | None = None
    interrupted: bool = False
    messages: list[str] = field(default_factory=list)
    # what stopped the run: a KeyboardInterrupt (Ctrl-C) or the CLI's subclass for SIGTERM / SIGHUP (``signum``)
    interrupt: KeyboardInterrupt | None = None
    unstopped: list[str] = field(default_factory=list)  # gates whose workload did not stop: no bundle


def _progress_printer(stream=sys.stderr) -> Callable[[str], None]:
    t0 = time.monotonic()

    def progress(msg: str) -> None:
        print(f"[{time.monotonic() - t0:7.1f}s] {msg}", file=stream, flush=True)
    return progress


def _stopped_by(exc: KeyboardInterrupt) -> str:
    """What stopped the run, in words: the signal the CLI turned into a KeyboardInterrupt (its text), or Ctrl-C."""
    return str(exc) or "Ctrl-C"


def new_run_dir(out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    for i in range(100):
        d = out_dir / f"run-{stamp}" if i == 0 else out_dir / f"run-{stamp}-{i}"
        try:
            d.mkdir()
            return d
        except FileExistsError:
            continue
    raise HarnessError(f"cannot create a run directory under {out_dir}")


def _write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # secrets (harness.redact) never reach the run directory's JSON
    path.write_text(redact_text(dumps_indented(obj, indent=1, sort_keys=True, default=str)) + "\n")


class GateTimeoutEvidence(Evidence):
    """A gate stopped at its ``timeout_s``: what was stopped on each node, what the workload saw after, and every
    write into the gate's directory (or a step of it) that was refused because it came after the gate's end."""

    timeout_s: float
    stopped_process_groups: dict[str, Any] = {}
    workload_returned_after_stop: bool = False
    after_stop: dict[str, Any] | None = None
    refused_writes: list[dict[str, Any]] = []


def _stop_gate(scoped: dict[str, ScopedTransport], reason: str) -> dict[str, Any]:
    """Cancel every node's view in parallel: node -> process groups stopped (or the error text)."""
    group = fan_out(scoped, lambda _n, view: view.cancel(reason))
    return {n: (o.value if o.ok else f"stop failed: {o.error}") for n, o in group.items()}


def gate_context(gate, params, nodes: dict[str, Any], scoped: dict[str, ScopedTransport], steps: StepLog,
                 gate_dir: Path, progress: Callable[[str], None], nvmeof=None, http=None,
                 clock: Clock | None = None, slurm=None) -> GateContext:
    """A gate's context as a run makes it: its cancellation (the deadline ``timeout_s`` from now on ``clock``,
    what its waits and requests check) guards its directory and its steps once the gate ended."""
    clock = clock or Clock()
    cancel = Cancellation(clock, timeout_s=gate.timeout_s, what=f"gate {gate.id}")
    guard_directory(gate_dir, cancel)
    return GateContext(gate=gate, params=params, nodes=nodes, transports=scoped,
                       steps=steps.guarded(cancel.guard_write), gate_dir=gate_dir, progress=progress,
                       http=http, nvmeof=nvmeof, clock=clock, cancel=cancel, slurm=slurm)


def wait_interruptibly(done: threading.Event, timeout_s: float | None, step_s: float = 0.2) -> bool:
    """Wait until ``done`` is set (or ``timeout_s`` passed) in short steps, so that Ctrl-C, SIGTERM and SIGHUP
    reach the main thread while it waits. A process-directed signal may be delivered to any thread: one caught
    by a worker thread only sets Python's flag, and a main thread blocked in one long wait never looks at it
    (seen: kvgate sat out the 300 s of a gate after SIGINT). Between steps it does. An Event, not Thread.join:
    a KeyboardInterrupt inside Thread.join marks a running thread stopped (CPython 3.11's bpo-45274 clean-up)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while not done.is_set():
        left = step_s if deadline is None else min(step_s, deadline - time.monotonic())
        if left <= 0:
            return False
        done.wait(left)
    return True


def run_gate_workload(workload, ctx: GateContext, scoped: dict[str, ScopedTransport],
                      progress: Callable[[str], None], still_running: list[str] | None = None) -> WorkloadResult:
    """Run one gate's workload, bounded by the gate's ``timeout_s``, and end the gate.

    The workload runs in a worker thread. Past the timeout (or on Ctrl-C, SIGTERM, SIGHUP) the gate's
    cancellation (``ctx.cancel``) is set first, so its waits, polls and HTTP requests end and it writes nothing
    more into its gate (refused writes are recorded); then the process group of every command it still runs is
    killed on every node (local and SSH) and its views start nothing more; then the worker is joined. A gate
    whose workload does not return within STOP_GRACE_S after that is named in ``still_running``: the run does
    not start another gate beside it. Whatever happened, the gate has ended for writes when this returns.
    A timed-out gate is ERROR "timed out after N s"; a bug in a workload is ERROR with the trace on disk.
    """
    gate = ctx.gate
    box: dict[str, Any] = {}

    finished = threading.Event()  # set when the workload returned (or raised), whatever the thread's state says

    def work() -> None:
        try:
            try:
                box["result"] = workload.run(ctx)
            except HarnessError as exc:
                box["result"] = WorkloadResult(error=str(exc))
            except Exception as exc:  # noqa: BLE001 - a bug in a workload is an ERROR verdict, with the trace on disk
                try:
                    write_gate_file(ctx.gate_dir / "traceback.txt", traceback.format_exc())
                except GateEnded:  # recorded by the gate's token; the error below still says what happened
                    pass
                box["result"] = WorkloadResult(error=f"internal error: {type(exc).__name__}: {exc}")
            box["cut_short"] = ctx.cancel.is_set()  # it returned because its gate was stopped (deadline reached)
        finally:
            finished.set()

    def join(grace_s: float) -> bool:
        if not wait_interruptibly(finished, grace_s) and still_running is not None:
            still_running.append(gate.id)
        return finished.is_set()

    worker = threading.Thread(target=work, name=f"gate-{gate.id}", daemon=True)
    worker.start()
    try:
        wait_interruptibly(finished, gate.timeout_s)
    except KeyboardInterrupt as exc:
        ctx.cancel.cancel(f"interrupted ({_stopped_by(exc)})")
        _stop_gate(scoped, f"gate {gate.id} interrupted ({_stopped_by(exc)})")
        join(STOP_GRACE_S)
        raise
    if finished.is_set() and not box.get("cut_short"):
        ctx.cancel.cancel("the gate ended")  # a thread the workload left behind writes nothing more here
        return box.get("result") or WorkloadResult(error="internal error: the workload ended without a result")
    reason = f"timed out after {gate.timeout_s:g} s"
    ctx.cancel.cancel(f"gate {gate.id} {reason}")
    progress(f"{gate.id}: {reason}; stopping its requests and its commands on {', '.join(scoped)}")
    stopped = _stop_gate(scoped, f"gate {gate.id} {reason}")
    returned = join(STOP_GRACE_S)
    return _timeout_result(gate.timeout_s, reason, stopped, returned, list(ctx.cancel.refused_writes),
                           box.get("result"))


def _timeout_result(timeout_s: float, reason: str, stopped: dict[str, Any], returned: bool,
                    refused_writes: list[dict[str, Any]], late: WorkloadResult | None) -> WorkloadResult:
    """A timed-out gate's ERROR result: what was stopped on each node, whether the workload returned after that,
    what it saw then (``late``) and the writes refused after the gate's end."""
    evidence = GateTimeoutEvidence(timeout_s=timeout_s, stopped_process_groups=stopped,
                                   workload_returned_after_stop=returned, refused_writes=refused_writes)
    if late is not None:  # what the workload saw once its commands were killed; its metrics do not count
        evidence.after_stop = {"error": late.error, "evidence": late.evidence_dict()}
    detail = ", ".join(f"{n}: {k}" for n, k in sorted(stopped.items()))
    error = f"{reason}; process groups stopped per node: {detail}"
    if not returned:
        error += f"; the workload did not return within {STOP_GRACE_S:g} s after that"
    return WorkloadResult({}, evidence, error=error)


def undo_after_gate(undo: UndoLog, result: WorkloadResult, transports: dict[str, Transport], steps: StepLog,
                    progress: Callable[[str], None]) -> WorkloadResult:
    """Run the inverses a gate left pending (its workload timed out, raised or was interrupted before it put its
    nodes back). One that fails makes the gate an ERROR naming it: a node left changed is never silent."""
    failed = [e for e in undo.run_pending(transports, steps, progress) if not e.ok]
    if not failed:
        return result
    what = "; ".join(f"{e.node}: {e.name}: {e.error}" for e in failed)
    return dataclasses.replace(result, error="; ".join(
        x for x in (result.error, f"a change to a node was NOT undone: {what}") if x))


@dataclass
class _SuiteRun:
    """One run of a suite: its directory, its nodes' connections, the gates' verdicts so far and what must be
    undone, stopped and closed whatever ends it. :func:`run_suite` drives it: connect, facts, gates, teardown,
    summary, bundle."""

    config: Config
    run_dir: Path
    progress: Callable[[str], None]
    steps: StepLog
    managed: ManagedTargets
    undo: UndoLog
    opened: dict[str, Transport]
    views: list[ScopedTransport] = field(default_factory=list)  # every gate's view of its nodes, stopped at the end
    node_errors: dict[str, str] = field(default_factory=dict)
    verdicts: list[Verdict] = field(default_factory=list)
    # each verdict as a dict, made once (a gate's evidence at a thousand nodes is megabytes of series):
    # verdict.json, verdicts.json and the signed predicate hold the same one; only read after this
    as_dict: dict[int, dict[str, Any]] = field(default_factory=dict)
    interrupted: bool = False
    interrupt: KeyboardInterrupt | None = None
    still_running: list[str] = field(default_factory=list)  # gates whose workload did not return once stopped

    def connect(self, trust_new_hosts: bool, known_hosts_path: str | None) -> None:
        """Every node connected at once (a dead node costs one connect timeout, not one per node before it); each
        keeps this one connection for the whole run: facts, gates, file transfers and stops."""
        to_open = {n.name: n for n in self.config.inventory.nodes if n.name not in self.opened}
        if to_open:
            self.progress(f"connecting to {', '.join(to_open)} (in parallel)")
        connected = fan_out(to_open, lambda _name, node: open_transport(
            node, trust_new_hosts=trust_new_hosts, known_hosts_path=known_hosts_path))
        for name in to_open:  # inventory order, whatever order the connections completed in
            o = connected[name]
            if o.ok:
                self.opened[name] = o.value
            else:
                self.node_errors[name] = o.error or "not connected"
                self.progress(f"ERROR {self.node_errors[name]}")
        _write_json(self.run_dir / "nodes" / "connect-errors.json", self.node_errors)
        self.managed.attach(managed_targets(self.config), self.opened)

    def facts(self) -> None:
        """snapshot.json (kernel, CPU, memory, fio, block devices, NUMA, NICs) and provenance.json (GPUs, NVMe,
        NVMe-oF, vLLM/LMCache versions) of every connected node: one command list, also what `kvgate plan` prints."""
        def one(name: str, tr: Transport) -> None:
            engine_python = getattr(self.config.inventory.node(name), "engine_python", None)
            for file, data in collect_node_facts(tr, self.steps, engine_python).items():
                _write_json(self.run_dir / "nodes" / name / f"{file}.json", data)

        if self.opened:
            self.progress(f"snapshot of {', '.join(self.opened)} (in parallel)")
            for name, err in fan_out(self.opened, one).failed.items():
                self.progress(f"snapshot of {name} failed: {err}")

    def gates(self) -> None:
        """Every gate in order; after a STOP, an interrupt or a workload that did not stop, the rest skipped."""
        stop_at: str | None = None
        for gate in self.config.suite.gates:
            wl_cls = self.config.workload(gate)
            unit = wl_cls.metric_unit(gate.metric)
            if stop_at:
                self.verdicts.append(skipped(gate, f"skipped: stop-loss hit at {stop_at}", unit))
                continue
            verdict = self.gate(gate, wl_cls, unit)
            if self.interrupted:
                stop_at = f"{gate.id} (interrupted)"
            elif self.still_running:
                # Its workload may still send requests to a shared engine or run on its nodes: no gate runs
                # beside it, and no bundle is written around it.
                stop_at = f"{gate.id} (its workload did not stop)"
            elif verdict.outcome is Outcome.STOP:
                stop_at = gate.id

    def gate(self, gate, wl_cls, unit: str) -> Verdict:
        """One gate: its workload on its nodes' scoped views, its undo, its verdict (redacted) on disk."""
        gate_dir = self.run_dir / "gates" / gate.id
        gate_dir.mkdir(parents=True, exist_ok=True)
        nodes = {n.name: n for n in self.config.gate_nodes(gate)}
        missing = [n for n in nodes if n not in self.opened]
        t0 = time.time()
        self.progress(f"{gate.id} {gate.title}: workload {gate.workload} on {', '.join(nodes)}")
        if missing:
            result = WorkloadResult(error="node(s) unreachable: " + "; ".join(
                f"{n}: {self.node_errors.get(n, 'not connected')}" for n in missing))
        else:
            scoped = {n: ScopedTransport(self.opened[n]) for n in nodes}
            self.views.extend(scoped.values())
            ctx = gate_context(gate, self.config.params[gate.id], nodes, scoped, self.steps, gate_dir, self.progress,
                               self.managed, slurm=self.config.inventory.slurm)
            ctx.undo = self.undo
            try:
                result = run_gate_workload(wl_cls(), ctx, scoped, self.progress, self.still_running)
            except KeyboardInterrupt as exc:
                self.interrupted, self.interrupt = True, exc
                result = WorkloadResult(error=f"interrupted by the operator ({_stopped_by(exc)})")
            result = undo_after_gate(self.undo, result, self.opened, self.steps, self.progress)
        verdict = evaluate(gate, result, unit, wl_cls.metric_unit)
        # the verdict goes into verdicts.json and the signed predicate: its texts and evidence redacted
        verdict = dataclasses.replace(verdict, reason=redact_text(verdict.reason),
                                      evidence=redact_obj(verdict.evidence))
        _write_json(gate_dir / "result.json", {**result.as_dict(), "started_unix_s": t0,
                                               "finished_unix_s": time.time()})
        self.as_dict[id(verdict)] = verdict.to_dict()
        _write_json(gate_dir / "verdict.json", self.as_dict[id(verdict)])
        self.verdicts.append(verdict)
        self.progress(f"{gate.id}: {verdict.outcome.value}: {verdict.reason}")
        return verdict

    def teardown(self) -> None:
        """Whatever ended the run: commands still running stopped, pending undos run (Ctrl-C between gates, or a
        second one during an undo), managed targets disconnected, connections closed."""
        for view in self.views:
            try:
                if view.abort():
                    self.progress(f"stopped the commands still running on {view.name}")
            except Exception:  # noqa: BLE001
                pass
        self.undo.run_pending(self.opened, self.steps, self.progress)
        self.managed.detach(self.opened)
        for tr in self.opened.values():
            try:
                if tr.abort():
                    self.progress(f"stopped the commands still running on {tr.name}")
                tr.close()
            except Exception:  # noqa: BLE001
                pass

    def summary(self, started: float, finished: float) -> tuple[Outcome, list[dict[str, Any]]]:
        """verdicts.json (gates never reached skipped as interrupted): the overall outcome and the verdicts."""
        suite = self.config.suite
        done_ids = {v.gate_id for v in self.verdicts}
        for gate in suite.gates:
            if gate.id not in done_ids:
                self.verdicts.append(skipped(gate, "skipped: run interrupted",
                                             self.config.workload(gate).metric_unit(gate.metric)))
        overall = overall_outcome(self.verdicts)
        verdict_dicts = [self.as_dict.get(id(v)) or v.to_dict() for v in self.verdicts]
        _write_json(self.run_dir / "verdicts.json", {
            "suite": suite.suite.model_dump(), "overall": overall.value, "verdicts": verdict_dicts,
            "run": {"started_unix_s": started, "finished_unix_s": finished, "interrupted": self.interrupted,
                    "node_errors": self.node_errors},
        })
        return overall, verdict_dicts


def _unsigned(run: _SuiteRun, outcome: RunOutcome) -> bool:
    """An interrupted run, or one whose workload did not stop, keeps its results and writes no bundle: why, in
    ``outcome.messages``. True when no bundle is to be written."""
    if run.interrupted:
        outcome.messages.append(f"interrupted ({_stopped_by(run.interrupt) if run.interrupt else 'Ctrl-C'}): "
                                f"partial results kept in {run.run_dir}; no bundle was written")
        return True
    if run.still_running:
        outcome.unstopped = list(run.still_running)
        outcome.messages.append(f"the workload of {', '.join(run.still_running)} did not stop within "
                                f"{STOP_GRACE_S:g} s after its gate ended: partial results kept in {run.run_dir}; "
                                "no bundle was written")
        return True
    return False


def _run_predicate(config: Config, overall: Outcome, verdict_dicts: list[dict[str, Any]], started: float,
                   finished: float, key_kind: str, pub: Any) -> dict[str, Any]:
    """The statement's predicate of a run: this kvgate, the suite, the verdicts, the run's times, the signing key."""
    return {
        "kvgate": {"version": __version__, "commit": git_commit()},
        "suite": config.suite.suite.model_dump(),
        "overall": overall.value,
        "verdicts": verdict_dicts,
        "run": {"started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
                "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(finished)),
                "duration_s": round(finished - started, 3)},
        "signing_key": {"kind": key_kind, "fingerprint": key_fingerprint(pub)},
    }


def run_suite(config: Config, out_dir: Path, private_key, *, key_kind: str = "operator",
              trust_new_hosts: bool = False, known_hosts_path: str | None = None,
              progress: Callable[[str], None] | None = None,
              transports: dict[str, Transport] | None = None, make_tar: bool = True) -> RunOutcome:
    """Run every gate of the suite and write the bundle under ``out_dir``."""
    shown = progress or _progress_printer()

    def progress(msg: str) -> None:  # a CI log keeps what kvgate prints: no secret in it either
        shown(redact_line(msg))
    run_dir = new_run_dir(Path(out_dir))
    started = time.time()
    progress(f"run directory {run_dir}")
    cfg_dir = run_dir / "config"
    cfg_dir.mkdir()
    shutil.copyfile(config.inventory_path, cfg_dir / "inventory.yaml")
    shutil.copyfile(config.gates_path, cfg_dir / "gates.yaml")
    steps = StepLog(run_dir)
    # managed NVMe-oF targets: connected before the facts (the snapshot shows them), disconnected in teardown
    # whatever happened (a failed gate, Ctrl-C); the inverses of the changes gates make to nodes (faults) run
    # whatever ends a gate (harness.execute.undo)
    run = _SuiteRun(config, run_dir, progress, steps, ManagedTargets(steps, run_dir, progress),
                    UndoLog(run_dir / "undo.json"), dict(transports or {}))
    # The last line of defence: every secret value known by the end (some were learnt after the files that hold
    # them were written) is redacted in every file of the run directory, bundle or not: by the bundle writer in
    # the pass that hashes each file (one read, not two), else below (no bundle, or it was not written).
    try:
        try:
            run.connect(trust_new_hosts, known_hosts_path)
            run.facts()
            run.gates()
        except KeyboardInterrupt as exc:
            run.interrupted, run.interrupt = True, exc
            progress(f"stopping the run: {_stopped_by(exc)}")
        finally:
            run.teardown()
        finished = time.time()
        overall, verdict_dicts = run.summary(started, finished)
        outcome = RunOutcome(run_dir, run.verdicts, overall, interrupted=run.interrupted, interrupt=run.interrupt)
        if _unsigned(run, outcome):
            return outcome
        predicate = _run_predicate(config, overall, verdict_dicts, started, finished, key_kind,
                                   private_key.public_key())
        progress("signing the bundle")
        # The run directory becomes the bundle (renamed, not copied); if signing fails it is renamed back.
        try:
            outcome.bundle = write_bundle(run_dir, Path(out_dir), private_key, predicate, make_tar=make_tar,
                                          render=bundle_renderer(predicate), move=True, scrub=scrub_read)
        except OSError as exc:
            raise HarnessError(f"the bundle was not written ({exc}); no half-written bundle was left, and the run "
                              f"directory with every result is kept at {run_dir}") from None
        outcome.run_dir = outcome.bundle.path
        return outcome
    finally:
        if run_dir.exists():  # the bundle is the run directory renamed: gone from here once written
            scrub_tree(run_dir)
