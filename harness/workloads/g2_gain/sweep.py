"""The capacity sweep: the tier arm's engine once, each working set x trial a trace-replay point of the load-point
runner, the curve judged (a mixin of the workload, and its pure functions)."""

from __future__ import annotations

import dataclasses
import json

from ...engines import EngineProfile, load_profile, shell_line
from ...errors import ConfigError
from ...parsers.pooldev import pool_blockstat_argv
from ..kit.base import GateContext, PlannedStep, WorkloadResult, pool_drive_of, write_summary
from ..kit.capacity import (CapacityEvidence, CapacityPoint, evaluate_capacity, point_levels, reusable_tokens,
                            sweep_issues, sweep_points, sweep_trace)
from ..kit.load import (Counters, G2LoadEvidence, LoadPrompts, LoadPoints, PointTrial, accounting_counters,
                        evaluate_load, load_fields, load_issues, load_prompts, point_invalid, reevaluate_load,
                        token_accounting)
from ..kit.g2 import G2Procedure, launch_values
from ..kit.engine import pool_record
from ..kit.phases import PhaseRunner
from ..kit.session import EngineSession
from .arms import engine_cache_issues, lmcache_override_issues, with_cache
from .spec import GainEvidence, GainParams, sweep_params


def sweep_point(pt: PointTrial, shape: CapacityPoint, ram_counter: str | None, evicted_counter: str | None,
                max_client_lag_p99_s: float, min_read_fraction: float, device_reads: bool,
                device_error: str | None = None, max_failed_share: float = 0.0) -> tuple[PointTrial, CapacityPoint]:
    """Pure: one sweep point × trial judged: its tokens by level (engine memory; the RAM level's hits, a further
    counter; the tier's, the connector's hits less those) and g2-load's validity with the tier's hits reconciled
    with the pool device's read bytes (RAM-level hits read no device)."""
    acc, extra = pt.accounting, pt.extra_counters or {}
    cp = shape.model_copy(update={"requests": pt.requests})
    if pt.figures is not None:
        cp = cp.model_copy(update={"goodput_rps": pt.figures.goodput_rps, "ttft_p95_s": pt.figures.ttft_p95_s})
    if acc is None:
        return pt, cp
    # an engine with no RAM level between its memory and the tier (no ram_counter) has none of its hits
    ram = extra.get(ram_counter) if ram_counter else 0.0
    cp = point_levels(cp, acc.prompt_tokens, acc.memory_hit_tokens, acc.tier_hit_tokens, ram,
                      extra.get(evicted_counter) if evicted_counter else None)
    cp = cp.model_copy(update={"device_read_bytes": acc.device_read_bytes})
    if pt.figures is not None:
        pool = token_accounting(0, acc.prompt_tokens, acc.memory_hit_tokens, cp.tier_hit_tokens, acc.kv_bytes_per_token,
                                acc.device_read_bytes, acc.device_write_bytes, acc.window_s)
        why = point_invalid(pt.figures, pool, max_client_lag_p99_s, min_read_fraction, device_reads, device_error,
                            max_failed_share, pt.cold)
        pt = pt.model_copy(update={"invalid_reason": why})
        cp = cp.model_copy(update={"invalid_reason": why})
    return pt, cp


def evaluate_sweep(points: list[PointTrial], shapes: list[CapacityPoint], ev: GainEvidence, arm_ev: G2LoadEvidence,
                   device_reads: bool, fallback: str | None = None) -> WorkloadResult:
    """Pure: a capacity sweep's result from the tier arm's points (g2-load's, with the RAM-level and tier-eviction
    counters' deltas in ``extra_counters``, named in ``ev.capacity``) and each point's shape (``shapes``, by label
    and trial): every point judged (:func:`sweep_point`), the arm as g2-load evaluates it, then the curve, its
    knee, the tier's end and the requirement (harness.workloads.kit.capacity.evaluate_capacity). INVALID when a
    proof fails."""
    ev = ev.model_copy(deep=True)
    assert ev.capacity is not None
    ram_counter, evicted_counter = ev.capacity.ram_counter, ev.capacity.evicted_counter
    by = {(c.label, c.trial): c for c in shapes}
    judged, cpoints = [], []
    for pt in points:
        shape = by.get((pt.label, pt.trial))
        if shape is None:
            continue
        pt, cp = sweep_point(pt, shape, ram_counter, evicted_counter, ev.max_client_lag_p99_s or 0.001,
                             ev.min_read_fraction if ev.min_read_fraction is not None else 0.5, device_reads,
                             arm_ev.pool_device_error, ev.max_failed_share or 0.0)
        judged.append(pt)
        cpoints.append(cp)
    arm = evaluate_load(judged, "trace", ev.ttft_slo_s or 0.0, ev.knee_percentile or 95, arm_ev, fallback=fallback)
    ev.arms = {"tier": arm.evidence}
    ev.endurance = arm.evidence.endurance
    cap_ev, metrics, checks = evaluate_capacity(cpoints, ev.capacity, arm.invalid_reason, None)
    ev.capacity = cap_ev
    ev.validity = checks
    bad = next((c for c in checks if not c.ok), None)
    return WorkloadResult(metrics=metrics, evidence=ev, invalid_reason=None if bad is None else f"{bad.name}: {bad.how}",
                          error=arm.error)


def sweep_counters(prof: EngineProfile) -> Counters:
    """Pure: the counters a capacity sweep reads: g2-load's, then the profile's per-level RAM-level hit and tier
    eviction counters (``capabilities.level_counters``), in that order; an engine without per-level counters
    (vLLM: its prefix cache and its connector, no RAM level between them) adds none."""
    level = prof.capabilities.level_counters
    if not level:
        return accounting_counters(prof)
    return dataclasses.replace(accounting_counters(prof), extra=(level + "ram_hit_tokens_total",
                                                                 level + "tier_evicted_tokens_total"))


def reevaluate_sweep(ev: GainEvidence, requests: dict[str, str], counters_text: dict[str, str], counters: Counters,
                     device_reads: bool, params: "GainParams | None" = None,
                     device: dict[str, tuple[int | None, int | None]] | None = None,
                     fallback: str | None | bool = False, evict_log: str | None = None) -> WorkloadResult:
    """Pure: a capacity sweep again from the tier arm's raw files: each point through g2-load's re-evaluation,
    the further counters' deltas from its counters file, then :func:`evaluate_sweep`. ``params``, ``device``,
    ``fallback`` (False: as the run judged it) as :func:`reevaluate_gain` takes them; ``evict_log`` the cold
    regime's log (each point's window read again)."""
    recorded = {c.name: c.how for c in ev.validity}
    arm_ev = ev.arms["tier"]
    if fallback is False:
        fallback = recorded.get("tier arm valid") if arm_ev.fallback_lines else None
    again = reevaluate_load(arm_ev.model_dump(mode="json"), requests, counters_text, counters, device_reads, fallback,
                            params=params, device=device, evict_log=evict_log)
    assert ev.capacity is not None
    names = [n for n in (ev.capacity.ram_counter, ev.capacity.evicted_counter) if n]
    points = []
    for pt in again.evidence.points:
        if pt.counters_file is not None and pt.counters_file in counters_text:
            c = json.loads(counters_text[pt.counters_file])
            extra = {}
            for n in names:
                a, b = c["before"].get(n), c["after"].get(n)
                extra[n] = None if a is None or b is None else b - a
            pt = pt.model_copy(update={"extra_counters": extra})
        points.append(pt)
    return evaluate_sweep(points, ev.capacity.points, ev, again.evidence, device_reads, fallback)


class CapacitySweep:
    """g2-gain's capacity sweep (``capacity:``), validated, planned and run (a mixin of
    :class:`~harness.workloads.g2_gain.G2Gain`)."""

    def _validate_sweep(self, params: GainParams, nodes) -> list[tuple[tuple, str]]:
        """A capacity sweep: g2-load's engine checks on its view, the engine memory it is measured against, the
        per-level counters it splits the reuse by, and a sweep that runs as written."""
        view = sweep_params(params)
        issues = [(path, msg.replace("g2-load", "g2-gain"))
                  for path, msg in load_issues(view, nodes) if path[:1] != ("load",)]
        if params.attach is not None:
            return issues + [(("attach",), "a capacity sweep launches its engine itself (its engine memory bounded "
                              "by engine_cache_tokens); an attached engine is not supported yet")]
        try:
            prof = load_profile(params.engine)
        except ConfigError:
            return issues
        cap = prof.capabilities
        if params.engine_cache_tokens is not None and not cap.engine_cache_flag:
            issues.append((("engine_cache_tokens",), f"profile {prof.name!r} declares no capabilities."
                           "engine_cache_flag: a capacity sweep needs the engine's memory bounded"))
        issues += engine_cache_issues(params, prof)
        hm = prof.hit_metrics
        if not cap.level_counters and not (hm is not None and hm.memory_hit_tokens and hm.hit_tokens):
            issues.append((("capacity",), f"profile {prof.name!r} declares neither capabilities.level_counters nor "
                           "hit_metrics memory_hit_tokens and hit_tokens: a capacity sweep splits the reuse by the "
                           "level that served it"))
        if not cap.level_counters and params.capacity.require and "ram" in params.capacity.require.levels:
            issues.append((("capacity", "require", "levels"), f"profile {prof.name!r} has no RAM level between its "
                           "memory and the tier (no capabilities.level_counters): require memory or tier"))
        return (issues + lmcache_override_issues(params, prof)
                + sweep_issues(params.capacity, params.engine_cache_tokens))

    def _plan_sweep(self, ctx: GateContext) -> list[PlannedStep]:
        p: GainParams = ctx.params
        spec = p.capacity
        assert spec is not None and p.engine_cache_tokens is not None
        view = sweep_params(p)
        prof = with_cache(p, load_profile(p.engine))
        node = next(iter(ctx.nodes.values()))
        g2v = self._arm_view(view, "tier", spec.context_tokens)
        v = launch_values(g2v, prof, node.work_dir, ctx.gate.id, g2v.port or 8000, "<run>", node.transport,
                          node.engine_python)
        steps = G2Procedure().plan_launch_setup(g2v, prof, node, v)
        argv = prof.render_argv(v)
        steps.append(PlannedStep(node.name, f"start {prof.name} with the tier, engine memory {p.engine_cache_tokens} "
                                 f"tokens, once for the whole sweep, in its own process group: "
                                 f"{shell_line(argv, prof.render_env(v))}", tuple(argv)))
        if p.warmup:
            steps.append(PlannedStep("(control host)", "one unrelated warm-up prompt (not in the statistics)"))
        for t in range(1, p.trials + 1):
            for label, x, n in sweep_points(spec, p.engine_cache_tokens):
                what = f"trial {t}/{p.trials}, working set {label} ({x:g}x engine memory)"
                steps.append(PlannedStep(node.name, f"{what}: the pool device's counters before",
                                         pool_blockstat_argv(v["pool_dir"])))
                steps.append(PlannedStep("(control host)", f"{what}: {n} session(s) of {spec.context_tokens} tokens, "
                                         f"each resumed whole {spec.rounds} times round-robin ({n * spec.rounds} "
                                         f"requests at {spec.rate_rps:g}/s), {p.max_tokens} output token(s) at most; "
                                         f"the engine's counters (per level) before and after; every request to "
                                         f"tier/requests-{label}-t{t}.jsonl"))
                steps.append(PlannedStep(node.name, f"{what}: the pool device's counters after",
                                         pool_blockstat_argv(v["pool_dir"])))
        steps.append(PlannedStep(node.name, "stop the engine (its process group); its log is checked for fall-back / "
                                 "connector-failure lines (a match is INVALID)"))
        return steps

    def _run_sweep(self, ctx: GateContext) -> WorkloadResult:
        """The capacity curve: the tier arm's engine started once, then each working set × trial a trace-replay
        point of g2-load's runner with the per-level counters read around it; judged by :func:`evaluate_sweep`."""
        p: GainParams = ctx.params
        spec = p.capacity
        assert spec is not None and p.engine_cache_tokens is not None
        view = sweep_params(p)
        prof = with_cache(p, load_profile(p.engine))
        load, g2 = LoadPoints(), G2Procedure()
        counters = sweep_counters(prof)
        ev = GainEvidence(engine_cache_tokens=p.engine_cache_tokens, min_tier_reuse_share=p.min_tier_reuse_share,
                          **load_fields(view))
        ev.capacity = CapacityEvidence(
            engine_cache_tokens=p.engine_cache_tokens, context_tokens=spec.context_tokens, rounds=spec.rounds,
            rate_rps=spec.rate_rps, require_levels=list(spec.require.levels) if spec.require else None,
            require_up_to_x=spec.require.up_to_x if spec.require else None,
            ram_counter=counters.extra[0] if counters.extra else None,
            evicted_counter=counters.extra[1] if counters.extra else None)
        arm_ev = G2LoadEvidence(**load_fields(view), device_reads=prof.device_reads, pool_drive=pool_drive_of(ctx))
        g2v = self._arm_view(view, "tier", spec.context_tokens)
        setup = g2.setup_launched(ctx, g2v, prof, labels=("tier",))
        if isinstance(setup, WorkloadResult):
            load.engine_evidence(arm_ev, setup.evidence)
            ev.arms = {"tier": arm_ev}
            return WorkloadResult(evidence=ev, error=f"tier arm: {setup.error or setup.invalid_reason}")
        load.engine_evidence(arm_ev, setup.ev)
        load.engine_evidence(ev, setup.ev)
        (ctx.gate_dir / "tier").mkdir(parents=True, exist_ok=True)
        actx = dataclasses.replace(ctx, gate_dir=ctx.gate_dir / "tier")
        _, _, vocab = g2.kv_shape(g2v, prof)
        ev.prompt_seed = p.seed
        session = EngineSession({"tier": PhaseRunner(actx, {"engine": setup.engine}, counters=True)},
                                label=lambda arm: f"{arm} arm")
        points: list[PointTrial] = []
        shapes: list[CapacityPoint] = []
        prompts: LoadPrompts | None = None

        def before() -> WorkloadResult | None:  # a text-only API without a usable tokenizer is known now
            nonlocal prompts
            try:
                prompts = load_prompts(prof, setup.ev, vocab, arm_ev)
            except ValueError as exc:
                ev.arms = {"tier": arm_ev}
                return WorkloadResult(evidence=ev, error=f"tier arm: {exc}")
            return None

        def sweep() -> str | None:
            if p.warmup:
                eng, s = setup.engine, setup
                mw = eng.metrics()
                g2.warm_up(actx, g2v, prof, eng.base_url, "tier", s.warm[0], s.ev)
                arm_ev.warmup = dict(s.ev.warmup)
                ok = s.ev.warmup.get("error") is None
                load.settled_metrics(ctx, eng, counters, mw, (s.warm[0].prompt_tokens or 0) if ok else 0)
            for t in range(1, p.trials + 1):
                for label, x, n in sweep_points(spec, p.engine_cache_tokens):
                    ctx.progress(f"{ctx.gate.id}: trial {t}/{p.trials}, working set {label} ({n} sessions)")
                    trace = sweep_trace(n, spec.context_tokens, spec.rounds, spec.rate_rps)
                    shapes.append(CapacityPoint(label=label, trial=t, working_set_x=x, sessions=n,
                                                working_set_tokens=n * spec.context_tokens, requests=len(trace.requests),
                                                reusable_tokens=float(reusable_tokens(trace))))
                    points.append(load.attempts(actx, view, prof, session.runner, setup, counters, t, label, 0.0,
                                                trace, p.seed, prompts, arm_ev))
            fallback, arm_ev.fallback_lines = session.fallback(session.close(), prof.fallback_patterns, "tier",
                                                               prof.in_force_log)
            return fallback

        def failed(why: str) -> WorkloadResult:
            arm_ev.points = points
            ev.arms = {"tier": arm_ev}
            return WorkloadResult(evidence=ev, error=why)

        def after() -> None:
            arm_ev.pool = ev.pool = pool_record(setup.engine) or arm_ev.pool

        fallback = session.run(sweep, failed, before=before, after=after)
        if isinstance(fallback, WorkloadResult):
            return fallback
        result = evaluate_sweep(points, shapes, ev, arm_ev, prof.device_reads, fallback)
        write_summary(ctx.gate_dir, "g2-gain-summary.json", result)
        return result
