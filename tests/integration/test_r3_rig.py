"""R3 on a 2-node rig: the cpu-reference engine (real LMCache 0.5.6, CPU) on n1 stores prompts' KV into
the shared pool (sshfs through the storage namespace's shaped port); a fresh engine on n2 serves the same
prompts from it. Runs through run_suite (the `kvgate run` path) and checks the signed bundle.

Needs root, /dev/fuse, iproute2, openssh-server, sshfs, and torch/transformers/lmcache (CI installs the
cpu-engine extra: not skipped when they are missing). The rig is torn down by name/PID in the fixture.
"""

import subprocess
from pathlib import Path

import pytest
import yaml

from harness.report.bundle import generate_keypair, load_private_key, verify_bundle
from harness.config import load_config
from harness.workloads import WORKLOADS
from harness.rigs.netns import RigSpec, check_prerequisites, existing_namespaces, node_processes, rig_down, rig_up
from harness.suite.runner import run_suite
from harness.gates.verdict import Outcome
import harness.workloads.r3_cross_instance  # noqa: F401  (registers r3-cross-instance)

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
missing = check_prerequisites()
if missing:
    pytest.skip(f"rig prerequisites missing: {', '.join(missing)}", allow_module_level=True)


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    spec = RigSpec(prefix="kvgr-", state_dir=tmp_path_factory.mktemp("rig"), node_count=2, subnet="10.78.0.0/24")
    try:
        yield spec, rig_up(spec)
    finally:
        rig_down(spec)
    assert not any(ns.startswith("kvgr-") for ns in existing_namespaces())


def run_r3(rig, tmp_path, **params):
    spec, state = rig
    data = yaml.safe_load((REPO / "gates" / "r3-cpu-reference.yaml").read_text())
    data["gates"][0]["params"].update(params)
    suite = tmp_path / "r3.yaml"
    suite.write_text(yaml.safe_dump(data, sort_keys=False))
    out = tmp_path / "out"
    out.mkdir()
    generate_keypair(out / "k")
    res = run_suite(load_config(state.inventory_path, suite, WORKLOADS), out, load_private_key(out / "k.key"),
                    known_hosts_path=state.known_hosts, progress=lambda m: print(m, flush=True))
    return res, out


def engines_left(spec):
    return {n: [c for _, c in node_processes(spec, n) if "cpu_reference" in c] for n in spec.node_names()}


def test_reader_instance_hits_the_kv_the_writer_instance_stored_in_the_shared_pool(rig, tmp_path):
    spec, state = rig
    res, out = run_r3(rig, tmp_path)
    v = res.verdicts[0]
    assert v.outcome is Outcome.PASS, v.reason
    assert v.metrics["hit_rate"] >= 0.95
    ev = v.evidence
    assert ev["writer_hit_tokens"] == 0 and ev["writer_query_tokens"] == 2 * 1536  # new to the pool
    assert ev["reader_query_tokens_before"] == 0  # the reader had never looked anything up
    assert ev["reader_query_tokens"] == 2 * 1536
    assert ev["reader_read_bytes"] == ev["reader_hit_tokens"] * ev["kv_bytes_per_token"] > 0
    # The same chunk files, written on n1, seen on n2 through its own mount of the pool.
    assert ev["pool_after_writer"]["bytes"] >= ev["expected_kv_bytes"]
    assert ev["pool_seen_from_reader_before"]["files"] == ev["pool_after_writer"]["files"] > 0
    # ... and they are in the storage namespace's pool, i.e. they went through the storage port.
    assert len(list(spec.pool_dir.glob(f"kvgate-r3/run-{ev['run_tag']}/*.data"))) == ev["pool_after_writer"]["files"]
    assert verify_bundle(res.bundle.path, out / "k.pub").ok
    assert (res.run_dir / "gates" / "R3" / "engine-reader.log").stat().st_size > 0
    assert engines_left(spec) == {n: [] for n in spec.node_names()}


def test_reader_whose_pool_mount_is_gone_misses_and_the_gate_stops(rig, tmp_path):
    # Runs last: n2's sshfs mount of the pool is detached, so n2's pool path falls through to an empty
    # local directory, as on a node whose shared mount silently went away. The writer still stores, the
    # reader finds nothing: R3 must not pass, and the evidence shows the reader could not see the files.
    spec, state = rig
    cp = subprocess.run(["ssh", "-F", str(spec.ssh_config_path), "n2", "umount", "-l", str(spec.pool_mount)],
                        capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    res, _ = run_r3(rig, tmp_path)
    v = res.verdicts[0]
    assert v.outcome is Outcome.STOP, v.reason
    assert v.metrics["hit_rate"] == 0.0
    ev = v.evidence
    assert ev["pool_after_writer"]["files"] > 0 and ev["pool_seen_from_reader_before"]["files"] == 0
    assert engines_left(spec) == {n: [] for n in spec.node_names()}
