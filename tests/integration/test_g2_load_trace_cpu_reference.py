"""G2 under load, trace replay, end to end as a user runs it: `kvgate trace synth` writes a session trace, `kvgate
run` replays it (gates/g2-load-trace-cpu-reference.yaml, 3 trials on one engine start) against the cpu-reference
engine with the real LMCache 0.5.6 on an fs:// pool, into a signed bundle that verifies, with the percentiles,
goodput, token accounting and confidence intervals in it."""

import json
from pathlib import Path

import pytest
import yaml

from kvgate_cli import kvgate
from polling import wait_no_process

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def test_a_synthesised_trace_replayed_through_lmcache_lands_in_a_signed_bundle_with_tier_hits_accounted(tmp_path):
    home = tmp_path / "home"
    trace = tmp_path / "trace.jsonl"
    synth = kvgate("trace", "synth", "--out", trace, "--sessions", "4", "--turns", "3", "--system-prompts", "1",
                   "--system-prompt-tokens", "256", "--user-tokens", "64", "--output-tokens", "8", "--rate-rps", "2",
                   "--think-time-s", "1", "--block-tokens", "256", "--seed", "1", home=home)
    assert synth.returncode == 0, synth.stderr
    suite = yaml.safe_load((ROOT / "gates" / "g2-load-trace-cpu-reference.yaml").read_text())
    suite["gates"][0]["params"]["load"]["path"] = str(trace)
    gates = tmp_path / "gates.yaml"
    gates.write_text(yaml.safe_dump(suite, sort_keys=False))
    inv = tmp_path / "inventory.yaml"
    inv.write_text(yaml.safe_dump({"nodes": [{"name": "cpu1", "transport": "local", "read_streams": 1,
                                              "work_dir": str(tmp_path / "work")}]}))
    assert kvgate("keygen", "--out", tmp_path / "op", home=home).returncode == 0
    out = tmp_path / "out"
    r = kvgate("run", "-i", inv, "-g", gates, "--out", out, "--key", tmp_path / "op.key", home=home, timeout=1200)
    report_id = next((l.split(": ")[1] for l in r.stdout.splitlines() if l.startswith("report ID: ")), None)
    assert report_id is not None, r.stdout[-3000:] + r.stderr[-3000:]
    bundle = out / report_id
    gate_dir = bundle / "gates" / "G2-trace"
    result = json.loads((gate_dir / "result.json").read_text())
    v = json.loads((bundle / "verdicts.json").read_text())["verdicts"][0]
    assert r.returncode == 0 and v["outcome"] == "PASS", (v["reason"], result["invalid_reason"], result["error"])
    assert "95 % CI" in v["reason"] and "3 trials" in v["reason"]
    m, ev = result["metrics"], result["evidence"]
    for fig in ("ttft_p50_s", "ttft_p95_s", "ttft_p99_s", "goodput_rps", "tier_hit_share", "client_lag_p99_s"):
        name = f"{fig}@trace"
        assert m[f"{name}_ci_low"] <= m[name] <= m[f"{name}_ci_high"] and m[f"{name}_ci_trials"] == 3, name
    assert ev["trace"]["requests"] == 12 and ev["trace"]["format"] == "mooncake"
    assert [p["trial"] for p in ev["points"]] == [1, 2, 3]
    for p in ev["points"]:
        recs = [json.loads(line) for line in (gate_dir / p["requests_file"]).read_text().splitlines()]
        assert len(recs) == 12 and all(r["error"] is None for r in recs)
        acc = p["accounting"]
        assert acc["prompt_tokens_source"] == "engine"
        assert acc["memory_hit_tokens"] + acc["tier_hit_tokens"] + acc["recomputed_tokens"] == acc["prompt_tokens"]
        # every session's turns 2 and 3 find their earlier context in the tier: at least the system prompt's
        # 256-token chunk (LMCache's chunk) for each of the 8 later turns; cpu-reference keeps no KV of its own
        assert acc["tier_hit_tokens"] >= 8 * 256 and acc["memory_hit_tokens"] == 0
        assert acc["device_write_bytes"] is not None
        # the trace's own reuse bounds what any cache finds in it
        assert acc["tier_hit_share"] <= ev["trace"]["unbounded_hit_rate"]
    vr = kvgate("verify", f"{bundle}.tar.gz", "--pubkey", tmp_path / "op.pub", home=home)
    assert vr.returncode == 0 and vr.stdout.startswith(f"OK {report_id}"), vr.stdout + vr.stderr
    wait_no_process(str(tmp_path / "work") + "/")
