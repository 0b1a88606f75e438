"""G2-multiturn (gates/g2-cpu-reference.yaml): g2-gain on multi-turn sessions, on the cpu-reference engine with the
real LMCache 0.5.6. Two real engines (with the tier, and with --no-kv-tier), both with 2048 tokens of engine memory;
6 sessions x 3 turns come back round-robin, in that order by one user, after that memory evicted them (the order
makes the eviction certain: the engine's lock is not first-come first-served, so requests queued on it by their
timestamps could be served out of order). Informational gate, signed bundle: the shipped suite's run exactly as
the README's table gives it, shared with test_g2_cpu_reference.py."""

import json
from pathlib import Path

import pytest

from harness.report.bundle import verify_bundle

pytestmark = pytest.mark.integration


def _records(path: Path) -> dict[str, dict]:
    return {r["request_id"]: r for r in map(json.loads, path.read_text().splitlines())}


def test_returning_sessions_read_their_context_from_the_tier_not_from_engine_memory(g2_cpu_reference_shipped):
    # the shipped suite's second gate, on its run exactly as the README's table gives it (tests/integration/conftest.py)
    r, bundle, pub = g2_cpu_reference_shipped
    v = json.loads((bundle / "verdicts.json").read_text())["verdicts"][1]
    result = json.loads((bundle / "gates" / "G2-multiturn" / "result.json").read_text())
    assert v["gate_id"] == "G2-multiturn" and v["outcome"] == "INFO", (v["reason"], result)  # measured, never decides
    m, ev = result["metrics"], result["evidence"]
    assert {c["name"]: c["ok"] for c in ev["validity"]} == {
        "tier arm valid": True, "no_tier arm valid": True, "arms equal but the tier switch": True,
        "tier served the reuse": True,
        "recomputed without the tier": True}, ev["validity"]
    assert "(1 trial, no interval)" in v["reason"]
    # the gain is the tier arm's completed request rate over the other's
    (pair,) = ev["pairs"]
    rate = pair["request_rate_rps"]
    assert m["throughput_gain"] == pytest.approx(rate["tier"] / rate["no_tier"] - 1)
    assert m["throughput_gain"] > 0
    # 12 returning turns, each finding its session's previous turn (1024 or 1280 tokens): 13824 tokens any cache
    # could serve, 60 % of the 23040 prompt tokens
    assert ev["reusable_share"] == pytest.approx(0.6)
    tier, none = ev["proofs"]["tier"], ev["proofs"]["no_tier"]
    # sessions came back after their KV left engine memory, in both arms
    assert tier["memory_hit_tokens"] == 0 and none["memory_hit_tokens"] == 0
    # with the tier all earlier context came back from LMCache; without it nothing did and every token was computed
    assert tier["tier_hit_tokens"] >= 0.9 * 13824 and m["tier_hit_rate"] >= 0.9
    assert none["tier_hit_tokens"] == 0 and none["recomputed_tokens"] == none["prompt_tokens"] == 23040
    assert tier["recomputed_tokens"] < 0.6 * none["recomputed_tokens"]
    # the same conversation, the same greedy tokens: the KV read back is the KV that was computed
    gate_dir = bundle / "gates" / "G2-multiturn"
    arms = {arm: _records(gate_dir / arm / "requests-trace-t1.jsonl") for arm in ("tier", "no_tier")}
    assert len(arms["tier"]) == len(arms["no_tier"]) == 18
    assert all(r["error"] is None and r["output_text"] for a in arms.values() for r in a.values())
    assert {k: r["output_text"] for k, r in arms["tier"].items()} == \
           {k: r["output_text"] for k, r in arms["no_tier"].items()}
    assert verify_bundle(bundle, pub).ok
