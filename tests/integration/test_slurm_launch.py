"""The slurm launcher's driver on this machine: `SynchronizedLaunch` over a `SlurmJob`, with stand-ins for srun,
scancel and scontrol (tests/fixtures/slurm/bin: local processes with Slurm's task environment) and the real task
program (harness/node/slurm_task.py). The real Slurm is test_g3_slurm.py's; this checks the protocol in seconds."""

import json
import os
import sys
import time
from pathlib import Path

import pytest

from harness.execute.fanout import FailurePolicy, LaunchSpec, SynchronizedLaunch
from harness.execute.slurm import SlurmCluster, SlurmJob
from harness.transport.local import LocalTransport
from harness.transport.steps import StepLog

BIN = Path(__file__).resolve().parents[1] / "fixtures" / "slurm" / "bin"
# Arms (prints its marker), waits for its go file, prints the start time it read, or sleeps forever with "hang".
PROGRAM = r"""
import sys, time, os
armed, go, mode = sys.argv[1:4]
open(armed, "w").close()
print('{"type":"armed"}', flush=True)
while not (os.path.exists(go) and open(go).read().endswith("\n")):
    time.sleep(0.01)
print("go " + open(go).read().strip(), flush=True)
if mode == "hang":
    for _ in range(600):
        print("sample", flush=True)
        time.sleep(0.1)
"""


def launch(tmp_path, modes):
    state = tmp_path / "fake"
    state.mkdir()
    job_dir = tmp_path / "jobs" / "run-G3"
    cluster = SlurmCluster(partition="rig", job_dir=str(tmp_path / "jobs"), python=sys.executable,
                           env={"PATH": f"{BIN}:{os.environ['PATH']}", "FAKE_SLURM_DIR": str(state)})
    prog = tmp_path / "prog.py"
    prog.write_text(PROGRAM)
    steps = StepLog(tmp_path / "run")
    job = SlurmJob(steps, LocalTransport(name="control"), cluster, str(job_dir), "kvgate-G3", list(modes), 120)
    specs = {n: LaunchSpec((sys.executable, str(prog), f"{job_dir}/{n}.armed", f"{job_dir}/{n}.go", m),
                           f"{job_dir}/{n}.armed", f"{job_dir}/{n}.go", b'{"type":"armed"')
             for n, m in modes.items()}
    sl = SynchronizedLaunch(job.transports(), specs, {n: 0.0 for n in modes}, FailurePolicy(),
                            log_dir=tmp_path / "gate")
    return job, sl, state, steps


def argvs(tmp_path):
    return [json.loads((d / "argv.json").read_text())["argv"] for d in sorted((tmp_path / "run" / "steps").iterdir())]


def test_one_step_every_node_armed_released_at_one_time_and_collected(tmp_path):
    job, sl, state, _ = launch(tmp_path, {"a": "end", "b": "end", "c": "end"})
    with job:
        with sl:
            assert sorted(sl.arm(timeout_s=30).succeeded) == ["a", "b", "c"]
            go = sl.release()
            assert sorted(sl.wait(timeout_s=30).succeeded) == ["a", "b", "c"]
    # One srun for the three nodes, then the job's record; nothing to cancel.
    runs = argvs(tmp_path)
    assert [a[0] for a in runs] == ["srun", "scontrol"]
    assert "--nodelist" in runs[0] and runs[0][runs[0].index("--nodelist") + 1] == "a,b,c"
    assert runs[0][runs[0].index("--ntasks-per-node") + 1] == "1"
    assert not (state / "scancel.log").exists()
    starts = {n: r.stdout.split("go ")[1].split()[0] for n, r in sl.runs.items()}
    assert set(starts.values()) == {f"{go:.6f}"} and all(r.rc == 0 for r in sl.runs.values())
    rec = job.record()
    assert rec["job_id"] == "4242" and rec["scontrol_show_job"]["JobState"] == "RUNNING"
    assert {t["node"]: t["task_rank"] for t in rec["tasks"].values()} == {"a": "0", "b": "1", "c": "2"}
    # each task records the spec it ran: the one kvgate wrote (G3 holds a self-reported run to it)
    assert rec["spec_sha256"] and {t["spec_sha256"] for t in rec["tasks"].values()} == {rec["spec_sha256"]}


def test_one_node_stopped_alone_the_others_read_on_then_scancel_ends_the_rest(tmp_path):
    job, sl, state, _ = launch(tmp_path, {"a": "end", "b": "hang", "c": "hang"})
    with job:
        with sl:
            sl.arm(timeout_s=30)
            sl.release()
            time.sleep(0.5)
            sl._stop_one("b", "stalled", grace_s=10)  # what a stall does: this node alone
            assert sl.runs["b"].rc is not None and sl.runs["c"].rc is None
            assert not (state / "scancel.log").exists()
            sl.wait(timeout_s=1)  # c hangs: the wait times out and stops every node left: the job is cancelled
    assert sl.runs["a"].rc == 0 and sl.runs["c"].rc not in (None, 0)
    assert (state / "scancel.log").read_text().split() == ["4242"]
    assert job.cancelled.startswith("every task stopped")
    assert ["scancel", "4242"] in argvs(tmp_path)
    assert job.srun.poll() is not None


def test_leaving_with_an_exception_cancels_the_job(tmp_path):
    job, sl, state, _ = launch(tmp_path, {"a": "hang", "b": "hang"})
    with pytest.raises(KeyboardInterrupt):
        with job:
            with sl:
                sl.arm(timeout_s=30)
                sl.release()
                raise KeyboardInterrupt
    assert (state / "scancel.log").read_text().split() == ["4242"]
    assert job.srun.wait(30) is not None
    assert all(r.rc is not None for r in sl.runs.values())
