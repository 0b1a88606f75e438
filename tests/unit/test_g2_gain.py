"""g2-gain: the gain over trials from paired points with its interval judged by the real verdict code, each arm's
proof (a tier arm served from engine memory or with its connector off is INVALID; tier reads without the tier are
INVALID), its configuration errors, and a scripted run of both arms (a scripted node, an httpx MockTransport that
answers each arm on its own port) that sends exactly the commands `kvgate plan` lists."""

import json
from pathlib import Path

import httpx
import pytest
import yaml

from harness.config import load_config
from harness.engines.load import LoadPoint
from harness.errors import ConfigError
from harness.gates.verdict import Outcome, evaluate
from harness.report.gain_section import gain_charts
from harness.suite.plan import gate_plan, plan_mismatch
from harness.workloads import WORKLOADS
from harness.workloads.g2_gain import GainEvidence, evaluate_gain, first_arm
from harness.workloads.kit.load import G2LoadEvidence, PointTrial, evaluate_load, token_accounting
from test_g2_load import ENGINE_LOG, gate_config, gate_context, scripted_node

# Scripted runs keep to one or two trials, for speed: the config loader's rule that such a gate can never PASS
# (tests/unit/test_sound_verdicts.py) is off here, and their verdicts say "N trials, no interval".
TRIALS_RULE = False


def fig(goodput_rps: float, ttft_p95_s: float, rate_rps: float = 2.0) -> LoadPoint:
    return LoadPoint(requests=4, ok=4, failed=0, duration_s=2.0, ttft_p50_s=ttft_p95_s / 2, ttft_p90_s=ttft_p95_s,
                     ttft_p95_s=ttft_p95_s, ttft_p99_s=ttft_p95_s, tpot_p50_s=0.01, e2e_p50_s=0.2, e2e_p99_s=0.3,
                     request_rate_rps=rate_rps, output_token_rate_tps=8.0, goodput_rps=goodput_rps,
                     client_lag_p99_s=0.0)


def pt(label: str, trial: int, figures: LoadPoint, memory: float, tier: float) -> PointTrial:
    acc = token_accounting(1000, 1000, memory, tier, 100, read_bytes=int(tier * 100), write_bytes=0, window_s=2.0)
    return PointTrial(label=label, load=float(label[1:]), load_kind="concurrency", trial=trial, seed=1, requests=4,
                      requests_file=f"requests-{label}-t{trial}.jsonl", figures=figures, accounting=acc)


def arms(tier_goodput: list[float], tier_memory: float = 0.0, tier_hits: float = 600.0,
         no_tier_hits: float = 0.0) -> dict:
    """A trial per tier goodput of a 2-point ladder: the arm without the tier has goodput 1.0 and 2.0 at c1 and c2;
    each arm's tier hits reconciled with its device reads (min_read_fraction 0.5)."""
    tier, none = [], []
    for t, g in enumerate(tier_goodput, 1):
        tier += [pt("c1", t, fig(1.0, 0.2), tier_memory, tier_hits), pt("c2", t, fig(g, 0.3, rate_rps=g),
                                                                          tier_memory, tier_hits)]
        none += [pt("c1", t, fig(1.0, 0.4), 0, no_tier_hits), pt("c2", t, fig(2.0, 0.6), 0, no_tier_hits)]
    ev = G2LoadEvidence(min_read_fraction=0.5, device_reads=True, trials=len(tier_goodput))
    return {"tier": evaluate_load(tier, "closed", 1.0, evidence=ev),
            "no_tier": evaluate_load(none, "closed", 1.0, evidence=ev)}


REUSABLE = 0.6  # of each point's 1000 prompt tokens, what the load offers to reuse: the 600 the tier serves


def gain(a: dict, min_tier_reuse_share: float = 0.9, **kw):
    """evaluate_gain with the load's reusable share known (REUSABLE) and the trials asked for as many as given."""
    trials = len({p.trial for p in a["tier"].evidence.points})
    return evaluate_gain(a, min_tier_reuse_share, evidence=GainEvidence(trials=trials, min_tier_served_share=0.5),
                         **{"reusable": REUSABLE, **kw})


# ------------------------------------------------------------------------------------------------ figures


def test_the_gain_is_the_paired_per_trial_ratio_over_the_ladder_with_an_interval_and_per_point():
    res = gain(arms([2.6, 2.8, 2.7] * 2))
    assert res.invalid_reason is None and res.error is None
    m = res.metrics
    # the ladder's highest goodput per arm and trial: 2.6/2, 2.8/2, 2.7/2 -> +30 %, +40 %, +35 % (twice): the
    # median and the exact interval [x(1), x(6)], typed beside it (no "_ci_" metrics)
    iv = res.intervals["goodput_gain"]
    assert m["goodput_gain"] == pytest.approx(0.35) and not any("_ci_" in k for k in m)
    assert (iv.trials, iv.asked) == (6, 6) and (iv.ci_low, iv.ci_high) == pytest.approx((0.30, 0.40))
    assert m["throughput_gain"] == pytest.approx(0.35)
    # TTFT ratios at the ladder's top point (c2): 0.3 / 0.6
    assert m["ttft_p95_ratio"] == pytest.approx(0.5) and m["ttft_p50_ratio"] == pytest.approx(0.5)
    assert m["goodput_gain@c1"] == pytest.approx(0.0) and m["ttft_p95_ratio@c1"] == pytest.approx(0.5)
    ev: GainEvidence = res.evidence
    assert [(g.trial, g.label, g.first) for g in ev.pairs][:3] == [(1, "c1", "tier"), (1, "c2", "tier"),
                                                                   (2, "c1", "no_tier")]
    assert ev.reference_gain.startswith("+29-40 %")
    assert all(c.ok for c in ev.validity) and len(ev.validity) == 4


def test_the_arm_that_goes_first_alternates_trial_by_trial():
    assert [first_arm(t) for t in (1, 2, 3, 4)] == ["tier", "no_tier", "tier", "no_tier"]


def gain_gate(tmp_path: Path, params: dict, metric: str = "goodput_gain", pass_: str = ">= 29 %",
              stop: str | None = "< 0 %") -> Path:
    return gate_config(tmp_path, params, metric, pass_, stop, workload="g2-gain", gate_id="GAIN",
                       reference={"value": "35 %", "note": "R2 single-instance basis: +29-40 %"})


BASE = {"engine": "cpu-reference", "python": "/engine/bin/python", "port": 18000, "trials": 2, "ttft_slo_s": 1.0,
        "max_tokens": 2, "load": {"concurrency": [1, 2]}, "requests_per_point": 3, "prompt_tokens": 64,
        "shared_prefix_tokens": 32, "min_read_fraction": 0}


@pytest.mark.parametrize("goodputs, outcome", [([2.7, 2.8, 2.9] * 2, Outcome.PASS),
                                               ([2.0, 2.8, 3.4] * 2, Outcome.FAIL),
                                               ([1.5, 1.6, 1.7] * 2, Outcome.STOP),
                                               ([2.7, 2.8, 2.9], Outcome.FAIL)])  # 3 trials: no interval
def test_the_gate_is_judged_on_the_interval_by_the_real_verdict_code(tmp_path, goodputs, outcome):
    d = gain_gate(tmp_path, BASE)
    gate = load_config(d / "i.yaml", d / "g.yaml", WORKLOADS, trials_rule=TRIALS_RULE).suite.gates[0]
    unit = WORKLOADS["g2-gain"].metric_unit(gate.metric)
    assert unit == "ratio" and WORKLOADS["g2-gain"].metric_unit("ttft_p95_ratio@c2") == "x"
    v = evaluate(gate, gain(arms(goodputs)), unit)
    assert v.outcome is outcome, v.reason
    if outcome is Outcome.FAIL:
        assert "inconclusive" in v.reason


# ------------------------------------------------------------------------------------------------ proofs


@pytest.mark.parametrize("kw, check, words", [
    ({"tier_hits": 0.0}, "tier served the reuse", "connector is off, or the working set fit"),
    ({"tier_hits": 100.0, "tier_memory": 500.0}, "tier served the reuse",
     "tier hit tokens 600 of 3600 reusable tokens the load offered (16.7%, at least 0.5 required); engine-memory "
     "hit tokens 3000"),
    ({"no_tier_hits": 50.0}, "recomputed without the tier", "tier hit tokens 300"),
])
def test_an_arm_whose_proof_fails_makes_the_gate_invalid_never_pass(tmp_path, kw, check, words):
    res = gain(arms([2.7, 2.8, 2.9], **kw))
    bad = [c for c in res.evidence.validity if not c.ok]
    assert [c.name for c in bad] == [check] and words in bad[0].how
    assert res.invalid_reason.startswith(check)
    d = gain_gate(tmp_path, BASE)
    gate = load_config(d / "i.yaml", d / "g.yaml", WORKLOADS, trials_rule=TRIALS_RULE).suite.gates[0]
    assert evaluate(gate, res, "ratio").outcome is Outcome.INVALID


def test_an_arm_with_an_invalid_point_or_a_fall_back_makes_the_gate_invalid_naming_the_arm():
    a = arms([2.7, 2.8, 2.9])
    res = gain(a, fallbacks={"tier": "tier's log: 'fell back to recompute'"})
    assert res.invalid_reason == "tier arm valid: tier's log: 'fell back to recompute'"
    bad = a["no_tier"].evidence.points[0].model_copy(update={"invalid_reason": "client lag p99 3 ms exceeds"})
    none = evaluate_load([bad] + a["no_tier"].evidence.points[1:], "closed", 1.0)
    res = gain({"tier": a["tier"], "no_tier": none})
    assert res.invalid_reason.startswith("no_tier arm valid: load point c1, trial 1: client lag")


# ----------------------------------------------------------------------------------------------- config


@pytest.mark.parametrize("params, where, message", [
    ({"attach": {"url": "http://e:8000"}}, "params", "attach (the engine with the tier) and no_tier_attach"),
    ({"engine": "vllm-cpu-prefix", "python": None}, "params.no_tier_engine", "declares no capabilities.no_tier_flag"),
    ({"no_tier_engine": "vllm-cpu-disk"}, "params.no_tier_engine", "both arms must be the same engine"),
    ({"engine": "vllm-cpu-prefix", "no_tier_engine": "vllm-cpu-disk", "engine_cache_tokens": 512},
     "params.engine_cache_tokens", "declares no capabilities.engine_cache_flag"),
])
def test_bad_gain_params_are_config_errors_naming_file_line_and_field(tmp_path, params, where, message):
    d = gain_gate(tmp_path, {**{k: v for k, v in BASE.items() if k != "python"},
                             **{k: v for k, v in params.items() if v is not None}})
    with pytest.raises(ConfigError) as exc:
        load_config(d / "i.yaml", d / "g.yaml", WORKLOADS, trials_rule=TRIALS_RULE)
    text = str(exc.value)
    assert "g.yaml:" in text and where in text and message in text, text


# ------------------------------------------------------------------------------------------- scripted run


class TwoArms:
    """Both arms' engines as one MockTransport handler, told apart by port: the tier arm (``port``) finds a prompt's
    first 32 tokens in its tier once any earlier prompt had them (or in its engine memory, ``serve_from``); the arm
    on ``port + 1`` has no tier and recomputes everything."""

    def __init__(self, port: int = 18000, serve_from: str = "external"):
        self.port, self.serve_from = port, serve_from
        self.counts = {a: {"prompt": 0, "gpu_hit": 0, "external_hit": 0} for a in ("tier", "no_tier")}
        self.seen: set[tuple[int, ...]] = set()
        self.ports: list[int] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        arm = "tier" if request.url.port == self.port else "no_tier"
        self.ports.append(request.url.port)
        c = self.counts[arm]
        if request.url.path == "/health":
            return httpx.Response(200, json={})
        if request.url.path == "/metrics":
            text = "".join(f"kvgate_cpu_ref_{k}_tokens_total {v}\n" for k, v in c.items())
            return httpx.Response(200, text=text + f"kvgate_cpu_ref_external_query_tokens_total {c['prompt']}\n")
        ids = json.loads(request.content)["prompt"]
        c["prompt"] += len(ids)
        if arm == "tier":
            level, n = self.hit(ids)
            c[level] += n
        return self.answer(ids)

    def hit(self, ids: list[int]) -> tuple[str, int]:
        """The tier arm's counter a prompt's hit goes to, and its tokens: the first 32 once seen before."""
        head = tuple(ids[:32])
        n = 32 if head in self.seen else 0
        self.seen.add(head)
        return f"{self.serve_from}_hit", n

    def answer(self, ids: list[int]) -> httpx.Response:
        body = 'data: {"choices": [{"text": " a"}]}\n\ndata: {"choices": [{"text": " b"}]}\n\ndata: [DONE]\n\n'
        return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})


def test_a_scripted_run_sends_exactly_the_planned_commands_on_both_arms_with_the_same_prompts(tmp_path):
    d = gain_gate(tmp_path, BASE)
    cfg = load_config(d / "i.yaml", d / "g.yaml", WORKLOADS, trials_rule=TRIALS_RULE)
    gate = cfg.suite.gates[0]
    node, engine = scripted_node(), TwoArms()
    ctx = gate_context(tmp_path, cfg, node, engine)
    result = WORKLOADS["g2-gain"]().run(ctx)
    assert result.error is None and result.invalid_reason is None, (result.error, result.invalid_reason)
    mine = [s for s in gate_plan(cfg, gate) if s.node == "n1"]
    assert plan_mismatch(mine, node.commands) is None, plan_mismatch(mine, node.commands)
    spawns = [e.argv for e in node.events if e.kind == "spawn"]
    # the two arms' engines start at once, in either order: one with the tier, one without
    assert sorted("--no-kv-tier" in argv for argv in spawns) == [False, True]
    assert {18000, 18001} <= set(engine.ports)

    ev: GainEvidence = result.evidence
    tier, none = ev.arms["tier"].points, ev.arms["no_tier"].points
    assert [(p.trial, p.label) for p in tier] == [(p.trial, p.label) for p in none] == [
        (1, "c1"), (1, "c2"), (2, "c1"), (2, "c2")]
    for a, b in zip(tier, none):  # the same prompts on both arms, each arm's files in its own folder
        ra = [json.loads(x) for x in (ctx.gate_dir / "tier" / a.requests_file).read_text().splitlines()]
        rb = [json.loads(x) for x in (ctx.gate_dir / "no_tier" / b.requests_file).read_text().splitlines()]
        assert a.seed == b.seed and len(ra) == len(rb) == 3
        assert a.accounting.tier_hit_tokens == 64 and b.accounting.tier_hit_tokens == 0
        assert b.accounting.recomputed_tokens == 192
    assert ev.proofs["tier"].tier_reuse_share == 1.0
    # min_read_fraction 0: the tier arm's device-read proof is not checked, and the verdict says so
    assert {c.name: (c.ok, c.checked) for c in ev.validity} == {
        "tier arm valid": (True, True), "no_tier arm valid": (True, True),
        "tier arm: tier hits read from the pool": (True, False), "arms equal but the tier switch": (True, True),
        "tier served the reuse": (True, True), "recomputed without the tier": (True, True)}
    assert ev.arm_difference == {"tier_only_argv": [], "no_tier_only_argv": ["--no-kv-tier"], "tier_only_env": [],
                                 "no_tier_only_env": []}
    assert result.intervals["goodput_gain"].trials == 2 and not result.intervals["goodput_gain"].has_interval
    v = evaluate(gate, result, "ratio")
    assert "(2 trials, no interval)" in v.reason
    assert "unproven (not checked): tier arm: tier hits read from the pool (not checked: the gate sets " \
           "min_read_fraction 0" in v.reason
    assert json.loads((ctx.gate_dir / "g2-gain-summary.json").read_text())["evidence"]["pairs"]
    # the report overlays the two arms' TTFT distributions, read back from each arm's requests files
    verdict = {"gate_id": "GAIN", "evidence": json.loads(result.evidence.model_dump_json())}
    (caption, svg), = gain_charts(verdict, ctx.gate_dir, "g2-gain").values()
    assert "with the tier (n=12)" in svg and "without the tier (n=12)" in svg and "SLO 1 s" in svg
    assert gain_charts(verdict, None, "g2-gain") == {} and gain_charts({"gate_id": "L", "evidence": {}}, ctx.gate_dir, "g2-gain") == {}


def test_a_tier_arm_silently_served_from_engine_memory_is_invalid(tmp_path):
    d = gain_gate(tmp_path, BASE)
    cfg = load_config(d / "i.yaml", d / "g.yaml", WORKLOADS, trials_rule=TRIALS_RULE)
    gate = cfg.suite.gates[0]
    result = WORKLOADS["g2-gain"]().run(gate_context(tmp_path, cfg, scripted_node(), TwoArms(serve_from="gpu")))
    assert result.error is None
    assert result.invalid_reason.startswith("tier served the reuse: the tier served no token")
    assert evaluate(gate, result, "ratio").outcome is Outcome.INVALID


def binding_log(cores: str) -> str:
    """ENGINE_LOG with the compute-core statement of vLLM's CPU build (as tests/fixtures/engine_logs/ captured it)."""
    return ENGINE_LOG + (
        "(EngineCore pid=24929) INFO 12-05 04:54:12 [ompmultiprocessing.py:185] OpenMP thread binding info: \n"
        f"(EngineCore pid=24929) INFO 12-05 04:54:12 [ompmultiprocessing.py:185] \tlocal_rank=0, core ids=[{cores}]\n"
        "(EngineCore pid=24929) INFO 12-05 04:54:12 [ompmultiprocessing.py:185] \treserved_cpus=[]\n")


def test_an_arm_without_the_tier_on_fewer_cores_makes_the_gain_invalid_and_the_bundle_re_derives_it(tmp_path):
    # what vLLM's CPU build did on the 2-core CI machine: with a KV connector configured it kept no core back from
    # its compute threads, without one it kept one: the baseline computed on half the cores
    d = gain_gate(tmp_path, BASE)
    cfg = load_config(d / "i.yaml", d / "g.yaml", WORKLOADS, trials_rule=TRIALS_RULE)
    gate = cfg.suite.gates[0]
    node = scripted_node(lambda argv: binding_log("0" if "--no-kv-tier" in argv else "0, 1"))
    result = WORKLOADS["g2-gain"]().run(gate_context(tmp_path / "a", cfg, node, TwoArms()))
    assert result.evidence.compute_cores == {"tier": [[0, 1]], "no_tier": [[0]]}
    why = result.invalid_reason
    assert why.startswith("arms computed on the same cores: as the engines' logs state: the tier arm computed on "
                          "cores 0,1; the no tier arm computed on cores 0 "), why
    assert "VLLM_CPU_NUM_OF_RESERVED_CPU" in why
    assert evaluate(gate, result, "ratio").outcome is Outcome.INVALID

    # the same cores on both: the check holds; then the no-tier arm's log in the bundle says otherwise, and the
    # re-derived gate follows the log, not the run's record
    ctx = gate_context(tmp_path / "b", cfg, scripted_node(binding_log("0, 1")), TwoArms())
    result = WORKLOADS["g2-gain"]().run(ctx)
    checks = {c.name: c for c in result.evidence.validity}
    assert result.invalid_reason is None and checks["arms computed on the same cores"].ok
    signed = json.loads(json.dumps(result.as_dict()))
    again = WORKLOADS["g2-gain"].rederive(ctx.gate_dir, signed, cfg.params["GAIN"], {"bundle_dir": tmp_path / "b"})
    assert again.invalid_reason is None
    (ctx.gate_dir / "engine-no_tier.log").write_text(binding_log("1"))
    again = WORKLOADS["g2-gain"].rederive(ctx.gate_dir, signed, cfg.params["GAIN"], {"bundle_dir": tmp_path / "b"})
    assert again.invalid_reason.startswith("arms computed on the same cores"), again.invalid_reason
    assert "no tier arm computed on cores 1" in again.invalid_reason


def test_the_vllm_gain_gates_arms_keep_the_same_cores_for_their_compute():
    from harness.engines import load_profile
    for name in ("vllm-cpu-disk", "vllm-cpu-no-tier"):
        assert load_profile(name).env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0", name


# ------------------------------------------------------------------------------------------ kvgate cost


def test_the_tier_hit_rate_feeds_kvgate_cost_by_report_id_and_an_invalid_run_feeds_nothing(tmp_path):
    import shutil
    from harness.cost import params as cp
    root = Path(__file__).resolve().parents[2]
    # of the 1000 prompt tokens per point, 0.75 could be reused; the tier served 600 of them per point
    res = gain(arms([2.7, 2.8, 2.9]), reusable=0.75)
    assert res.metrics["tier_hit_rate"] == pytest.approx(0.8) and res.evidence.tier_hit_rate == pytest.approx(0.8)
    d = gain_gate(tmp_path, BASE)
    gate = load_config(d / "i.yaml", d / "g.yaml", WORKLOADS, trials_rule=TRIALS_RULE).suite.gates[0]
    verdict = evaluate(gate, res, "ratio", WORKLOADS["g2-gain"].metric_unit).to_dict()
    (m,) = [x for x in cp.extract_measured({"verdicts": [verdict]}, "KVG-20261201-gain") if x.name == "hit_rate"]
    assert (m.name, m.value, m.gate_id, m.metric) == ("hit_rate", pytest.approx(0.8), "GAIN", "tier_hit_rate")
    shutil.copytree(root / "workloads" / "models", tmp_path / "models")
    lines = (root / "workloads" / "cost-params.example.yaml").read_text().replace("  hit_rate: 90 %\n", "")
    (tmp_path / "params.yaml").write_text(lines)
    with pytest.raises(cp.ConfigError, match=r"params.yaml:\d+: fleet.hit_rate: required field is missing \(or pass a "
                       "g2-gain bundle"):
        cp.resolve(tmp_path / "params.yaml", [])  # neither set nor measured
    r = cp.resolve(tmp_path / "params.yaml", [m])  # the hit rate alone (the measured gain: the next test)
    v = r.inputs["hit_rate"]
    assert v.kind == "measured" and v.value == pytest.approx(0.8) and "KVG-20261201-gain GAIN" in v.source
    invalid = evaluate(gate, gain(arms([2.7, 2.8, 2.9], tier_hits=0.0), reusable=0.75), "ratio",
                       WORKLOADS["g2-gain"].metric_unit).to_dict()
    assert invalid["outcome"] == "INVALID" and cp.extract_measured({"verdicts": [invalid]}, "KVG-x") == []


def test_the_measured_gain_is_set_beside_the_models_in_kvgate_costs_report_by_report_id(tmp_path):
    import shutil
    from harness.cost import params as cp
    from harness.cost.report import build_tables, render_markdown
    root = Path(__file__).resolve().parents[2]
    d = gain_gate(tmp_path, BASE, metric="throughput_gain")
    gate = load_config(d / "i.yaml", d / "g.yaml", WORKLOADS, trials_rule=TRIALS_RULE).suite.gates[0]
    # both arms complete 2 requests/s at best: a measured gain of 0 is a measurement, not nothing
    flat = evaluate(gate, gain(arms([1.8, 1.8, 1.8]), reusable=0.75), "ratio",
                    WORKLOADS["g2-gain"].metric_unit).to_dict()
    found = {m.name: m for m in cp.extract_measured({"verdicts": [flat]}, "KVG-20261202-gain")}
    measured = found["measured_throughput_gain"]
    assert measured.value == 0.0 and (measured.gate_id, measured.metric) == ("GAIN", "throughput_gain")
    shutil.copytree(root / "workloads" / "models", tmp_path / "models")
    (tmp_path / "params.yaml").write_text((root / "workloads" / "cost-params.example.yaml").read_text()
                                          .replace("  hit_rate: 90 %\n", ""))
    r = cp.resolve(tmp_path / "params.yaml", list(found.values()))
    assert r.measured_gain is measured and "measured_throughput_gain" not in r.inputs  # not a model input
    md = render_markdown(r, build_tables(r), "KVG-cost")
    line = next(x for x in md.splitlines() if x.startswith("Cross-check: the model gives a throughput gain"))
    assert "measured on the same load with the tier and without: +0.0% (KVG-20261202-gain GAIN throughput_gain" \
        in line
    # no g2-gain bundle: no such line; an INVALID gain run feeds nothing
    r0 = cp.resolve(tmp_path / "params.yaml", [found["hit_rate"]])
    assert r0.measured_gain is None and "Cross-check: the model gives a throughput" not in render_markdown(
        r0, build_tables(r0), "KVG-cost")
    invalid = evaluate(gate, gain(arms([2.7, 2.8, 2.9], tier_hits=0.0)), "ratio",
                       WORKLOADS["g2-gain"].metric_unit).to_dict()
    assert cp.extract_measured({"verdicts": [invalid]}, "KVG-x") == []


def test_a_bundle_re_derives_the_gain_from_each_arms_requests_and_counters_files(tmp_path):
    d = gain_gate(tmp_path, BASE)
    cfg = load_config(d / "i.yaml", d / "g.yaml", WORKLOADS, trials_rule=TRIALS_RULE)
    ctx = gate_context(tmp_path, cfg, scripted_node(), TwoArms())
    result = WORKLOADS["g2-gain"]().run(ctx)
    signed = json.loads(json.dumps(result.as_dict()))  # result.json as the bundle holds it
    again = WORKLOADS["g2-gain"].rederive(ctx.gate_dir, signed, cfg.params["GAIN"], {"bundle_dir": tmp_path})
    metrics, invalid = again.metrics, again.invalid_reason
    assert invalid is None and metrics.keys() == result.metrics.keys()
    assert all(metrics[k] == pytest.approx(v) for k, v in result.metrics.items())
    # the tier arm's counters edited after the run to claim no tier hits: the proof follows the raw files
    for pt in signed["evidence"]["arms"]["tier"]["points"]:
        f = ctx.gate_dir / "tier" / pt["counters_file"]
        c = json.loads(f.read_text())
        c["after"]["kvgate_cpu_ref_external_hit_tokens_total"] = c["before"]["kvgate_cpu_ref_external_hit_tokens_total"]
        f.write_text(json.dumps(c))
    again = WORKLOADS["g2-gain"].rederive(ctx.gate_dir, signed, cfg.params["GAIN"], {"bundle_dir": tmp_path})
    metrics, invalid = again.metrics, again.invalid_reason
    assert invalid is not None and invalid.startswith("tier served the reuse: the tier served no token")


def test_the_vllm_gates_arm_without_the_tier_is_the_same_launch_less_its_connector():
    from harness.engines import load_profile
    tier, none = load_profile("vllm-cpu-disk"), load_profile("vllm-cpu-no-tier")
    i = tier.argv.index("--kv-transfer-config")
    assert none.argv == tier.argv[:i] + tier.argv[i + 2:] and "--enforce-eager" in none.argv
    assert none.env == tier.env and none.hit_metrics == tier.hit_metrics


def test_a_trace_is_replayed_on_both_arms_with_its_reuse_accounted_and_its_hit_rate_reported(tmp_path):
    trace = tmp_path / "trace.jsonl"
    rows = [{"timestamp": 0, "input_length": 64, "output_length": 2, "hash_ids": [0, 1]},
            {"timestamp": 10, "input_length": 64, "output_length": 2, "hash_ids": [0, 2]}]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    params = {k: v for k, v in BASE.items() if k not in ("load", "requests_per_point", "prompt_tokens",
                                                         "shared_prefix_tokens")}
    # the engine double finds 32-token blocks: LMCache's chunk set to 32 (its 256 would find none of this trace)
    params.update(load={"path": str(trace), "format": "mooncake", "block_tokens": 32}, max_client_lag_p99_s=10,
                  lmcache_overrides={"chunk_size": 32})
    d = gain_gate(tmp_path, params)
    cfg = load_config(d / "i.yaml", d / "g.yaml", WORKLOADS, trials_rule=TRIALS_RULE)
    node = scripted_node()
    result = WORKLOADS["g2-gain"]().run(gate_context(tmp_path, cfg, node, TwoArms()))
    assert result.error is None and result.invalid_reason is None, (result.error, result.invalid_reason)
    mine = [s for s in gate_plan(cfg, cfg.suite.gates[0]) if s.node == "n1"]
    assert plan_mismatch(mine, node.commands) is None
    ev: GainEvidence = result.evidence
    assert ev.trace.requests == 2 and ev.arms["tier"].trace.sha256 == ev.trace.sha256
    # the second request's first block (32 of 128 prompt tokens) is the trace's reuse, and the tier served it
    assert ev.reusable_share == pytest.approx(0.25) and result.metrics["tier_hit_rate"] == pytest.approx(1.0)
    assert [p.accounting.tier_hit_tokens for p in ev.arms["tier"].points] == [32, 32]


def test_a_gain_gate_cannot_judge_a_capacity_figure(tmp_path):
    d = gain_gate(tmp_path, BASE, metric="capacity_hit_rate", pass_=">= 90 %", stop=None)
    with pytest.raises(ConfigError) as exc:
        load_config(d / "i.yaml", d / "g.yaml", WORKLOADS, trials_rule=TRIALS_RULE)
    assert "g.yaml:" in str(exc.value) and "needs capacity:" in str(exc.value), str(exc.value)


# ------------------------------------------------------------------------------------------ attached pair


class AttachedPair:
    """Two vLLM servers someone else runs, as one MockTransport handler told apart by host: the one at
    ``tier_host`` finds a prompt's first 32 tokens on its tier once an earlier prompt had them (vLLM's external
    prefix cache counters); the other has no tier and recomputes everything."""

    def __init__(self, tier_host: str = "10.0.0.21"):
        self.tier_host = tier_host
        self.counts = {a: {"prompt": 0, "ext_hit": 0, "ext_query": 0} for a in ("tier", "no_tier")}
        self.seen: set[tuple[int, ...]] = set()
        self.prompts: dict[str, list[list[int]]] = {"tier": [], "no_tier": []}

    def __call__(self, request: httpx.Request) -> httpx.Response:
        arm = "tier" if request.url.host == self.tier_host else "no_tier"
        c = self.counts[arm]
        if request.url.path == "/health":
            return httpx.Response(200)
        if request.url.path == "/metrics":
            return httpx.Response(200, text=(
                f"vllm:prompt_tokens_total {c['prompt']}\nvllm:prefix_cache_hits_total 0\n"
                f"vllm:external_prefix_cache_hits_total {c['ext_hit']}\n"
                f"vllm:external_prefix_cache_queries_total {c['ext_query']}\n"))
        ids = json.loads(request.content)["prompt"]
        self.prompts[arm].append(ids)
        c["prompt"] += len(ids)
        if arm == "tier":
            c["ext_query"] += len(ids)
            head = tuple(ids[:32])
            if head in self.seen:
                c["ext_hit"] += 32
            self.seen.add(head)
        body = 'data: {"choices": [{"text": " a"}]}\n\ndata: {"choices": [{"text": " b"}]}\n\ndata: [DONE]\n\n'
        return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})


ATTACHED = {k: v for k, v in BASE.items() if k not in ("python", "port")} | {
    "engine": "vllm-attach", "pool_path": "/mnt/kvpool",
    "attach": {"url": "http://10.0.0.21:8000", "log": {"node": "n1", "run": "journalctl -u vllm-tier"}},
    "no_tier_attach": {"url": "http://10.0.0.22:8000", "log": {"node": "n1", "run": "journalctl -u vllm-plain"}},
    "model_config_inline": {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 2,
                            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000,
                            "torch_dtype": "bfloat16"}}


def test_an_attached_pair_is_measured_as_two_arms_sending_exactly_its_plan_with_the_same_prompts(tmp_path):
    from harness.transport.doubles import Reply, ScriptedTransport
    d = gain_gate(tmp_path, ATTACHED)
    cfg = load_config(d / "i.yaml", d / "g.yaml", WORKLOADS, trials_rule=TRIALS_RULE)

    def handler(call):
        if call.argv[:2] == ("sh", "-c") and call.argv[2].startswith("journalctl"):
            return Reply(stdout="INFO engine serving\n")
        if "kvgate-pool-blockstat" in call.argv:
            return Reply(stdout="kvgate-pool-device 8:1 /dev/sda1\n1 0 5000 0 1 0 4096 0 0 0 0\n")
        return Reply(rc=127, stderr=f"{call.argv[0]}: not expected")

    node, engines = ScriptedTransport(handler, name="n1"), AttachedPair()
    result = WORKLOADS["g2-gain"]().run(gate_context(tmp_path, cfg, node, engines))
    assert result.error is None and result.invalid_reason is None, (result.error, result.invalid_reason)
    # nothing launched or stopped; every command (each arm's log, the tier's pool device) as planned, in order
    plan = gate_plan(cfg, cfg.suite.gates[0])
    assert node.commands == [s.argv for s in plan if s.argv] and not [e for e in node.events if e.kind == "spawn"]
    assert sum(c == ("sh", "-c", "journalctl -u vllm-plain") for c in node.commands) == 2 + 2 * 4
    assert sum("kvgate-pool-blockstat" in c for c in node.commands) == 2 * 4  # the tier arm's points only
    # after each engine's own warm-up prompt, the same prompts on both (a per-run seed: attached engines outlive
    # the run)
    assert engines.prompts["tier"][1:] == engines.prompts["no_tier"][1:] and len(engines.prompts["tier"]) == 1 + 2 * 6
    ev: GainEvidence = result.evidence
    assert ev.prompt_seed != ATTACHED.get("seed", 0) and ev.arms["tier"].attached and ev.arms["no_tier"].attached
    assert ev.arms["no_tier"].base_url == "http://10.0.0.22:8000" and ev.arms["no_tier"].pool_dir is None
    assert {c.name: c.ok for c in ev.validity} == {"tier arm valid": True, "no_tier arm valid": True,
                                                   "tier arm: tier hits read from the pool": True,
                                                   "tier served the reuse": True, "recomputed without the tier": True}
    assert ev.proofs["no_tier"].tier_hit_tokens == 0 and ev.proofs["tier"].tier_hit_tokens == 2 * 2 * 64


@pytest.mark.parametrize("change, message", [
    ({"no_tier_attach": None}, "attach (the engine with the tier) and no_tier_attach (the same engine without it) go "
                               "together"),
    ({"attach": None, "pool_path": None}, "go together"),
    ({"no_tier_attach": {"url": "http://10.0.0.21:8000/"}}, "one engine cannot be both arms"),
    ({"engine_cache_tokens": 4096}, "an attached engine's memory is its operator's"),
    ({"lmcache_overrides": {"max_local_cpu_size": 0.1}}, "an attached engine's LMCache is configured by its operator"),
    ({"no_tier_attach": {"url": "http://10.0.0.22:8000", "log": {"node": "n9", "run": "true"}}},
     "node 'n9' is not one of the gate's nodes"),
    ({"no_tier_engine": "vllm-cpu-no-tier"}, "an attached arm takes a profile without argv"),
])
def test_a_half_attached_or_self_compared_pair_is_a_config_error_naming_file_and_field(tmp_path, change, message):
    params = {k: v for k, v in {**ATTACHED, **change}.items() if v is not None}
    d = gain_gate(tmp_path, params)
    with pytest.raises(ConfigError) as exc:
        load_config(d / "i.yaml", d / "g.yaml", WORKLOADS, trials_rule=TRIALS_RULE)
    text = str(exc.value)
    assert "g.yaml:" in text and message in text, text
