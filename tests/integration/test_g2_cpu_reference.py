"""gates/g2-cpu-reference.yaml end to end on the cpu-reference engine, run once exactly as the README's table gives
it (the shipped suite on inventory/localhost.yaml): G2 (real LMCache, real fs:// pool, real page-cache drop) and the
informational G2-multiturn gain (tests/integration/test_g2_multiturn_gain.py checks it on the same run), into one
signed bundle that verifies and re-derives."""

import json
import sys
from pathlib import Path

import pytest
import yaml

# Not skipped when torch/lmcache are missing: CI installs the cpu-engine extra and this must really run.

import harness.workloads.g2_ttft  # noqa: E402,F401  (registers g2-ttft)
from harness.report.bundle import generate_keypair, verify_bundle  # noqa: E402
from harness.config import load_config  # noqa: E402
from harness.workloads import WORKLOADS  # noqa: E402
from harness.suite.runner import run_suite  # noqa: E402
from harness.gates.verdict import Outcome  # noqa: E402

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _suite(tmp_path, **param_overrides):
    suite = yaml.safe_load((ROOT / "gates" / "g2-cpu-reference.yaml").read_text())
    # the G2 gate alone: the suite's informational G2-multiturn gate has its own test (test_g2_multiturn_gain.py)
    suite["gates"] = [g for g in suite["gates"] if g["id"] == "G2"]
    suite["gates"][0]["params"].update(python=sys.executable, **param_overrides)
    gates = tmp_path / "gates.yaml"
    gates.write_text(yaml.safe_dump(suite, sort_keys=False))
    inv = tmp_path / "inventory.yaml"
    inv.write_text(yaml.safe_dump({"nodes": [{"name": "localhost", "transport": "local",
                                              "work_dir": str(tmp_path / "work")}]}))
    return load_config(inv, gates, WORKLOADS)


def _run(tmp_path, config):
    key, pub = generate_keypair(tmp_path / "op")
    from cryptography.hazmat.primitives.serialization import load_pem_private_key
    private = load_pem_private_key(key.read_bytes(), None)
    out = run_suite(config, tmp_path / "out", private, progress=lambda m: print(m, flush=True))
    return out, pub


def test_cold_readback_beats_recompute_with_hits_and_bytes_from_the_pool(g2_cpu_reference_shipped):
    r, bundle, pub = g2_cpu_reference_shipped
    v = json.loads((bundle / "verdicts.json").read_text())["verdicts"][0]
    result = json.loads((bundle / "gates" / "G2" / "result.json").read_text())
    assert v["gate_id"] == "G2" and v["outcome"] == "PASS", (v["reason"], result, r.stderr[-2000:])
    m, ev = result["metrics"], result["evidence"]
    assert m["ttft_readback_p50_s"] < m["ttft_recompute_p50_s"]
    assert m["hit_rate"] >= 0.95
    assert ev["recompute_hit_tokens"] == 0
    assert ev["pool_after_populate"]["bytes"] >= ev["expected_kv_bytes"]
    assert m["readback_device_read_bytes"] > 0
    assert ev["page_cache_dropped"] is True
    # what the re-compute's stores cost the drive: at least the KV the pool gained reached the device (synced
    # before the read-back; other writers on this host's device only add), over the prompts it served
    e = ev["endurance"]
    print(f"re-compute wrote {e['device_write_bytes']} B for {e['stored_kv_bytes']} B of KV, "
          f"{e['write_bytes_per_mtok']:.4g} B per million tokens, {e['store_write_gb_s']:.4g} GB/s")
    assert e["device_write_bytes"] >= e["stored_kv_bytes"] == ev["pool_after_populate"]["bytes"] > 0
    assert e["served_tokens"] == ev["prompts"] * ev["prompt_tokens"][0]  # one length: prompts x its tokens
    assert e["window_s"] > 0 and e["write_amplification"] >= 1.0 and e["days_to_rating"] is None
    assert ev["lmcache_version_pinned"] == "0.5.6" and ev["versions"]["lmcache"] == "0.5.6"
    # every request is on disk, and the engine logs of both starts are in the bundle
    gate_dir = bundle / "gates" / "G2"
    for phase in ("recompute", "readback"):
        recs = [json.loads(l) for l in (gate_dir / f"requests-{phase}.jsonl").read_text().splitlines()]
        assert len(recs) == 2 and all(r["error"] is None and r["ttft_s"] > 0 for r in recs)
        assert "ready on http://127.0.0.1" in (gate_dir / f"engine-{phase}.log").read_text()
    # same prompts, same greedy output: the read-back KV is the KV that was computed
    rc = [json.loads(l)["output_text"] for l in (gate_dir / "requests-recompute.jsonl").read_text().splitlines()]
    rb = [json.loads(l)["output_text"] for l in (gate_dir / "requests-readback.jsonl").read_text().splitlines()]
    assert rc == rb
    res = verify_bundle(bundle, pub)
    assert res.ok
    # kvgate report's re-derivation: both phases' records, the read-back's probe steps, both engine logs
    from harness.gates.reevaluate import reevaluate_bundle
    again = reevaluate_bundle(bundle, res.statement["predicate"])
    assert again.same and again.checks[0].rederived, again.differences


def test_engine_that_crashes_at_start_is_error_with_its_log(tmp_path):
    # a negative MLP size: the KV shape is fine (kvgate accepts the config), but the model cannot be built,
    # so the engine exits with a traceback before serving
    bad = yaml.safe_load((ROOT / "gates" / "g2-cpu-reference.yaml").read_text())["gates"][0]["params"]
    bad["model_config_inline"]["intermediate_size"] = -1
    out, _ = _run(tmp_path, _suite(tmp_path, model_config_inline=bad["model_config_inline"]))
    v = out.verdicts[0]
    assert v.outcome is Outcome.ERROR
    assert "did not start" in v.reason and "exited with rc" in v.reason
    log = (out.run_dir / "gates" / "G2" / "engine-recompute.log").read_text()
    assert "Traceback" in log
