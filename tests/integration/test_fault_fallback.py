"""G2 under failure for real (gates/g2-faults-cpu-reference.yaml): the cpu-reference engine with the real LMCache
0.5.6 on rig node n1 keeps its KV pool on n1's sshfs mount of the storage node's pool; kvgate stores the prompts,
restarts the engine, then serves them one at a time while it drops every packet from n1 to the pool's server
(a blackhole route on n1 for the server's address) and puts the path back. Runs through run_suite (the `kvgate run`
path) and checks the signed bundle: what each request was served from, counted from the engine's counters (a
fall-back is never a hit), the verdict, and n1 left as it was found.

Needs root, /dev/fuse, iproute2, openssh-server, sshfs (skipped without them, as the other rig modules) and
torch/transformers/lmcache (the cpu-engine extra; not skipped when missing: CI installs it).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from harness.config import load_config
from harness.gates.verdict import Outcome
from harness.report.bundle import generate_keypair, load_private_key, verify_bundle
from harness.rigs.netns import RigSpec, check_prerequisites, existing_namespaces, node_processes, rig_down, rig_up
from harness.suite.runner import run_suite
from harness.workloads import WORKLOADS

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "kvgff-"
missing = check_prerequisites()
if missing:
    pytest.skip(f"rig prerequisites missing: {', '.join(missing)}", allow_module_level=True)


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    spec = RigSpec(prefix=PREFIX, state_dir=tmp_path_factory.mktemp("rig"), node_count=1, subnet="10.84.0.0/24")
    try:
        yield spec, rig_up(spec)
    finally:
        rig_down(spec)
    assert not any(ns.startswith(PREFIX) for ns in existing_namespaces())


@pytest.fixture(scope="module")
def faulted(rig, tmp_path_factory):
    spec, state = rig
    d = tmp_path_factory.mktemp("g2faults")
    key, pub = generate_keypair(d / "op")
    out = run_suite(load_config(state.inventory_path, ROOT / "gates" / "g2-faults-cpu-reference.yaml", WORKLOADS),
                    d / "out", load_private_key(key), known_hosts_path=state.known_hosts,
                    progress=lambda m: print(m, flush=True))
    assert verify_bundle(out.bundle.path, pub).ok
    gate = out.verdicts[0].gate_id
    return out, json.loads((out.run_dir / "gates" / gate / "result.json").read_text())


def n1(spec, *argv: str) -> str:
    cp = subprocess.run(["ssh", "-F", str(spec.ssh_config_path), "n1", *argv], capture_output=True, text=True,
                        timeout=60)
    return cp.stdout


def test_a_lost_pool_path_stalls_the_engine_a_detached_pool_makes_it_recompute_reported_degraded(rig, faulted):
    spec, _ = rig
    out, result = faulted
    v, ev = out.verdicts[0], result["evidence"]
    reqs = ev["requests"]
    print(json.dumps([{k: r[k] for k in ("index", "t_start_s", "t_end_s", "ttft_s", "served", "window",
                                         "hit_tokens")} for r in reqs]), ev["faults"], v.reason, sep="\n")
    # before the faults the tier served every request: the engine's hit counter grew by the prompt's stored KV
    assert all(r["served"] == "tier" and r["hit_tokens"] >= r["expected_hit_tokens"] > 0
               for r in reqs if r["window"] == "before")
    loss, unmount = ev["faults"]
    assert all(f["applied_ok"] and f["undone_ok"] and f["undone_by"] == "workload" for f in (loss, unmount))
    assert ev["pool_server"] == spec.storage_addr and ev["pool_mount_point"] == str(spec.pool_mount)
    # the path lost: LMCache's lookup waits on the mount, the engine stalls for the outage and then serves from the
    # tier (nothing re-computed, nothing failed), and the stall is measured
    assert loss["requests"] >= 1 and loss["recompute"] == 0 and loss["failed"] == 0
    outage = loss["t_undo_s"] - loss["t_apply_s"]
    assert loss["max_ttft_s"] >= outage / 2, (loss, outage)
    # the pool detached: the engine finds nothing and re-computes; counted as such, never as hits
    fell_back = [r for r in reqs if r["served"] == "re-compute"]
    assert unmount["recompute"] >= 1 and len(fell_back) == unmount["recompute"]
    assert all(r["hit_tokens"] == 0 and r["error"] is None and r["window"] == "during" for r in fell_back)
    assert result["metrics"]["recompute_requests"] == len(fell_back)
    assert result["metrics"]["tier_requests"] == len(reqs) - len(fell_back)
    assert all(r["answer_matches"] for r in reqs)  # the same answers, however they were served
    # the verdict: within the stall bound, and says, visibly, what was degraded
    assert v.outcome is Outcome.PASS, v.reason
    assert f"DEGRADED: {len(fell_back)} of {len(reqs)} request(s) fell back to re-compute" in v.reason
    # the tier served again after each undo, and n1 is as it was found
    assert loss["recovery_s"] is not None and unmount["recovery_s"] is not None
    assert "blackhole" not in n1(spec, "ip", "route", "show")
    assert n1(spec, "findmnt", "-n", "-o", "FSTYPE", str(spec.pool_mount)).strip() == "fuse.sshfs"
    assert not any("cpu_reference" in c for _, c in node_processes(spec, "n1"))
    # the signed bundle's report draws the timeline: every request by source, each fault and its inverse marked
    svg = (out.bundle.path / "charts" / f"{v.gate_id}-timeline.svg").read_text()
    assert all(f'id="{i}"' in svg for i in ("ttft-tier", "ttft-re-compute", "fault-made-0", "fault-undone-0",
                                             "fault-made-1", "fault-undone-1"))
    assert f'id="chart-{v.gate_id}-timeline"' in (out.bundle.path / "report.html").read_text()
