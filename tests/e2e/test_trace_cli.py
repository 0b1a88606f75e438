"""``kvgate trace synth`` and ``kvgate trace stats`` as a user runs them."""

import json

import pytest

from kvgate_cli import kvgate

pytestmark = pytest.mark.e2e


def test_synth_then_stats_with_capacities(tmp_path):
    out = tmp_path / "t.jsonl"
    r = kvgate("trace", "synth", "--out", out, "--sessions", "10", "--turns", "3", "--system-prompts", "2",
               "--block-tokens", "256", "--seed", "5")
    assert r.returncode == 0, r.stderr
    assert "30 requests in 10 sessions" in r.stdout
    first = json.loads(out.read_text().splitlines()[0])
    assert set(first) == {"timestamp", "input_length", "output_length", "hash_ids"}
    again = kvgate("trace", "synth", "--out", out)
    assert again.returncode == 2 and again.stderr.splitlines()[0] == f"<command line>: --out: {out} exists; refusing to overwrite it"
    r = kvgate("trace", "stats", out, "--block-tokens", "256", "--capacity-tokens", "2k", "--capacity-tokens", "1M",
               "--json")
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    assert st["requests"] == 30 and [c["capacity_tokens"] for c in st["capacities"]] == [2000, 1000000]
    small, large = st["capacities"]
    assert small["lru_hit_rate"] <= small["ideal_hit_rate"] <= large["ideal_hit_rate"] == st["unbounded_hit_rate"] > 0
    text = kvgate("trace", "stats", out, "--block-tokens", "256", "--capacity-tokens", "64Ki").stdout
    assert "capacity 65536 tokens: LRU" in text and "working set" in text


def test_a_bad_trace_is_named_line_by_line_and_nothing_else(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1]}\n'
                   '{"timestamp": "soon", "input_length": 5, "output_length": 1, "hash_ids": [1]}\n')
    r = kvgate("trace", "stats", bad)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.splitlines() == [
        f"{bad}:1: hash_ids: 1 hash ids for 600 input tokens; blocks of 512 tokens need 2",
        f'{bad}:2: timestamp: expected a number >= 0 (ms), got "soon"',
        "2 configuration error(s)"]
    for args in (("trace", "stats", tmp_path), ("trace", "stats", bad, "--capacity-tokens", "lots")):
        r = kvgate(*args)
        assert r.returncode == 2 and len(r.stderr.splitlines()) <= 2 and "Traceback" not in r.stderr


def test_synth_writes_the_shape_a_gate_declares_the_same_trace_byte_for_byte(tmp_path):
    import hashlib

    from harness.load.synth import SessionRecoveryShape
    from harness.workloads.kit.load import LoadSpec, read_load_trace

    out = tmp_path / "recovery.jsonl"
    r = kvgate("trace", "synth", "--out", out, "--shape", "session-recovery", "--sessions", "3", "--resumes", "2")
    assert r.returncode == 0, r.stderr
    assert "session-recovery shape, 9 requests in 3 sessions" in r.stdout
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    # each session arrives once, then is resumed twice with the very same blocks (its whole context)
    assert [len(r["hash_ids"]) for r in rows] == [17] * 9
    assert rows[3]["hash_ids"] == rows[0]["hash_ids"] and rows[6]["hash_ids"] == rows[0]["hash_ids"]
    _, info = read_load_trace(LoadSpec(session_recovery=SessionRecoveryShape(sessions=3, resumes=2)))
    assert info.sha256 == hashlib.sha256(out.read_bytes()).hexdigest() and info.shape == "session-recovery"
    wrong = kvgate("trace", "synth", "--out", tmp_path / "x.jsonl", "--shape", "fan-out", "--turns", "3")
    assert wrong.returncode == 2 and wrong.stderr.splitlines()[0].startswith(
        "<command line>: --turns: not a field of shape fan-out")
    assert not (tmp_path / "x.jsonl").exists()


def test_the_shipped_mooncake_excerpt_is_what_its_readme_says(tmp_path):
    from harness.paths import data_path

    trace = data_path("traces", "mooncake-conversation-3000.jsonl")
    r = kvgate("trace", "stats", trace, "--capacity-tokens", "1M", "--json")
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    readme = data_path("traces", "README.md").read_text()
    assert st["requests"] == 3000 and f"{st['unbounded_hit_rate']:.3f}" in readme
    assert f"{st['capacities'][0]['lru_hit_rate']:.3f}" in readme
    assert data_path("traces", "mooncake-LICENSE-APACHE").read_text().lstrip().startswith("Apache License")
    # the cut g2-load-trace-cpu-reference.yaml replays, and the bound its comment quotes (LMCache's 256-token
    # chunks at 16 tokens per hash id: 8192 trace tokens)
    r = kvgate("trace", "stats", "traces/mooncake-conversation-3000.jsonl", "--max-requests", "300",
               "--engine-block-tokens", "8192", "--json")
    st = json.loads(r.stdout)
    gate = (data_path("gates", "g2-load-trace-cpu-reference.yaml")).read_text()
    assert st["requests"] == 300 and f"{st['unbounded_hit_rate'] * 100:.1f} %" in gate
    assert "max_requests: 300" in gate and "tokens_per_block: 16" in gate
