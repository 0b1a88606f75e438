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


@pytest.mark.parametrize("nt,t,failing", [
    ([_rec(1, 100)], [_rec(1, 100, tier=100)], set()),
    ([_rec(1, 100, mem=50)], [_rec(1, 100, tier=100)], {"evicted (without the tier)"}),
    ([_rec(1, 100)], [_rec(1, 100, tier=50)], {"tier served"}),
    ([_rec(1, 100, tier=10)], [_rec(1, 100, tier=100)], {"no tier without the tier"}),
    ([_rec(1, 100)], [_rec(1, 100, tier=100, ok=False)], {"requests"}),
])
def test_the_evaluator_states_each_proof_of_the_gain_in_its_validity_list(nt, t, failing):
    checks = {c.name: c for c in evaluate_multiturn(_phases(nt, t), 0.9, 0.1).evidence.validity}
    assert {n for n, c in checks.items() if not c.ok} == failing
    assert checks["tier served"].unit == "ratio" and checks["evicted (with the tier)"].figure


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


# ------------------------------------------------------------------------------------------ a scripted run

import json
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import yaml

from doubles import Router, argv_starts, gate_context, normalized, ok, preflight, spawned
from harness.config import load_config
from harness.suite.plan import gate_plan
from harness.transport.doubles import Reply, ScriptedTransport
from harness.workloads import WORKLOADS

ROOT = Path(__file__).resolve().parents[2]
DEGRADED = ". System will operate in degraded mode (recompute). (manager.py:107:lmcache.v1.manager)"


class Instances:
    """Both instances' HTTP APIs, told apart by port (the spawn's argv says which one has no tier): the engine's own
    memory keeps nothing between turns; the tier instance finds a returning session's earlier prompt in the tier."""

    def __init__(self):
        self.tier_by_port: dict[int, bool] = {}
        self.stored: dict[int, list[list[int]]] = {}
        self.counters: dict[int, dict[str, float]] = {}

    def spawn(self, call) -> Reply:
        port = int(call.argv[call.argv.index("--port") + 1])
        self.tier_by_port[port] = "--no-kv-tier" not in call.argv
        self.stored[port], self.counters[port] = [], {}
        return Reply(stdout=f"ready on http://127.0.0.1:{port} kv_tier={self.tier_by_port[port]}\n")

    def __call__(self, request: httpx.Request) -> httpx.Response:
        port, c = request.url.port, self.counters[request.url.port]
        if request.url.path == "/health":
            return httpx.Response(200)
        if request.url.path == "/metrics":
            return httpx.Response(200, text="".join(f"kvgate_cpu_ref_{k} {v}\n" for k, v in c.items()))
        ids = json.loads(request.content)["prompt"]
        hit = max((len(s) for s in self.stored[port] if ids[:len(s)] == s), default=0) \
            if self.tier_by_port[port] else 0
        self.stored[port].append(ids)
        for k, v in (("prompt_tokens_total", len(ids)), ("prefill_tokens_total", len(ids) - hit),
                     ("external_hit_tokens_total", hit), ("gpu_hit_tokens_total", 0)):
            c[k] = c.get(k, 0) + v
        return httpx.Response(200, text='data: {"choices": [{"text": " same"}]}\n\ndata: [DONE]\n\n')


def multiturn_run(tmp_path, log_line: str = ""):
    suite = yaml.safe_load((ROOT / "gates" / "g2-cpu-reference.yaml").read_text())
    suite["gates"] = [g for g in suite["gates"] if g["id"] == "G2-multiturn"]
    suite["gates"][0]["params"].update(python="/engine/bin/python", sessions=2, turns=2, first_prompt_tokens=64,
                                       user_tokens=16, reply_tokens=8)
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(suite))
    (tmp_path / "i.yaml").write_text(yaml.safe_dump({"nodes": [{"name": "n1", "transport": "local", "work_dir": "/w"}]}))
    cfg = load_config(tmp_path / "i.yaml", tmp_path / "g.yaml", WORKLOADS)
    engines = Instances()

    def spawn(call):
        r = engines.spawn(call)
        return Reply(stdout=r.stdout + (log_line + "\n" if log_line and "--no-kv-tier" not in call.argv else ""))
    node = ScriptedTransport(Router(preflight(), (spawned, spawn), *ok(argv_starts("mkdir"))), name="n1")
    ctx = gate_context(tmp_path / "run", cfg, transports={"n1": node}, http=engines)
    return cfg, ctx, node, WORKLOADS["g2-multiturn"]().run(ctx)


def test_a_scripted_run_sends_exactly_the_planned_commands_and_measures_the_tiers_gain(tmp_path):
    cfg, ctx, node, result = multiturn_run(tmp_path)
    assert result.error is None and result.invalid_reason is None, (result.error, result.invalid_reason)
    assert result.metrics["tier_hit_rate"] == 1.0 and result.evidence.outputs_matching == 4
    assert result.evidence.no_tier.returning_tier_hit_tokens == 0
    ports = {name: str(urlsplit(url).port) for name, url in result.evidence.base_urls.items()}
    tag = result.evidence.pool_dir.rsplit("run-", 1)[1]
    sent = normalized(node.commands, {tag: "<run>", ports["no_tier"]: "<port>", ports["tier"]: "<tier port>"})
    assert sent == [s.argv for s in gate_plan(cfg, ctx.gate) if s.argv]
    assert sum(e.kind == "kill" for e in node.events) == 2  # both instances stopped
    assert "kv_tier=False" in (ctx.gate_dir / "engine-no_tier.log").read_text()


def test_an_instance_whose_log_says_it_fell_back_makes_the_run_invalid(tmp_path):
    _, _, _, result = multiturn_run(tmp_path, log_line=DEGRADED)
    assert result.invalid_reason.startswith("the engine fell back in the tier instance's phase")
