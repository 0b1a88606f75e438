"""g2-load: its token accounting, what makes a point INVALID, the knee over trials and its interval judged by the
real verdict code, its configuration errors, and a scripted run (a scripted node, an httpx MockTransport engine)
that sends exactly the commands `kvgate plan` lists."""

import json
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import yaml

import doubles  # tests/doubles.py: the shared gate context
from harness.config import load_config
from harness.engines.load import LoadPoint, arrival_offsets
from harness.errors import ConfigError, HarnessError
from harness.execute.clock import ScriptedClock
from harness.parsers.poolloop import evict_window
from harness.gates.verdict import Outcome, evaluate
from harness.stats import ORDER_STATISTICS, Interval
from harness.suite.plan import gate_plan
from harness.transport.doubles import Reply, ScriptedTransport
from harness.workloads import WORKLOADS
from harness.workloads.kit.base import GateContext
from harness.workloads.kit.load import (G2LoadEvidence, PointTrial, evaluate_load, point_invalid, synthetic_requests,
                                       token_accounting)

# Scripted runs keep to one or two trials, for speed: the config loader's rule that such a gate can never PASS
# (tests/unit/test_sound_verdicts.py) is off here, and their verdicts say "N trials, no interval".
TRIALS_RULE = False

ROOT = Path(__file__).resolve().parents[2]
PREFLIGHT_CPU_REFERENCE = doubles.PREFLIGHT_CPU_REFERENCE


def fig(ttft_p95_s: float = 0.1, lag_s: float = 0.0, failed: int = 0, goodput_rps: float = 2.0) -> LoadPoint:
    return LoadPoint(requests=4, ok=4 - failed, failed=failed, duration_s=2.0, ttft_p50_s=ttft_p95_s / 2,
                     ttft_p90_s=ttft_p95_s * 0.9, ttft_p95_s=ttft_p95_s, ttft_p99_s=ttft_p95_s * 1.1, tpot_p50_s=0.01,
                     e2e_p50_s=0.2, e2e_p99_s=0.3, request_rate_rps=2.0, output_token_rate_tps=8.0,
                     goodput_rps=goodput_rps, client_lag_p99_s=lag_s)


def point(label: str, load: float, trial: int, figures: LoadPoint, invalid: str | None = None) -> PointTrial:
    return PointTrial(label=label, load=load, load_kind="concurrency", trial=trial, seed=1, requests=4,
                      requests_file=f"requests-{label}-t{trial}.jsonl", figures=figures, invalid_reason=invalid)


# ------------------------------------------------------------------------------------------ accounting


def test_prompt_tokens_are_memory_hits_plus_tier_hits_plus_recomputed_and_the_tier_is_reconciled_with_the_device():
    acc = token_accounting(sent_prompt_tokens=1000, prompt_delta=1000, memory_delta=400, tier_delta=300,
                           kv_bytes_per_token=2048, read_bytes=300 * 2048 // 2, write_bytes=4_000_000, window_s=2.0)
    assert acc.recomputed_tokens == 300
    assert acc.memory_hit_tokens + acc.tier_hit_tokens + acc.recomputed_tokens == acc.prompt_tokens
    assert (acc.memory_hit_share, acc.tier_hit_share, acc.recomputed_share) == pytest.approx((0.4, 0.3, 0.3))
    assert acc.tier_hit_kv_bytes == 300 * 2048 and acc.read_fraction == pytest.approx(0.5)
    assert acc.store_write_gb_s == pytest.approx(0.002)  # 4 MB in 2 s, decimal GB/s
    assert acc.prompt_tokens_source == "engine"


def test_an_engine_without_a_prompt_counter_is_accounted_by_what_was_sent_and_unknown_hits_stay_unknown():
    acc = token_accounting(sent_prompt_tokens=512, prompt_delta=None, memory_delta=None, tier_delta=128,
                           kv_bytes_per_token=None, read_bytes=None, write_bytes=None, window_s=1.0)
    assert acc.prompt_tokens == 512 and acc.prompt_tokens_source == "sent"
    assert acc.tier_hit_share == 0.25 and acc.recomputed_tokens is None and acc.memory_hit_share is None
    assert acc.read_fraction is None and acc.store_write_gb_s is None


# ------------------------------------------------------------------------------------------- INVALID


def test_client_lag_above_the_bound_makes_the_point_invalid_naming_the_lag():
    why = point_invalid(fig(lag_s=0.0042), None, max_client_lag_p99_s=0.001, min_read_fraction=0.5,
                        device_reads=True)
    assert why is not None and "client lag p99 4.200 ms" in why and "1 ms bound" in why
    assert point_invalid(fig(lag_s=0.0009), None, 0.001, 0.5, True) is None


def test_tier_hits_the_pool_device_did_not_read_make_the_point_invalid():
    short = token_accounting(1000, 1000, 0, 500, 1000, read_bytes=100_000, write_bytes=0, window_s=1.0)
    why = point_invalid(fig(), short, 0.001, min_read_fraction=0.5, device_reads=True)
    assert why is not None and "read fraction 0.2000 is below 0.5" in why and "100000 B" in why
    unmeasured = token_accounting(1000, 1000, 0, 500, 1000, read_bytes=None, write_bytes=None, window_s=1.0)
    why = point_invalid(fig(), unmeasured, 0.001, 0.5, True, device_error="the pool is on tmpfs")
    assert why is not None and "could not be measured (the pool is on tmpfs)" in why
    full = token_accounting(1000, 1000, 0, 500, 1000, read_bytes=500_000, write_bytes=0, window_s=1.0)
    assert point_invalid(fig(), full, 0.001, 0.5, True) is None
    # no tier hits claimed: nothing for the device to prove
    none = token_accounting(1000, 1000, 900, 0, 1000, read_bytes=0, write_bytes=0, window_s=1.0)
    assert point_invalid(fig(), none, 0.001, 0.5, True) is None


def test_one_invalid_point_makes_the_gate_invalid_naming_point_and_trial():
    pts = [point("c1", 1, 1, fig()), point("c2", 2, 1, fig(), invalid="client lag p99 3.000 ms exceeds ...")]
    res = evaluate_load(pts, "closed", ttft_slo_s=1.0)
    assert res.invalid_reason.startswith("load point c2, trial 1: client lag p99 3.000 ms")
    assert res.error is None


# ------------------------------------------------------------------------------------- knee over trials


def ladder(p95_by_trial: list[tuple[float, float, float]]) -> list[PointTrial]:
    return [point(f"c{c}", c, t, fig(ttft_p95_s=v)) for t, row in enumerate(p95_by_trial, 1)
            for c, v in zip((1, 2, 4), row)]


def test_the_knee_is_found_per_trial_and_reported_as_its_median_with_an_interval():
    # trial 1 holds the SLO (1 s) up to 4 users, trial 2 only up to 2, trial 3 up to 4
    res = evaluate_load(ladder([(0.2, 0.5, 0.9), (0.2, 0.6, 1.4), (0.3, 0.5, 0.8)]), "closed", ttft_slo_s=1.0)
    ev: G2LoadEvidence = res.evidence
    assert ev.knee_per_trial == [4.0, 2.0, 4.0]
    m, ivs = res.metrics, res.intervals
    # the median over trials as the metric, its interval typed beside it (no "_ci_" metrics): 3 trials give none
    assert m["knee_concurrency"] == 4.0 and not any("_ci_" in k for k in m)
    assert ivs["knee_concurrency"] == Interval(median=4.0, trials=3, asked=3, method=ORDER_STATISTICS)
    # every figure of every point, over the trials
    assert m["ttft_p95_s@c2"] == pytest.approx(0.5) and ivs["ttft_p95_s@c2"].trials == 3
    assert [s.label for s in ev.summary] == ["c1", "c2", "c4"]
    assert ev.summary[2].figures["ttft_p95_s"].median == pytest.approx(0.9)
    # six trials: the exact interval [x(1), x(6)] of the knees 2, 2, 4, 4, 4, 4 (coverage 1 - 2/64)
    six = evaluate_load(ladder([(0.2, 0.5, 0.9), (0.2, 0.6, 1.4), (0.3, 0.5, 0.8)] * 2), "closed", ttft_slo_s=1.0)
    iv = six.intervals["knee_concurrency"]
    assert (iv.median, iv.ci_low, iv.ci_high, iv.trials) == (4.0, 2.0, 4.0, 6)
    assert iv.coverage == pytest.approx(1 - 2 / 64)


def test_a_trial_whose_lowest_load_misses_the_slo_has_knee_zero_and_a_point_with_failures_ends_the_ladder():
    pts = ladder([(1.5, 0.5, 0.5), (0.2, 0.5, 0.5)])
    pts[4] = point("c2", 2, 2, fig(ttft_p95_s=0.5, failed=1))
    res = evaluate_load(pts, "closed", ttft_slo_s=1.0)
    assert res.evidence.knee_per_trial == [None, 1.0]
    assert res.metrics["knee_concurrency"] == 0.5  # the median of 0 and 1


def test_a_point_whose_requests_all_failed_is_data_the_knee_stops_below_it_and_only_a_run_that_served_nothing_errs():
    pts = ladder([(0.2, 0.5, 0.5)])
    top = LoadPoint(**{**fig().to_dict(), "ok": 0, "failed": 4, "ttft_p95_s": None, "goodput_rps": 0.0})
    pts[2] = point("c4", 4, 1, top).model_copy(update={"error": "every request failed; first: HTTP 503"})
    res = evaluate_load(pts, "closed", ttft_slo_s=1.0)
    assert res.error is None and res.evidence.knee_per_trial == [2.0]
    assert res.evidence.points[2].error.endswith("HTTP 503")
    dead = [point(p.label, p.load, 1, top).model_copy(update={"error": "every request failed; first: refused"})
            for p in pts]
    res = evaluate_load(dead, "closed", ttft_slo_s=1.0)
    assert res.error == "not one request of the run succeeded; first: every request failed; first: refused"


def gate_config(tmp_path: Path, params: dict, metric: str = "knee_concurrency", pass_: str = ">= 3",
                stop: str | None = "< 1", workload: str = "g2-load", gate_id: str = "L", **more) -> Path:
    gate = {"id": gate_id, "title": "load", "workload": workload, "params": params, "metric": metric, "pass": pass_,
            **more}
    if stop:
        gate["stop_loss"] = stop
    (tmp_path / "g.yaml").write_text(yaml.safe_dump({"suite": {"name": "t", "version": "1"}, "gates": [gate]},
                                                    sort_keys=False))
    (tmp_path / "i.yaml").write_text(yaml.safe_dump({"nodes": [{"name": "n1", "transport": "local",
                                                                "work_dir": "/w"}]}))
    return tmp_path


ENGINE = {"engine": "cpu-reference", "python": "/engine/bin/python", "port": 18000, "trials": 2, "ttft_slo_s": 1.0,
          "max_tokens": 2}
BASE = {**ENGINE, "load": {"concurrency": [1, 2]}, "requests_per_point": 3, "prompt_tokens": 64,
        "shared_prefix_tokens": 32}


def test_an_interval_straddling_the_threshold_is_an_inconclusive_fail_through_the_real_verdict_code(tmp_path):
    d = gate_config(tmp_path, BASE)
    cfg = load_config(d / "i.yaml", d / "g.yaml", WORKLOADS, trials_rule=TRIALS_RULE)
    gate = cfg.suite.gates[0]
    unit = WORKLOADS["g2-load"].metric_unit(gate.metric)
    # knees 4, 2, 4, 4, 2, 4: median 4 clears ">= 3" but the interval [2, 4] does not
    straddling = evaluate_load(ladder([(0.2, 0.5, 0.9), (0.2, 0.6, 1.4), (0.3, 0.5, 0.8)] * 2), "closed", 1.0)
    v = evaluate(gate, straddling, unit)
    assert v.outcome is Outcome.FAIL and v.actual == 4.0
    assert v.reason.startswith("inconclusive: median 4 count (95 % CI 2-4, 6 trials) straddles pass >= 3")
    assert "trials would separate them" in v.reason
    # the same median with every trial at 4 users: the whole interval clears pass
    clear = evaluate_load(ladder([(0.2, 0.5, 0.9)] * 6), "closed", 1.0)
    assert evaluate(gate, clear, unit).outcome is Outcome.PASS
    # ... but from 3 trials there is no 95 % interval: never PASS
    three = evaluate(gate, evaluate_load(ladder([(0.2, 0.5, 0.9)] * 3), "closed", 1.0), unit)
    assert three.outcome is Outcome.FAIL and "(3 trials, no interval)" in three.reason
    # every trial misses at the lowest load: the whole interval [0, 0] hits the stop-loss
    stop = evaluate_load(ladder([(1.2, 1.5, 1.9)] * 6), "closed", 1.0)
    assert evaluate(gate, stop, unit).outcome is Outcome.STOP


# ------------------------------------------------------------------------------------------- config


def test_a_point_figure_is_a_gate_metric_in_its_unit(tmp_path):
    d = gate_config(tmp_path, BASE, metric="ttft_p95_s@c2", pass_="<= 500 ms", stop=None)
    cfg = load_config(d / "i.yaml", d / "g.yaml", WORKLOADS, trials_rule=TRIALS_RULE)
    assert WORKLOADS["g2-load"].metric_unit(cfg.suite.gates[0].metric) == "s"
    res = evaluate_load(ladder([(0.2, 0.3, 0.9)] * 6), "closed", 1.0)
    assert evaluate(cfg.suite.gates[0], res, "s").outcome is Outcome.PASS


@pytest.mark.parametrize("params,metric,where,message", [
    ({"load": {"concurrency": [1, 2], "rates_rps": [1.0]}}, "knee_concurrency", "gates[0].params.load",
     "give exactly one of concurrency"),
    ({"load": {"concurrency": [1], "burstiness": 0.5}}, "knee_concurrency", "gates[0].params.load",
     "burstiness belongs to an open loop"),
    ({"load": {"rates_rps": [1.0, -2.0]}}, "knee_rate_rps", "gates[0].params.load", "every rate must be > 0"),
    ({"trials": 0}, "knee_concurrency", "gates[0].params.trials", "greater than or equal to 1"),
    ({"shared_prefix_tokens": 64}, "knee_concurrency", "gates[0].params", "must be below prompt_tokens"),
    ({"knee_percentile": 97}, "knee_concurrency", "gates[0].params.knee_percentile", ""),
    ({}, "ttft_p95_s@x4", "gates[0].metric", "has no metric 'ttft_p95_s@x4'"),
    ({"load": {"path": "t.jsonl"}}, "ttft_p95_s@trace", "gates[0].params",
     "requests_per_point, prompt_tokens, shared_prefix_tokens: shape synthetic prompts"),
    ({"load": {"concurrency": [2], "time_scale": 0.5}}, "knee_concurrency", "gates[0].params.load",
     "time_scale: only for a trace"),
])
def test_bad_load_params_are_config_errors_naming_file_line_and_field(tmp_path, params, metric, where, message):
    d = gate_config(tmp_path, {**BASE, **params}, metric=metric)
    with pytest.raises(ConfigError) as e:
        load_config(d / "i.yaml", d / "g.yaml", WORKLOADS, trials_rule=TRIALS_RULE)
    text = str(e.value)
    assert f"g.yaml:" in text and f": {where}" in text and message in text, text
    line = int(text.split("g.yaml:")[1].split(":")[0])
    assert line > 1


def test_a_bad_trace_line_is_named_by_the_trace_file_line_and_field(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [1, 2]}\n'
                     '{"timestamp": 10, "input_length": 600, "output_length": 4, "hash_ids": [1]}\n')
    d = gate_config(tmp_path, {**ENGINE, "load": {"path": str(trace), "format": "mooncake"}}, metric="ttft_p95_s@trace",
                    pass_="<= 1 s", stop=None)
    with pytest.raises(ConfigError) as e:
        load_config(d / "i.yaml", d / "g.yaml", WORKLOADS, check_files=True, trials_rule=TRIALS_RULE)
    assert f"gates[0].params.load.path: trace: {trace}:2: hash_ids: 1 hash ids for 600 input tokens" in str(e.value)
    # a bundle's suite re-loaded for re-evaluation does not read the trace (the run recorded its digest)
    assert load_config(d / "i.yaml", d / "g.yaml", WORKLOADS,
                       trials_rule=TRIALS_RULE).params["L"].load.path == str(trace)


def test_synthetic_prompts_share_exactly_the_prefix_of_their_group_and_are_new_at_every_point(tmp_path):
    d = gate_config(tmp_path, {**BASE, "prefix_groups": 2})
    p = load_config(d / "i.yaml", d / "g.yaml", WORKLOADS, trials_rule=TRIALS_RULE).params["L"]
    a = synthetic_requests(p, "c1", 1, seed=7, vocab_size=1000)
    assert [len(r.prompt) for r in a] == [64, 64, 64]
    assert a[0].prompt[:32] == a[2].prompt[:32] != a[1].prompt[:32]  # groups round-robin
    assert a[0].prompt[32:] != a[2].prompt[32:]
    b = synthetic_requests(p, "c1", 1, seed=8, vocab_size=1000)
    assert not set(map(tuple, (r.prompt[:32] for r in a))) & set(map(tuple, (r.prompt[:32] for r in b)))


# ------------------------------------------------------------------------------------------ a scripted run


class PrefixEngine:
    """The cpu-reference engine's HTTP API as a MockTransport handler: its per-level counters (prompt tokens,
    engine-memory hits for a first 32-token block it has seen before, no tier hits) and a streaming completion."""

    def __init__(self):
        self.prompt = self.gpu_hit = 0
        self.seen: set[tuple[int, ...]] = set()
        self.paths: list[str] = []
        self.prompts: list[list[int]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(request.url.path)
        if request.url.path == "/health":
            return httpx.Response(200, json={})
        if request.url.path == "/metrics":
            text = "".join(f"kvgate_cpu_ref_{k}_tokens_total {v}\n" for k, v in
                           (("prompt", self.prompt), ("gpu_hit", self.gpu_hit), ("external_hit", 0),
                            ("external_query", self.prompt)))
            return httpx.Response(200, text=text)
        ids = json.loads(request.content)["prompt"]
        self.prompts.append(ids)
        self.prompt += len(ids)
        head = tuple(ids[:32])
        self.gpu_hit += 32 if head in self.seen else 0
        self.seen.add(head)
        body = 'data: {"choices": [{"text": " a"}]}\n\ndata: {"choices": [{"text": " b"}]}\n\ndata: [DONE]\n\n'
        return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})


# an engine's log: cpu-reference's lines, and LMCache 0.5.6's line that shows O_DIRECT in force (captured from
# engine-tier.log of a cpu-reference-odirect run on this machine: the profile's in_force_log)
ENGINE_LOG = ("cpu-reference: listening on 127.0.0.1\n"
              "[2026-12-04 14:13:24,814] LMCache INFO: Initialized FSConnector with base paths "
              "[PosixPath('/var/tmp/kvgate-work/kvgate-kv-pool/run-325a525a')], relative tmp dir: None, read ahead size: "
              "None, use O_DIRECT: True (fs_connector.py:121:lmcache.v1.storage_backend.connector.fs_connector)\n"
              "cpu-reference: served\n")


def scripted_node(engine_log: str | Callable[[list[str]], str] = ENGINE_LOG) -> ScriptedTransport:
    """The node: pool-device probes whose read and written bytes grow (a cold tier's reads: 200 MB between two
    probes), the engine's pre-flight, the loop pool's make, and a spawned engine that leaves ``engine_log`` (or
    ``engine_log(argv)`` of its launch) as its log on the node (fetched into the gate directory as a real run's is)."""
    writes = iter(range(0, 10 ** 9, 2048))
    reads = iter(range(5000, 10 ** 12, 400_000))
    files: dict[str, bytes] = {}

    def handler(call):
        argv = call.argv
        if call.spawned:
            files[call.log_path] = (engine_log(list(argv)) if callable(engine_log) else engine_log).encode()
            return Reply()
        if argv[0] == "mkdir":
            return Reply()
        if "kvgate-pool-blockstat" in argv:
            return Reply(stdout=f"kvgate-pool-device 8:1 /dev/sda1\n1 0 {next(reads)} 0 1 0 {next(writes)} 0 0 0 0\n")
        if "kvgate-pool-loop" in argv:  # a gate's loop pool (pool_device: {kind: loop}), as this machine answered
            return Reply(stdout="kvgate-pool-loop /dev/loop7 7:7 1\n")
        if argv[0] == "/engine/bin/python":
            return Reply(stdout=PREFLIGHT_CPU_REFERENCE)
        return Reply(rc=127, stderr=f"{argv[0]}: not expected")
    return ScriptedTransport(handler, name="n1", files=files)


def gate_context(tmp_path: Path, cfg, node: ScriptedTransport, engine=None, clock=None) -> GateContext:
    """The gate of ``cfg`` on the scripted node ``n1``, with its engine (an httpx handler) and clock."""
    return doubles.gate_context(tmp_path, cfg, transports={"n1": node}, http=engine, clock=clock)


def test_a_scripted_run_sends_exactly_the_planned_commands_and_accounts_every_point(tmp_path):
    d = gate_config(tmp_path, BASE, pass_=">= 2", stop=None)
    cfg = load_config(d / "i.yaml", d / "g.yaml", WORKLOADS, trials_rule=TRIALS_RULE)
    gate = cfg.suite.gates[0]
    node = scripted_node()
    ctx = gate_context(tmp_path, cfg, node, PrefixEngine())
    gate_dir = ctx.gate_dir
    result = WORKLOADS["g2-load"]().run(ctx)
    assert result.error is None and result.invalid_reason is None, (result.error, result.invalid_reason)

    # every command the run sent is in the plan, in the plan's order (kvgate plan lists what a run sends); the
    # plan names the run's directories by <run>, the run by its own tag
    tag = result.evidence.pool_dir.rsplit("run-", 1)[1]
    sent = [tuple(a.replace(tag, "<run>") for a in c) for c in node.commands]
    planned = [s.argv for s in gate_plan(cfg, gate) if s.argv]
    assert sent == planned
    assert sum("kvgate-pool-blockstat" in c for c in node.commands) == 2 * 2 * 2  # 2 loads x 2 trials, before/after
    assert sum(e.kind == "spawn" for e in node.events) == 1  # one engine start for the whole ladder

    ev: G2LoadEvidence = result.evidence
    assert [(p.trial, p.label) for p in ev.points] == [(1, "c1"), (1, "c2"), (2, "c1"), (2, "c2")]
    for p in ev.points:
        recs = [json.loads(line) for line in (gate_dir / p.requests_file).read_text().splitlines()]
        assert len(recs) == 3 and all(r["error"] is None and r["sent_s"] >= r["due_s"] for r in recs)
        acc = p.accounting
        # 3 prompts of 64 tokens; the 2nd and 3rd find the first 32 in the engine's memory
        assert acc.prompt_tokens == 192 and acc.prompt_tokens_source == "engine"
        assert (acc.memory_hit_tokens, acc.tier_hit_tokens, acc.recomputed_tokens) == (64, 0, 128)
        assert acc.device_write_bytes == 2048 * 512 and acc.device_read_bytes == 400_000 * 512  # the scripted device's reads
        counters = json.loads((gate_dir / p.counters_file).read_text())  # what the accounting came from
        assert (counters["after"]["kvgate_cpu_ref_prompt_tokens_total"]
                - counters["before"]["kvgate_cpu_ref_prompt_tokens_total"]) == acc.prompt_tokens
    assert ev.knee_per_trial == [2.0, 2.0] and result.metrics["knee_concurrency"] == 2.0
    assert result.metrics["recomputed_share@c1"] == pytest.approx(128 / 192)
    assert ev.warmup["load"]["error"] is None
    # two trials give no 95 % interval: the knee is reported, never a conclusive PASS
    v = evaluate(gate, result, "count")
    assert v.outcome is Outcome.FAIL and "median 2 count (2 trials, no interval)" in v.reason
    # the validity as named checks; min_read_fraction's proof is on (0.5 by default) and nothing claimed tier hits
    assert [(c.name, c.ok, c.checked) for c in ev.validity] == [
        ("requests served", True, True), ("client kept the schedule", True, True),
        ("tier hits read from the pool", True, True), ("no fall-back", True, True)]
    assert ev.validity[0].how == "12 requests sent, 12 served, 0 failed over 4 points"
    summary = json.loads((gate_dir / "g2-load-summary.json").read_text())
    assert summary["evidence"]["points"][0]["figures"]["requests"] == 3


def run_valid(tmp_path: Path, d: Path):
    """The g2-load gate written in ``d`` run on the scripted node and the engine double; it must end valid."""
    cfg = load_config(d / "i.yaml", d / "g.yaml", WORKLOADS, trials_rule=TRIALS_RULE)
    ctx = gate_context(tmp_path, cfg, scripted_node(), PrefixEngine())
    result = WORKLOADS["g2-load"]().run(ctx)
    assert result.error is None and result.invalid_reason is None, (result.error, result.invalid_reason)
    return cfg, ctx, result


def test_an_open_loop_sends_on_its_schedule_and_records_due_and_sent_times(tmp_path):
    d = gate_config(tmp_path, {**BASE, "load": {"rates_rps": [50.0]}, "trials": 1, "max_client_lag_p99_s": 1.0},
                    metric="knee_rate_rps", pass_=">= 1 /s", stop=None)
    cfg = load_config(d / "i.yaml", d / "g.yaml", WORKLOADS, trials_rule=TRIALS_RULE)
    ctx = gate_context(tmp_path, cfg, scripted_node(), PrefixEngine())
    gate_dir = ctx.gate_dir
    result = WORKLOADS["g2-load"]().run(ctx)
    assert result.error is None and result.invalid_reason is None
    (p,) = result.evidence.points
    assert p.label == "r50" and p.load_kind == "rate_rps"
    recs = [json.loads(line) for line in (gate_dir / p.requests_file).read_text().splitlines()]
    assert [r["due_s"] for r in recs] == pytest.approx(arrival_offsets(3, 50.0, 1.0, p.seed))
    assert all(r["sent_s"] >= r["due_s"] for r in recs)
    assert result.metrics["knee_rate_rps"] == 50.0


def test_the_plan_of_a_ladder_against_a_deployed_stack_lists_every_point_and_trial_with_its_device_probes(tmp_path):
    """docs/g2.md's attach example: nothing launched, the pool device probed on its node around every point."""
    params = {"engine": "vllm-attach", "served_model_name": "Qwen/Qwen3-Coder-480B-A35B-Instruct",
              "model_config_inline": {"model_type": "llama", "hidden_size": 512, "num_hidden_layers": 2,
                                      "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 1000,
                                      "torch_dtype": "bfloat16"},
              "attach": {"url": "http://10.0.0.21:8000"}, "pool_path": "/mnt/kvpool/lmcache",
              "load": {"rates_rps": [1, 2, 4, 8, 16]}, "trials": 2, "ttft_slo_s": 2.0, "tpot_slo_s": 0.05}
    d = gate_config(tmp_path, params, metric="knee_rate_rps", pass_=">= 4 /s", stop="< 1 /s")
    cfg = load_config(d / "i.yaml", d / "g.yaml", WORKLOADS, trials_rule=TRIALS_RULE)
    steps = gate_plan(cfg, cfg.suite.gates[0])
    probes = [s for s in steps if "kvgate-pool-blockstat" in s.argv]
    assert len(probes) == 5 * 2 * 2 and all(s.node == "n1" and s.argv[-1] == "/mnt/kvpool/lmcache" for s in probes)
    loads = [s.description.split(":")[0] for s in steps if s.node == "(control host)" and "open loop" in s.description]
    assert loads == [f"trial {t}/2, r{r}" for t in (1, 2) for r in (1, 2, 4, 8, 16)]
    assert not any(s.argv and s.argv[0] == "mkdir" for s in steps)  # nothing is launched


def test_a_trace_that_is_not_there_is_the_runs_error_not_a_suite_that_no_longer_loads(tmp_path):
    """A bundle re-evaluated where its trace is gone still loads its suite; the run itself says what is missing."""
    d = gate_config(tmp_path, {**ENGINE, "load": {"path": str(tmp_path / "gone.jsonl")}}, metric="ttft_p95_s@trace",
                    pass_="<= 1 s", stop=None)
    cfg = load_config(d / "i.yaml", d / "g.yaml", WORKLOADS, trials_rule=TRIALS_RULE)
    node = scripted_node()
    ctx = gate_context(tmp_path, cfg, node)
    result = WORKLOADS["g2-load"]().run(ctx)
    assert result.error.startswith(f"trace {tmp_path / 'gone.jsonl'}: ") and "gone.jsonl" in result.error
    assert node.commands == []  # nothing started


def test_a_trace_is_replayed_by_its_scaled_timestamps_with_prompts_sharing_exactly_their_shared_blocks(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 40, "output_length": 9, "hash_ids": [1, 2, 3]}\n'
                     '{"timestamp": 100, "input_length": 64, "output_length": 1, "hash_ids": [1, 2, 4, 5]}\n'
                     '{"timestamp": 300, "input_length": 30, "output_length": 3, "hash_ids": [7, 8]}\n')
    load = {"path": str(trace), "format": "mooncake", "time_scale": 0.5}
    d = gate_config(tmp_path, {**ENGINE, "load": {**load, "tokens_per_block": 16}, "trials": 1,
                               "max_client_lag_p99_s": 1.0}, metric="ttft_p95_s@trace", pass_="<= 1 s", stop=None)
    # the trace's own blocks are 512 tokens (Mooncake); re-mapped to 16-token blocks: 40 tokens -> 2 blocks
    with pytest.raises(ConfigError):  # 40 tokens in 512-token blocks need 1 hash id, not 3
        load_config(d / "i.yaml", d / "g.yaml", WORKLOADS, check_files=True, trials_rule=TRIALS_RULE)
    trace.write_text('{"timestamp": 0, "input_length": 1200, "output_length": 9, "hash_ids": [1, 2, 3]}\n'
                     '{"timestamp": 100, "input_length": 1600, "output_length": 1, "hash_ids": [1, 2, 4, 5]}\n'
                     '{"timestamp": 300, "input_length": 900, "output_length": 3, "hash_ids": [7, 8]}\n')
    cfg = load_config(d / "i.yaml", d / "g.yaml", WORKLOADS, trials_rule=TRIALS_RULE)
    engine = PrefixEngine()
    ctx = gate_context(tmp_path, cfg, scripted_node(), engine)
    result = WORKLOADS["g2-load"]().run(ctx)
    assert result.error is None and result.invalid_reason is None, (result.error, result.invalid_reason)
    (p,) = result.evidence.points
    assert p.label == "trace" and result.evidence.trace.requests == 3 and result.evidence.knee is None
    assert result.evidence.trace.unbounded_hit_rate == pytest.approx(1024 / 3700)  # ids 1, 2 again in request 2
    recs = [json.loads(line) for line in (ctx.gate_dir / p.requests_file).read_text().splitlines()]
    assert [r["due_s"] for r in recs] == pytest.approx([0.0, 0.05, 0.15])  # timestamps (ms) x 0.5
    # 512-token blocks re-mapped to 16: 1200 -> 38 tokens, 1600 -> 50, 900 -> 29 (blocks of 16, the last cut)
    a, b, c = engine.prompts[-3:]
    assert (len(a), len(b), len(c)) == (38, 50, 29)
    assert a[:32] == b[:32] and a[32:] != b[32:38]      # hash ids 1, 2 shared: exactly those two blocks
    assert a[:16] != c[:16]                               # hash ids 7, 8: nothing shared
    assert p.accounting.memory_hit_tokens == 32  # the engine found the shared blocks once
    assert "ttft_p95_s@trace" in result.metrics and "knee_rate_rps" not in result.metrics


class LateCountingEngine(PrefixEngine):
    """An engine that answers a request's last token before it counts the request (vLLM records its statistics
    after the output is sent): a request's tokens reach /metrics only ``late`` reads of /metrics later."""

    def __init__(self, late: int):
        super().__init__()
        self.late = late
        self.pending: list[list[int]] = []  # [reads left, prompt tokens, gpu hits]

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            for p in self.pending:
                p[0] -= 1
            for p in [p for p in self.pending if p[0] < 0]:
                self.prompt, self.gpu_hit = self.prompt + p[1], self.gpu_hit + p[2]
                self.pending.remove(p)
        before = (self.prompt, self.gpu_hit)
        resp = super().__call__(request)
        if request.url.path.startswith("/v1/"):
            self.pending.append([self.late, self.prompt - before[0], self.gpu_hit - before[1]])
            self.prompt, self.gpu_hit = before
        return resp


@pytest.mark.parametrize("late,settled", [(3, True), (50, False)])
def test_counters_read_after_a_point_wait_on_the_gates_clock_until_the_engine_counted_it(tmp_path, late, settled):
    d = gate_config(tmp_path, {**BASE, "load": {"concurrency": [1]}, "trials": 1})
    cfg = load_config(d / "i.yaml", d / "g.yaml", WORKLOADS, trials_rule=TRIALS_RULE)
    clock = ScriptedClock()
    ctx = gate_context(tmp_path, cfg, scripted_node(), LateCountingEngine(late), clock)
    result = WORKLOADS["g2-load"]().run(ctx)
    (p,) = result.evidence.points
    settle_waits = [w for w in clock.waits if w == 0.2]
    if settled:  # read again, 0.2 s apart on the gate's clock, until the prompt tokens sent are counted: the
        # warm-up's before the point's counters are read (else it would count in the point), then the point's
        assert p.accounting.prompt_tokens == 192 and p.accounting.memory_hit_tokens == 64
        assert 2 <= len(settle_waits) < 20
    else:  # an engine that never catches up is read 10 times more (after the warm-up, after the point), then
        # taken as it is: the shortfall shows
        assert p.accounting.prompt_tokens < 192 and len(settle_waits) == 20


def test_a_ladder_against_an_attached_engine_sends_exactly_its_plan_including_the_operators_log_command(tmp_path):
    params = {**BASE, "engine": "vllm-attach", "pool_path": "/mnt/kvpool",
              "attach": {"url": "http://10.0.0.21:8000", "log": {"node": "n1", "run": "journalctl -u vllm"}},
              "model_config_inline": {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 2,
                                      "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000,
                                      "torch_dtype": "bfloat16"}}
    for launch_only in ("python", "port"):
        params.pop(launch_only)
    d = gate_config(tmp_path, params)
    cfg = load_config(d / "i.yaml", d / "g.yaml", WORKLOADS, trials_rule=TRIALS_RULE)

    def handler(call):
        if call.argv == ("sh", "-c", "journalctl -u vllm"):
            return Reply(stdout="INFO engine serving\n")
        if "kvgate-pool-blockstat" in call.argv:
            return Reply(stdout="kvgate-pool-device 8:1 /dev/sda1\n1 0 5000 0 1 0 4096 0 0 0 0\n")
        return Reply(rc=127, stderr=f"{call.argv[0]}: not expected")

    node = ScriptedTransport(handler, name="n1")
    ctx = gate_context(tmp_path, cfg, node, PrefixEngine())
    result = WORKLOADS["g2-load"]().run(ctx)
    assert result.error is None and result.invalid_reason is None, (result.error, result.invalid_reason)
    assert node.commands == [s.argv for s in gate_plan(cfg, cfg.suite.gates[0]) if s.argv]
    assert result.evidence.attached is True and len(result.evidence.points) == 4


def test_a_bundle_re_derives_the_same_metrics_and_verdict_from_its_requests_and_counters_files(tmp_path):
    d = gate_config(tmp_path, BASE, pass_=">= 2", stop=None)
    cfg = load_config(d / "i.yaml", d / "g.yaml", WORKLOADS, trials_rule=TRIALS_RULE)
    ctx = gate_context(tmp_path, cfg, scripted_node(), PrefixEngine())
    result = WORKLOADS["g2-load"]().run(ctx)
    signed = json.loads(json.dumps(result.as_dict()))  # result.json as the bundle holds it
    again = WORKLOADS["g2-load"].rederive(ctx.gate_dir, signed, cfg.params["L"], {"bundle_dir": tmp_path})
    metrics, invalid = again.metrics, again.invalid_reason
    assert invalid is None and metrics.keys() == result.metrics.keys()
    assert all(metrics[k] == pytest.approx(v) for k, v in result.metrics.items())
    # the typed intervals travel through result.json and come back the same; the re-derived verdict (kvgate
    # report's) says as the run's did that 2 trials give no interval
    assert signed["intervals"]["knee_concurrency"]["trials"] == 2 and again.intervals == result.intervals
    gate = cfg.suite.gates[0]
    assert evaluate(gate, again, "count").reason == evaluate(gate, result, "count").reason
    assert "(2 trials, no interval)" in evaluate(gate, again, "count").reason
    # a request file edited after the run: its point's figures follow the raw file, not the recorded ones
    first = ctx.gate_dir / signed["evidence"]["points"][0]["requests_file"]
    lines = [json.loads(line) for line in first.read_text().splitlines()]
    lines[0]["ttft_s"], lines[0]["sent_s"] = 9.0, lines[0]["due_s"] + 0.5
    first.write_text("".join(json.dumps(r) + "\n" for r in lines))
    again = WORKLOADS["g2-load"].rederive(ctx.gate_dir, signed, cfg.params["L"], {"bundle_dir": tmp_path})
    metrics, invalid = again.metrics, again.invalid_reason
    assert metrics["ttft_p99_s@c1"] > result.metrics["ttft_p99_s@c1"]
    assert invalid is not None and invalid.startswith("load point c1, trial 1: client lag p99")


# ------------------------------------------------------------------------------ attempts spoiled by the client


class StallsOnce(PrefixEngine):
    """The engine double, but its first completion after the warm-up holds the client's event loop for ``stall_s``
    (as a client starved of CPU would be held): the requests due after it leave late, the attempt is spoiled by the
    client."""

    def __init__(self, stall_s: float = 0.4):
        super().__init__()
        self.stall_s, self.completions = stall_s, 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/completions"):
            self.completions += 1
            if self.completions == 2:
                time.sleep(self.stall_s)
        return super().__call__(request)


SPOILABLE = {**BASE, "load": {"rates_rps": [50.0]}, "trials": 1, "max_client_lag_p99_s": 0.1}


def test_an_attempt_spoiled_by_the_client_is_set_aside_and_repeated_with_new_prompts_and_re_derived(tmp_path):
    d = gate_config(tmp_path, {**SPOILABLE, "repeat_spoiled": 1}, metric="knee_rate_rps", pass_=">= 1 /s", stop=None)
    cfg = load_config(d / "i.yaml", d / "g.yaml", WORKLOADS, trials_rule=TRIALS_RULE)
    engine = StallsOnce()
    ctx = gate_context(tmp_path, cfg, scripted_node(), engine)
    result = WORKLOADS["g2-load"]().run(ctx)
    assert result.error is None and result.invalid_reason is None, (result.error, result.invalid_reason)
    ev: G2LoadEvidence = result.evidence
    (spoiled,), (kept,) = ev.spoiled, ev.points
    assert (spoiled.attempt, kept.attempt) == (0, 1) and spoiled.figures.client_lag_p99_s > 0.1
    assert kept.figures.client_lag_p99_s <= 0.1 and kept.requests_file == "requests-r50-t1-a1.jsonl"
    assert (ctx.gate_dir / spoiled.requests_file).exists() and (ctx.gate_dir / kept.requests_file).exists()
    # the repeat sent new prompts: nothing of the spoiled attempt's KV can serve it
    first, again = engine.prompts[1:4], engine.prompts[4:7]  # prompts[0]: the warm-up
    assert len(first) == len(again) == 3 and not {tuple(p[32:]) for p in first} & {tuple(p[32:]) for p in again}
    assert result.metrics["knee_rate_rps"] == 50.0  # from the kept attempt only
    assert ev.client_priority
    # a third party re-derives the same, judging the attempt set aside on its own records
    signed = json.loads(json.dumps(result.as_dict()))
    again = WORKLOADS["g2-load"].rederive(ctx.gate_dir, signed, cfg.params["L"], {"bundle_dir": tmp_path})
    metrics, invalid = again.metrics, again.invalid_reason
    assert invalid is None and metrics == pytest.approx(result.metrics)
    # an attempt set aside whose records keep the schedule (a signer who dropped an attempt they did not like)
    f = ctx.gate_dir / spoiled.requests_file
    recs = [json.loads(line) for line in f.read_text().splitlines()]
    f.write_text("".join(json.dumps({**r, "sent_s": r["due_s"], "lag_s": 0.0}) + "\n" for r in recs))
    again = WORKLOADS["g2-load"].rederive(ctx.gate_dir, signed, cfg.params["L"], {"bundle_dir": tmp_path})
    metrics, invalid = again.metrics, again.invalid_reason
    assert invalid is not None and "set aside without cause" in invalid and "trial 1, attempt 0" in invalid


def test_an_attempt_whose_reads_came_before_the_evictor_dropped_their_store_is_set_aside_and_re_derived(
        tmp_path, monkeypatch):
    # the evictor beside the engine (its cold regime) fell behind during the first attempt: the pool's log, fetched
    # into the gate directory at each point's mark, shows a read before its store was dropped; that attempt is set
    # aside and repeated, the repeat counts, and a third party re-derives both from the log in the bundle
    from harness.workloads.kit.pool import PoolHandle

    def mark(self, name: str, **_):
        log = self.ctx.gate_dir / "pool-evict.jsonl"
        lines = [] if not log.exists() else log.read_text().splitlines()
        if not lines:
            lines.append(json.dumps({"type": "breach", "t": 20.0, "file": "/pool/a/model.layers.0.safetensors",
                                     "pending": "store", "seen_t": 19.9}))
        lines.append(json.dumps({"type": "mark", "t": 21.0 + len(lines), "name": name, "pending": 0}))
        log.write_text("\n".join(lines) + "\n")
        return evict_window(log.read_text(), name, made_unix_s=20.5)

    monkeypatch.setattr(PoolHandle, "mark", mark)
    d = gate_config(tmp_path, {**SPOILABLE, "repeat_spoiled": 1}, metric="knee_rate_rps", pass_=">= 1 /s", stop=None)
    cfg = load_config(d / "i.yaml", d / "g.yaml", WORKLOADS, trials_rule=TRIALS_RULE)
    ctx = gate_context(tmp_path, cfg, scripted_node(), PrefixEngine())
    result = WORKLOADS["g2-load"]().run(ctx)
    assert result.error is None and result.invalid_reason is None, (result.error, result.invalid_reason)
    ev: G2LoadEvidence = result.evidence
    (spoiled,), (kept,) = ev.spoiled, ev.points
    assert (spoiled.attempt, kept.attempt) == (0, 1) and spoiled.figures.client_lag_p99_s <= 0.1
    assert spoiled.cold.breaches == 1 and spoiled.invalid_reason.startswith("the cold regime fell behind")
    assert kept.cold.name == "r50-t1-a1" and kept.cold.breaches == 0 and kept.invalid_reason is None
    signed = json.loads(json.dumps(result.as_dict()))
    again = WORKLOADS["g2-load"].rederive(ctx.gate_dir, signed, cfg.params["L"], {"bundle_dir": tmp_path})
    assert again.invalid_reason is None and again.metrics == pytest.approx(result.metrics)
    # the breach taken out of the log (an attempt set aside that the signer did not like): without cause
    log = ctx.gate_dir / "pool-evict.jsonl"
    log.write_text("".join(line + "\n" for line in log.read_text().splitlines() if '"breach"' not in line))
    again = WORKLOADS["g2-load"].rederive(ctx.gate_dir, signed, cfg.params["L"], {"bundle_dir": tmp_path})
    assert again.invalid_reason is not None and "set aside without cause" in again.invalid_reason
    # the log gone from the bundle: nothing to re-derive the windows from
    log.unlink()
    with pytest.raises(HarnessError, match="pool-evict.jsonl"):
        WORKLOADS["g2-load"].rederive(ctx.gate_dir, signed, cfg.params["L"], {"bundle_dir": tmp_path})


def test_without_repeats_allowed_the_spoiled_attempt_counts_and_makes_the_gate_invalid(tmp_path):
    d = gate_config(tmp_path, SPOILABLE, metric="knee_rate_rps", pass_=">= 1 /s", stop=None)
    cfg = load_config(d / "i.yaml", d / "g.yaml", WORKLOADS, trials_rule=TRIALS_RULE)
    ctx = gate_context(tmp_path, cfg, scripted_node(), StallsOnce())
    result = WORKLOADS["g2-load"]().run(ctx)
    assert result.evidence.spoiled == [] and [p.attempt for p in result.evidence.points] == [0]
    assert result.invalid_reason.startswith("load point r50, trial 1: client lag p99")


def test_attempts_set_aside_beyond_the_allowance_or_without_a_repeat_make_the_gate_invalid():
    late, on_time = fig(lag_s=0.5), fig(lag_s=0.0)

    def at(attempt: int, figures: LoadPoint, trial: int = 1) -> PointTrial:
        return point("c1", 1.0, trial, figures).model_copy(update={"attempt": attempt})

    def judge(spoiled, points, allowed=2):
        ev = G2LoadEvidence(max_client_lag_p99_s=0.1, repeat_spoiled=allowed, spoiled=spoiled)
        return evaluate_load(points, "closed", 1.0, evidence=ev).invalid_reason

    assert judge([at(0, late), at(1, late)], [at(2, on_time)]) is None
    assert "3 attempts were set aside" in judge([at(0, late), at(1, late), at(2, late)], [at(3, on_time)])
    assert "no attempt 1 follows it" in judge([at(0, late)], [at(0, on_time, trial=2)])
    assert "attempt 0 before it is not recorded" in judge([], [at(1, on_time)])
    assert "set aside without cause" in judge([at(0, on_time)], [at(1, on_time)])
    # the statistics are the kept attempts': a late attempt set aside moves nothing
    ev = G2LoadEvidence(max_client_lag_p99_s=0.1, repeat_spoiled=1, spoiled=[at(0, fig(ttft_p95_s=9.0, lag_s=0.5))])
    assert evaluate_load([at(1, on_time)], "closed", 1.0, evidence=ev).metrics["ttft_p95_s@c1"] == pytest.approx(0.1)


def test_the_load_client_sends_from_a_thread_of_raised_priority_and_puts_it_back(monkeypatch):
    import os
    import threading
    from harness.engines.load import client_priority
    tid = threading.get_native_id()
    before = os.getpriority(os.PRIO_PROCESS, tid)
    with client_priority(-3) as how:
        inside = os.getpriority(os.PRIO_PROCESS, tid)
    assert os.getpriority(os.PRIO_PROCESS, tid) == before
    if os.geteuid() == 0:
        assert inside == max(-20, before - 3) and how.startswith(f"nice {inside} while sending")

    def refuse(*_a):
        raise PermissionError(1, "Operation not permitted")
    monkeypatch.setattr(os, "setpriority", refuse)
    with client_priority(-3) as how:
        assert os.getpriority(os.PRIO_PROCESS, tid) == before
    assert "refused (Operation not permitted)" in how


def test_a_trace_replayed_by_users_is_sent_in_order_each_request_after_the_one_before(tmp_path):
    trace = tmp_path / "t.jsonl"
    # three requests meant to arrive at once: by one user they go one after another, in the trace's order
    trace.write_text("".join(json.dumps({"timestamp": 0, "input_length": 64, "output_length": 2,
                                         "hash_ids": [i, 100 + i]}) + "\n" for i in range(3)))
    d = gate_config(tmp_path, {**ENGINE, "trials": 1, "load": {"path": str(trace), "block_tokens": 32, "users": 1}},
                    metric="ttft_p95_s@trace", pass_="<= 5 s", stop=None)
    cfg, ctx, result = run_valid(tmp_path, d)
    (pt,) = result.evidence.points
    recs = [json.loads(line) for line in (ctx.gate_dir / pt.requests_file).read_text().splitlines()]
    # each sent once the one before had finished (a closed loop), in the trace's order
    assert [r["request_id"] for r in recs] == ["trace-t1-0", "trace-t1-1", "trace-t1-2"]
    assert all(b["sent_s"] >= a["sent_s"] + a["e2e_s"] for a, b in zip(recs, recs[1:]))
    assert result.evidence.trace.users == 1
    assert "in its order by 1 user, each sending its next request" in " ".join(
        s.description for s in gate_plan(cfg, cfg.suite.gates[0]))
    with pytest.raises(ConfigError, match="a trace replayed by users does not use its timestamps"):
        load_config(gate_config(tmp_path, {**ENGINE, "load": {"path": str(trace), "users": 1, "time_scale": 2}})
                    / "i.yaml", tmp_path / "g.yaml", WORKLOADS)
