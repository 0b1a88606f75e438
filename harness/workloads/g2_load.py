"""G2 under load (``g2-load``): TTFT tails, goodput at an SLO and the knee of a load ladder, with the tokens of
every load point accounted for (engine memory, tier, re-computed) and the tier's device bytes beside them,
judged on confidence intervals over repeated trials.

One engine start for the whole run (launched, or attached with ``attach:``), one warm-up prompt, then for each
trial (``trials``, default 6: the fewest that give a 95 % interval for the median) each point of ``load:``:

- closed loop, ``{concurrency: [1, 2, 4]}``: that many users, each sending its next request when its last one
  finished (``requests_per_point`` requests per point);
- open loop, ``{rates_rps: [1, 2, 4], burstiness: 1.0}``: requests sent on a Poisson (burstiness 1) or gamma
  schedule at that mean rate, whatever the responses (no coordinated omission);
- trace replay, ``{path, format, time_scale, max_requests, max_duration_s}``: a Mooncake or Qwen-Bailian trace
  (harness/load/traces.py) sent by its own timestamps times ``time_scale``, or with ``users: N`` in its order
  by N users, each sending its next request when its previous one finished (a closed loop: on a slower or busier
  machine the same sequence is served more slowly, not into an overload its timestamps never meant); prompts
  sharing hash ids share exactly those token blocks (harness/load/prompts.py);
- multi-turn sessions, ``{multi_turn: {sessions, turns, first_prompt_tokens, user_tokens, reply_tokens,
  rate_rps}}``: served round-robin turn by turn, each turn's prompt the session's whole history, replayed as the
  trace harness.load.synth.multi_turn_trace synthesises from them (pure: the plan's and the run's are one).

Around each point × trial: the engine's counters (prompt tokens, engine-memory hits, tier hits) and the pool
device's read and write bytes are read before and after; every request (when it was due, when it was sent, what
it measured) goes to ``requests-<point>-t<trial>.jsonl``. Synthetic prompts are new to the engine at every point
and trial (seeded by both, and by a per-run nonce on an attached engine), so one point's cache never serves the
next one; within a point they share ``shared_prefix_tokens`` per prefix group, the reuse the engine's memory and
the tier can serve.

Failures count: every point states its requests sent, served and failed; a failed request is an infinite TTFT in
the percentiles (a percentile that falls on one has no finite value: the point gives no such figure), and a point
whose failed share exceeds ``max_failed_share`` (default 0) is INVALID. A point is INVALID too when its client lag
p99 exceeds ``max_client_lag_p99_s`` (the client set the send times, not the server), or when it had tier hits and
the pool's device read less than ``min_read_fraction`` of the KV they claim (the KV came from a cache, not the
tier). One INVALID point makes the gate INVALID, naming it. The evaluator states its validity as named
ValidityChecks (:func:`load_validity`); a proof the gate turns off (``min_read_fraction: 0``, a profile without
device reads) is one marked not checked, and the verdict says "unproven".

Metrics (``METRICS``): every point figure as ``FIGURE@LOAD`` (``ttft_p95_s@c4``: closed loop, 4 users;
``goodput_rps@r2``: open loop at 2 requests/s; ``ttft_p99_s@trace``), and over the ladder ``knee_concurrency`` /
``knee_rate_rps`` (the highest load whose ``knee_percentile`` TTFT stays within ``ttft_slo_s``, every request
served) and ``max_goodput_rps``. Each is the median over trials with an exact 95 % confidence interval for the
median from binomial order statistics (harness.stats.median_interval; fewer than 6 trials give none), typed on the
result (``WorkloadResult.intervals``), on which the gate's thresholds are judged (harness.gates.verdict
.judge_interval: PASS only when the whole interval clears ``pass``; no interval, or a trial without the figure,
never PASS).
"""

from __future__ import annotations

from typing import Any
from pathlib import Path

from .kit.rederive import device_by_attempt, evict_log_text, load_texts, rescanned_fallback
from .kit.load import reevaluate_load
from ..engines import load_profile, shell_line
from ..errors import ConfigError
from ..parsers.pooldev import pool_blockstat_argv
from ..safeio import InputFileError
from .kit.base import ControlFile, GateContext, PlannedStep, Workload, WorkloadResult, pool_drive_of, \
    register_workload, write_summary
from .kit.engine import pool_record
from .kit.g2 import G2Procedure, launch_values
from .kit.load import (SUMMARY_METRICS, G2LoadEvidence, G2LoadParams, LoadPoints, LoadPrompts, PointTrial,
                       FIGURES, accounting_counters, evaluate_load, g2_view, load_control_files, load_fields, load_issues,
                       load_prompts, point_metric_unit,
                       read_load_trace, trace_error)
from .kit.phases import PhaseRunner
from .kit.session import EngineSession

POINTS = LoadPoints()


def rederive(gate_dir: Path, result: dict[str, Any], params: Any, ctx: dict[str, Any]):
    """g2-load from every point's raw requests file (its figures, the knee) and the engine counters the run read
    around it (its accounting), with the gate's bounds from config/gates.yaml, the pool device's bytes re-parsed
    from the run's probe steps and a launched engine's log (``engine-load.log``) re-scanned for fall-backs, through
    the workload's own pure functions (harness.workloads.kit.load.reevaluate_load). An attached engine's fall-back
    is taken as the run judged it (its log is the operator's, read through steps)."""
    ev_dict = result.get("evidence") or {}
    ev = G2LoadEvidence.model_validate(ev_dict)
    texts = load_texts(gate_dir, "", ev)
    prof = load_profile(params.engine)
    if params.attach is None:
        fallback = rescanned_fallback(gate_dir, "engine-load.log", prof.fallback_patterns, "load", prof.in_force_log)
    else:
        fallback = result.get("invalid_reason") if ev.fallback_lines else None
    device = device_by_attempt(Path(ctx["bundle_dir"]), gate_dir.name, ev.pool_dir, ev.points + ev.spoiled)
    return reevaluate_load(ev_dict, texts["requests"], texts["counters"], accounting_counters(prof), prof.device_reads,
                           fallback, params=params, device=device,
                           evict_log=evict_log_text(gate_dir, ev.points + ev.spoiled))


@register_workload("g2-load")
class G2Load(Workload):
    rederive = staticmethod(rederive)  # the gate re-judged from the bundle's raw files
    # what its endurance prices (docs/endurance.md), for `kvgate plan`
    ENDURANCE = ("every point x trial: the pool device's bytes written over the point, per million prompt tokens served "
                 "and over its length (no write amplification: the pool's growth is not read per point)")
    Params = G2LoadParams
    EvidenceModel = G2LoadEvidence
    METRICS = SUMMARY_METRICS  # the ladder's; every point figure too, as FIGURE@LOAD (metric_unit)

    @classmethod
    def metric_unit(cls, name: str) -> str | None:
        return cls.METRICS[name] if name in cls.METRICS else point_metric_unit(name, FIGURES)

    def control_files(self, params) -> list[ControlFile]:
        return load_control_files(params)

    @staticmethod
    def interval_trials(params: G2LoadParams, metric: str) -> int | None:
        """Every g2-load figure is judged on its interval over ``trials`` (the config loader refuses too few)."""
        return params.trials

    def validate_against(self, params, nodes):
        return load_issues(params, nodes)

    def plan(self, ctx: GateContext) -> list[PlannedStep]:
        p: G2LoadParams = ctx.params
        prof = load_profile(p.engine)
        view = g2_view(p, POINTS.longest_prompt(p))
        steps: list[PlannedStep] = []
        if p.attach is None:
            node = next(iter(ctx.nodes.values()))
            v = launch_values(view, prof, node.work_dir, ctx.gate.id, p.port or 8000, "<run>", node.transport,
                              node.engine_python)
            argv = prof.render_argv(v)
            pool_node, pool_dir = node.name, v["pool_dir"]
            steps += G2Procedure().plan_launch_setup(view, prof, node, v)
            steps.append(PlannedStep(node.name, f"start {prof.name} once for the whole ladder, in its own process "
                                     f"group: {shell_line(argv, prof.render_env(v))}", tuple(argv)))
        else:
            a = p.attach
            pool_node, pool_dir = p.pool_node or next(iter(ctx.nodes)), p.pool_path
            steps.append(PlannedStep("(control host)", f"attach: {prof.name} already running at {a.url}; its "
                                     f"{prof.health_path} must answer 200 within {a.connect_timeout_s:.0f} s"))
            if a.log:
                steps.append(PlannedStep(a.log.node, "the engine's log before the ladder", ("sh", "-c", a.log.run)))
        if p.warmup:
            steps.append(PlannedStep("(control host)", "one unrelated warm-up prompt (recorded, not in the statistics)"))
        # an attached engine's log is its operator's command, read where the runner marks it around each point
        log = ([PlannedStep(p.attach.log.node, "the engine's log (fall-back lines)", ("sh", "-c", p.attach.log.run))]
               if p.attach is not None and p.attach.log else [])
        for t, label, load in POINTS.schedule(p):
            if pool_dir:
                steps.append(PlannedStep(pool_node, f"trial {t}/{p.trials}, {label}: the pool device's read and write "
                                         "counters before", pool_blockstat_argv(pool_dir)))
            steps += log
            steps.append(PlannedStep("(control host)", f"trial {t}/{p.trials}, {label}: "
                                     + POINTS.point_text(p, label, load, t)))
            if pool_dir:
                steps.append(PlannedStep(pool_node, f"trial {t}/{p.trials}, {label}: the pool device's counters after",
                                         pool_blockstat_argv(pool_dir)))
            steps += log
        if p.attach is None:
            steps.append(PlannedStep(next(iter(ctx.nodes)), "stop the engine (its process group); its log is checked "
                                     "for fall-back / connector-failure lines (a match is INVALID)"))
        elif p.attach.log:
            steps.append(PlannedStep(p.attach.log.node, "the engine's log after the ladder (fall-back lines)",
                                     ("sh", "-c", p.attach.log.run)))
        return steps

    def run(self, ctx: GateContext) -> WorkloadResult:
        p: G2LoadParams = ctx.params
        prof = load_profile(p.engine)
        ev = G2LoadEvidence(**load_fields(p), device_reads=prof.device_reads,
                             pool_drive=pool_drive_of(ctx, p.pool_node if p.attach else None))
        trace = None
        if p.load.kind == "trace":
            try:
                trace, ev.trace = read_load_trace(p.load)
            except (ConfigError, InputFileError, ValueError) as exc:
                return WorkloadResult(evidence=ev, error=trace_error(p.load, exc))
        view = g2_view(p, POINTS.longest_prompt(p))
        g2 = G2Procedure()
        setup = (g2.setup_attached(ctx, view, prof) if p.attach is not None
                 else g2.setup_launched(ctx, view, prof, labels=("load",)))
        if isinstance(setup, WorkloadResult):
            POINTS.engine_evidence(ev, setup.evidence)
            return WorkloadResult(evidence=ev, error=setup.error, invalid_reason=setup.invalid_reason)
        POINTS.engine_evidence(ev, setup.ev)
        _, _, vocab = g2.kv_shape(view, prof)
        seed = setup.ev.prompt_seed if setup.ev.prompt_seed is not None else p.seed
        ev.prompt_seed = seed
        eng = setup.engine
        counters = accounting_counters(prof)
        # the one phase runner: each point x trial is a phase (counters, pool device and log marks around it)
        session = EngineSession({"engine": PhaseRunner(ctx, {"engine": eng}, counters=counters.any)})
        points: list[PointTrial] = []
        prompts: LoadPrompts | None = None

        def before() -> WorkloadResult | None:  # a text-only API without a usable tokenizer is known now
            nonlocal prompts
            try:
                prompts = load_prompts(prof, setup.ev, vocab, ev)
            except ValueError as exc:
                return WorkloadResult(evidence=ev, error=str(exc))
            return None

        def ladder() -> str | None:
            if p.warmup:  # once for the ladder, counted by the engine before the first point's counters are read
                mw = eng.metrics() if counters.any else None
                g2.warm_up(ctx, view, prof, eng.base_url, "load", setup.warm[0], setup.ev)
                ev.warmup = dict(setup.ev.warmup)
                ok = setup.ev.warmup.get("error") is None
                POINTS.settled_metrics(ctx, eng, counters, mw, (setup.warm[0].prompt_tokens or 0) if ok else 0)
            for t, label, load in POINTS.schedule(p):
                ctx.progress(f"{ctx.gate.id}: trial {t}/{p.trials}, load point {label}")
                points.append(POINTS.attempts(ctx, p, prof, session.runner, setup, counters, t, label, load, trace,
                                              seed, prompts, ev))
            fallback, ev.fallback_lines = session.fallback(session.close(), prof.fallback_patterns, "load",
                                                           prof.in_force_log)
            return fallback

        def failed(why: str) -> WorkloadResult:
            ev.points = points
            return WorkloadResult(evidence=ev, error=why)

        def after() -> None:
            ev.pool = pool_record(eng) or ev.pool

        fallback = session.run(ladder, failed, before=before, after=after)
        if isinstance(fallback, WorkloadResult):
            return fallback
        result = evaluate_load(points, p.load.kind, p.ttft_slo_s, p.knee_percentile, ev, fallback=fallback)
        write_summary(ctx.gate_dir, "g2-load-summary.json", result)
        return result
