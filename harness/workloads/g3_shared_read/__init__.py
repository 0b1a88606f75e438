"""G3: N nodes read back one shared KV copy at once, through one port; how close to its line rate?

The KV copy is a file set laid out as an LMCache fs:// pool would hold it (one file per chunk, named
`<fmt>@<model>@<world_size>@<worker>@<hash>.data`, each a 28-byte metadata header plus
chunk_tokens x kv_bytes_per_token bytes), created once in the shared pool by one node. Every reader node
reads the whole copy cold (page cache dropped, recorded; O_DIRECT where the mount allows, recorded),
started together with a measured skew, and reports a per-interval series. The aggregate is taken over the
time-aligned window in which all nodes were reading.

Isolation (``writer:``): the same readers read the copy twice, alone and then while one further node writes to
the shared store through the same port for the whole of their read (the reader program in write mode, its
bytes counted per interval); the gate reports both aggregates and the readers' loss (docs/g3.md, "Isolation").
"""

from __future__ import annotations

import json
import posixpath
import tempfile
import time
from pathlib import Path
from typing import Any

from ...errors import HarnessError, WorkloadError
from ..kit.rederive import one_step_output
from ...parsers.g3series import port_rate
from ...safeio import read_text
from ...execute.clock import CLOCK_SESSION_ARGV, applied_offset_s, measure_clock_offsets
from ...execute.fanout import FailurePolicy, GroupResult, LaunchSpec, NodeOutcome, SynchronizedLaunch, fan_out
from ...node import program_path
from ...parsers.g3series import NodeSeries, PortRate, cross_check_port_rate
from ..kit.base import (DROP_CACHES_ARGV, CacheDrop, GateContext, PlannedStep, Workload, WorkloadResult, drop_caches,
                        register_workload, write_summary, write_gate_file)
from .evaluate import (PROCESS_KEYS, SELF_REPORTED, STREAM_ERRORS, evaluate_g3, evaluate_isolation, g3_validity,
                       parse_stream, reevaluate_g3)
from .params import (ARMED_MARKER, G3Aggregate, G3Bounds, G3Evidence, G3Isolation, G3Launch, G3NodeRecord, G3Params,
                     G3Pool, G3Process, G3Writer, G3WriterRecord, LMCACHE_HEADER_BYTES, MANIFEST, WITH_WRITER,
                     chunk_file_names, manifest_for)
from .params import _node_dir, _pool_dir, _reader_spec, _writer_spec, _writes_dir  # the package's own
from .slurm import SlurmLaunch


__all__ = ["G3SharedRead", "rederive", "ARMED_MARKER", "G3Aggregate", "G3Bounds", "G3Evidence", "G3Isolation",
           "G3Launch", "G3NodeRecord", "G3Params", "G3Pool", "G3Process", "G3Writer", "G3WriterRecord",
           "LMCACHE_HEADER_BYTES", "MANIFEST", "WITH_WRITER", "chunk_file_names", "manifest_for", "PROCESS_KEYS",
           "SELF_REPORTED", "STREAM_ERRORS", "evaluate_g3", "evaluate_isolation", "g3_validity", "parse_stream",
           "reevaluate_g3"]


def rederive(gate_dir: Path, result: dict[str, Any], params: Any, ctx: dict[str, Any]):
    """G3 from every reader's raw stream (``nodes/<node>/reader.jsonl``; with a writer also
    ``reader-with-writer.jsonl`` and ``nodes/<writer>/writer.jsonl``) with the bounds of the bundle's
    config/gates.yaml, the port's declared rate from its config/inventory.yaml and its measured rate from the
    run's port-speed and port-qdisc step outputs (else as the evidence records them), through the workload's
    own pure functions (harness.workloads.g3_shared_read.reevaluate_g3). A missing or empty raw stream of a
    reader the run says read is an error, never the signed figure."""
    ev = result.get("evidence") or {}
    port_node, nic, _ = G3SharedRead()._roles(params, ctx["nodes"])
    declared = next(n.line_rate_gbit_s for n in ctx["nodes"][port_node].nics if n.name == nic)
    steps_dir = Path(ctx["bundle_dir"]) / "steps"
    speed, qdisc = (one_step_output(steps_dir, port_node, n) for n in ("port-speed", "port-qdisc"))
    recorded = ev.get("port_rate") if isinstance(ev.get("port_rate"), dict) else {}
    if speed is not None or qdisc is not None:
        port = cross_check_port_rate(declared, speed, qdisc, params.port_rate_tolerance)
    else:
        port = port_rate(declared, recorded.get("sysfs_speed_gbit_s"), recorded.get("tbf_rate_gbit_s"),
                         params.port_rate_tolerance)
    iso = ev.get("isolation") if isinstance(ev.get("isolation"), dict) else None
    wanted = [f"nodes/{n}/reader.jsonl" for n in ev.get("readers") or []]
    if iso is not None:
        wanted += [f"nodes/{n}/reader{WITH_WRITER}.jsonl" for n in iso.get("nodes") or {}]
        wanted.append(f"nodes/{iso.get('writer')}/writer.jsonl")
    raw: dict[str, str | None] = {}
    for rel in wanted:
        path = gate_dir / rel
        raw[rel] = read_text(path, max_bytes=1 << 30, what="a G3 node's raw stream", follow_symlinks=False,
                             display_name=f"gates/{gate_dir.name}/{rel}") if path.is_file() else None
    again = reevaluate_g3(ev, raw, params, port, gate_dir.name)
    if again.error:
        raise HarnessError(f"{gate_dir.name}: re-derived from the raw streams: {again.error}")
    return again.metrics, again.invalid_reason


@register_workload("g3-shared-read")
class G3SharedRead(SlurmLaunch, Workload):
    rederive = staticmethod(rederive)  # the gate re-judged from the bundle's raw files
    Params = G3Params
    EvidenceModel = G3Evidence
    METRICS = {
        "aggregate_read_gb_s": "GB/s",
        "nic_ceiling_ratio": "ratio",
        "fairness_min_max": "ratio",
        "nodes_completed": "count",
        "start_skew_s": "s",
        # isolation (writer:) only
        "readers_loss": "ratio",
        "aggregate_read_gb_s_with_writer": "GB/s",
        "writer_write_gb_s": "GB/s",
        "nodes_completed_with_writer": "count",
    }

    # ---- config-time checks
    def _roles(self, p: G3Params, nodes: dict) -> tuple[str, str, list[str]]:
        port_node, _, nic = p.port.partition(":")
        writer = p.writer.node if p.writer else None
        readers = list(p.readers) if p.readers else [n for n in nodes if n not in (port_node, writer)]
        return port_node, nic, readers

    def validate_against(self, params, nodes):
        issues = []
        port_node, nic, readers = self._roles(params, nodes)
        node = nodes.get(port_node)
        if node is None:
            issues.append((("port",), f"port node {port_node!r} is not among the gate's nodes "
                           f"(expected one of {', '.join(nodes)})"))
        elif not any(n.name == nic for n in node.nics):
            issues.append((("port",), f"node {port_node!r} declares no NIC {nic!r} "
                           f"(declared: {', '.join(n.name for n in node.nics) or 'none'})"))
        if not readers:
            issues.append((("readers",), "no reader nodes (the gate's nodes minus the port node are empty)"))
        for i, r in enumerate(readers):
            rn = nodes.get(r)
            if rn is None:
                issues.append((("readers", i), f"reader {r!r} is not among the gate's nodes"))
                continue
            t = rn.target(params.pool_target)
            if t is None or t.kind != "directory":
                issues.append((("pool_target",), f"node {r!r} has no directory target {params.pool_target!r}"))
        if params.stall_timeout_s < 20 * params.interval_s:
            issues.append((("stall_timeout_s",), f"must be at least 20 x interval_s ({20 * params.interval_s:g} s): "
                           "a reader is silent between samples"))
        if params.create_on and params.create_on not in readers:
            issues.append((("create_on",), f"create_on {params.create_on!r} is not a reader"))
        w = params.writer
        if w is not None:
            wn = nodes.get(w.node)
            if params.launcher != "ssh":
                issues.append((("writer",), f"a writer (isolation) runs with launcher ssh only, not {params.launcher}"))
            if wn is None:
                issues.append((("writer", "node"), f"writer {w.node!r} is not among the gate's nodes "
                               f"(expected one of {', '.join(nodes)})"))
            elif w.node == port_node:
                issues.append((("writer", "node"), f"writer {w.node!r} is the port's node: it must write through "
                               "the port, from another node"))
            elif w.node in readers:
                issues.append((("writer", "node"), f"writer {w.node!r} is also a reader: the writer is a further node"))
            else:
                t = wn.target(params.pool_target)
                if t is None or t.kind != "directory":
                    issues.append((("writer", "node"), f"writer {w.node!r} has no directory target "
                                   f"{params.pool_target!r} to write to"))
        return issues

    # ---- plan (pure)
    def _reader_argv(self, ctx: GateContext, node, p: G3Params, phase: str = ""
                     ) -> tuple[LaunchSpec, tuple[str, ...]]:
        nd = _node_dir(node, ctx.gate.id)
        spec = _reader_spec(node, p, posixpath.join(nd, "g3_reader.py"), posixpath.join(nd, "armed" + phase),
                            posixpath.join(nd, "go" + phase), posixpath.join(nd, f"series{phase}.jsonl"))
        return spec, spec.argv

    def _writer_argv(self, ctx: GateContext, node, p: G3Params) -> tuple[LaunchSpec, str]:
        nd = _node_dir(node, ctx.gate.id)
        return _writer_spec(node, p, posixpath.join(nd, "g3_reader.py"), nd)

    def _create_argv(self, ctx: GateContext, node, p: G3Params) -> tuple[str, ...]:
        nd = _node_dir(node, ctx.gate.id)
        return ("python3", posixpath.join(nd, "g3_reader.py"), "create", "--pool-dir", _pool_dir(node, p),
                "--manifest-json", json.dumps(manifest_for(p), separators=(",", ":")),
                "--block-bytes", str(p.block_bytes))

    def plan(self, ctx: GateContext) -> list[PlannedStep]:
        p: G3Params = ctx.params
        if p.launcher == "slurm":
            return self._plan_slurm(ctx, p)
        port_node, nic, readers = self._roles(p, ctx.nodes)
        creator = ctx.nodes[p.create_on or readers[0]]
        out = [PlannedStep(port_node, f"line rate of {nic} (cross-check)", ("cat", f"/sys/class/net/{nic}/speed")),
               PlannedStep(port_node, f"shaping of {nic} (cross-check)", ("tc", "-j", "qdisc", "show", "dev", nic))]
        writer = p.writer.node if p.writer else None
        for r in readers + ([writer] if writer else []):  # the program goes here (a file copy, not a command)
            out.append(PlannedStep(r, "create the node's directory for kvgate's reader",
                                   ("mkdir", "-p", _node_dir(ctx.nodes[r], ctx.gate.id))))
        manifest = posixpath.join(_pool_dir(creator, p), MANIFEST)
        out.append(PlannedStep(creator.name, "the KV copy's manifest, if one is there", ("cat", manifest)))
        out.append(PlannedStep(creator.name, f"lay out the KV copy ({p.chunks} chunk files, {p.copy_bytes} bytes) "
                               f"in {_pool_dir(creator, p)} unless its manifest matches",
                               self._create_argv(ctx, creator, p), optional=True))
        for r in readers:
            node = ctx.nodes[r]
            out.append(PlannedStep(r, f"measure clock offset: one command, {p.clock_samples} round trips over its "
                                   "open stdin (a newline in, the node's time out)", CLOCK_SESSION_ARGV))
            if p.drop_caches:
                out.append(PlannedStep(r, "drop the page cache (recorded)", DROP_CACHES_ARGV))
            spec, _ = self._reader_argv(ctx, node, p)
            out.append(PlannedStep(r, "armed reader (a stale go/armed file removed first): opens every file, "
                                   "waits for the common start", spec.command()))
            if writer:
                if p.drop_caches:
                    out.append(PlannedStep(r, "drop the page cache again before the read with the writer (recorded)",
                                           DROP_CACHES_ARGV))
                out.append(PlannedStep(r, f"armed reader, second read: released together with the writer {writer}",
                                       self._reader_argv(ctx, node, p, WITH_WRITER)[0].command()))
        if writer:
            wnode = ctx.nodes[writer]
            out.append(PlannedStep(writer, f"measure clock offset: one command, {p.clock_samples} round trips over "
                                   "its open stdin (a newline in, the node's time out)", CLOCK_SESSION_ARGV))
            spec, _ = self._writer_argv(ctx, wnode, p)
            out.append(PlannedStep(writer, f"armed writer: released with the readers' second read, writes into "
                                   f"{_writes_dir(wnode, p)} until its stop file is put there (a file copy) once "
                                   "the readers are done", spec.command()))
            out.append(PlannedStep(writer, "remove what the writer wrote", ("rm", "-rf", "--", _writes_dir(wnode, p))))
        return out

    # ---- run
    def run(self, ctx: GateContext) -> WorkloadResult:
        p: G3Params = ctx.params
        port_node, nic, readers = self._roles(p, ctx.nodes)
        policy = FailurePolicy(p.max_failed_share, p.on_node_failure)
        ev = G3Evidence(readers=readers, port=p.port, copy_bytes=p.copy_bytes, chunks=p.chunks,
                        chunk_bytes=p.chunk_bytes, streams_per_node=p.streams, block_bytes=p.block_bytes,
                        policy=vars(policy))
        try:
            if p.launcher == "slurm":
                return self._run_slurm(ctx, p, port_node, nic, readers, policy, ev)
            return self._run(ctx, p, port_node, nic, readers, policy, ev)
        except WorkloadError as exc:  # a phase failed beyond the policy: what was gathered stays evidence
            return WorkloadResult(evidence=ev, error=str(exc))

    def _run(self, ctx: GateContext, p: G3Params, port_node: str, nic: str, readers: list[str],
             policy: FailurePolicy, ev: G3Evidence) -> WorkloadResult:
        nodes_dir = ctx.gate_dir / "nodes"
        nodes_dir.mkdir(parents=True, exist_ok=True)
        tr = {r: ctx.transports[r] for r in readers}
        writer = p.writer.node if p.writer else None

        # 1. The port's line rate: declared, cross-checked where the port's node lets us read it.
        port = self._port_rate(ctx, port_node, nic, p.port_rate_tolerance)
        ev.port_rate = vars(port) | {"notes": list(port.notes)}

        # 2. Reader script on every node (a node failing here is a node failure like any other).
        prep = self._prepare_nodes(ctx, tr, writer, policy, ev)

        # 3. The KV copy, once.
        creator = p.create_on or next(r for r in readers if r in prep.succeeded)
        ev.pool = self._ensure_copy(ctx, creator, p)

        # 4. Clock offsets (the writer's too: it is released with the readers), cold caches.
        offs, applied, live = self._offsets_and_cold(ctx, p, {r: tr[r] for r in prep.succeeded}, writer, ev)

        # 5. Arm, release together, wait.
        specs = {r: self._reader_argv(ctx, ctx.nodes[r], p)[0] for r in live}
        launch = SynchronizedLaunch(live, specs, applied, policy, log_dir=ctx.gate_dir)
        self._arm_release_wait(ctx, p, launch, policy, len(live))
        uncertainty = max((o.uncertainty_s for o in offs.succeeded.values()), default=0.0)
        if not writer:
            return self._collect(ctx, p, readers, launch, applied, prep.failed, offs.failed, uncertainty, port,
                                 policy, ev)
        # 6. Isolation: the readers that read alone read again, released together with the writer; not when
        # the first read already failed beyond the policy (its error is the verdict).
        again = {r: live[r] for r in live if launch.runs[r].error is None}
        first = GroupResult({r: NodeOutcome(r, r in again, None, None if r in again else "failed") for r in readers})
        if not again or policy.verdict_error(first):
            return self._collect(ctx, p, readers, launch, applied, prep.failed, offs.failed, uncertainty, port,
                                 policy, ev)
        try:
            launch2 = self._with_writer(ctx, p, again, writer, applied, policy, ev)
        finally:
            wnode = ctx.nodes[writer]
            r = ctx.steps.run(ctx.transports[writer], "writer-cleanup", ("rm", "-rf", "--", _writes_dir(wnode, p)),
                              timeout_s=120)
            if not r.ok:
                ctx.progress(f"{ctx.gate.id}: what the writer wrote was not removed: {r.summary()}")
        return self._collect(ctx, p, readers, launch, applied, prep.failed, offs.failed, uncertainty, port, policy,
                             ev, launch2)

    def _prepare_nodes(self, ctx: GateContext, tr: dict, writer: str | None, policy: FailurePolicy,
                       ev: G3Evidence) -> GroupResult:
        """The reader script put on every reader (judged by the policy) and on the writer (its failing is the
        gate's error: no writer, no isolation to measure); returns the readers' outcomes."""
        def prepare(name: str, t):
            nd = _node_dir(ctx.nodes[name], ctx.gate.id)
            r = ctx.steps.run(t, "mkdir", ("mkdir", "-p", nd), timeout_s=30)
            if not r.ok:
                raise WorkloadError(r.summary())
            t.put(program_path("g3_reader.py"), posixpath.join(nd, "g3_reader.py"))
            return nd

        prep = fan_out(tr, prepare)
        self._check_policy(prep, policy, "preparing nodes", ev)
        if writer:
            ev.isolation = G3Isolation(writer=writer)
            wprep = fan_out({writer: ctx.transports[writer]}, prepare)
            if wprep.failed:
                raise WorkloadError(f"preparing the writer {writer}: {wprep.failed[writer]}")
        return prep

    def _offsets_and_cold(self, ctx: GateContext, p: G3Params, live: dict, writer: str | None, ev: G3Evidence
                          ) -> tuple[GroupResult, dict[str, float], dict]:
        """Every live node's clock offset (the writer's too: it is released with the readers; its failing is the
        gate's error), then the page cache dropped on the readers whose offset is known. Returns the offsets'
        outcomes, the offsets applied and the readers still live."""
        t_phase = time.monotonic()
        offs = measure_clock_offsets({**live, **({writer: ctx.transports[writer]} if writer else {})},
                                     samples=p.clock_samples, timeout_s=p.clock_probe_timeout_s)
        if writer and writer not in offs.succeeded:
            raise WorkloadError(f"the writer {writer}'s clock offset: {offs.failed.get(writer)}")
        ctx.progress(f"{ctx.gate.id}: clock offsets of {len(offs.succeeded)}/{len(offs)} nodes in "
                     f"{time.monotonic() - t_phase:.1f} s")
        applied = {n: applied_offset_s(o, p.clock_alignment) for n, o in offs.succeeded.items()}
        ev.clock_offsets = {n: vars(o) | {"applied_s": applied[n]} for n, o in offs.succeeded.items()}
        ev.clock_alignment = p.clock_alignment
        ev.clock_offset_errors = offs.failed
        live = {r: live[r] for r in offs.succeeded if r in live}
        if p.drop_caches:
            t_phase = time.monotonic()
            drops = fan_out(live, lambda _n, t: drop_caches(ctx, t, timeout_s=120))
            ev.page_cache_dropped = {n: o.value if o.ok else CacheDrop(dropped=False, error=o.error)
                                     for n, o in drops.items()}
            ctx.progress(f"{ctx.gate.id}: page cache dropped on {len(drops.succeeded)}/{len(live)} nodes in "
                         f"{time.monotonic() - t_phase:.1f} s")
        return offs, applied, live

    def _with_writer(self, ctx: GateContext, p: G3Params, readers: dict, writer: str, applied: dict[str, float],
                     policy: FailurePolicy, ev: G3Evidence) -> SynchronizedLaunch:
        """The readers' second read with the writer: caches dropped again, readers and writer armed and released
        at one instant, the readers waited for, then the writer told to stop (its stop file put) and waited for."""
        if p.drop_caches:
            drops = fan_out(readers, lambda _n, t: drop_caches(ctx, t, timeout_s=120))
            ev.isolation = ev.isolation.model_copy(update={"page_cache_dropped": {
                n: o.value if o.ok else CacheDrop(dropped=False, error=o.error) for n, o in drops.items()}})
        wspec, stop_path = self._writer_argv(ctx, ctx.nodes[writer], p)
        specs = {r: self._reader_argv(ctx, ctx.nodes[r], p, WITH_WRITER)[0] for r in readers}
        specs[writer] = wspec
        transports = {**readers, writer: ctx.transports[writer]}
        launch = SynchronizedLaunch(transports, specs, applied, policy, log_dir=ctx.gate_dir / "with-writer")
        with launch:
            ctx.progress(f"{ctx.gate.id}: arming {len(readers)} readers and the writer {writer}")
            armed = launch.arm(timeout_s=p.arm_timeout_s)
            rgroup = GroupResult({n: armed[n] for n in readers})
            if writer not in armed.succeeded or not policy.tolerates(rgroup) or not rgroup.succeeded:
                launch.stop_all("arming failed (the writer, or readers beyond the failure policy)")
                return launch
            go = launch.release()
            ctx.progress(f"{ctx.gate.id}: released at {go:.3f} with the writer {writer}")
            launch.wait(timeout_s=p.read_timeout_s, stall_timeout_s=p.stall_timeout_s, nodes=list(readers))
            with tempfile.TemporaryDirectory(prefix="kvgate-stop-") as tmp:
                stop = Path(tmp) / "stop"
                stop.write_text("stop\n")
                try:
                    ctx.transports[writer].put(stop, stop_path)
                except Exception as exc:  # noqa: BLE001 - an unreachable writer is stopped by its group instead
                    launch.stop_all(f"the writer's stop file could not be put: {exc}")
            launch.wait(timeout_s=max(30.0, 20 * p.interval_s), stall_timeout_s=p.stall_timeout_s, nodes=[writer])
        return launch

    def _port_rate(self, ctx: GateContext, port_node: str, nic: str, tolerance: float = 0.02) -> PortRate:
        declared = next(n.line_rate_gbit_s for n in ctx.nodes[port_node].nics if n.name == nic)
        pt = ctx.transports.get(port_node)
        speed = tcj = None
        if pt is not None:
            r = ctx.steps.run(pt, "port-speed", ("cat", f"/sys/class/net/{nic}/speed"), timeout_s=30)
            speed = r.stdout if r.ok else None
            r = ctx.steps.run(pt, "port-qdisc", ("tc", "-j", "qdisc", "show", "dev", nic), timeout_s=30)
            tcj = r.stdout if r.ok else None
        return cross_check_port_rate(declared, speed, tcj, tolerance)

    def _arm_release_wait(self, ctx: GateContext, p: G3Params, launch: SynchronizedLaunch, policy: FailurePolicy,
                          n: int) -> None:
        with launch:
            ctx.progress(f"{ctx.gate.id}: arming readers on {n} nodes")
            t_phase = time.monotonic()
            armed = launch.arm(timeout_s=p.arm_timeout_s)
            ctx.progress(f"{ctx.gate.id}: {len(armed.succeeded)}/{n} armed in {time.monotonic() - t_phase:.1f} s")
            if not policy.tolerates(armed) or not armed.succeeded:
                launch.stop_all("arming failed beyond the failure policy")
            else:
                go = launch.release()
                ctx.progress(f"{ctx.gate.id}: released at {go:.3f}; reading {p.copy_bytes / 1e9:.3f} GB per node")
                launch.wait(timeout_s=p.read_timeout_s, stall_timeout_s=p.stall_timeout_s)

    def _collect(self, ctx: GateContext, p: G3Params, readers: list[str], launch: SynchronizedLaunch,
                 applied: dict[str, float], prep_failed: dict[str, str], offs_failed: dict[str, str],
                 uncertainty: float, port: PortRate, policy: FailurePolicy, ev: G3Evidence,
                 launch2: SynchronizedLaunch | None = None) -> WorkloadResult:
        # 7. Per-node raw series (partial ones too), parsed.
        ev.port_rate = vars(port) | {"notes": list(port.notes)}
        series, node_ev, failed = self._gather(ctx, readers, launch, applied, prep_failed, offs_failed, "reader")
        ev.nodes = node_ev
        ev.failed_nodes = failed
        ev.launch = G3Launch(go_ref_s=launch.go_ref_s, events=launch.events)
        with_writer = writer = None
        if launch2 is not None:
            iso = ev.isolation
            later = [r for r in readers if r not in failed]
            if launch2.runs[iso.writer].armed_at_s is None:  # the readers were stopped for the writer's sake
                later = []
            with_writer, iso_nodes, iso_failed = self._gather(ctx, later, launch2, applied, {}, {},
                                                              "reader" + WITH_WRITER)
            writer, wrec = self._gather_writer(ctx, p, iso.writer, launch2, applied)
            ev.isolation = iso.model_copy(update=dict(
                nodes=iso_nodes, failed_nodes=iso_failed, writer_record=wrec,
                launch=G3Launch(go_ref_s=launch2.go_ref_s, events=launch2.events)))
        result = evaluate_g3(ev, series, port, policy, p.min_window_s, uncertainty, launch.go_ref_s, with_writer,
                             writer, p.writer.max_idle_s if p.writer else 2.0, G3Bounds.of(p))
        write_summary(ctx.gate_dir, "g3.json", result)
        return result

    def _gather_writer(self, ctx: GateContext, p: G3Params, name: str, launch: SynchronizedLaunch,
                       applied: dict[str, float]) -> tuple[NodeSeries | None, G3WriterRecord]:
        """The writer's raw stream kept and parsed: its series (bytes written per interval) and its record."""
        run = launch.runs.get(name)
        if run is None or run.process is None:
            return None, G3WriterRecord(node=name, error=(run.error if run else None) or "not started")
        ndir = ctx.gate_dir / "nodes" / name
        ndir.mkdir(parents=True, exist_ok=True)
        write_gate_file(ndir / "writer.jsonl", run.stdout)
        write_gate_file(ndir / "writer.stderr", run.stderr)
        info: dict[str, Any] = run.as_dict() | {"dir": _writes_dir(ctx.nodes[name], p)}
        series, info = parse_stream(name, run.stdout, applied[name], info, f"nodes/{name}/writer.jsonl", "writer")
        run.error = info["error"]
        return series, G3WriterRecord.model_validate(info)

    def _gather(self, ctx: GateContext, readers: list[str], launch: SynchronizedLaunch, applied: dict[str, float],
                prep_failed: dict[str, str], offs_failed: dict[str, str], stem: str
                ) -> tuple[dict[str, NodeSeries], dict[str, G3NodeRecord], dict[str, str]]:
        """Every reader's raw stream kept (``nodes/<node>/<stem>.jsonl``) and parsed: series, records, failures."""
        nodes_dir = ctx.gate_dir / "nodes"
        series: dict[str, NodeSeries] = {}
        node_ev: dict[str, G3NodeRecord] = {}
        failed: dict[str, str] = {}
        for name in readers:
            run = launch.runs.get(name)
            if run is None:
                failed[name] = (prep_failed.get(name) or offs_failed.get(name) or "not started")
                node_ev[name] = G3NodeRecord(error=failed[name])
                continue
            ndir = nodes_dir / name
            ndir.mkdir(parents=True, exist_ok=True)
            write_gate_file(ndir / f"{stem}.jsonl", run.stdout)
            write_gate_file(ndir / f"{stem}.stderr", run.stderr)
            one, info = parse_stream(name, run.stdout, applied[name], run.as_dict(), f"nodes/{name}/{stem}.jsonl")
            if one is not None:
                series[name] = one
            run.error = info["error"]
            if run.error:
                failed[name] = run.error
            node_ev[name] = G3NodeRecord.model_validate(info)
        return series, node_ev, failed

    def _check_policy(self, group: GroupResult, policy: FailurePolicy, what: str, ev: G3Evidence) -> None:
        ev.phase_failures = {**ev.phase_failures, what: group.failed}
        err = policy.verdict_error(group)
        if err or not group.succeeded:
            raise WorkloadError(f"{what}: {err or group.summary()}")

    def _ensure_copy(self, ctx: GateContext, creator: str, p: G3Params) -> G3Pool:
        node = ctx.nodes[creator]
        t = ctx.transports[creator]
        pool = _pool_dir(node, p)
        want = manifest_for(p)
        r = ctx.steps.run(t, "pool-manifest", ("cat", posixpath.join(pool, MANIFEST)), timeout_s=60)
        if r.ok:
            try:
                have = json.loads(r.stdout)
                if all(have.get(k) == v for k, v in want.items()):
                    return G3Pool(created=False, by=creator, dir=pool, manifest=have)
            except json.JSONDecodeError:
                pass
        ctx.progress(f"{ctx.gate.id}: laying out the KV copy on {creator}: {p.chunks} x {p.chunk_bytes} bytes in {pool}")
        r = ctx.steps.run(t, "pool-create", self._create_argv(ctx, node, p),
                          timeout_s=max(600.0, p.copy_bytes / 10e6))
        if not r.ok:
            raise WorkloadError(f"creating the KV copy on {creator} failed: {r.summary()}")
        return G3Pool(created=True, by=creator, dir=pool, report=r.stdout.strip())

