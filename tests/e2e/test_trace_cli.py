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
