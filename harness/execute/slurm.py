"""The `slurm` launcher: a gate's node-side programs as one Slurm job step, driven by the same synchronized launch.

`SynchronizedLaunch` (fanout.py) is the driver, written once; this module gives it backends of its primitives.
A `SlurmJob` hands out one `SlurmNodeTransport` per node. Their `spawn` calls register each node's command; the
last one submits a single `srun` (one task per node, the node list, partition, account, GRES, a time limit from
the gate's timeout) that starts `harness/node/slurm_task.py` on every node. That task runs its node's command
with stdout and stderr in the job directory (a directory every node and the control host see at the same path),
so a task's `Process` here reads its output from `NODE.out`, its exit status from `NODE.rc`, and is stopped
alone by `NODE.stop`; the go file (the common start time) is written into the same directory. `SlurmJob.close`
records `scontrol show job`, then `scancel`s the job if anything of it still runs, and waits for `srun` to end.

Every command sent to Slurm (srun, scontrol, scancel) is a step of the run (`StepLog`). The parsers of
`sinfo` and `scontrol show job` / `show node` output are pure functions, tested on captured output
(tests/fixtures/slurm/captured).
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..errors import TransportError
from .cancel import GateEnded
from ..node import program_path
from ..transport.base import Process, Transport

TASK_PROGRAM = "slurm_task.py"
# How long a task whose srun has ended may still take to write its exit status (a shared file system's delay).
RC_GRACE_S = 5.0


# ------------------------------------------------------------------------------------------------ parsers

# How long a job's record is read again while Slurm still reports it COMPLETING (its epilogs running): seconds.
SETTLE_S = 30.0


def record_settled(rec: dict[str, str]) -> bool:
    """Pure: the ``scontrol show job`` record names the job's whole allocation: any state but COMPLETING, in which
    Slurm's NodeList names only the nodes still completing (captured: ``NodeList=n1`` for a job of n[1-8])."""
    return rec.get("JobState") != "COMPLETING"


def job_nodes(rec: dict[str, str]) -> list[str] | None:
    """Pure: the nodes a job was allocated, from its ``scontrol show job`` record: [] without one, None when the
    record is COMPLETING (its NodeList is partial)."""
    if not rec:
        return []
    return expand_nodelist(rec.get("NodeList", "")) if record_settled(rec) else None


def parse_scontrol_record(text: str) -> dict[str, str]:
    """Pure: ``scontrol show job ID`` (or ``show node``) output as a dict of its ``Key=Value`` fields.

    Values run to the next `` Key=``; a value may hold spaces (``Command=``, ``Reason=``), and ``=`` inside a value
    (``TRES=cpu=8,mem=1G``) stays in it."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        tokens = line.split(" ")
        key = None
        for tok in tokens:
            k, sep, v = tok.partition("=")
            if sep and k and k.replace("/", "").replace(":", "").isalnum() and k[0].isupper():
                key = k
                out[key] = v
            elif key is not None:
                out[key] += " " + tok
    return {k: v.strip() for k, v in out.items()}


def parse_sinfo_nodes(text: str) -> dict[str, str]:
    """Pure: ``sinfo -h -N -o "%N %t"`` output as node -> state (``idle``, ``alloc``, ``down*``, ...).
    A node listed in several partitions appears once."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2:
            out[parts[0]] = parts[1]
    return out


USABLE_STATES = ("idle", "alloc", "allocated", "mix", "mixed", "comp", "completing")


def unusable_nodes(states: Mapping[str, str], wanted: Sequence[str]) -> dict[str, str]:
    """Pure: the wanted nodes a job step cannot use, by ``sinfo`` (node -> state): absent, down, drained or
    draining, or not responding (a state ending in ``*``); node -> why."""
    out = {}
    for n in wanted:
        st = states.get(n)
        if st is None:
            out[n] = "slurm: not in the cluster's sinfo"
        elif st.endswith("*") or st.rstrip("~#!%$@^-+") not in USABLE_STATES:
            out[n] = f"slurm: node state {st}"
    return out


def sinfo_argv(nodes: Sequence[str]) -> tuple[str, ...]:
    """Pure: the node states of ``nodes``, one ``NODE STATE`` line each (:func:`parse_sinfo_nodes`)."""
    return ("sinfo", "-h", "-N", "-n", ",".join(nodes), "-o", "%N %t")


def expand_nodelist(text: str) -> list[str]:
    """Pure: a Slurm host list (``n[1-3,8],storage``) as names, in order."""
    out: list[str] = []
    depth, cur, parts = 0, "", []
    for ch in text.strip():
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += ch == "["
        depth -= ch == "]"
        cur += ch
    if cur:
        parts.append(cur)
    for p in parts:
        if "[" not in p:
            out.append(p)
            continue
        prefix, rest = p.split("[", 1)
        body, suffix = rest.split("]", 1)
        for rng in body.split(","):
            lo, _, hi = rng.partition("-")
            if not hi:
                out.append(f"{prefix}{lo}{suffix}")
                continue
            for i in range(int(lo), int(hi) + 1):
                out.append(f"{prefix}{str(i).zfill(len(lo))}{suffix}")
    return out


def time_limit_arg(timeout_s: float) -> str:
    """Pure: srun's ``--time`` in whole minutes, rounded up, at least one (Slurm's own granularity)."""
    return str(max(1, math.ceil(timeout_s / 60.0)))


# ------------------------------------------------------------------------------------------------ the job

@dataclass(frozen=True)
class SlurmCluster:
    """The cluster as the inventory names it (``slurm:`` in the inventory; harness.config.models.SlurmConfig)."""

    partition: str | None = None
    account: str | None = None
    job_dir: str = "/tmp/kvgate-slurm"
    python: str = "python3"
    gres_per_task: str | None = None
    time_margin_s: float = 60.0
    extra_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_config(cls, cfg: Any) -> "SlurmCluster":
        return cls(partition=cfg.partition, account=cfg.account, job_dir=cfg.job_dir, python=cfg.python,
                   gres_per_task=cfg.gres_per_task, time_margin_s=cfg.time_margin_s,
                   extra_args=tuple(cfg.extra_args), env=dict(cfg.env))


def srun_options(cluster: SlurmCluster, job_name: str, nodes: Sequence[str], time_limit_s: float) -> list[str]:
    """Pure: srun's options for one task on each of ``nodes`` exactly, with the cluster's partition, account,
    GRES and extra arguments and a time limit of ``time_limit_s`` (rounded up to minutes)."""
    argv = ["--job-name", job_name, "--nodes", str(len(nodes)), "--ntasks", str(len(nodes)),
            "--ntasks-per-node", "1", "--nodelist", ",".join(nodes), "--time", time_limit_arg(time_limit_s)]
    if cluster.partition:
        argv += ["--partition", cluster.partition]
    if cluster.account:
        argv += ["--account", cluster.account]
    if cluster.gres_per_task:
        argv += ["--gres", cluster.gres_per_task]
    return argv + list(cluster.extra_args)


def srun_command(cluster: SlurmCluster, job_name: str, node: str, time_limit_s: float, argv: Sequence[str]
                 ) -> tuple[str, ...]:
    """Pure: one command on one node as its own short job step; its output comes back through srun."""
    return ("srun", *srun_options(cluster, job_name, [node], time_limit_s), *argv)


def srun_argv(cluster: SlurmCluster, job_name: str, nodes: Sequence[str], time_limit_s: float, job_dir: str
              ) -> tuple[str, ...]:
    """Pure: the one ``srun`` of a gate's step: one task per node on exactly ``nodes``, each running the task
    program over the job directory's spec; a task's own output goes to the job's files, not through srun."""
    return ("srun", *srun_options(cluster, job_name, nodes, time_limit_s), "--kill-on-bad-exit=0",
            "--output", "/dev/null", "--error", f"{job_dir}/srun-task-%t.err",
            cluster.python, f"{job_dir}/{TASK_PROGRAM}", "--spec", f"{job_dir}/spec.json", "--job-dir", job_dir)


def job_dir_for(cluster: SlurmCluster, run_id: str, gate_id: str) -> str:
    """Where one gate's step keeps its files: under the cluster's shared ``job_dir``, per run and gate."""
    return f"{cluster.job_dir.rstrip('/')}/{run_id}-{gate_id}"


class SlurmTask(Process):
    """One node's task of the step, seen through its files in the job directory."""

    def __init__(self, job: "SlurmJob", node: str):
        self.job, self.node = job, node
        self.pid = None
        self._rc: int | None = None
        self._srun_ended_at: float | None = None

    def _path(self, ext: str) -> Path:
        return Path(self.job.job_dir) / f"{self.node}.{ext}"

    def poll(self) -> int | None:
        if self._rc is not None:
            return self._rc
        try:
            self._rc = int(self._path("rc").read_text().strip())
            return self._rc
        except (OSError, ValueError):
            pass
        if self.job.submit_error is not None:
            self._rc = 255
            return self._rc
        srun = self.job.srun
        if srun is not None and srun.poll() is not None:  # the step is over and this task left no status
            self._srun_ended_at = self._srun_ended_at or time.monotonic()
            if time.monotonic() - self._srun_ended_at > RC_GRACE_S:
                self._rc = 255
        return self._rc

    def wait(self, timeout_s: float | None = None) -> int | None:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                return None
            time.sleep(0.05)
        return self._rc

    def kill_group(self, grace_s: float = 5.0) -> None:
        """Stop this node's program: alone, through ``NODE.stop`` (the task stops it; a node that is gone never
        reads it, and `SlurmJob.close` cancels the whole job), or, once every task of the step is stopped or
        over, by ``scancel`` of the job."""
        if self.job.stopping(self.node):
            self.job.cancel(f"every task stopped ({self.node} last)")
        else:
            self._path("stop").write_text("stop\n")
        self.wait(grace_s)

    def _read(self, ext: str) -> bytes:
        try:
            return self._path(ext).read_bytes()
        except OSError:
            return b""

    def output(self) -> tuple[bytes, bytes]:
        err = self._read("err")
        if self._rc == 255 and not self._path("rc").exists():
            err += self.job.task_error(self.node).encode()
        return self._read("out"), err

    def stdout_so_far(self) -> bytes | None:
        return self._read("out")

    def stdout_bytes_so_far(self) -> int | None:
        try:
            return self._path("out").stat().st_size
        except OSError:
            return 0


class SlurmNodeTransport(Transport):
    """A node as the synchronized launch sees it under Slurm: ``spawn`` registers the node's command with the
    job (the last one submits the step), ``put`` writes into the shared job directory. Nothing else runs
    through it: a node's other commands are not sent by this launcher."""

    def __init__(self, job: "SlurmJob", node: str):
        self.job, self.name = job, node

    def _start(self, argv, env, stdin, log_path) -> Process:
        if log_path is not None or stdin is not None:
            raise TransportError(f"{self.name}: a Slurm task runs only its step's program")
        return self.job.register(self.name, list(argv), env)

    def put(self, local_path, remote_path) -> None:
        shutil.copyfile(local_path, remote_path)

    def get(self, remote_path, local_path) -> None:
        shutil.copyfile(remote_path, local_path)


class SlurmJob:
    """One gate's job step on a Slurm cluster (see the module docstring). Use as a context manager: leaving it
    records the job and cancels whatever of it still runs.

    steps: the run's StepLog; control: the control host's transport (local) that runs srun, scontrol, scancel;
    nodes: the Slurm node names, one task each; drop_caches: each task drops its node's page cache before it
    starts its program (recorded in its provenance); cancel: the gate's cancellation (harness.execute.cancel):
    once it is set (the gate's timeout_s, Ctrl-C, SIGTERM) the job is cancelled at once."""

    def __init__(self, steps: Any, control: Transport, cluster: SlurmCluster, job_dir: str, job_name: str,
                 nodes: Sequence[str], time_limit_s: float, drop_caches: bool = False,
                 cancel: Any = None, progress: Callable[[str], None] = lambda m: None):
        self.steps, self.control, self.cluster = steps, control, cluster
        self.job_dir, self.job_name, self.nodes = job_dir, job_name, list(nodes)
        self.time_limit_s, self.drop_caches = time_limit_s, drop_caches
        self.token, self.progress = cancel, progress
        self._stopping: set[str] = set()
        self.tasks: dict[str, SlurmTask] = {}
        self.srun: Process | None = None
        self.srun_argv: tuple[str, ...] = ()
        self.submit_error: str | None = None
        self.spec_sha256: str | None = None
        self.job_id: str | None = None
        self.scontrol: dict[str, str] = {}
        self.cancelled: str | None = None
        self.scancel: dict | None = None  # the scancel sent, as a step records it
        self._argv: dict[str, list[str]] = {}
        self._lock = threading.Lock()
        Path(job_dir).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(program_path(TASK_PROGRAM), Path(job_dir) / TASK_PROGRAM)

    def transports(self) -> dict[str, SlurmNodeTransport]:
        """One launch backend per node, for `SynchronizedLaunch`."""
        return {n: SlurmNodeTransport(self, n) for n in self.nodes}

    def env(self) -> dict[str, str]:
        return dict(self.cluster.env)

    def register(self, node: str, argv: list[str], env: Mapping[str, str] | None) -> SlurmTask:
        if env:
            raise TransportError(f"{node}: a Slurm task's program takes no environment of its own")
        with self._lock:
            if node not in self.nodes:
                raise TransportError(f"{node} is not a node of this job ({', '.join(self.nodes)})")
            self._argv[node] = argv
            task = self.tasks[node] = SlurmTask(self, node)
            if len(self._argv) == len(self.nodes):
                self._submit()
        if self.submit_error:
            raise TransportError(self.submit_error)
        return task

    def _submit(self) -> None:
        spec = {n: {"argv": self._argv[n], "drop_caches": self.drop_caches} for n in self.nodes}
        text = json.dumps(spec, indent=1)
        self.spec_sha256 = hashlib.sha256(text.encode()).hexdigest()  # each task records the one it read
        (Path(self.job_dir) / "spec.json").write_text(text)
        self.srun_argv = srun_argv(self.cluster, self.job_name, self.nodes, self.time_limit_s, self.job_dir)
        try:
            self.srun, _ = self.steps.spawn(self.control, "srun", self.srun_argv, env=self.env() or None,
                                            log_path=f"{self.job_dir}/srun.log")
        except Exception as exc:  # noqa: BLE001 - a step that could not be submitted fails every task
            self.submit_error = f"srun could not start: {exc}"
            return
        if self.token is not None:
            threading.Thread(target=self._watch, name="kvgate-slurm-watch", daemon=True).start()

    def _watch(self) -> None:
        """The gate's cancellation, seen while srun runs: scancel at once (the runner stops the commands of the
        gate's node transports; this step runs through none of them)."""
        while self.srun is not None and self.srun.poll() is None:
            if self.token.is_set():
                self.cancel(f"the gate was stopped: {self.token.reason}")
                return
            time.sleep(0.2)

    def stopping(self, node: str) -> bool:
        """Mark ``node``'s task as being stopped; True when now every task of the step is stopped or over."""
        with self._lock:
            self._stopping.add(node)
            return all(n in self._stopping or self.tasks[n].poll() is not None for n in self.tasks)

    def task_error(self, node: str) -> str:
        """Why a task left no exit status: srun's own last words, when there are any."""
        try:
            tail = (Path(self.job_dir) / "srun.log").read_text(errors="replace").strip().splitlines()[-3:]
        except OSError:
            tail = []
        return f"\nslurm: the task on {node} left no exit status" + (f" (srun: {' | '.join(tail)})" if tail else "")

    def provenance(self) -> dict[str, dict]:
        """Each task's own record (NODE.task.json): its node, hostname, job and step id, rank, PIDs, start
        time and page cache drop."""
        out = {}
        for n in self.nodes:
            try:
                out[n] = json.loads((Path(self.job_dir) / f"{n}.task.json").read_text())
            except (OSError, ValueError):
                pass
        return out

    def _find_job_id(self) -> str | None:
        ids = {p.get("job_id") for p in self.provenance().values() if p.get("job_id")}
        return sorted(ids)[0] if ids else None

    def show_job(self, name: str = "scontrol-show-job") -> dict[str, str]:
        """``scontrol show job ID`` as a step, parsed; {} when the job id is not known or scontrol failed."""
        self.job_id = self.job_id or self._find_job_id()
        if not self.job_id:
            return {}
        r = self.steps.run(self.control, name, ("scontrol", "show", "job", self.job_id), timeout_s=30,
                           env=self.env() or None)
        return parse_scontrol_record(r.stdout) if r.ok else {}

    def cancel(self, reason: str) -> None:
        """``scancel`` the job (a step), then wait for srun to end; idempotent."""
        with self._lock:
            self.job_id = self.job_id or self._find_job_id()
            if self.srun is None or self.srun.poll() is not None or self.cancelled is not None:
                return
            self.cancelled = reason
        self.progress(f"slurm: scancel {self.job_id or self.job_name}: {reason}")
        argv = ("scancel", *((self.job_id,) if self.job_id else ("--name", self.job_name)))
        try:
            r = self.steps.run(self.control, "scancel", argv, timeout_s=30, env=self.env() or None)
        except GateEnded:
            # The gate ended (its timeout_s, a stop signal): its steps take no more writes, and the job must
            # still go. The command is run and kept in the job directory (scancel.json) and in record().
            r = self.control.run(argv, timeout_s=30, env=self.env() or None)
        self.scancel = {"argv": list(r.argv), "rc": r.rc, "stdout": r.stdout[-2000:], "stderr": r.stderr[-2000:],
                        "error": r.error, "reason": reason}
        (Path(self.job_dir) / "scancel.json").write_text(json.dumps(self.scancel, indent=1))
        if self.srun.wait(30.0) is None:
            self.srun.kill_group(grace_s=5.0)

    def __enter__(self) -> "SlurmJob":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(f"{exc_type.__name__} in orchestrator" if exc_type else "the gate's step is over")

    def close(self, reason: str) -> None:
        """Record the job (``scontrol show job``, again while it is COMPLETING: its NodeList then names only the
        nodes still completing), then cancel what still runs of it and wait for srun; :meth:`record` is what the
        gate's evidence keeps."""
        try:
            self.scontrol = self.show_job() or self.scontrol
            deadline = time.monotonic() + SETTLE_S
            tries = 1
            while not record_settled(self.scontrol) and time.monotonic() < deadline:
                time.sleep(0.5)
                tries += 1
                self.scontrol = self.show_job(f"scontrol-show-job-{tries}") or self.scontrol
        finally:
            self.cancel(reason)

    def record(self) -> dict:
        """What the run snapshot keeps of the job (``job_nodes``: the nodes Slurm allocated it, from a record that
        is not COMPLETING; None when the only record is)."""
        return {"job_id": self.job_id, "job_name": self.job_name, "nodes": self.nodes,
                "job_nodes": job_nodes(self.scontrol),
                "job_state": self.scontrol.get("JobState"),
                "srun_argv": list(self.srun_argv), "srun_rc": None if self.srun is None else self.srun.poll(),
                "submit_error": self.submit_error, "cancelled": self.cancelled, "scancel": self.scancel, "job_dir": self.job_dir,
                "spec_sha256": self.spec_sha256,
                "scontrol_show_job": self.scontrol, "tasks": self.provenance()}

