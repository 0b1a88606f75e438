"""g2-gain judged: each arm's proof, the pairs of arms per point and trial, the gain figures over trials, the tier's
hit rate and share, the validity."""

from __future__ import annotations

import dataclasses
from typing import Literal

from ...engines import EngineProfile
from ...load.reuse import reuse_stats
from ...load.traces import Trace
from ...stats import median_interval
from ..kit.base import ValidityCheck, WorkloadResult
from ..kit.load import G2LoadParams, PointTrial, emit
from .spec import ARMS, ArmProof, GAIN_FIGURES, GainEvidence, GainParams, GainTrial


def first_arm(trial: int) -> Literal["tier", "no_tier"]:
    """Pure: which arm goes first in a trial: the tier arm in odd trials, the other in even ones."""
    return "tier" if trial % 2 else "no_tier"


def arm_proof(points: list[PointTrial]) -> ArmProof:
    """Pure: an arm's accounting summed over its points and trials (None where any point lacks the figure)."""
    accs = [p.accounting for p in points if p.accounting is not None]

    def total(name: str) -> float | None:
        vals = [getattr(a, name) for a in accs]
        return None if not vals or any(v is None for v in vals) else float(sum(vals))

    mem, tier = total("memory_hit_tokens"), total("tier_hit_tokens")
    reads = total("device_read_bytes")
    reused = (mem or 0.0) + (tier or 0.0)
    return ArmProof(prompt_tokens=sum(a.prompt_tokens for a in accs), memory_hit_tokens=mem, tier_hit_tokens=tier,
                    recomputed_tokens=total("recomputed_tokens"),
                    device_read_bytes=None if reads is None else int(reads),
                    tier_hit_kv_bytes=total("tier_hit_kv_bytes"),
                    tier_reuse_share=None if tier is None or reused <= 0 else tier / reused)


def gain_validity(arms: dict[str, WorkloadResult], proofs: dict[str, ArmProof], min_tier_reuse_share: float,
                  fallbacks: dict[str, str | None], min_tier_served_share: float = 0.0,
                  difference: dict[str, list[str]] | None = None,
                  compute_cores: dict[str, list[list[int]] | None] | None = None) -> list[ValidityCheck]:
    """Pure: what the gain rests on. Each arm valid by g2-load's rules and without a fall-back in its log (a proof
    of the tier arm the gate turned off carried over NOT CHECKED); the arms equal but for the tier switch
    (``difference``, :func:`arm_difference`, when recorded); the tier arm's reused context served by the tier (not
    engine memory, not a connector that is off) and covering ``min_tier_served_share`` of the reuse the load
    offers; the arm without the tier reading nothing from a tier, so what its engine memory did not hold was
    recomputed; both arms computing on the same cores, where their engines' logs state them (``compute_cores``)."""
    out = []
    for arm in ARMS:
        res = arms.get(arm)
        why = fallbacks.get(arm) or (res.invalid_reason if res is not None else "the arm did not run")
        checks = [c for c in (res.evidence.validity if res is not None and res.evidence is not None else [])
                  if isinstance(c, ValidityCheck)]
        proven = [c.name for c in checks if c.checked]
        out.append(ValidityCheck(name=f"{arm} arm valid", ok=why is None,
                                 claim=f"every point of the {arm.replace('_', ' ')} arm is valid by g2-load's rules and "
                                       "its engine's log shows no fall-back",
                                 how=why or f"g2-load's checks held: {', '.join(proven) or 'none recorded'}"))
        if arm == "tier":
            out += [c.model_copy(update={"name": f"tier arm: {c.name}"}) for c in checks if not c.checked]
    if difference is not None:
        words = {"tier_only_argv": "the tier arm's argv adds", "no_tier_only_argv": "the no-tier arm's argv adds",
                 "tier_only_env": "the tier arm's environment adds", "no_tier_only_env": "the no-tier arm's "
                 "environment adds"}
        shown = "; ".join(f"{words.get(k, k)} {' '.join(v)}" for k, v in difference.items() if v)
        out.append(ValidityCheck(name="arms equal but the tier switch", ok=True,
                                 claim="the arm without the tier runs the tier arm's argv and environment, less its "
                                       "connector (or plus its no-tier flag) and nothing else",
                                 how=f"as the profiles write them: {shown or 'no difference'}"))
    if compute_cores is not None and any(v is not None for v in compute_cores.values()):
        out.append(same_cores_check(compute_cores))
    out.append(served_check(proofs.get("tier", ArmProof()), min_tier_reuse_share, min_tier_served_share))
    n = proofs.get("no_tier", ArmProof())
    flat = n.tier_hit_tokens is not None and n.tier_hit_tokens == 0
    out.append(ValidityCheck(
        name="recomputed without the tier", ok=flat,
        claim="without the tier, nothing was read from a tier: what engine memory did not hold was recomputed",
        how=("the arm's tier hit counter is not exposed: unproven" if n.tier_hit_tokens is None else
             f"tier hit tokens {n.tier_hit_tokens:.0f}; recomputed {n.recomputed_tokens or 0:.0f} and engine-memory "
             f"hits {n.memory_hit_tokens or 0:.0f} of {n.prompt_tokens:.0f} prompt tokens"),
        figure="tier hit tokens", value=n.tier_hit_tokens, unit="count"))
    return out


def same_cores_check(compute_cores: dict[str, list[list[int]] | None]) -> ValidityCheck:
    """Pure: "arms computed on the same cores": both arms' engines stated their compute cores (a list per rank)
    and the lists are equal. A baseline computing on fewer cores is slowed by the machine, not by the missing
    tier (vLLM's CPU build keeps one more core off its compute threads when a KV connector is configured)."""
    def shown(arm: str) -> str:
        cores = compute_cores.get(arm)
        return (f"the {arm.replace('_', ' ')} arm's log states no compute cores" if cores is None else
                f"the {arm.replace('_', ' ')} arm computed on cores "
                + " | ".join(",".join(str(c) for c in rank) for rank in cores))
    values = [compute_cores.get(a) for a in ARMS]
    ok = all(v is not None for v in values) and all(v == values[0] for v in values)
    how = "; ".join(shown(a) for a in ARMS)
    if not ok and all(v is not None for v in values):
        how += (" (vLLM's CPU build keeps one more core from its compute threads when a KV connector is "
                "configured: give both arms the same VLLM_CPU_NUM_OF_RESERVED_CPU or VLLM_CPU_OMP_THREADS_BIND)")
    return ValidityCheck(name="arms computed on the same cores", ok=ok,
                         claim="both arms' engines ran their compute threads on the same cores, so the arm without "
                               "the tier is not slowed by fewer cores",
                         how=f"as the engines' logs state: {how}")


def served_check(t: ArmProof, min_tier_reuse_share: float, min_tier_served_share: float) -> ValidityCheck:
    """Pure: "tier served the reuse": the tier arm's tier hit tokens at least ``min_tier_served_share`` of the
    reusable tokens its load offered (``t.reusable_tokens``: the ideal, not the engine's memory hits) and at least
    ``min_tier_reuse_share`` of what was reused (engine memory + tier)."""
    share, served = t.tier_reuse_share, t.tier_served_share
    ok = (bool(t.tier_hit_tokens) and share is not None and share >= min_tier_reuse_share
          and served is not None and served >= min_tier_served_share)
    if t.tier_hit_tokens is None:
        how = "the engine exposes no tier hit counter: the tier's service is unproven"
    elif not t.tier_hit_tokens:
        how = "the tier served no token: its connector is off, or the working set fit the engine's memory"
    elif t.reusable_tokens is None:
        how = (f"tier hit tokens {t.tier_hit_tokens:.0f}, but the reuse the load offers is not known (no trace "
               "ideal, no declared reuse): unproven")
    else:
        how = (f"tier hit tokens {t.tier_hit_tokens:.0f} of {t.reusable_tokens:.0f} reusable tokens the load offered "
               f"({served if served is not None else 0:.1%}, at least {min_tier_served_share:g} required); "
               f"engine-memory hit tokens {t.memory_hit_tokens or 0:.0f} (the tier's share of the reuse "
               f"{share if share is not None else 0:.1%}, at least {min_tier_reuse_share:g}); {t.prompt_tokens:.0f} "
               "prompt tokens")
    if t.device_read_bytes is not None and t.tier_hit_kv_bytes:
        how += (f"; the pool device read {t.device_read_bytes} B for {t.tier_hit_kv_bytes:.0f} B of KV the hits "
                f"claim")
    return ValidityCheck(name="tier served the reuse", ok=ok,
                         claim="with the tier, the reuse the load offers came from the tier, not from engine memory",
                         how=how, figure="tier share of the reusable tokens", value=served, unit="ratio")


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b <= 0 else a / b


def gain_pairs(arms: dict[str, list[PointTrial]]) -> list[GainTrial]:
    """Pure: the two arms' points paired by (trial, label), in the order the tier arm ran them."""
    other = {(p.trial, p.label): p for p in arms.get("no_tier", [])}
    out = []
    for p in arms.get("tier", []):
        q = other.get((p.trial, p.label))
        if q is None:
            continue
        g = GainTrial(label=p.label, trial=p.trial, first=first_arm(p.trial))
        for arm, pt in (("tier", p), ("no_tier", q)):
            f = pt.figures
            if f is None:
                continue
            g.goodput_rps[arm], g.request_rate_rps[arm] = f.goodput_rps, f.request_rate_rps
            if f.ttft_p50_s is not None:
                g.ttft_p50_s[arm] = f.ttft_p50_s
            if f.ttft_p95_s is not None:
                g.ttft_p95_s[arm] = f.ttft_p95_s
        out.append(g)
    return out


def gain_figures(pairs: list[GainTrial]) -> dict[str, dict[str, list[float]]]:
    """Pure: per figure (``GAIN_FIGURES``), per scope (a point's label, or ``""`` for the ladder), the per-trial
    values. Over the ladder: each arm's highest goodput / request rate over the trial's points, and the TTFT
    ratios of the ladder's last (highest) point."""
    out: dict[str, dict[str, list[float]]] = {f: {} for f in GAIN_FIGURES}

    def put(fig: str, scope: str, v: float | None) -> None:
        if v is not None:
            out[fig].setdefault(scope, []).append(v)

    for g in pairs:
        gp = _ratio(g.goodput_rps.get("tier"), g.goodput_rps.get("no_tier"))
        tp = _ratio(g.request_rate_rps.get("tier"), g.request_rate_rps.get("no_tier"))
        put("goodput_gain", g.label, None if gp is None else gp - 1)
        put("throughput_gain", g.label, None if tp is None else tp - 1)
        put("ttft_p50_ratio", g.label, _ratio(g.ttft_p50_s.get("tier"), g.ttft_p50_s.get("no_tier")))
        put("ttft_p95_ratio", g.label, _ratio(g.ttft_p95_s.get("tier"), g.ttft_p95_s.get("no_tier")))
    labels = list(dict.fromkeys(g.label for g in pairs))
    for t in sorted({g.trial for g in pairs}):
        mine = [g for g in pairs if g.trial == t]

        def best(field: str, arm: str) -> float | None:
            vals = [getattr(g, field).get(arm) for g in mine if getattr(g, field).get(arm) is not None]
            return max(vals) if vals else None

        gp = _ratio(best("goodput_rps", "tier"), best("goodput_rps", "no_tier"))
        tp = _ratio(best("request_rate_rps", "tier"), best("request_rate_rps", "no_tier"))
        put("goodput_gain", "", None if gp is None else gp - 1)
        put("throughput_gain", "", None if tp is None else tp - 1)
        top = next((g for g in mine if g.label == labels[-1]), None)
        if top is not None:
            put("ttft_p50_ratio", "", _ratio(top.ttft_p50_s.get("tier"), top.ttft_p50_s.get("no_tier")))
            put("ttft_p95_ratio", "", _ratio(top.ttft_p95_s.get("tier"), top.ttft_p95_s.get("no_tier")))
    return out


def reusable_share(p: G2LoadParams, trace: Trace | None, chunk_tokens: int | None = None) -> float | None:
    """Pure: the share of the load's prompt tokens any cache could serve, in whole chunks of the engine's
    ``chunk_tokens`` (its KV block or LMCache chunk; None: the trace's block): a trace's unbounded-cache hit rate
    as sent (its blocks re-mapped to ``tokens_per_block``; harness/load/reuse.py), or a synthetic ladder's declared
    reuse: its shared prefixes after each group's first request."""
    if p.load.kind == "trace":
        if trace is None:
            return None
        per = p.load.tokens_per_block or trace.block_tokens
        if per != trace.block_tokens:
            trace = dataclasses.replace(trace, block_tokens=per, requests=tuple(
                dataclasses.replace(r, input_tokens=-(-r.input_tokens * per // trace.block_tokens))
                for r in trace.requests))
        return reuse_stats(trace, engine_block_tokens=chunk_tokens).unbounded_hit_rate
    if p.requests_per_point <= p.prefix_groups:
        return 0.0
    return (p.requests_per_point - p.prefix_groups) * p.shared_prefix_tokens / (p.requests_per_point
                                                                                 * p.prompt_tokens)


def chunk_tokens(prof: EngineProfile) -> int | None:
    """The tokens the profile's tier stores and finds in whole units: its connector's KV block
    (``kv_block_tokens``) or its LMCache config's ``chunk_size``; None: the trace's own block."""
    if prof.kv_block_tokens:
        return prof.kv_block_tokens
    size = prof.lmcache.config.get("chunk_size") if prof.lmcache is not None else None
    return int(size) if isinstance(size, int) and size > 0 else None


def tier_hit_rate(proof: ArmProof, share: float | None) -> float | None:
    """Pure: of the context the load could reuse (``share`` of the tier arm's prompt tokens), the part the tier
    served (at most 1): the hit rate ``kvgate cost`` takes (its ``hit_rate``)."""
    if share is None or share <= 0 or not proof.prompt_tokens or proof.tier_hit_tokens is None:
        return None
    return min(1.0, proof.tier_hit_tokens / (proof.prompt_tokens * share))


def evaluate_gain(arms: dict[str, WorkloadResult], min_tier_reuse_share: float,
                  fallbacks: dict[str, str | None] | None = None,
                  evidence: GainEvidence | None = None, reusable: float | None = None) -> WorkloadResult:
    """Pure: the gain over trials and its validity from both arms' g2-load results (each from
    :func:`~harness.workloads.kit.load.evaluate_load` over its points); ``reusable``: the share of the prompt tokens
    a cache could serve (:func:`reusable_share`), for ``tier_hit_rate`` and the proof that the tier served the
    reuse. Each figure over the trials that gave one, against the trials asked for (``evidence.trials``). INVALID
    when a proof fails (the first one named); ERROR when either arm served nothing."""
    fallbacks = fallbacks or {}
    ev = (evidence or GainEvidence()).model_copy(deep=True)
    ev.arms = {a: r.evidence for a, r in arms.items()}
    points = {a: list(r.evidence.points) for a, r in arms.items()}
    ev.proofs = {a: arm_proof(pts) for a, pts in points.items()}
    ev.pairs = gain_pairs(points)
    # what the tier arm's serving cost the pool's drive (the no-tier arm stores nothing on it)
    ev.endurance = getattr(arms["tier"].evidence, "endurance", None) if "tier" in arms else None
    out = WorkloadResult(metrics={}, evidence=ev)
    asked = ev.trials or len({g.trial for g in ev.pairs}) or None
    ev.gain = {}
    for fig, scopes in gain_figures(ev.pairs).items():
        for scope, values in scopes.items():
            name = f"{fig}@{scope}" if scope else fig
            ev.gain[name] = median_interval(values, asked=asked)
            emit(out, name, ev.gain[name])
    ev.reusable_share = reusable
    tier = ev.proofs.get("tier", ArmProof())
    if reusable is not None and tier.prompt_tokens:
        reusable_tokens_ = tier.prompt_tokens * reusable
        ev.proofs["tier"] = tier.model_copy(update={
            "reusable_tokens": reusable_tokens_,
            "tier_served_share": None if tier.tier_hit_tokens is None or reusable_tokens_ <= 0
            else tier.tier_hit_tokens / reusable_tokens_})
    ev.tier_hit_rate = tier_hit_rate(ev.proofs.get("tier", ArmProof()), reusable)
    if ev.tier_hit_rate is not None:
        out.metrics["tier_hit_rate"] = ev.tier_hit_rate
    served = (ev.min_tier_served_share if ev.min_tier_served_share is not None  # an older bundle: today's default
              else GainParams.model_fields["min_tier_served_share"].default)
    ev.validity = gain_validity(arms, ev.proofs, min_tier_reuse_share, fallbacks, served, ev.arm_difference,
                                ev.compute_cores)
    bad = next((c for c in ev.validity if not c.ok), None)
    out.invalid_reason = None if bad is None else f"{bad.name}: {bad.how}"
    errors = [f"{a} arm: {r.error}" for a, r in arms.items() if r.error]
    out.error = errors[0] if errors else None
    return out
