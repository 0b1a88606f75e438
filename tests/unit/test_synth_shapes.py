"""The shapes a gate's ``load:`` declares (harness/load/synth.py): pure, prefix-aware as Mooncake's traces, and
refused with the field named when wrong."""

import re

import pytest
from pydantic import ValidationError

from harness.load.reuse import reuse_stats
from harness.load.synth import SHAPES, FanOutShape, SessionRecoveryShape, fan_out_trace, session_recovery_trace
from harness.workloads.kit.load import SHAPE_KEYS, LoadSpec, load_trace


def test_a_resumed_session_is_its_first_arrival_again_and_nothing_else_is_shared():
    t = session_recovery_trace(SessionRecoveryShape(sessions=3, resumes=2, prompt_tokens=300, block_tokens=128))
    assert [r.t_ms for r in t.requests] == [0.0, 600.0, 1200.0, 4000.0, 4100.0, 4200.0, 4300.0, 4400.0, 4500.0]
    first = {r.session: r.hash_ids for r in t.requests[:3]}
    assert all(len(ids) == 3 for ids in first.values()) and len({i for ids in first.values() for i in ids}) == 9
    assert [r.hash_ids for r in t.requests[3:]] == [first[f"s{s}"] for _ in range(2) for s in range(3)]
    assert [r.turn for r in t.requests] == [1, 1, 1, 2, 2, 2, 3, 3, 3]


def test_a_fan_out_shares_exactly_its_system_prompts_whole_blocks():
    t = fan_out_trace(FanOutShape(requests=4, system_prompts=2, system_prompt_tokens=600, user_tokens=100,
                                  block_tokens=256, rate_rps=2))
    assert [r.t_ms for r in t.requests] == [0.0, 500.0, 1000.0, 1500.0]
    ids = [r.hash_ids for r in t.requests]
    assert all(len(i) == 3 for i in ids)                      # 700 tokens: 2 whole shared blocks + 1 own
    assert ids[0][:2] == ids[2][:2] != ids[1][:2] == ids[3][:2]
    assert len({i[2] for i in ids}) == 4                      # the partial block (prompt tail + message) is own
    # the reuse an unbounded cache finds: the second user of each system prompt, its 512 shared tokens
    assert reuse_stats(t).unbounded_hit_rate == pytest.approx(2 * 512 / (4 * 700))


@pytest.mark.parametrize("key", sorted(SHAPE_KEYS))
def test_every_shape_key_names_a_shape_and_replays_as_a_trace(key):
    cls = SHAPES[SHAPE_KEYS[key]][0]
    body = ({"sessions": 2, "turns": 2, "first_prompt_tokens": 64, "user_tokens": 8} if key == "multi_turn" else {})
    spec = LoadSpec.model_validate({key: body, "users": 1})
    assert spec.kind == "trace" and spec.shape[0] == SHAPE_KEYS[key] and isinstance(spec.shape[1], cls)
    assert load_trace(spec).requests


@pytest.mark.parametrize("load, message", [
    ({"fan_out": {"requests": 0}}, "fan_out: requests: must be >= 1"),
    ({"session_recovery": {"sessions": 2, "turns": 3}}, "turns"),
    ({"fan_out": {}, "block_tokens": 64}, "block_tokens: only for a trace file (path)"),
    ({"fan_out": {}, "session_recovery": {}}, "got session_recovery, fan_out"),
])
def test_a_bad_shape_is_refused_naming_the_field(load, message):
    with pytest.raises(ValidationError, match=re.escape(message)):
        LoadSpec.model_validate(load)
