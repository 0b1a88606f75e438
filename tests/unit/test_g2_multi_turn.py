"""Multi-turn sessions as a g2-gain load (``load: {multi_turn: ...}``): the trace synthesised from their shape (pure,
the same in the plan and the run), each turn's prompt the session's whole history, served round-robin; config
errors; and the shipped G2-multiturn gate run scripted (both arms answered by an httpx MockTransport with a prefix
tier) sending exactly the commands `kvgate plan` lists, its tier hits and its proofs."""

import json
from pathlib import Path

import httpx
import pytest
import yaml

from harness.config import load_config
from harness.errors import ConfigError
from harness.load.prompts import trace_prompts
from harness.load.reuse import reuse_stats
from harness.load.synth import MultiTurnShape, multi_turn_trace
from harness.suite.plan import gate_plan, plan_mismatch
from harness.workloads import WORKLOADS
from harness.workloads.g2_gain import GainEvidence
from harness.workloads.kit.load import G2LoadEvidence, LoadSpec, read_load_trace
from test_g2_gain import TwoArms
from test_g2_load import gate_context, scripted_node

# Scripted runs keep to one or two trials, for speed: the config loader's rule that such a gate can never PASS
# (tests/unit/test_sound_verdicts.py) is off here, and their verdicts say "N trials, no interval".
TRIALS_RULE = False

ROOT = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------------------------- the trace


def test_each_turn_is_the_sessions_whole_history_and_sessions_are_served_round_robin():
    shape = MultiTurnShape(sessions=3, turns=3, first_prompt_tokens=100, user_tokens=20, reply_tokens=5, rate_rps=10)
    trace = multi_turn_trace(shape)
    assert [(r.session, r.turn) for r in trace.requests] == [
        ("s0", 1), ("s1", 1), ("s2", 1), ("s0", 2), ("s1", 2), ("s2", 2), ("s0", 3), ("s1", 3), ("s2", 3)]
    assert [r.t_ms for r in trace.requests] == [j * 100.0 for j in range(9)]  # 1 / rate_rps apart, in that order
    assert [r.input_tokens for r in trace.requests] == [100] * 3 + [125] * 3 + [150] * 3
    # blocks of gcd(100, 25) tokens: no block is partial, a turn's ids are the previous turn's and then new ones
    assert trace.block_tokens == 25
    prompts = trace_prompts(trace, 4096, seed=4)
    for j, r in enumerate(trace.requests):
        assert len(prompts[j]) == r.input_tokens
        if r.turn > 1:
            prev = j - 3
            assert r.hash_ids[:len(trace.requests[prev].hash_ids)] == trace.requests[prev].hash_ids
            assert prompts[j][:len(prompts[prev])] == prompts[prev]      # token for token
    assert prompts[0][:25] != prompts[1][:25]                            # sessions share nothing
    assert {h for r in trace.requests if r.session == "s0" for h in r.hash_ids}.isdisjoint(
        {h for r in trace.requests if r.session == "s1" for h in r.hash_ids})
    # every later turn's prior context is reusable: (100 + 125) x 3 of 1125 prompt tokens
    assert reuse_stats(trace).unbounded_hit_rate == pytest.approx(675 / 1125)


def test_the_trace_is_pure_same_shape_same_trace_and_its_digest_is_recorded():
    spec = LoadSpec(multi_turn={"sessions": 6, "turns": 3, "first_prompt_tokens": 1024, "user_tokens": 192,
                                "reply_tokens": 64})
    (a, info_a), (b, info_b) = read_load_trace(spec), read_load_trace(spec)
    assert a == b and info_a == info_b
    assert info_a.path == "(multi-turn sessions)" and info_a.requests == 18 and info_a.block_tokens == 256
    assert info_a.multi_turn == spec.multi_turn and info_a.unbounded_hit_rate == pytest.approx(0.6)
    other = LoadSpec(multi_turn={**spec.multi_turn.model_dump(), "user_tokens": 191})
    assert read_load_trace(other)[1].sha256 != info_a.sha256


def test_a_load_report_names_the_sessions_not_a_file():
    from harness.report.load_section import view
    spec = LoadSpec(multi_turn={"sessions": 6, "turns": 3, "first_prompt_tokens": 1024, "user_tokens": 192,
                                "reply_tokens": 64})
    ev = G2LoadEvidence(load_kind="trace", trace=read_load_trace(spec)[1], trials=1)
    assert view(ev, [])["kind_text"] == (
        "trace replay of multi-turn sessions: 6 sessions x 3 turns round-robin (18 requests, 0.05 s apart), turn 1 "
        "1024 tokens, each later turn the session's whole history plus a 64-token reply and a 192-token user message "
        "(turn 3: 1536 tokens); the trace's own bound, an unbounded prefix cache, hits 60.0 % of its prompt tokens "
        "(beside the tier's share below)")


def test_a_bad_shape_names_its_fields():
    with pytest.raises(ValueError, match="sessions: must be >= 1; rate_rps: must be > 0"):
        multi_turn_trace(MultiTurnShape(sessions=0, rate_rps=0))


# ----------------------------------------------------------------------------------------------- config


def shipped_gate(tmp_path: Path, **params) -> Path:
    """The shipped G2-multiturn gate (gates/g2-cpu-reference.yaml) alone, its ports fixed so the mock engines are
    told apart (the tier arm on 18000, the other on 18001)."""
    suite = yaml.safe_load((ROOT / "gates" / "g2-cpu-reference.yaml").read_text())
    suite["gates"] = [g for g in suite["gates"] if g["id"] == "G2-multiturn"]
    suite["gates"][0]["params"].update({"python": "/engine/bin/python", "port": 18000, **params})
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(suite, sort_keys=False))
    (tmp_path / "i.yaml").write_text(yaml.safe_dump({"nodes": [{"name": "n1", "transport": "local",
                                                                "work_dir": "/w"}]}))
    return tmp_path


@pytest.mark.parametrize("load, message", [
    ({"multi_turn": {"sessions": 1, "turns": 3, "first_prompt_tokens": 64, "user_tokens": 8}},
     "greater than or equal to 2"),
    ({"multi_turn": {"sessions": 2, "turns": 2, "first_prompt_tokens": 64, "user_tokens": 8}, "format": "mooncake"},
     "format: only for a trace file (path)"),
    ({"multi_turn": {"sessions": 2, "turns": 2, "first_prompt_tokens": 64, "user_tokens": 8},
      "concurrency": [1]}, "got concurrency, multi_turn"),
])
def test_bad_multi_turn_loads_are_config_errors_naming_file_and_line(tmp_path, load, message):
    d = shipped_gate(tmp_path, load=load)
    with pytest.raises(ConfigError) as exc:
        load_config(d / "i.yaml", d / "g.yaml", WORKLOADS, trials_rule=TRIALS_RULE)
    assert "g.yaml:" in str(exc.value) and message in str(exc.value), str(exc.value)


def test_synthetic_prompt_shapes_do_not_go_with_multi_turn_sessions(tmp_path):
    d = shipped_gate(tmp_path, prompt_tokens=512)
    with pytest.raises(ConfigError, match="prompt_tokens: shape synthetic prompts"):
        load_config(d / "i.yaml", d / "g.yaml", WORKLOADS, trials_rule=TRIALS_RULE)


def test_lmcache_overrides_are_checked_against_the_pinned_lmcache(tmp_path):
    d = shipped_gate(tmp_path, lmcache_overrides={"max_local_cpu_sise": 0.1})
    with pytest.raises(ConfigError) as exc:
        load_config(d / "i.yaml", d / "g.yaml", WORKLOADS, trials_rule=TRIALS_RULE)
    assert "params.lmcache_overrides.max_local_cpu_sise" in str(exc.value), str(exc.value)


# ------------------------------------------------------------------------------------------- a scripted run


class Sessions(TwoArms):
    """Both arms' engines as one MockTransport handler, told apart by port (test_g2_gain.TwoArms). The tier arm
    (``port``) finds in its tier the longest earlier prompt that starts this one (or, ``memory``, in its engine
    memory instead); the arm on ``port + 1`` has no tier and recomputes everything. Greedy output: a digest of the
    prompt."""

    def __init__(self, port: int = 18000, memory: bool = False):
        super().__init__(port, serve_from="gpu" if memory else "external")
        self.stored: list[list[int]] = []

    def hit(self, ids: list[int]) -> tuple[str, int]:
        n = max((len(s) for s in self.stored if ids[:len(s)] == s), default=0)
        self.stored.append(ids)
        return f"{self.serve_from}_hit", n

    def answer(self, ids: list[int]) -> httpx.Response:
        text = json.dumps({"choices": [{"text": f" {sum(ids) % 997}"}]})
        return httpx.Response(200, text=f"data: {text}\n\ndata: [DONE]\n\n",
                              headers={"content-type": "text/event-stream"})


def multi_turn_scenario(tmp_path: Path, engine: Sessions | None = None):
    """The shipped G2-multiturn gate, its config, a scripted node, the mock engines and the gate's context."""
    d = shipped_gate(tmp_path)
    cfg = load_config(d / "i.yaml", d / "g.yaml", WORKLOADS, trials_rule=TRIALS_RULE)
    node, engine = scripted_node(), engine or Sessions()
    return cfg, node, engine, gate_context(tmp_path, cfg, node, engine)


def test_the_shipped_gate_replays_the_sessions_on_both_arms_and_the_tier_serves_every_returning_turn(tmp_path):
    cfg, node, engine, ctx = multi_turn_scenario(tmp_path)
    result = WORKLOADS["g2-gain"]().run(ctx)
    assert result.error is None and result.invalid_reason is None, (result.error, result.invalid_reason)
    mine = [s for s in gate_plan(cfg, cfg.suite.gates[0]) if s.node == "n1"]
    assert plan_mismatch(mine, node.commands) is None, plan_mismatch(mine, node.commands)
    spawns = [e.argv for e in node.events if e.kind == "spawn"]
    # both arms with the same engine memory, one without the tier
    assert all(a[a.index("--gpu-cache-tokens") + 1] == "2048" for a in spawns)
    assert sorted("--no-kv-tier" in a for a in spawns) == [False, True]
    ev: GainEvidence = result.evidence
    assert ev.trace.multi_turn.sessions == 6 and ev.engine_cache_tokens == 2048
    rows = {arm: [json.loads(x) for x in (ctx.gate_dir / arm / "requests-trace-t1.jsonl").read_text().splitlines()]
            for arm in ("tier", "no_tier")}
    # the same 18 prompts on both arms (6 sessions x 3 turns of 1024, 1280, 1536 tokens), the same outputs
    assert [r["prompt_tokens"] for r in rows["tier"]] == [1024] * 6 + [1280] * 6 + [1536] * 6
    assert [(r["request_id"], r["output_text"]) for r in rows["tier"]] == \
           [(r["request_id"], r["output_text"]) for r in rows["no_tier"]]
    # 12 returning turns each found its previous turn (6 x (1024 + 1280) tokens) in the tier
    assert ev.proofs["tier"].tier_hit_tokens == 13824 and ev.proofs["tier"].memory_hit_tokens == 0
    assert ev.proofs["no_tier"].tier_hit_tokens == 0 and ev.proofs["no_tier"].recomputed_tokens == 23040
    assert ev.reusable_share == pytest.approx(0.6) and result.metrics["tier_hit_rate"] == pytest.approx(1.0)
    assert {c.name: (c.ok, c.checked) for c in ev.validity} == {
        "tier arm valid": (True, True), "no_tier arm valid": (True, True),
        "arms equal but the tier switch": (True, True),
        "tier served the reuse": (True, True), "recomputed without the tier": (True, True)}
    assert "throughput_gain" in result.metrics and result.intervals["throughput_gain"].trials == 1


def test_returning_turns_served_from_engine_memory_make_the_gate_invalid(tmp_path):
    # an engine memory that still held the sessions: the gain would not be the tier's
    _, _, _, ctx = multi_turn_scenario(tmp_path, Sessions(memory=True))
    result = WORKLOADS["g2-gain"]().run(ctx)
    assert result.invalid_reason == ("tier served the reuse: the tier served no token: its connector is off, or "
                                     "the working set fit the engine's memory"), result.invalid_reason
    assert result.evidence.proofs["tier"].memory_hit_tokens == 13824
