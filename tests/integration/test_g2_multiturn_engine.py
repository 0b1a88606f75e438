"""G2 multi-turn gain on the cpu-reference engine: two real instances (with and without the LMCache tier),
sessions returning after eviction from the engine's own KV memory, informational gate, signed bundle."""

import json
import sys
from pathlib import Path

import pytest
import yaml

import harness.workloads.g2_multiturn  # noqa: F401  (registers g2-multiturn)
from harness.report.bundle import generate_keypair, verify_bundle
from harness.config import load_config
from harness.workloads import WORKLOADS
from harness.suite.runner import run_suite
from harness.gates.verdict import Outcome

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _run(tmp_path, **overrides):
    suite = yaml.safe_load((ROOT / "gates" / "g2-cpu-reference.yaml").read_text())
    suite["gates"] = [g for g in suite["gates"] if g["id"] == "G2-multiturn"]
    suite["gates"][0]["params"].update(python=sys.executable, **overrides)
    (tmp_path / "gates.yaml").write_text(yaml.safe_dump(suite, sort_keys=False))
    (tmp_path / "inv.yaml").write_text(yaml.safe_dump({"nodes": [{"name": "localhost", "transport": "local",
                                                                   "work_dir": str(tmp_path / "work")}]}))
    config = load_config(tmp_path / "inv.yaml", tmp_path / "gates.yaml", WORKLOADS)
    key, pub = generate_keypair(tmp_path / "op")
    from cryptography.hazmat.primitives.serialization import load_pem_private_key
    out = run_suite(config, tmp_path / "out", load_pem_private_key(key.read_bytes(), None),
                    progress=lambda m: print(m, flush=True))
    result = json.loads((out.run_dir / "gates" / "G2-multiturn" / "result.json").read_text())
    return out, pub, result


def test_returning_sessions_read_their_context_from_the_tier(tmp_path):
    out, pub, result = _run(tmp_path)
    v = out.verdicts[0]
    assert v.outcome is Outcome.INFO, (v.reason, result)  # informational: measured, never decides
    m, ev = result["metrics"], result["evidence"]
    assert m["throughput_gain_ratio"] == pytest.approx(m["tier_throughput_tokens_per_s"]
                                                      / m["no_tier_throughput_tokens_per_s"])
    nt, t = ev["no_tier"], ev["tier"]
    # sessions came back after their KV left engine memory, in both instances
    assert nt["returning_memory_hit_tokens"] == 0 and t["returning_memory_hit_tokens"] == 0
    assert nt["memory_evicted_tokens"] > 0
    # with the tier all earlier context came back from LMCache, and far fewer tokens were computed
    assert m["tier_hit_rate"] >= 0.9 and t["tier_read_bytes"] > 0
    assert nt["returning_tier_hit_tokens"] == 0
    assert t["prefill_tokens"] < 0.6 * nt["prefill_tokens"]
    # same conversation, same greedy tokens: the KV read back is the KV that was computed
    assert ev["outputs_matching"] == 18
    gate_dir = out.run_dir / "gates" / "G2-multiturn"
    for name in ("no_tier", "tier"):
        assert len((gate_dir / f"requests-{name}.jsonl").read_text().splitlines()) == 18
        assert "ready on http://127.0.0.1" in (gate_dir / f"engine-{name}.log").read_text()
    assert "kv_tier=False" in (gate_dir / "engine-no_tier.log").read_text()
    assert verify_bundle(out.bundle.path, pub).ok


def test_sessions_still_in_engine_memory_make_it_invalid(tmp_path):
    # engine memory large enough to keep every session: the gain would not be the tier's
    out, _, result = _run(tmp_path, sessions=2, turns=2, first_prompt_tokens=256, user_tokens=64, reply_tokens=0,
                          gpu_cache_tokens=100000)
    v = out.verdicts[0]
    assert v.outcome is Outcome.INVALID, (v.reason, result)
    assert "still in engine" in v.reason
