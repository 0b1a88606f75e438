"""G3 through the `slurm` launcher on the 8-node rig: a real slurmctld + one slurmd per rig node (Debian's 22.05,
munge), started by the fixture in a private state dir and stopped by PID (harness/rigs/slurm.py).

One rig and one cluster for the whole module. Needs root and what scripts/setup.sh --test installs.
"""

import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml

from harness.config import load_config
from harness.execute.slurm import parse_scontrol_record, parse_sinfo_nodes
from harness.gates.verdict import Outcome
from harness.report.bundle import generate_keypair, load_private_key, verify_bundle
from harness.rigs.netns import RigSpec, check_prerequisites, kill_node, node_processes, rig_down, rig_up
from harness.rigs.slurm import check_slurm_prerequisites, remove_state, slurm_down, slurm_up
from harness.suite.runner import run_suite
from harness.workloads import WORKLOADS
import harness.workloads.g3_shared_read  # noqa: F401

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
missing = check_prerequisites() + check_slurm_prerequisites()
if missing:
    pytest.skip(f"rig/slurm prerequisites missing: {', '.join(missing)}", allow_module_level=True)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    spec = RigSpec(prefix="kvgsl-", state_dir=tmp_path_factory.mktemp("rig"), node_count=8, port_rate_mbit=500,
                   subnet="10.79.0.0/24")
    st = None
    try:
        state = rig_up(spec)
        st = slurm_up(spec, state, tmp_path_factory.mktemp("slurm"))
        yield spec, state, st
    finally:
        if st is not None:
            slurm_down(st)
        rig_down(spec)
        if st is not None:
            remove_state(st)


def inventory(spec, state, st, tmp_path) -> Path:
    inv = yaml.safe_load(Path(state.inventory_path).read_text())
    job_dir = tmp_path / "jobs"
    inv["slurm"] = {"partition": st.partition, "job_dir": str(job_dir), "env": st.env(), "time_margin_s": 60}
    p = tmp_path / "inventory.yaml"
    p.write_text(yaml.safe_dump(inv, sort_keys=False))
    return p


def run_g3(cluster, tmp_path, gate_timeout_s=None, **params):
    spec, state, st = cluster
    data = yaml.safe_load((REPO / "gates" / "g3-rig.yaml").read_text())
    data["gates"][0]["params"].update({"chunks": 4, "read_timeout_s": 90, "launcher": "slurm"}, **params)
    if gate_timeout_s is not None:
        data["gates"][0]["timeout_s"] = gate_timeout_s
    g = tmp_path / "g3.yaml"
    g.write_text(yaml.safe_dump(data, sort_keys=False))
    out = tmp_path / "out"
    out.mkdir()
    generate_keypair(out / "k")
    cfg = load_config(inventory(spec, state, st, tmp_path), g, WORKLOADS)
    res = run_suite(cfg, out, load_private_key(out / "k.key"), known_hosts_path=state.known_hosts,
                    progress=lambda m: None)
    return res, out


def squeue(st) -> str:
    return subprocess.run(["squeue", "-h", "-o", "%i %T"], env={**os.environ, **st.env()}, capture_output=True,
                          text=True, timeout=30).stdout.strip()


def no_job_within(st, timeout_s=60.0) -> str:
    """squeue's jobs once none is left, or what is still there after ``timeout_s``. A cancelled job is
    COMPLETING for a moment (its epilog; on a node that died, until slurmctld marks the node down): the tasks
    are gone by then (readers_left), the job's record follows."""
    deadline = time.time() + timeout_s
    while (left := squeue(st)) and time.time() < deadline:
        assert "RUNNING" not in left, left
        time.sleep(1)
    return left


def readers_left(spec):
    return {n: [c for _, c in node_processes(spec, n) if "g3_reader.py" in c or "slurm_task.py" in c]
            for n in spec.node_names()}


def test_sinfo_shows_every_rig_node_idle_and_srun_runs_one_task_per_namespace(cluster):
    spec, _, st = cluster
    env = {**os.environ, **st.env()}
    nodes = parse_sinfo_nodes(subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=env, capture_output=True,
                                             text=True, timeout=30).stdout)
    assert nodes == {n: "idle" for n in spec.node_names()}
    cp = subprocess.run(["srun", "-N8", "--ntasks-per-node=1", "sh", "-c", 'echo "$(hostname) $SLURMD_NODENAME"'],
                        env=env, capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    assert sorted(cp.stdout.split("\n")[:-1]) == sorted(f"{n} {n}" for n in spec.node_names())


def test_g3_through_slurm_passes_with_the_ssh_bounds_and_records_the_job(cluster, tmp_path):
    spec, _, st = cluster
    res, out = run_g3(cluster, tmp_path)
    v = res.verdicts[0]
    assert v.outcome is Outcome.PASS, v.reason
    m = v.metrics
    assert m["nodes_completed"] == 8
    assert 0.90 <= m["nic_ceiling_ratio"] <= 1.02  # the same bounds as test_g3_rig (through SSH)
    ev = v.evidence
    assert ev["launcher"] == "slurm" and ev["clock_alignment"] == "assume_synced"
    starts = ev["start_times_node_clock_s"].values()
    assert max(starts) - min(starts) < 0.25  # the same skew bound as through SSH
    assert all(d["dropped"] for d in ev["page_cache_dropped"].values()) and len(ev["page_cache_dropped"]) == 8
    job = ev["slurm_job"]
    assert job["job_id"] and job["job_nodes"] == spec.node_names()
    assert job["scontrol_show_job"]["JobId"] == job["job_id"]
    assert {t["node"]: t["hostname"] for t in job["tasks"].values()} == {n: n for n in spec.node_names()}
    assert {t["job_id"] for t in job["tasks"].values()} == {job["job_id"]}
    # the tasks' files are self-reported: held to the job's frame, the copy's size and the spec kvgate wrote
    checks = {c["name"]: c for c in ev["validity"]}
    assert checks["self-reported figures"]["ok"], checks["self-reported figures"]["how"]
    assert checks["port rate"]["ok"] and checks["within line rate"]["ok"]
    assert ev["time_frame"]["not_before_s"] < min(starts) and ev["time_frame"]["max_duration_s"] >= 60
    assert {t["spec_sha256"] for t in job["tasks"].values()} == {job["spec_sha256"]}
    assert all(n["bytes_read"] == ev["copy_bytes"] for n in ev["nodes"].values())
    run_dir = res.run_dir
    for n in spec.node_names():
        assert '"end"' in (run_dir / "gates" / "G3" / "nodes" / n / "reader.jsonl").read_text()
    # Every command sent to Slurm is a step of the run, and no SSH session started a reader.
    argvs = [json.loads((d / "argv.json").read_text())["argv"] for d in (run_dir / "steps").iterdir()
             if (d / "argv.json").exists()]
    assert any(a[0] == "srun" and "slurm_task.py" in " ".join(a) for a in argvs)
    assert any(a[:3] == ["scontrol", "show", "job"] for a in argvs)
    assert not any("g3_reader.py" in " ".join(a) and a[0] == "sh" for a in argvs)
    assert verify_bundle(res.bundle.path, out / "k.pub").ok
    assert readers_left(spec) == {n: [] for n in spec.node_names()}
    assert no_job_within(st) == ""


def steps_argv(run_dir):
    return [json.loads((d / "argv.json").read_text())["argv"] for d in sorted((run_dir / "steps").iterdir())
            if (d / "argv.json").exists()]


def test_scancel_when_the_read_times_out_leaves_no_task_running(cluster, tmp_path):
    spec, _, st = cluster
    # A read far too long for its timeout: the port at 500 Mbit/s needs ~35 s for 64 chunks x 8 nodes.
    res, _ = run_g3(cluster, tmp_path, chunks=64, read_timeout_s=4)
    v = res.verdicts[0]
    assert v.outcome is Outcome.ERROR
    job = v.evidence["slurm_job"]
    assert job["cancelled"].startswith("every task stopped") and job["job_id"]
    assert ["scancel", job["job_id"]] in steps_argv(res.run_dir)
    assert readers_left(spec) == {n: [] for n in spec.node_names()}
    assert no_job_within(st) == ""


def test_scancel_at_the_gates_timeout_s_leaves_no_task_running(cluster, tmp_path):
    spec, _, st = cluster
    t0 = time.time()
    res, _ = run_g3(cluster, tmp_path, gate_timeout_s=15, chunks=64, read_timeout_s=300)
    assert time.time() - t0 < 120  # the gate's 15 s, not the read's 300 s
    v = res.verdicts[0]
    assert v.outcome is Outcome.ERROR and "timed out" in v.reason
    # The gate's steps take no writes once it ended: the scancel is kept in the job's directory.
    sent = [json.loads(f.read_text()) for f in (tmp_path / "jobs").glob("*/scancel.json")]
    assert len(sent) == 1 and sent[0]["argv"][0] == "scancel" and sent[0]["rc"] == 0
    assert "timed out" in sent[0]["reason"]
    assert readers_left(spec) == {n: [] for n in spec.node_names()}
    assert no_job_within(st) == ""


def test_a_drained_node_fails_before_the_step_and_the_others_read(cluster, tmp_path):
    spec, _, st = cluster
    env = {**os.environ, **st.env()}
    scontrol = ["scontrol", "update", "nodename=n3"]
    subprocess.run(scontrol + ["state=drain", "reason=kvgate-test"], env=env, check=True, timeout=30)
    try:
        res, _ = run_g3(cluster, tmp_path, max_failed_share=0.2)
    finally:
        subprocess.run(scontrol + ["state=resume"], env=env, check=True, timeout=30)
    v = res.verdicts[0]
    ev = v.evidence
    assert ev["failed_nodes"] == {"n3": "slurm: node state drain"}
    assert v.metrics["nodes_completed"] == 7 and "n3" not in ev["slurm_job"]["nodes"]
    assert v.outcome is Outcome.PASS, v.reason  # one node of eight is within the gate's 0.2 failure share


def test_node_killed_mid_read_is_error_with_the_others_data_kept(cluster, tmp_path):
    spec, _, st = cluster
    victim = "n3"
    killed = []
    jobs = tmp_path / "jobs"

    def killer():
        deadline = time.time() + 120
        while time.time() < deadline:
            for f in jobs.glob(f"*/{victim}.series.jsonl"):
                if f.read_text().count('"sample"') >= 10:
                    killed.extend(kill_node(spec, victim))
                    return
            time.sleep(0.05)

    th = threading.Thread(target=killer, daemon=True)
    th.start()
    res, out = run_g3(cluster, tmp_path, stall_timeout_s=8)
    th.join(5)
    assert killed, "the reader on the victim never produced samples"
    v = res.verdicts[0]
    assert v.outcome is Outcome.ERROR and victim in v.reason
    ev = v.evidence
    assert set(ev["failed_nodes"]) == {victim}
    assert ev["nodes"][victim]["samples"] >= 1 and not ev["nodes"][victim]["completed"]
    others = [n for n in spec.node_names() if n != victim]
    assert all(ev["nodes"][n]["completed"] for n in others)
    assert v.metrics["nodes_completed"] == 7
    assert res.bundle is not None and verify_bundle(res.bundle.path, out / "k.pub").ok
    assert readers_left(spec) == {n: [] for n in spec.node_names()}
    assert no_job_within(st, 120) == ""  # the dead node's part ends when it is marked down


def test_captured_scontrol_output_parses(cluster):
    _, _, st = cluster
    env = {**os.environ, **st.env()}
    cp = subprocess.run(["scontrol", "show", "node", "n1"], env=env, capture_output=True, text=True, timeout=30)
    rec = parse_scontrol_record(cp.stdout)
    assert rec["NodeName"] == "n1" and rec["Partitions"] == st.partition
