"""G3 launched through Slurm: nothing is sent to a node but through srun from the control host (the plan, the
run, the copy made or found), as a mixin of the workload."""

from __future__ import annotations

import json
import posixpath
import shutil
import time
from pathlib import Path

from ...errors import WorkloadError
from ...execute.fanout import FailurePolicy, GroupResult, LaunchSpec, NodeOutcome, SynchronizedLaunch
from ...execute.slurm import (SlurmCluster, SlurmJob, job_dir_for, parse_sinfo_nodes, sinfo_argv, srun_argv,
                              srun_command, time_limit_arg, unusable_nodes)
from ...transport.local import LocalTransport
from ...node import program_path
from ..kit.base import CacheDrop, GateContext, PlannedStep, WorkloadResult
from .params import G3Evidence, G3Params, G3Pool, MANIFEST, _pool_dir, _reader_spec, manifest_for


class SlurmLaunch:
    """The slurm launcher of :class:`~harness.workloads.g3_shared_read.G3SharedRead` (``launcher: slurm``)."""

    # ---- the slurm launcher: nothing is sent to a node but through Slurm, from the control host
    def _cluster(self, ctx: GateContext) -> SlurmCluster:
        if ctx.slurm is None:
            raise WorkloadError("launcher slurm: the inventory names no `slurm:` cluster")
        return SlurmCluster.from_config(ctx.slurm)

    def _slurm_paths(self, ctx: GateContext, p: G3Params) -> tuple[SlurmCluster, str]:
        cluster = self._cluster(ctx)
        run_id = ctx.gate_dir.parent.parent.name or "<run>"  # a plan has no run directory yet
        return cluster, job_dir_for(cluster, run_id, ctx.gate.id)

    def _slurm_one(self, cluster: SlurmCluster, node: str, argv: tuple[str, ...], time_s: float) -> tuple[str, ...]:
        return srun_command(cluster, "kvgate-g3-pool", node, time_s, argv)

    def _slurm_reader_spec(self, job_dir: str, node, ctx: GateContext, p: G3Params) -> LaunchSpec:
        nd = posixpath.join(job_dir, node.name)
        return _reader_spec(node, p, posixpath.join(job_dir, "g3_reader.py"), nd + ".armed", nd + ".go",
                            nd + ".series.jsonl")

    def _plan_slurm(self, ctx: GateContext, p: G3Params) -> list[PlannedStep]:
        port_node, nic, readers = self._roles(p, ctx.nodes)
        cluster, job_dir = self._slurm_paths(ctx, p)
        creator = ctx.nodes[p.create_on or readers[0]]
        out = [PlannedStep(port_node, f"line rate of {nic} (cross-check)", ("cat", f"/sys/class/net/{nic}/speed")),
               PlannedStep(port_node, f"shaping of {nic} (cross-check)", ("tc", "-j", "qdisc", "show", "dev", nic))]
        out.append(PlannedStep("control", "the readers' node states (a drained, down or absent node fails there)",
                               sinfo_argv(readers)))
        manifest = posixpath.join(_pool_dir(creator, p), MANIFEST)
        out.append(PlannedStep("control", f"the KV copy's manifest on {creator.name}, if one is there (srun)",
                               self._slurm_one(cluster, creator.name, ("cat", manifest), 300)))
        create = self._create_argv(ctx, creator, p)
        create = create[:1] + (posixpath.join(job_dir, "g3_reader.py"),) + create[2:]
        out.append(PlannedStep("control", f"lay out the KV copy on {creator.name} unless its manifest matches (srun)",
                               self._slurm_one(cluster, creator.name, create, max(600.0, p.copy_bytes / 10e6)),
                               optional=True))
        out.append(PlannedStep("control", f"one job step, a task per reader ({', '.join(readers)}): each drops its "
                               "page cache (recorded), arms its reader, waits for the common start in the job's files",
                               srun_argv(cluster, f"kvgate-{ctx.gate.id}", readers,
                                         p.arm_timeout_s + p.read_timeout_s + cluster.time_margin_s, job_dir)))
        out.append(PlannedStep("control", "the job's record (read again, up to 30 s, while Slurm reports it COMPLETING: "
                               "its NodeList then names only the nodes still completing)",
                               ("scontrol", "show", "job", "<job id>")))
        out.append(PlannedStep("control", "cancel what still runs of the job (timeout, Ctrl-C, a stopped node)",
                               ("scancel", "<job id>"), optional=True))
        return out

    def _run_slurm(self, ctx: GateContext, p: G3Params, port_node: str, nic: str, readers: list[str],
                   policy: FailurePolicy, ev: G3Evidence) -> WorkloadResult:
        """G3 through Slurm: the same phases, the KV copy laid out by a one-task step, the readers armed and
        released by one job step (harness.execute.slurm), the same evaluation. Clocks: the cluster's nodes are
        taken as synchronized (no per-node session to measure an offset over); recorded."""
        nodes_dir = ctx.gate_dir / "nodes"
        nodes_dir.mkdir(parents=True, exist_ok=True)
        cluster, job_dir = self._slurm_paths(ctx, p)
        control = LocalTransport(name="control")
        ev.launcher = "slurm"
        port = self._port_rate(ctx, port_node, nic, p.port_rate_tolerance)

        env = dict(cluster.env) or None
        r = ctx.steps.run(control, "sinfo", sinfo_argv(readers), timeout_s=30, env=env)
        if not r.ok:
            raise WorkloadError(f"slurm: the readers' node states could not be read: {r.summary()}")
        bad = unusable_nodes(parse_sinfo_nodes(r.stdout), readers)
        self._check_policy(GroupResult({n: NodeOutcome(n, n not in bad, None, bad.get(n)) for n in readers}),
                           policy, "slurm node states", ev)
        readers = [n for n in readers if n not in bad]
        Path(job_dir).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(program_path("g3_reader.py"), posixpath.join(job_dir, "g3_reader.py"))
        ev.pool = self._slurm_copy(ctx, p, cluster, job_dir, control, env, p.create_on or readers[0])

        applied = {n: 0.0 for n in readers}
        ev.clock_alignment = "assume_synced"
        ev.clock_offsets = {n: {"applied_s": 0.0, "how": "slurm: cluster clocks taken as synchronized"}
                            for n in readers}
        specs = {n: self._slurm_reader_spec(job_dir, ctx.nodes[n], ctx, p) for n in readers}
        job = SlurmJob(ctx.steps, control, cluster, job_dir, f"kvgate-{ctx.gate.id}", readers,
                       p.arm_timeout_s + p.read_timeout_s + cluster.time_margin_s, drop_caches=p.drop_caches,
                       cancel=ctx.cancel, progress=ctx.progress)
        launch = SynchronizedLaunch(job.transports(), specs, applied, policy, log_dir=ctx.gate_dir)
        submitted_s = time.time()
        with job:
            self._arm_release_wait(ctx, p, launch, policy, len(readers))
        # The tasks' files are what the nodes wrote into the job directory: held to the job's frame on our clock.
        ev.time_frame = {"not_before_s": submitted_s, "not_after_s": time.time(),
                         "max_duration_s": 60.0 * int(time_limit_arg(job.time_limit_s)), "slack_s": p.clock_slack_s}
        ev.slurm_job = job.record()
        if p.drop_caches:
            ev.page_cache_dropped = {n: CacheDrop.model_validate(t["cache_drop"])
                                     for n, t in job.provenance().items() if t.get("cache_drop") is not None}
        return self._collect(ctx, p, ev.readers, launch, applied, bad, {}, 0.0, port, policy, ev)

    def _slurm_copy(self, ctx: GateContext, p: G3Params, cluster: SlurmCluster, job_dir: str,
                    control: LocalTransport, env: dict[str, str] | None, creator: str) -> G3Pool:
        """The KV copy through srun on ``creator``: kept when its manifest matches the gate's, else laid out by a
        one-task step running the reader script from the job directory."""
        node = ctx.nodes[creator]
        r = ctx.steps.run(control, "pool-manifest", self._slurm_one(
            cluster, creator, ("cat", posixpath.join(_pool_dir(node, p), MANIFEST)), 300), timeout_s=360, env=env)
        have = None
        if r.ok:
            try:
                have = json.loads(r.stdout)
            except json.JSONDecodeError:
                have = None
        want = manifest_for(p)
        if isinstance(have, dict) and all(have.get(k) == v for k, v in want.items()):
            return G3Pool(created=False, by=creator, dir=_pool_dir(node, p), manifest=have)
        create = self._create_argv(ctx, node, p)
        create = create[:1] + (posixpath.join(job_dir, "g3_reader.py"),) + create[2:]
        t = max(600.0, p.copy_bytes / 10e6)
        r = ctx.steps.run(control, "pool-create", self._slurm_one(cluster, creator, create, t),
                          timeout_s=t + 60, env=env)
        if not r.ok:
            raise WorkloadError(f"creating the KV copy on {creator} through srun failed: {r.summary()}")
        return G3Pool(created=True, by=creator, dir=_pool_dir(node, p), report=r.stdout.strip())
