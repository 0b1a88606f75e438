"""G2 under load, trace replay, end to end as a user runs it: `kvgate run` of gates/g2-load-trace-cpu-reference.yaml as
shipped replays the real Mooncake conversation trace kvgate ships (its first 300 requests, 16 tokens per hash id, in
order by one user) against the cpu-reference engine with the real LMCache 0.5.6 on a cold tier (O_DIRECT, a loop
device of its own), 6 trials on one engine start, into a signed bundle that verifies, with the percentiles, goodput,
token accounting, the validity checks, the 95 % intervals for the median and the tier's hit share beside the trace's
own bound in it."""

import json
from pathlib import Path

import pytest

from kvgate_cli import kvgate, readme_run

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def test_the_shipped_mooncake_trace_replayed_through_lmcache_lands_in_a_signed_bundle_with_tier_hits_accounted(tmp_path):
    # exactly as the README's table runs it: the shipped gate names the shipped trace
    r, bundle, work = readme_run("g2-load-trace-cpu-reference.yaml", "localhost.yaml", tmp_path, timeout=1200)
    home = tmp_path / "home"
    gate_dir = bundle / "gates" / "G2-trace"
    result = json.loads((gate_dir / "result.json").read_text())
    v = json.loads((bundle / "verdicts.json").read_text())["verdicts"][0]
    assert r.returncode == 0 and v["outcome"] == "PASS", (v["reason"], result["invalid_reason"], result["error"])
    assert "95 % CI" in v["reason"] and "6 trials" in v["reason"]
    m, ev, ivs = result["metrics"], result["evidence"], result["intervals"]
    for fig in ("ttft_p50_s", "ttft_p95_s", "ttft_p99_s", "goodput_rps", "tier_hit_share", "client_lag_p99_s"):
        name = f"{fig}@trace"
        iv = ivs[name]
        assert iv["ci_low"] <= m[name] <= iv["ci_high"] and iv["trials"] == iv["asked"] == 6, name
    assert {c["name"]: (c["ok"], c["checked"]) for c in ev["validity"]} == {
        "requests served": (True, True), "client kept the schedule": (True, True),
        "tier hits read from the pool": (True, True), "no fall-back": (True, True)}
    tr = ev["trace"]
    assert tr["requests"] == 300 and tr["format"] == "mooncake" and tr["tokens_per_block"] == 16 and tr["users"] == 1
    assert tr["path"].endswith("traces/mooncake-conversation-3000.jsonl")
    assert [p["trial"] for p in ev["points"]] == [1, 2, 3, 4, 5, 6]
    for p in ev["points"]:
        recs = [json.loads(line) for line in (gate_dir / p["requests_file"]).read_text().splitlines()]
        assert len(recs) == 300 and all(r["error"] is None for r in recs)
        acc = p["accounting"]
        assert acc["prompt_tokens_source"] == "engine"
        assert acc["memory_hit_tokens"] + acc["tier_hit_tokens"] + acc["recomputed_tokens"] == acc["prompt_tokens"]
        # the trace's few returning conversations find their earlier turns in the tier (whole 256-token chunks of
        # LMCache's), read from the pool's own device with O_DIRECT; cpu-reference keeps no KV of its own
        assert acc["tier_hit_tokens"] >= 256 and acc["memory_hit_tokens"] == 0
        assert acc["read_fraction"] is not None and acc["read_fraction"] >= 0.5, acc
        assert acc["device_write_bytes"] is not None
        # the trace's own reuse bounds what any cache finds in it
        assert acc["tier_hit_share"] <= tr["unbounded_hit_rate"]
    vr = kvgate("verify", f"{bundle}.tar.gz", "--pubkey", home / "dev-signing.pub", home=home)
    assert vr.returncode == 0 and vr.stdout.startswith(f"OK {bundle.name}"), vr.stdout + vr.stderr
    # re-derived offline from the requests and counters files, the same verdict as signed
    rep = kvgate("report", bundle, "--pubkey", home / "dev-signing.pub", "--out", tmp_path / "re", home=home)
    assert rep.returncode == 0 and "verdicts: SAME as signed" in rep.stdout, rep.stdout + rep.stderr
    assert "1 of 1 gates re-derived from raw files" in rep.stdout, rep.stdout  # device bytes from the steps, log
