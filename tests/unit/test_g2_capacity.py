"""g2-gain's capacity curve: the working-set sweep's points and traces, the levels from the engine's counters,
the knee, the tier running out, the requirement judged PASS / FAIL / INVALID by the real verdict code, bad
``capacity:`` blocks as file:line errors, a scripted sweep (a scripted node, an engine whose engine memory, RAM
level and tier are LRU caches of declared sizes) that sends exactly what `kvgate plan` lists and re-derives from
its raw files, and the report's stacked curve with the knee marked."""

import json
from collections import OrderedDict

import httpx
import pytest

from harness.config import load_config
from harness.errors import ConfigError
from harness.gates.verdict import Outcome, evaluate
from harness.report.gain_section import gain_charts
from harness.suite.plan import gate_plan, plan_mismatch
from harness.workloads import WORKLOADS
from harness.workloads.kit.capacity import (CapacityCurvePoint, CapacityPoint, capacity_knee, capacity_validity,
                                           point_levels, requirement_rate, reusable_tokens, sweep_points, sweep_trace,
                                           tier_exhausted, CapacitySpec)
from harness.workloads.g2_gain import GainEvidence
from test_g2_load import gate_config, gate_context, scripted_node

# Scripted runs keep to one or two trials, for speed: the config loader's rule that such a gate can never PASS
# (tests/unit/test_sound_verdicts.py) is off here, and their verdicts say "N trials, no interval".
TRIALS_RULE = False

PREFIX = "kvgate_cpu_ref_"


# ------------------------------------------------------------------------------------------ the sweep, pure


def test_each_working_set_is_sessions_of_the_context_as_a_multiple_of_engine_memory():
    spec = CapacitySpec(working_set_x=[0.5, 1, 2, 8], context_tokens=256)
    assert sweep_points(spec, 1024) == [("x0.5", 0.5, 2), ("x1", 1.0, 4), ("x2", 2.0, 8), ("x8", 8.0, 32)]
    # a working set that is not a whole number of sessions is rounded, and recorded as run
    assert sweep_points(CapacitySpec(working_set_x=[0.3, 3], context_tokens=400), 1000) == [
        ("x0.3", 0.4, 1), ("x3", 3.2, 8)]


def test_a_point_resumes_every_sessions_whole_context_round_robin_on_a_fixed_schedule():
    t = sweep_trace(3, 600, 2, rate_rps=4.0, block_tokens=256)
    assert [r.session for r in t.requests] == ["s0", "s1", "s2"] * 2
    assert [r.t_ms for r in t.requests] == [0, 250, 500, 750, 1000, 1250]
    assert t.requests[0].hash_ids == t.requests[3].hash_ids == (0, 1, 2)   # 600 tokens: 3 blocks of 256
    assert not set(t.requests[0].hash_ids) & set(t.requests[1].hash_ids)   # sessions share nothing
    # the second round could be served whole but its last token: 3 x 599
    assert reusable_tokens(t) == 3 * 599


def rates(mem, ram, tier, evicted=None, x=1.0, label="x1") -> CapacityCurvePoint:
    f = {"memory_hit_rate": mem, "ram_hit_rate": ram, "tier_hit_rate": tier,
         "recomputed_rate": max(0.0, 1 - mem - ram - tier)}
    if evicted is not None:
        f["tier_evicted_tokens"] = evicted
    return CapacityCurvePoint(label=label, working_set_x=x, sessions=1, figures=f)


def test_the_levels_are_the_counters_split_with_the_tier_the_connectors_hits_less_the_ram_levels():
    shape = CapacityPoint(label="x2", trial=1, working_set_x=2, sessions=4, working_set_tokens=2048, requests=12,
                          reusable_tokens=4000)
    p = point_levels(shape, prompt=6144, memory=1000, connector=2500, ram=500, evicted=0)
    assert (p.memory_hit_tokens, p.ram_hit_tokens, p.tier_hit_tokens, p.recomputed_tokens) == (1000, 500, 2000, 500)
    assert (p.memory_hit_rate, p.ram_hit_rate, p.tier_hit_rate, p.recomputed_rate) == (0.25, 0.125, 0.5, 0.125)
    # a level the engine does not count leaves the split unknown, not zero
    q = point_levels(shape, prompt=6144, memory=1000, connector=2500, ram=None, evicted=None)
    assert q.tier_hit_tokens is None and q.recomputed_rate is None and q.tier_evicted_tokens is None


def test_the_knee_is_where_engine_memory_stops_holding_and_the_levels_below_take_over():
    curve = [rates(1.0, 0, 0, x=0.5), rates(0.9, 0.1, 0, x=1), rates(0.2, 0.3, 0.5, x=2), rates(0, 0, 1, x=8)]
    assert capacity_knee(curve)[0] == 2
    held = capacity_knee([rates(1.0, 0, 0, x=0.5), rates(0.8, 0, 0, x=4)])
    assert held[0] is None and "held every working set" in held[1]
    nothing = capacity_knee([rates(1.0, 0, 0, x=0.5), rates(0.0, 0, 0, x=2)])
    assert nothing[0] is None and "no level below it took over" in nothing[1]


def test_the_tier_runs_out_where_it_evicts_and_the_reuse_is_recomputed_and_uncounted_evictions_say_nothing():
    # at 4x the tier evicts what earlier points left but still serves the reuse; at 16x it cannot hold it
    curve = [rates(1, 0, 0, 0, x=0.5), rates(0, 0, 1, 0, x=2), rates(0, 0, 0.9, 4096, x=4), rates(0, 0, 0.6, 9e3, x=8),
             rates(0, 0, 0.2, 9e3, x=16)]
    assert tier_exhausted(curve) == 16
    assert tier_exhausted([rates(1, 0, 0, None, x=0.5), rates(0, 0, 1, None, x=8)]) is None


def test_the_requirement_is_the_lowest_rate_of_its_levels_past_engine_memory_up_to_its_working_set():
    curve = [rates(1.0, 0, 0, x=0.5), rates(0.9, 0.05, 0.05, x=1), rates(0.1, 0.3, 0.6, x=2), rates(0, 0.1, 0.85, x=8),
             rates(0, 0, 0.2, x=16)]
    assert requirement_rate(curve, ["tier"], 8) == pytest.approx(0.6)        # x=2 is the worst within 8x
    assert requirement_rate(curve, ["ram", "tier"], 8) == pytest.approx(0.9)  # x2 0.9, x8 0.95
    assert requirement_rate(curve, ["tier"], 16) == pytest.approx(0.2)
    gap = curve[:2] + [CapacityCurvePoint(label="x2", working_set_x=2, sessions=1, figures={"memory_hit_rate": 0})]
    assert requirement_rate(gap, ["tier"], 8) is None  # a level not counted: no figure, never a pass


def test_a_sweep_whose_levels_are_not_counted_or_counted_twice_or_whose_engine_memory_did_not_hold_is_invalid():
    shape = CapacityPoint(label="x0.5", trial=1, working_set_x=0.5, sessions=1, working_set_tokens=512, requests=3,
                          reusable_tokens=1022)
    good = point_levels(shape, 1536, 1022, 0, 0, 0)
    curve = [rates(1.0, 0, 0, x=0.5)]
    assert all(c.ok for c in capacity_validity([good], curve, None, None))
    cases = [
        ([point_levels(shape, 1536, 1022, 0, None, None)], curve, "levels counted", "no counter for the RAM level"),
        ([point_levels(shape, 1536, 0, 100, 300, 0)], curve, "levels counted", "exceed the connector's"),
        ([point_levels(shape, 1536, 1022, 1000, 0, 0)], curve, "levels counted", "counted at two levels"),
        ([good], [rates(0.1, 0, 0.9, x=0.5)], "engine memory held the smallest working set", "served 0.10"),
    ]
    for points, c, name, words in cases:
        bad = [v for v in capacity_validity(points, c, None, None) if not v.ok]
        assert [v.name for v in bad] == [name] and words in bad[0].how, bad
    bad = [v for v in capacity_validity([good], curve, None, "tier's log: 'fell back'") if not v.ok]
    assert [v.name for v in bad] == ["tier arm valid"]


# ----------------------------------------------------------------------------------------------- config

SWEEP = {"engine": "cpu-reference", "python": "/engine/bin/python", "port": 18000, "trials": 1, "ttft_slo_s": 1.0,
         "max_tokens": 1, "engine_cache_tokens": 128, "max_client_lag_p99_s": 10,
         "capacity": {"working_set_x": [0.5, 1, 2, 4], "context_tokens": 64, "rounds": 2, "rate_rps": 1000,
                      "require": {"levels": ["ram", "tier"], "up_to_x": 4}}}


VLLM_MODEL = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 1000, "torch_dtype": "bfloat16"}


def sweep_gate(tmp_path, params=None, pass_=">= 90 %", metric="capacity_hit_rate"):
    return gate_config(tmp_path, params or SWEEP, metric, pass_, None, workload="g2-gain", gate_id="CAP")


@pytest.mark.parametrize("change, where, message", [
    ({"capacity": {"working_set_x": [1, 2], "context_tokens": 64}}, "params.capacity",
     "must start below engine memory"),
    ({"capacity": {"working_set_x": [0.5, 4, 2], "context_tokens": 64}}, "params.capacity", "ascending"),
    ({"capacity": {"working_set_x": [0.5, 2], "context_tokens": 64, "require": {"up_to_x": 8}}}, "params.capacity",
     "beyond the sweep's largest"),
    ({"capacity": {"working_set_x": [0.5, 2], "context_tokens": 64, "require": {"up_to_x": 2, "levels": ["disk"]}}},
     "params.capacity.require.levels", "memory"),
    ({"capacity": {"working_set_x": [0.5, 2], "context_tokens": 64, "rounds": 1}}, "params.capacity.rounds", "greater than or equal to 2"),
    ({"capacity": {"working_set_x": [0.5, 2], "context_tokens": 64, "sessions": 3}}, "params.capacity.sessions",
     "unknown key"),
    ({"engine_cache_tokens": None}, "params.engine_cache_tokens", "needs the engine memory"),
    ({"capacity": {"working_set_x": [0.5, 0.6, 2], "context_tokens": 64}}, "params.capacity.working_set_x",
     "both give 1 session(s)"),
    ({"capacity": {"working_set_x": [0.4, 2], "context_tokens": 256}}, "params.capacity.working_set_x",
     "not below engine memory"),
    ({"load": {"concurrency": [1]}}, "params", "exactly one of load"),
    ({"prompt_tokens": 64}, "params", "not for a capacity sweep"),
    ({"attach": {"url": "http://e:8000"}}, "params.attach", "launches its engine itself"),
    ({"engine": "vllm-cpu-prefix", "python": None}, "params.engine_cache_tokens",
     "declares no capabilities.engine_cache_flag"),
    ({"engine": "vllm-cpu-tiered", "python": None, "engine_cache_tokens": 1000, "model_config_inline": VLLM_MODEL,
      "capacity": {"working_set_x": [0.5, 2], "context_tokens": 200, "require": {"up_to_x": 2}}},
     "params.engine_cache_tokens", "not a whole number of 128-token KV blocks"),
    ({"engine": "vllm-cpu-tiered", "python": None, "model_config_inline": VLLM_MODEL},
     "params.capacity.require.levels", "has no RAM level between its memory and the tier"),
])
def test_bad_capacity_params_are_config_errors_naming_file_line_and_field(tmp_path, change, where, message):
    params = {**SWEEP, **change}
    params = {k: v for k, v in params.items() if v is not None}
    with pytest.raises(ConfigError) as exc:
        load_config(sweep_gate(tmp_path, params) / "i.yaml", tmp_path / "g.yaml", WORKLOADS)
    text = str(exc.value)
    assert "g.yaml:" in text and where in text and message in text, text


@pytest.mark.parametrize("metric, ok", [("goodput_gain", False), ("ttft_p95_ratio", False), ("capacity_hit_rate", True),
                                        ("tier_hit_rate@x2", True), ("knee_x", True)])
def test_a_capacity_gate_judges_only_what_a_sweep_measures(tmp_path, metric, ok):
    # a gain figure on a capacity gate passed validation and was missing at run time (ERROR after the engine ran)
    pass_ = {"knee_x": ">= 1 x", "goodput_gain": ">= 10 %", "ttft_p95_ratio": ">= 10 %"}.get(metric, ">= 90 %")
    d = sweep_gate(tmp_path, metric=metric, pass_=pass_)
    if ok:
        load_config(d / "i.yaml", tmp_path / "g.yaml", WORKLOADS)
        return
    with pytest.raises(ConfigError) as exc:
        load_config(d / "i.yaml", tmp_path / "g.yaml", WORKLOADS)
    text = str(exc.value)
    assert "g.yaml:" in text and "metric" in text and "not measured by a capacity sweep" in text, text


# ------------------------------------------------------------------------------------------- scripted run


class Levels:
    """An engine with three LRU levels of whole prompts (tokens): engine memory, the RAM level and the tier. A
    prompt is served by the first level that holds it (engine memory: all but its last token; the connector: all
    of it, as LMCache counts whole chunks), then held by every level; the tier counts its evictions."""

    def __init__(self, memory: int, ram: int, tier: int, count_evictions: bool = True, ram_counter: bool = True):
        self.caps = {"memory": memory, "ram": ram, "tier": tier}
        self.held = {k: OrderedDict() for k in self.caps}
        self.c = {"prompt": 0, "gpu_hit": 0, "external_hit": 0, "ram_hit": 0, "tier_evicted": 0}
        self.count_evictions, self.ram_counter = count_evictions, ram_counter

    def _put(self, level: str, key: tuple) -> None:
        held = self.held[level]
        held[key] = len(key)
        held.move_to_end(key)
        while sum(held.values()) > self.caps[level]:
            _, n = held.popitem(last=False)
            if level == "tier":
                self.c["tier_evicted"] += n

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200, json={})
        if request.url.path == "/metrics":
            names = [k for k in self.c if (k != "ram_hit" or self.ram_counter)
                     and (k != "tier_evicted" or self.count_evictions)]
            return httpx.Response(200, text="".join(f"{PREFIX}{k}_tokens_total {self.c[k]}\n" for k in names))
        ids = tuple(json.loads(request.content)["prompt"])
        n = len(ids)
        self.c["prompt"] += n
        if ids in self.held["memory"]:
            self.c["gpu_hit"] += n - 1
        elif ids in self.held["ram"]:
            self.c["external_hit"] += n
            self.c["ram_hit"] += n
        elif ids in self.held["tier"]:
            self.c["external_hit"] += n
        for level in self.caps:
            self._put(level, ids)
        body = 'data: {"choices": [{"text": " a"}]}\n\ndata: [DONE]\n\n'
        return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})


def run_sweep(tmp_path, engine, params=None, pass_=">= 90 %"):
    d = sweep_gate(tmp_path, params, pass_)
    cfg = load_config(d / "i.yaml", d / "g.yaml", WORKLOADS, trials_rule=TRIALS_RULE)
    gate = cfg.suite.gates[0]
    node = scripted_node()
    ctx = gate_context(tmp_path, cfg, node, engine)
    result = WORKLOADS["g2-gain"]().run(ctx)
    return cfg, gate, node, ctx, result


def test_a_scripted_sweep_sends_exactly_the_planned_commands_and_draws_the_levels_the_knee_and_the_tiers_end(
        tmp_path):
    # engine memory 128 tokens (2 sessions of 64), RAM level 192, tier 320: the sweep 0.5x .. 4x crosses them all
    cfg, gate, node, ctx, result = run_sweep(tmp_path, Levels(memory=128, ram=192, tier=320))
    assert result.error is None, result.error
    mine = [s for s in gate_plan(cfg, gate) if s.node == "n1"]
    assert plan_mismatch(mine, node.commands) is None, plan_mismatch(mine, node.commands)
    assert sum(e.kind == "spawn" for e in node.events) == 1   # one engine for the sweep, with the tier
    spawn = next(e.argv for e in node.events if e.kind == "spawn")
    assert "--no-kv-tier" not in spawn and spawn[spawn.index("--gpu-cache-tokens") + 1] == "128"
    ev: GainEvidence = result.evidence
    cap = ev.capacity
    curve = {c.label: c.figures for c in cap.curve}
    assert [(c.label, c.sessions) for c in cap.curve] == [("x0.5", 1), ("x1", 2), ("x2", 4), ("x4", 8)]
    assert curve["x0.5"]["memory_hit_rate"] == curve["x1"]["memory_hit_rate"] == 1.0
    assert curve["x2"]["memory_hit_rate"] == 0 and curve["x2"]["tier_hit_rate"] == 1.0   # 256 > RAM's 192
    assert curve["x4"]["recomputed_rate"] == 1.0 and curve["x4"]["tier_evicted_tokens"] > 0   # 512 > tier's 320
    assert cap.knee_x == 2 and cap.tier_exhausted_x == 4 and cap.tier_evictions_counted
    m = result.metrics
    assert m["knee_x"] == 2 and m["tier_exhausted_x"] == 4 and m["tier_hit_rate@x2"] == 1.0
    assert m["capacity_hit_rate"] == 0.0   # the tier ran out at 4x: the requirement up to 4x fails
    assert WORKLOADS["g2-gain"].metric_unit("tier_hit_rate@x2") == "ratio"
    assert WORKLOADS["g2-gain"].metric_unit("knee_x") is not None
    assert {c.name: c.ok for c in ev.validity} == {"tier arm valid": True, "levels counted": True,
                                                   "engine memory held the smallest working set": True}
    verdict_ = evaluate(gate, result, "ratio", WORKLOADS["g2-gain"].metric_unit)
    assert verdict_.outcome is Outcome.FAIL
    # a sweep measures no fleet hit rate and no gain: kvgate cost takes nothing from it
    from harness.cost.params import extract_measured
    assert extract_measured({"verdicts": [json.loads(json.dumps(verdict_.to_dict()))]}, "KVG-x") == []
    # every point's requests and counters in the tier arm's folder, each point's prompts new
    pts = ev.arms["tier"].points
    assert [p.label for p in pts] == ["x0.5", "x1", "x2", "x4"] and len({p.seed for p in pts}) == 4
    assert all((ctx.gate_dir / "tier" / p.requests_file).is_file() for p in pts)

    # the report: the levels stacked per working set, the knee and the tier's end marked
    verdict = {"gate_id": "CAP", "evidence": json.loads(ev.model_dump_json())}
    charts = gain_charts(verdict, ctx.gate_dir, "g2-gain")
    caption, svg = charts["capacity-curve"]
    assert "knee 2x" in svg and "tier full 4x" in svg and "levels stacked" in caption
    for level in ("engine memory", "RAM level", "tier", "recomputed"):
        assert level in svg

    # re-derived from the bundle's raw files; a counters file edited to claim the RAM level served the tier's
    # hits moves the curve with it
    signed = json.loads(json.dumps(result.as_dict()))
    again = WORKLOADS["g2-gain"].rederive(ctx.gate_dir, signed, cfg.params["CAP"], {"bundle_dir": tmp_path})
    metrics, invalid = again.metrics, again.invalid_reason
    assert invalid is None and metrics == pytest.approx(result.metrics)
    x2 = next(p for p in signed["evidence"]["arms"]["tier"]["points"] if p["label"] == "x2")
    f = ctx.gate_dir / "tier" / x2["counters_file"]
    c = json.loads(f.read_text())
    c["after"][PREFIX + "ram_hit_tokens_total"] = c["after"][PREFIX + "external_hit_tokens_total"] - \
        c["before"][PREFIX + "external_hit_tokens_total"] + c["before"][PREFIX + "ram_hit_tokens_total"]
    f.write_text(json.dumps(c))
    again = WORKLOADS["g2-gain"].rederive(ctx.gate_dir, signed, cfg.params["CAP"], {"bundle_dir": tmp_path})
    metrics, _ = again.metrics, again.invalid_reason
    assert metrics["tier_hit_rate@x2"] == 0 and metrics["ram_hit_rate@x2"] == 1.0


def test_a_tier_that_holds_the_sweep_passes_the_requirement(tmp_path):
    _, gate, _, _, result = run_sweep(tmp_path, Levels(memory=128, ram=0, tier=10_000))
    assert result.invalid_reason is None and result.metrics["capacity_hit_rate"] == 1.0
    assert result.evidence.capacity.tier_exhausted_x is None and result.evidence.capacity.knee_x == 2
    assert evaluate(gate, result, "ratio", WORKLOADS["g2-gain"].metric_unit).outcome is Outcome.PASS


@pytest.mark.parametrize("engine, reason", [
    (Levels(memory=128, ram=0, tier=10_000, ram_counter=False), "levels counted:"),
    (Levels(memory=0, ram=0, tier=10_000), "engine memory held the smallest working set:"),
])
def test_a_sweep_without_its_levels_proven_is_invalid_never_pass(tmp_path, engine, reason):
    _, gate, _, _, result = run_sweep(tmp_path, engine)
    assert result.invalid_reason.startswith(reason), result.invalid_reason
    assert evaluate(gate, result, "ratio", WORKLOADS["g2-gain"].metric_unit).outcome is Outcome.INVALID


# ------------------------------------------------------------------------------ an engine without a RAM level


def test_vllms_engine_memory_is_given_in_whole_kv_blocks_and_a_sweep_on_it_reads_no_ram_level(tmp_path):
    from harness.engines import load_profile
    from harness.workloads.g2_gain import GainParams, sweep_counters, sweep_point, with_cache
    from harness.workloads.kit.load import PointTrial, token_accounting
    params = {**{k: v for k, v in SWEEP.items() if k != "python"}, "engine": "vllm-cpu-tiered",
              "model_config_inline": VLLM_MODEL, "engine_cache_tokens": 5120,
              "capacity": {**SWEEP["capacity"], "context_tokens": 1026, "require": {"up_to_x": 4}}}
    load_config(sweep_gate(tmp_path, params) / "i.yaml", tmp_path / "g.yaml", WORKLOADS)  # a valid gate
    prof = load_profile("vllm-cpu-tiered")
    argv = with_cache(GainParams.model_validate(params), prof).argv
    assert argv[-2:] == ["--num-gpu-blocks-override", "40"]  # 5120 tokens = 40 blocks of 128
    counters = sweep_counters(prof)
    assert counters.extra == () and counters.memory_hit_tokens == ["vllm:prefix_cache_hits_total"]
    # the tier's hits are the connector's whole: no RAM level takes a share of them
    acc = token_accounting(2052, 2052.0, 0.0, 2048.0, 1024, None, None, 1.0)
    pt = PointTrial(label="x2", load=0.0, load_kind="trace", trial=1, seed=1, requests=4, requests_file="r.jsonl",
                    accounting=acc)
    shape = CapacityPoint(label="x2", trial=1, working_set_x=2.0, sessions=2, working_set_tokens=2052, requests=4,
                          reusable_tokens=2048.0)
    _, cp = sweep_point(pt, shape, None, None, 0.25, 0.0, False)
    assert (cp.memory_hit_tokens, cp.ram_hit_tokens, cp.tier_hit_tokens) == (0.0, 0.0, 2048.0)
    assert cp.tier_hit_rate == 1.0 and cp.tier_evicted_tokens is None
