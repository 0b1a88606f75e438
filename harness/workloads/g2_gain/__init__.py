"""The tier's worth (``g2-gain``): the same load served by the same engine and model twice, once with the KV tier
and once without, interleaved trial by trial, and the gain judged on its confidence interval (the reference's
single-instance basis: +29-40 %).

Two arms, two engine processes side by side on one node, started once for the whole run (both at once):

- ``tier``: the profile ``engine`` as it is (its connector, or LMCache with a fresh pool);
- ``no_tier``: the same engine without the tier: ``no_tier_engine`` (a profile that differs only by its
  connector), or ``engine`` with its ``capabilities.no_tier_flag``. ``engine_cache_tokens`` bounds both arms'
  engine memory alike (``capabilities.engine_cache_flag``).

The load is g2-load's (``load:``: a closed or open ladder of synthetic prompts, a trace replayed by its
timestamps, or multi-turn sessions served round-robin, a trace synthesised from their shape), with its prompts, its
per point × trial phase (counters, pool device and log marks around it) and its token accounting
(harness/workloads/g2_load.py). Each trial runs every load point on both arms, the arm that goes
first alternating trial by trial, so drift on the machine falls on both; both arms get the same prompts.

Metrics, each the median over trials of the paired per-trial figure with an exact 95 % confidence interval for
the median (binomial order statistics, typed on the result: ``WorkloadResult.intervals``), judged as g2-load's
(harness.gates.verdict.judge_interval; a trial whose pair gives no figure, e.g. an arm that served nothing, is a
failed trial, and the gate judges only when every trial gave one):
``goodput_gain`` (the tier arm's highest goodput over the ladder / the other's, minus 1: 0.35 is +35 %),
``throughput_gain`` (the same for the completed request rate), ``ttft_p50_ratio`` and ``ttft_p95_ratio`` (the
tier arm's TTFT / the other's at the ladder's highest load), and each of them per point as ``FIGURE@LABEL``.

Proofs, one ValidityCheck each (any failing makes the gate INVALID; see :func:`gain_validity`): every point of both
arms valid by g2-load's own rules (failed requests, client lag, tier hits reconciled with the pool device's read
bytes, the last NOT CHECKED where the gate turns it off); neither arm's log shows a fall-back; the arms equal but
for the tier switch (:func:`arm_difference`: the no-tier arm's argv and environment are the tier arm's less its
connector, or plus its ``no_tier_flag``; anything else is refused by the config loader); the tier arm's reused
context came from the tier (its tier hit tokens at least ``min_tier_reuse_share`` of its reused tokens, engine
memory and tier together) and the tier served the reuse the load offers (its tier hit tokens at least
``min_tier_served_share`` of the reusable tokens: the trace's ideal at the engine's chunk size, or the ladder's
shared prefixes); the arm without the tier read nothing from a tier (its tier hit counter flat) and recomputed
what the engine's memory did not hold.

With ``capacity:`` instead of ``load:`` the gate is the capacity curve: a working-set sweep on the tier arm alone
(one engine, its memory bounded by ``engine_cache_tokens``), each point a session-recovery trace replayed by
g2-load's point runner with the per-level counters read around it; the curve, its knee, where the tier ran out and
the requirement are harness/workloads/kit/capacity.py's, judged here by :func:`evaluate_sweep`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ...engines import EngineProfile, load_profile, shell_line
from ...errors import ConfigError, HarnessError
from ...parsers.engine_log import parse_compute_binding
from ...parsers.pooldev import pool_blockstat_argv
from ...safeio import InputFileError
from ..kit.base import (GateContext, PlannedStep, Workload, WorkloadResult, register_workload, pool_drive_of,
                        write_summary)
from ..kit.capacity import CAPACITY_FIGURES, CAPACITY_METRICS
from ..kit.load import (Counters, G2LoadEvidence, LoadPrompts, LoadPoints, PointTrial, accounting_counters,
                        evaluate_load, g2_view, load_control_files, load_fields, load_issues, read_load_trace,
                        reevaluate_load, trace_error)
from ..kit.g2 import G2Procedure, launch_values
from ..kit.engine import pool_record
from ..kit.phases import PhaseRunner
from ..kit.rederive import device_by_attempt, evict_log_text, load_texts, raw_text, rescanned_fallback
from ..kit.session import EngineSession
from .spec import (ARMS, ArmProof, GAIN_FIGURES, GainEvidence, GainModel, GainParams, GainTrial, REFERENCE_GAIN,
                   SWEEP_LABEL_RE, SWEEP_PATH, gain_metric_unit, sweep_params)
from .arms import (arm_difference, arm_prompts, engine_cache_issues, engine_cache_value, lmcache_override_issues,
                   no_tier_engine_issues, no_tier_profile, unequal_arms, with_cache)
from .sweep import CapacitySweep, evaluate_sweep, reevaluate_sweep, sweep_counters, sweep_point
from .evaluate import (arm_proof, chunk_tokens, evaluate_gain, first_arm, gain_figures, gain_pairs, gain_validity,
                       reusable_share, same_cores_check, served_check, tier_hit_rate)


__all__ = ["G2Gain", "rederive", "reevaluate_gain", "ARMS", "ArmProof", "GainEvidence", "GainModel", "GainParams",
           "GainTrial", "REFERENCE_GAIN", "SWEEP_LABEL_RE", "SWEEP_PATH", "gain_metric_unit", "sweep_params",
           "arm_difference", "arm_prompts", "engine_cache_issues", "engine_cache_value", "lmcache_override_issues",
           "no_tier_engine_issues", "no_tier_profile", "unequal_arms", "with_cache", "CapacitySweep",
           "evaluate_sweep", "reevaluate_sweep", "sweep_counters", "sweep_point", "arm_proof", "chunk_tokens",
           "evaluate_gain", "first_arm", "gain_figures", "gain_pairs", "gain_validity", "reusable_share",
           "served_check", "tier_hit_rate", "compute_cores", "same_cores_check"]


def reevaluate_gain(evidence: dict[str, Any], requests: dict[str, dict[str, str]],
                    counters_text: dict[str, dict[str, str]], counters: dict[str, Counters],
                    device_reads: dict[str, bool], params: "GainParams | None" = None,
                    device: dict[str, dict[str, tuple[int | None, int | None]]] | None = None,
                    fallbacks: dict[str, str | None] | None = None, evict_log: str | None = None) -> WorkloadResult:
    """Pure: a bundle's g2-gain result again from its raw files: each arm's points through g2-load's own
    re-evaluation (``requests`` / ``counters_text``: arm -> file name -> text; ``counters``: arm -> which counters
    are prompt tokens, memory and tier hits), then :func:`evaluate_gain`. ``params``: the gate's params, whose
    bounds (each arm's SLOs and read fraction, ``min_tier_reuse_share``, the reusable share of a synthetic load)
    replace the evidence's; ``device``: arm -> requests file -> the pool device's (read, written) bytes re-parsed
    from the steps; ``fallbacks``: arm -> its engine log's fall-back as re-scanned (None: as the run judged it);
    ``evict_log``: the tier arm's cold-regime log (its points' windows read again)."""
    ev = GainEvidence.model_validate(evidence)
    device = device or {}
    if ev.capacity is not None:
        return reevaluate_sweep(ev, requests.get("tier", {}), counters_text.get("tier", {}), counters["tier"],
                                device_reads["tier"], sweep_params(params) if params is not None else None,
                                device.get("tier") if device else None,
                                fallbacks["tier"] if fallbacks is not None else False, evict_log=evict_log)
    recorded = {c.name: c.how for c in ev.validity}
    arms = {}
    if fallbacks is None:
        fallbacks = {arm: recorded.get(f"{arm} arm valid") if ev.arms[arm].fallback_lines else None for arm in ARMS}
    for arm in ARMS:
        arms[arm] = reevaluate_load(ev.arms[arm].model_dump(mode="json"), requests.get(arm, {}),
                                    counters_text.get(arm, {}), counters[arm], device_reads[arm], fallbacks[arm],
                                    params=params, device=device.get(arm) if device else None,
                                    evict_log=evict_log if arm == "tier" else None)
    share = params.min_tier_reuse_share if params is not None else (
        ev.min_tier_reuse_share if ev.min_tier_reuse_share is not None else 0.9)
    # a ladder's declared reuse from the config; a trace's ideal (at the engine's chunk) as the run computed it from
    # the trace it replayed (its sha256 recorded; the file need not be where the bundle is re-derived)
    reusable = reusable_share(params, None) if params is not None and params.load.kind != "trace" \
        else ev.reusable_share
    return evaluate_gain(arms, share, fallbacks, ev, reusable=reusable)


def compute_cores(log_text: str | None) -> list[list[int]] | None:
    """Pure: the compute cores (a list per rank) an engine's log states, or None."""
    binding = parse_compute_binding(log_text or "")
    return None if binding is None else binding.cores()


def rederive(gate_dir: Path, result: dict[str, Any], params: Any, ctx: dict[str, Any]):
    """g2-gain from each arm's raw requests and counters files (``gates/ID/tier/``, ``gates/ID/no_tier/``), with the
    gate's bounds from config/gates.yaml, each arm's pool-device bytes re-parsed from the run's probe steps and a
    launched arm's log (``engine-ARM.log``) re-scanned, through the workload's own pure functions
    (harness.workloads.g2_gain.reevaluate_gain)."""
    ev = result.get("evidence") or {}
    gain = GainEvidence.model_validate(ev)
    texts: dict[str, dict[str, dict[str, str]]] = {"requests": {}, "counters": {}}
    device: dict[str, dict[str, tuple[int | None, int | None]]] = {}
    arms = ("tier",) if gain.capacity is not None else ("tier", "no_tier")
    for arm in arms:
        if arm not in gain.arms:
            raise HarnessError(f"gates/{gate_dir.name}/result.json: the evidence has no {arm} arm")
        arm_ev = gain.arms[arm]
        got = load_texts(gate_dir, f"{arm}/", arm_ev)
        texts["requests"][arm], texts["counters"][arm] = got["requests"], got["counters"]
        device[arm] = device_by_attempt(Path(ctx["bundle_dir"]), gate_dir.name, arm_ev.pool_dir,
                                        arm_ev.points + arm_ev.spoiled)
    profs = G2Gain()._profiles(params)
    fallbacks = None
    if params.attach is None:
        fallbacks = {arm: rescanned_fallback(gate_dir, f"engine-{arm}.log", profs[arm].fallback_patterns, arm,
                                             profs[arm].in_force_log if arm == "tier" else ())
                     for arm in arms}
        if gain.capacity is None:  # the arms' compute cores again from their logs, not as the run recorded them
            ev = {**ev, "compute_cores": {arm: compute_cores(raw_text(gate_dir, f"engine-{arm}.log", "an engine log"))
                                          for arm in arms}}
    tier = gain.arms["tier"]
    return reevaluate_gain(ev, texts["requests"], texts["counters"],
                           {a: accounting_counters(p) for a, p in profs.items()},
                           {a: p.device_reads for a, p in profs.items()}, params=params, device=device,
                           fallbacks=fallbacks, evict_log=evict_log_text(gate_dir, tier.points + tier.spoiled))


@register_workload("g2-gain")
class G2Gain(CapacitySweep, Workload):
    rederive = staticmethod(rederive)  # the gate re-judged from the bundle's raw files
    # what its endurance prices (docs/endurance.md), for `kvgate plan`
    ENDURANCE = ("the tier arm's points as g2-load prices them (the no-tier arm stores nothing); a capacity sweep's "
                 "points the same way")
    Params = GainParams
    EvidenceModel = GainEvidence
    METRICS = {**GAIN_FIGURES, "tier_hit_rate": "ratio", **CAPACITY_METRICS}  # per point too (metric_unit)

    @classmethod
    def metric_unit(cls, name: str) -> str | None:
        return cls.METRICS[name] if name in cls.METRICS else gain_metric_unit(name)

    @staticmethod
    def interval_trials(params: GainParams, metric: str) -> int | None:
        """The gain figures are judged on their interval over ``trials``; a capacity sweep's figures (counts of
        the levels' tokens, no interval) and ``tier_hit_rate`` are not."""
        fig = metric.partition("@")[0]
        return params.trials if params.capacity is None and fig in GAIN_FIGURES else None

    @staticmethod
    def metric_issue(params: GainParams, metric: str) -> str | None:
        """A capacity sweep has only the capacity figures; a gain run has none of them."""
        fig, at, label = metric.partition("@")
        capacity_metric = metric in CAPACITY_METRICS or (bool(at) and bool(SWEEP_LABEL_RE.fullmatch(label))
                                                         and fig in CAPACITY_FIGURES)
        if params.capacity is not None and not capacity_metric:
            return (f"metric {metric!r} is not measured by a capacity sweep (capacity: runs the tier arm alone; "
                    f"expected one of {', '.join(sorted(CAPACITY_METRICS))} or FIGURE@x<working set>)")
        if params.capacity is None and metric in CAPACITY_METRICS:
            return f"metric {metric!r} needs capacity: (a working-set sweep); this gate compares the two arms"
        return None

    def control_files(self, params):
        return load_control_files(params)

    def validate_against(self, params, nodes):
        if params.capacity is not None:
            return self._validate_sweep(params, nodes)
        issues = load_issues(params, nodes)
        issues = [(path, msg.replace("g2-load", "g2-gain")) for path, msg in issues]
        if params.attach is not None:
            return issues + self._validate_attached(params, nodes)
        try:
            prof = load_profile(params.engine)
        except ConfigError:
            return issues
        cap = prof.capabilities
        if params.no_tier_engine is None and not cap.no_tier_flag:
            issues.append((("no_tier_engine",), f"profile {prof.name!r} declares no capabilities.no_tier_flag: name "
                           "the profile of the same engine without the tier (no_tier_engine)"))
        issues += no_tier_engine_issues(params, prof, attached=False)
        if params.engine_cache_tokens is not None and not cap.engine_cache_flag:
            issues.append((("engine_cache_tokens",), f"profile {prof.name!r} declares no capabilities."
                           "engine_cache_flag: bound its engine memory in the profile instead"))
        return issues + engine_cache_issues(params, prof) + lmcache_override_issues(params, prof)

    @staticmethod
    def _validate_attached(params: GainParams, nodes) -> list[tuple[tuple, str]]:
        """An attached pair: the arm without the tier is an attach profile of the same engine, its log command on
        one of the gate's nodes (the tier arm's attach: is g2-load's, checked above)."""
        issues: list[tuple[tuple, str]] = []
        a = params.no_tier_attach
        assert a is not None
        for path, name in a.as_g2().named_nodes():
            if name not in nodes:
                issues.append((("no_tier_attach",) + path[1:], f"node {name!r} is not one of the gate's nodes "
                               f"({', '.join(nodes) or 'none'})"))
        try:
            prof = load_profile(params.engine)
        except ConfigError:
            return issues  # named by g2-load's checks
        return issues + no_tier_engine_issues(params, prof, attached=True)

    # ----------------------------------------------------------------------------------------------- plan

    def _profiles(self, p: GainParams) -> dict[str, EngineProfile]:
        prof = load_profile(p.engine)
        if p.attach is not None:  # attached: the profiles say how to talk to each engine, nothing is launched
            return {"tier": prof, "no_tier": load_profile(p.no_tier_engine) if p.no_tier_engine else prof}
        return {"tier": with_cache(p, prof), "no_tier": no_tier_profile(p, prof)}

    @staticmethod
    def _arm_view(p: GainParams, arm: str, longest: int):
        view = g2_view(p, longest)
        if p.attach is not None and arm == "no_tier":
            # the second engine, at its own URL; it has no pool (nothing of it is probed on a device)
            assert p.no_tier_attach is not None
            return view.model_copy(update={"attach": p.no_tier_attach.as_g2(), "pool_path": None})
        # the second engine listens on the next port when the gate fixes one
        return view if arm == "tier" or not p.port else view.model_copy(update={"port": p.port + 1})

    def _plan_attached(self, ctx: GateContext) -> list[PlannedStep]:
        """Both arms attached: nothing launched or stopped; each arm's engine log (its operator's command) read
        around each of its points, the tier arm's pool device probed around each of its points."""
        p: GainParams = ctx.params
        profs = self._profiles(p)
        load = LoadPoints()
        attach = {"tier": p.attach, "no_tier": p.no_tier_attach}
        pool_node, pool_dir = p.pool_node or next(iter(ctx.nodes)), p.pool_path
        steps: list[PlannedStep] = []

        def log(arm: str, when: str) -> list[PlannedStep]:
            a = attach[arm]
            return ([PlannedStep(a.log.node, f"the {arm.replace('_', ' ')} arm's engine log {when}",
                                 ("sh", "-c", a.log.run))] if a.log else [])
        for arm in ARMS:
            a = attach[arm]
            steps.append(PlannedStep("(control host)", f"attach: the {arm.replace('_', ' ')} arm, {profs[arm].name} "
                                     f"already running at {a.url}; its {profs[arm].health_path} must answer 200 within "
                                     f"{a.connect_timeout_s:.0f} s"))
            steps += log(arm, "before the run")
        if p.warmup:
            steps.append(PlannedStep("(control host)", "one unrelated warm-up prompt per arm (not in the statistics)"))
        for t, label, lv in load.schedule(p):
            first = first_arm(t)
            for arm in (first, "no_tier" if first == "tier" else "tier"):
                what = f"trial {t}/{p.trials}, {label}, {arm} arm"
                if arm == "tier" and pool_dir:
                    steps.append(PlannedStep(pool_node, f"{what}: the pool device's counters before",
                                             pool_blockstat_argv(pool_dir)))
                steps += log(arm, f"({what}, before)")
                steps.append(PlannedStep("(control host)", f"{what}: " + load.point_text(p, label, lv, t)))
                if arm == "tier" and pool_dir:
                    steps.append(PlannedStep(pool_node, f"{what}: the pool device's counters after",
                                             pool_blockstat_argv(pool_dir)))
                steps += log(arm, f"({what}, after)")
        for arm in ARMS:
            steps += log(arm, "after the run (fall-back / connector-failure lines: a match is INVALID)")
        return steps

    def plan(self, ctx: GateContext) -> list[PlannedStep]:
        p: GainParams = ctx.params
        if p.capacity is not None:
            return self._plan_sweep(ctx)
        if p.attach is not None:
            return self._plan_attached(ctx)
        profs = self._profiles(p)
        load = LoadPoints()
        longest = load.longest_prompt(p)
        node = next(iter(ctx.nodes.values()))
        steps: list[PlannedStep] = []
        values = {}
        for arm in ARMS:
            view = self._arm_view(p, arm, longest)
            v = launch_values(view, profs[arm], node.work_dir, ctx.gate.id, view.port or 8000, "<run>",
                              node.transport, node.engine_python)
            values[arm] = v
            steps += G2Procedure().plan_launch_setup(view, profs[arm], node, v)
        for arm in ARMS:
            argv = profs[arm].render_argv(values[arm])
            what = (f"start the {arm.replace('_', ' ')} arm's {profs[arm].name} once for the whole run (both at once), "
                    f"in its own process group: {shell_line(argv, profs[arm].render_env(values[arm]))}")
            # both start at once: their spawns may reach the node in either order
            steps.append(PlannedStep(node.name, what + (" (sent before or after the other arm's start)"
                                                        if arm == ARMS[0] else ""), tuple(argv),
                                     optional=arm == ARMS[0]))
        steps.append(PlannedStep(node.name, f"the {ARMS[0].replace('_', ' ')} arm: (its start, when sent after the "
                                 "other arm's)", tuple(profs[ARMS[0]].render_argv(values[ARMS[0]])), optional=True))
        if p.warmup:
            steps.append(PlannedStep("(control host)", "one unrelated warm-up prompt per arm (not in the statistics)"))
        for t, label, lv in load.schedule(p):
            first = first_arm(t)
            for arm in (first, "no_tier" if first == "tier" else "tier"):
                pool = values[arm]["pool_dir"]
                steps.append(PlannedStep(node.name, f"trial {t}/{p.trials}, {label}, {arm} arm: the pool device's "
                                         "counters before", pool_blockstat_argv(pool)))
                steps.append(PlannedStep("(control host)", f"trial {t}/{p.trials}, {label}, {arm} arm: "
                                         + load.point_text(p, label, lv, t)))
                steps.append(PlannedStep(node.name, f"trial {t}/{p.trials}, {label}, {arm} arm: the pool device's "
                                         "counters after", pool_blockstat_argv(pool)))
        steps.append(PlannedStep(node.name, "stop both engines (their process groups); their logs are checked for "
                                 "fall-back / connector-failure lines (a match is INVALID)"))
        return steps

    # ------------------------------------------------------------------------------------------------ run

    def _setup_arms(self, ctx: GateContext, p: GainParams, profs: dict[str, EngineProfile], ev: GainEvidence,
                    longest: int) -> tuple[dict, dict[str, G2LoadEvidence], dict[str, GateContext]] | WorkloadResult:
        """Each arm's engine prepared (launched or attached), its evidence begun, its files in its own folder of the
        gate's directory: (setups, evidence, contexts) by arm, or the first arm's failure as the gate's error."""
        load, g2, attached = LoadPoints(), G2Procedure(), p.attach is not None
        setups, arm_ev, ctxs = {}, {}, {}
        for arm in ARMS:
            view = self._arm_view(p, arm, longest)
            setup = (g2.setup_attached(ctx, view, profs[arm]) if attached
                     else g2.setup_launched(ctx, view, profs[arm], labels=(arm,)))
            arm_ev[arm] = G2LoadEvidence(**load_fields(p), trace=ev.trace, device_reads=profs[arm].device_reads,
                                         pool_drive=pool_drive_of(ctx, p.pool_node if attached else None))
            if isinstance(setup, WorkloadResult):
                load.engine_evidence(arm_ev[arm], setup.evidence)
                ev.arms = arm_ev
                return WorkloadResult(evidence=ev, error=f"{arm} arm: {setup.error or setup.invalid_reason}")
            load.engine_evidence(arm_ev[arm], setup.ev)
            setups[arm] = setup
            (ctx.gate_dir / arm).mkdir(parents=True, exist_ok=True)
            ctxs[arm] = dataclasses.replace(ctx, gate_dir=ctx.gate_dir / arm)
        load.engine_evidence(ev, setups["tier"].ev)
        return setups, arm_ev, ctxs

    def run(self, ctx: GateContext) -> WorkloadResult:
        p: GainParams = ctx.params
        if p.capacity is not None:
            return self._run_sweep(ctx)
        profs = self._profiles(p)
        load = LoadPoints()
        ev = GainEvidence(no_tier_engine_profile=profs["no_tier"].name, engine_cache_tokens=p.engine_cache_tokens,
                          min_tier_reuse_share=p.min_tier_reuse_share, min_tier_served_share=p.min_tier_served_share,
                          arm_difference=None if p.attach is not None else arm_difference(profs["tier"], profs["no_tier"]),
                          device_reads=profs["tier"].device_reads, **load_fields(p))
        trace = None
        if p.load.kind == "trace":
            try:
                trace, ev.trace = read_load_trace(p.load)
            except (ConfigError, InputFileError, ValueError) as exc:
                return WorkloadResult(evidence=ev, error=trace_error(p.load, exc))
        longest = load.longest_prompt(p)
        g2 = G2Procedure()
        attached = p.attach is not None
        arms = self._setup_arms(ctx, p, profs, ev, longest)
        if isinstance(arms, WorkloadResult):
            return arms
        setups, arm_ev, ctxs = arms
        _, _, vocab = g2.kv_shape(g2_view(p, longest), profs["tier"])
        # both arms, the same prompts; attached engines outlive the run, so their prompts are new to them by the
        # tier arm's per-run seed
        seed = setups["tier"].ev.prompt_seed if attached and setups["tier"].ev.prompt_seed is not None else p.seed
        ev.prompt_seed = seed
        counters = {arm: accounting_counters(profs[arm]) for arm in ARMS}
        # both engines start at once (a start-up is mostly one process importing at a time: two overlap on a node's
        # cores instead of one waiting for the other); attached: nothing to start, each engine's health (and log)
        # checked in turn, in the plan's order; each is closed whether it started or not
        session = EngineSession({arm: PhaseRunner(ctxs[arm], {"engine": setups[arm].engine},
                                                  counters=counters[arm].any) for arm in ARMS},
                                parallel=not attached, label=lambda arm: f"{arm} arm")
        points: dict[str, list[PointTrial]] = {arm: [] for arm in ARMS}
        fallbacks: dict[str, str | None] = {}
        prompts: LoadPrompts | None = None

        def before() -> WorkloadResult | None:  # a text-only API without a usable tokenizer is known now
            nonlocal prompts
            try:
                prompts = arm_prompts(profs, setups, vocab, arm_ev)
            except ValueError as exc:
                ev.arms = arm_ev
                return WorkloadResult(evidence=ev, error=str(exc))
            return None

        def both_arms() -> None:
            if p.warmup:
                for arm in ARMS:
                    s, eng = setups[arm], setups[arm].engine
                    mw = eng.metrics() if counters[arm].any else None
                    g2.warm_up(ctxs[arm], g2_view(p, longest), profs[arm], eng.base_url, arm, s.warm[0], s.ev)
                    arm_ev[arm].warmup = dict(s.ev.warmup)
                    ok = s.ev.warmup.get("error") is None
                    load.settled_metrics(ctx, eng, counters[arm], mw, (s.warm[0].prompt_tokens or 0) if ok else 0)
            for t, label, lv in load.schedule(p):
                first = first_arm(t)
                for arm in (first, "no_tier" if first == "tier" else "tier"):
                    ctx.progress(f"{ctx.gate.id}: trial {t}/{p.trials}, load point {label}, {arm} arm")
                    points[arm].append(load.attempts(ctxs[arm], p, profs[arm], session.runners[arm], setups[arm],
                                                     counters[arm], t, label, lv, trace, seed, prompts, arm_ev[arm]))
            cores: dict[str, list[list[int]] | None] = {}
            for arm in ARMS:
                logs = session.close(arm)
                fallbacks[arm], arm_ev[arm].fallback_lines = session.fallback(
                    logs, profs[arm].fallback_patterns, arm, profs[arm].in_force_log if arm == "tier" else ())
                cores[arm] = compute_cores(next((log.end.text for log in logs.values()), None))
            if not attached:  # an attached engine's log is its operator's command's, from whenever it started
                ev.compute_cores = cores

        def failed(why: str) -> WorkloadResult:
            for arm in ARMS:
                arm_ev[arm].points = points[arm]
            ev.arms = arm_ev
            return WorkloadResult(evidence=ev, error=why)

        def after() -> None:
            for arm in ARMS:
                arm_ev[arm].pool = pool_record(setups[arm].engine) or arm_ev[arm].pool
            ev.pool = arm_ev["tier"].pool

        stopped = session.run(both_arms, failed, before=before, after=after)
        if stopped is not None:
            return stopped
        results = {arm: evaluate_load(points[arm], p.load.kind, p.ttft_slo_s, p.knee_percentile, arm_ev[arm],
                                      fallback=fallbacks.get(arm)) for arm in ARMS}
        result = evaluate_gain(results, p.min_tier_reuse_share, fallbacks, ev,
                               reusable=reusable_share(p, trace, chunk_tokens(profs["tier"])))
        write_summary(ctx.gate_dir, "g2-gain-summary.json", result)
        return result
