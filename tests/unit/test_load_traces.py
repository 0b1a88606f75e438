"""Session traces (Mooncake, Qwen-Bailian), synthetic traces, prompts from hash ids, and the reuse bound."""

import json
import statistics

import pytest

from harness.errors import ConfigError
from harness.load.prompts import prompt_ids, trace_prompts
from harness.load.reuse import reuse_stats
from harness.load.synth import TraceShape, synthesize
from harness.load.traces import Trace, TraceRequest, cut, parse_trace, scale_time, trace_lines
from harness.stats import median_interval, order_statistic_rank

# the shape of the public traces' lines (Mooncake's README / AIPerf's docs; Bailian's as its tools document it)
MOONCAKE = """{"timestamp": 27482, "input_length": 655, "output_length": 52, "hash_ids": [46, 47]}
{"timestamp": 0, "input_length": 655, "output_length": 52, "hash_ids": [46, 47]}
{"timestamp": 10535, "input_length": 672, "output_length": 26, "hash_ids": [46, 47]}
"""
BAILIAN = """{"chat_id": 159, "parent_chat_id": -1, "timestamp": 61.114, "input_length": 40, "output_length": 132, "type": "text", "turn": 1, "hash_ids": [1089, 1090, 1091]}
{"chat_id": 160, "parent_chat_id": 159, "timestamp": 62.5, "input_length": 50, "output_length": 80, "type": "text", "turn": 2, "hash_ids": [1089, 1090, 1092, 1093]}
{"chat_id": 170, "parent_chat_id": -1, "timestamp": 61.2, "input_length": 16, "output_length": 8, "type": "text", "turn": 1, "hash_ids": [7]}
{"chat_id": 171, "parent_chat_id": 160, "timestamp": 70.0, "input_length": 17, "output_length": 8, "type": "text", "turn": 3, "hash_ids": [1089, 9]}
"""


def test_mooncake_lines_in_arrival_order_in_ms():
    t = parse_trace(MOONCAKE, "m.jsonl")
    assert t.format == "mooncake" and t.block_tokens == 512
    assert [r.t_ms for r in t.requests] == [0, 10535, 27482] and [r.line for r in t.requests] == [2, 3, 1]
    assert t.requests[0].hash_ids == (46, 47) and t.duration_s == 27.482


def test_bailian_sessions_follow_the_parent_chain_and_seconds_become_ms():
    t = parse_trace(BAILIAN, "b.jsonl")
    assert t.format == "bailian" and t.block_tokens == 16
    assert [(r.session, r.turn) for r in t.requests] == [("159", 1), ("170", 1), ("159", 2), ("159", 3)]
    assert t.requests[1].t_ms == pytest.approx(86.0) and t.requests[-1].t_ms == pytest.approx(8886.0)


def test_every_bad_line_is_named_by_file_line_and_field_at_once():
    bad = "\n".join([
        '{"timestamp": -1, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}',
        '{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1]}',
        '{"timestamp": 0, "input_length": true, "output_length": 1, "hash_ids": [1]}',
        '[1, 2]',
        '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1], "prompt": "x"}',
        '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": ["a"]}',
        '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [' * 5000,
    ])
    with pytest.raises(ConfigError) as e:
        parse_trace(bad, "t.jsonl", fmt="mooncake")
    got = [str(i) for i in e.value.issues]
    assert got[0].startswith("t.jsonl:4: <root>: not a JSON object") and got[1].startswith("t.jsonl:7: <root>: not a JSON")
    with pytest.raises(ConfigError) as e:
        parse_trace("\n".join(bad.splitlines()[:3] + bad.splitlines()[4:6]), "t.jsonl", fmt="mooncake")
    got = [str(i) for i in e.value.issues]
    assert got == [
        "t.jsonl:1: timestamp: expected a number >= 0 (ms), got -1",
        "t.jsonl:2: hash_ids: 1 hash ids for 600 input tokens; blocks of 512 tokens need 2",
        "t.jsonl:3: input_length: expected an integer >= 1, got true",
        "t.jsonl:4: prompt: not a field of the mooncake format",
        "t.jsonl:5: hash_ids: expected a list of integers",
    ]
    with pytest.raises(ConfigError, match="no requests"):
        parse_trace("\n\n", "empty.jsonl")


def test_cut_by_count_or_duration_and_time_scaling():
    t = parse_trace(MOONCAKE)
    assert len(cut(t, max_requests=2).requests) == 2
    assert [r.t_ms for r in cut(t, max_duration_s=11).requests] == [0, 10535]
    assert [r.t_ms for r in scale_time(t, 2.0).requests] == [0, 5267.5, 13741]
    with pytest.raises(ValueError):
        scale_time(t, 0)


@pytest.mark.parametrize("text", [MOONCAKE, BAILIAN])
def test_written_traces_read_back_the_same(text):
    t = parse_trace(text)
    back = parse_trace("\n".join(trace_lines(t)))
    strip = lambda tr: [(round(r.t_ms, 3), r.input_tokens, r.output_tokens, r.hash_ids, r.turn) for r in tr.requests]
    assert strip(back) == strip(t)
    if t.format == "bailian":  # the session structure survives (chat ids renumbered)
        assert len({r.session for r in back.requests}) == len({r.session for r in t.requests}) == 2


def test_synthetic_sessions_share_exactly_their_context_and_system_prompt():
    shape = TraceShape(sessions=12, turns=4, system_prompts=2, system_prompt_tokens=1024, user_tokens=300,
                       output_tokens=100, block_tokens=256, seed=3)
    t = synthesize(shape)
    assert t == synthesize(shape) and t != synthesize(TraceShape(**{**shape.__dict__, "seed": 4}))
    assert len(t.requests) == 48 and [r.t_ms for r in t.requests] == sorted(r.t_ms for r in t.requests)
    by = {}
    for r in t.requests:
        by.setdefault(r.session, []).append(r)
    for turns in by.values():
        assert [r.turn for r in turns] == [1, 2, 3, 4]
        for a, b in zip(turns, turns[1:]):
            whole = a.input_tokens // 256
            assert b.input_tokens == a.input_tokens + 100 + 300
            assert b.hash_ids[:whole] == a.hash_ids[:whole]           # the whole blocks of the context so far
            assert not set(b.hash_ids[whole:]) & set(a.hash_ids)      # nothing after them
    firsts = [turns[0].hash_ids[:4] for turns in by.values()]
    assert len(set(firsts)) == 2                                       # two system prompts, 4 whole blocks each
    other = [set(turns[0].hash_ids[4:]) for turns in by.values()]
    assert all(not (a & b) for i, a in enumerate(other) for b in other[i + 1:])


def test_burstiness_shapes_the_session_arrivals():
    def cv(b):
        t = synthesize(TraceShape(sessions=400, turns=1, rate_rps=10, burstiness=b, seed=1))
        gaps = [y.t_ms - x.t_ms for x, y in zip(t.requests, t.requests[1:])]
        return statistics.pstdev(gaps) / statistics.mean(gaps), statistics.mean(gaps)
    bursty, poisson, regular = cv(0.25), cv(1.0), cv(16.0)
    assert bursty[0] > 1.5 > poisson[0] > 0.8 > 0.5 > regular[0]      # CV 2, 1, 0.25 in expectation
    assert all(80 < m < 120 for _, m in (bursty, poisson, regular))    # 10 sessions/s whatever the shape
    with pytest.raises(ValueError, match="rate_rps: must be > 0; burstiness: must be > 0"):
        synthesize(TraceShape(rate_rps=0, burstiness=-1))


def _trace(*reqs, block=4):
    return Trace("mooncake", block, tuple(TraceRequest(float(i), n, 1, tuple(h)) for i, (n, h) in enumerate(reqs)))


def test_hits_are_whole_prefix_blocks_short_of_the_last_token():
    t = _trace((8, [1, 2]), (8, [1, 2]), (8, [1, 3]), (12, [4, 1, 3]))
    st = reuse_stats(t)
    # 2nd: both blocks held, but the last token is always computed: (8 - 1) // 4 = 1 block; 3rd: block 1 only;
    # 4th: its first block is new, and ids are prefix-aware, so nothing after it is found
    assert st.unbounded_hit_rate == pytest.approx((0 + 4 + 4 + 0) / 36)
    assert st.distinct_blocks == 4 and st.working_set_tokens == 16
    # an engine with blocks of 8 tokens finds no whole 8-token block within 7 tokens
    assert reuse_stats(t, engine_block_tokens=8).unbounded_hit_rate == 0.0
    assert reuse_stats(t, engine_block_tokens=2).unbounded_hit_rate == pytest.approx((0 + 6 + 4 + 0) / 36)


def test_the_ideal_bound_beats_lru_where_recency_misleads():
    # a loop over 3 prompts of 2 blocks through a 4-block cache: LRU always evicts the prompt needed next
    t = _trace(*[(5, [b, b + 10]) for b in [1, 2, 3] * 4])
    (point,) = reuse_stats(t, [16]).capacities
    assert point.lru_hit_rate == 0.0
    assert point.ideal_hit_rate > 0.3
    assert reuse_stats(t, [24]).capacities[0].lru_hit_rate == pytest.approx(9 * 4 / 60)  # all fit: 9 repeats


def test_requests_sharing_hash_ids_share_exactly_those_tokens():
    t = parse_trace(BAILIAN)
    p = {r.turn if r.session == "159" else 0: ids for r, ids in zip(t.requests, trace_prompts(t, 32000, 7))}
    assert [len(p[k]) for k in (1, 2, 3)] == [40, 50, 17]
    assert p[1][:32] == p[2][:32] and p[1][32:40] != p[2][32:40]     # blocks 1089, 1090 shared; then 1091 vs 1092
    assert p[3][:16] == p[1][:16] and p[3][16] != p[1][16]
    assert all(10 <= i < 32000 for ids in p.values() for i in ids)
    assert trace_prompts(t, 32000, 7) == trace_prompts(t, 32000, 7) != trace_prompts(t, 32000, 8)
    # re-mapped to 256-token blocks: 16x longer, the same sharing block for block
    r1, r2 = t.requests[0], t.requests[2]
    a, b = prompt_ids(r1, 16, 32000, 7, 256), prompt_ids(r2, 16, 32000, 7, 256)
    assert (len(a), len(b)) == (640, 800) and a[:512] == b[:512] and a[512:640] != b[512:640]


def test_the_interval_for_the_median_is_exact_from_binomial_order_statistics():
    """[x(k), x(n+1-k)] with the largest k whose coverage 1 - 2 P(B <= k-1), B ~ Binomial(n, 1/2), is >= 95 %:
    none below 6 values (even [min, max] of 5 covers 1 - 2/32 = 93.75 %)."""
    assert [order_statistic_rank(n) for n in (5, 6, 8, 9, 11, 12, 20)] == [None, 1, 1, 2, 2, 3, 6]
    iv = median_interval([10.0, 11.0, 12.0, 30.0, 9.0, 10.5, 11.5, 9.5, 40.0], asked=9)
    assert (iv.median, iv.ci_low, iv.ci_high) == (11.0, 9.5, 30.0)  # x(2), x(8) of the 9 sorted
    assert iv.coverage == pytest.approx(1 - 2 * 10 / 512) and iv.coverage >= 0.95 and iv.asked == 9
    five = median_interval([10.0, 11.0, 12.0, 30.0, 9.0])
    assert five.median == 11.0 and not five.has_interval and five.text("s") == "median 11 s (5 trials, no interval)"
    assert median_interval([5.0]).text() == "median 5 (1 trial, no interval)"
    with pytest.raises(ValueError):
        median_interval([])
