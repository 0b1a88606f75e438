"""g2-multiturn pure parts: the conversation, the request order, the verdict logic, the engine's LRU cache."""

import pytest

from harness.engines.cpu_reference import PrefixKVCache, common_prefix_len
from harness.workloads.g2_multiturn import MultiTurnParams, conversation, evaluate_multiturn, request_order


def test_conversation_is_deterministic_and_each_turn_extends_the_last():
    p = MultiTurnParams(sessions=3, turns=3, first_prompt_tokens=100, user_tokens=20, reply_tokens=5, seed=4)
    a, b = conversation(p, 4096), conversation(p, 4096)
    assert a == b
    assert [len(x) for x in a[2]] == [150, 150, 150]
    for t in (1, 2):
        for s in range(3):
            assert a[t][s][:len(a[t - 1][s])] == a[t - 1][s]
    assert a[0][0] != a[0][1]  # sessions differ
    assert conversation(MultiTurnParams(sessions=3, turns=3, first_prompt_tokens=100, user_tokens=20,
                                        reply_tokens=5, seed=5), 4096) != a
    assert all(10 <= i < 4096 for turn in a for ids in turn for i in ids)


def test_round_robin_order():
    order = request_order([[[1], [2]], [[1, 3], [2, 4]]])
    assert [(t, s) for t, s, _ in order] == [(0, 0), (0, 1), (1, 0), (1, 1)]


def _rec(turn, prior, mem=0, tier=0, prefill=0, ok=True, text="x"):
    return {"turn": turn, "session": 0, "prior_tokens": prior, "ok": ok, "error": None if ok else "boom",
            "output_text": text, "delta": {"gpu_hit_tokens_total": mem, "external_hit_tokens_total": tier,
                                           "prefill_tokens_total": prefill}}


def _phases(no_tier_recs, tier_recs, nt_wall=2.0, t_wall=1.0):
    return {"no_tier": {"wall_s": nt_wall, "tokens": 1000, "sessions": 2, "records": no_tier_recs},
            "tier": {"wall_s": t_wall, "tokens": 1000, "sessions": 2, "records": tier_recs}}


def test_gain_and_valid_when_the_tier_serves_returning_context():
    r = evaluate_multiturn(_phases([_rec(0, 0), _rec(1, 100)], [_rec(0, 0), _rec(1, 100, tier=100)]), 0.9, 0.1)
    assert r.invalid_reason is None and r.error is None
    assert r.metrics["throughput_gain_ratio"] == pytest.approx(2.0)
    assert r.metrics["tier_hit_rate"] == 1.0 and r.evidence.outputs_matching == 2


@pytest.mark.parametrize("nt,t,why", [
    ([_rec(1, 100, mem=50)], [_rec(1, 100, tier=100)], "still in engine memory"),
    ([_rec(1, 100)], [_rec(1, 100, tier=50)], "the gain is not the tier's"),
    ([_rec(1, 100, tier=10)], [_rec(1, 100, tier=100)], "not what they claim"),
    ([_rec(0, 0)], [_rec(0, 0)], "nothing was measured"),
])
def test_invalid_cases(nt, t, why):
    assert why in evaluate_multiturn(_phases(nt, t), 0.9, 0.1).invalid_reason


def test_failed_request_is_an_error():
    r = evaluate_multiturn(_phases([_rec(1, 100)], [_rec(1, 100, tier=100, ok=False)]), 0.9, 0.1)
    assert r.error and "boom" in r.error


def test_prefix_cache_longest_prefix_and_lru_eviction():
    c = PrefixKVCache(10)
    assert c.match([1, 2, 3]) == (0, None)
    assert c.put([1, 2, 3, 4], "k1", "v1") == 0
    assert c.put([5, 6, 7, 8], "k2", "v2") == 0
    n, kv = c.match([1, 2, 9])
    assert n == 2 and kv == ("k1", "v1")  # partial common prefix is reusable KV
    # [1,2,3,4] was just used: inserting 4 more tokens evicts [5,6,7,8], the least recently used
    assert c.put([9, 9, 9, 9], "k3", "v3") == 4
    assert c.match([5, 6])[0] == 0 and c.match([1, 2, 3, 4, 5])[0] == 4
    assert c.tokens == 8
    assert c.put(list(range(11)), "big", "big") == 0 and c.tokens == 8  # larger than the cache: not kept
    assert common_prefix_len((1, 2, 3), [1, 2, 4]) == 2
