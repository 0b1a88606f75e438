"""The tier's worth on the cpu-reference engine with the real LMCache 0.5.6, end to end as a user runs it: `kvgate
trace synth` writes a session trace, `kvgate run` of gates/g2-gain-cpu-reference.yaml replays it on two engines
(with LMCache, and with --no-kv-tier) interleaved over 3 trials, into a signed bundle that verifies: PASS with both
arms proven (the tier served the returning sessions' context; without it nothing came from a tier). The same gate
with an engine memory that holds the whole working set (engine_cache_tokens) is INVALID: the tier arm was served
from engine memory, not from the tier. The capacity curve (gates/g2-gain-capacity-cpu-reference.yaml): a
working-set sweep from half the engine memory to 4x it, engine memory serving the reuse below the knee and
LMCache's RAM level past it, its requirement PASS and the curve drawn in the signed report."""

import json
from pathlib import Path

import pytest
import yaml

from kvgate_cli import kvgate, signed_run
from polling import wait_no_process

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("gain")
    home, trace = d / "home", d / "trace.jsonl"
    synth = kvgate("trace", "synth", "--out", trace, "--sessions", "4", "--turns", "3", "--system-prompts", "1",
                   "--system-prompt-tokens", "1024", "--user-tokens", "256", "--output-tokens", "4", "--rate-rps",
                   "4", "--think-time-s", "0.5", "--block-tokens", "256", "--seed", "1", home=home)
    assert synth.returncode == 0, synth.stderr
    assert kvgate("keygen", "--out", d / "op", home=home).returncode == 0
    inv = d / "inventory.yaml"
    inv.write_text(yaml.safe_dump({"nodes": [{"name": "cpu1", "transport": "local", "read_streams": 1,
                                              "work_dir": str(d / "work")}]}))
    return d, home, trace, inv


def run_gate(setup, name: str, **params):
    d, home, trace, inv = setup
    suite = yaml.safe_load((ROOT / "gates" / "g2-gain-cpu-reference.yaml").read_text())
    suite["gates"][0]["params"]["load"]["path"] = str(trace)
    suite["gates"][0]["params"].update(params)
    gates = d / f"{name}.yaml"
    gates.write_text(yaml.safe_dump(suite, sort_keys=False))
    r, bundle = signed_run(inv, gates, d / name, d / "op.key", home, timeout=900)
    result = json.loads((bundle / "gates" / "G2-gain" / "result.json").read_text())
    v = json.loads((bundle / "verdicts.json").read_text())["verdicts"][0]
    wait_no_process(str(d / "work") + "/")
    return r, bundle, result, v


def test_the_tier_arm_passes_with_both_arms_proven_and_the_bundle_verifies(setup):
    r, bundle, result, v = run_gate(setup, "pass")
    assert r.returncode == 0 and v["outcome"] == "PASS", (v["reason"], result["invalid_reason"], result["error"])
    assert "95 % CI" in v["reason"] and "3 trials" in v["reason"]
    m, ev = result["metrics"], result["evidence"]
    assert {c["name"]: c["ok"] for c in ev["validity"]} == {
        "tier arm valid": True, "no_tier arm valid": True, "tier served the reuse": True,
        "recomputed without the tier": True}
    for fig in ("throughput_gain", "ttft_p50_ratio", "ttft_p95_ratio"):
        assert m[f"{fig}_ci_low"] <= m[fig] <= m[f"{fig}_ci_high"] and m[f"{fig}_ci_trials"] == 3, fig
    assert m["ttft_p50_ratio"] < 1  # the tier arm's median TTFT is below the one that recomputes
    tier, none = ev["proofs"]["tier"], ev["proofs"]["no_tier"]
    # every session's later turns found their context (at least the 1024-token system prompt) in the tier
    assert tier["tier_hit_tokens"] >= 3 * 8 * 1024 and tier["memory_hit_tokens"] == 0
    assert none["tier_hit_tokens"] == 0 and none["recomputed_tokens"] == none["prompt_tokens"]
    assert [p["first"] for p in ev["pairs"]] == ["tier", "no_tier", "tier"]
    d, home = setup[0], setup[1]
    vr = kvgate("verify", f"{bundle}.tar.gz", "--pubkey", d / "op.pub", home=home)
    assert vr.returncode == 0 and vr.stdout.startswith("OK "), vr.stdout + vr.stderr


def test_a_tier_arm_whose_engine_memory_holds_the_working_set_is_invalid_not_pass(setup):
    # 32k tokens of engine memory hold the whole trace's working set (6144 tokens): the returning sessions find
    # their context in the engine, and the tier serves nothing
    r, _, result, v = run_gate(setup, "fits", engine_cache_tokens=32768, trials=1)
    assert v["outcome"] == "INVALID" and r.returncode != 0, v
    assert result["invalid_reason"].startswith("tier served the reuse"), result["invalid_reason"]
    assert result["evidence"]["proofs"]["tier"]["memory_hit_tokens"] > 0


def test_the_capacity_curve_hands_the_reuse_from_engine_memory_to_lmcache_at_the_knee(setup):
    d, home, _, inv = setup
    r, bundle = signed_run(inv, ROOT / "gates" / "g2-gain-capacity-cpu-reference.yaml", d / "capacity", d / "op.key",
                           home, timeout=600)
    result = json.loads((bundle / "gates" / "G2-capacity" / "result.json").read_text())
    v = json.loads((bundle / "verdicts.json").read_text())["verdicts"][0]
    wait_no_process(str(d / "work") + "/")
    assert r.returncode == 0 and v["outcome"] == "PASS", (v["reason"], result["invalid_reason"], result["error"])
    ev = result["evidence"]
    assert {c["name"]: c["ok"] for c in ev["validity"]} == {
        "tier arm valid": True, "levels counted": True, "engine memory held the smallest working set": True}
    cap = ev["capacity"]
    curve = {c["label"]: c["figures"] for c in cap["curve"]}
    assert [(c["label"], c["sessions"]) for c in cap["curve"]] == [("x0.5", 1), ("x1", 2), ("x2", 4), ("x4", 8)]
    # up to engine memory (1024 tokens: two sessions of 512) the engine's own prefix cache serves every
    # returning context; past it, round-robin over 4 and 8 sessions, it serves none and LMCache's RAM level all
    for x in ("x0.5", "x1"):
        assert curve[x]["memory_hit_rate"] == 1.0 and curve[x]["ram_hit_rate"] == 0, (x, curve[x])
    for x in ("x2", "x4"):
        assert curve[x]["memory_hit_rate"] == 0 and curve[x]["ram_hit_rate"] == 1.0, (x, curve[x])
        assert curve[x]["recomputed_rate"] == 0 and curve[x]["goodput_rps"] > 0
    assert cap["knee_x"] == 2 and result["metrics"]["capacity_hit_rate"] == 1.0
    # the fs:// pool never evicts and cpu-reference does not count tier evictions: no "tier full" point claimed
    assert cap["tier_exhausted_x"] is None and not cap["tier_evictions_counted"]
    (svg,) = (bundle / "charts").glob("*capacity-curve.svg")
    assert "knee 2x" in svg.read_text()
