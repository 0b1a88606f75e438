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

from pathlib import Path

import dataclasses
import json
import re
from collections import Counter
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..errors import HarnessError
from .kit.rederive import device_by_attempt, load_texts, rescanned_fallback
from ..engines import EngineProfile, check_lmcache_config, load_profile, shell_line
from ..errors import ConfigError
from ..parsers.pooldev import pool_blockstat_argv
from ..load.reuse import reuse_stats
from ..load.traces import Trace
from ..safeio import InputFileError
from ..stats import median_interval
from .kit.base import GateContext, PlannedStep, ValidityCheck, Workload, WorkloadResult, register_workload, \
    pool_drive_of, write_summary
from .kit.capacity import (CAPACITY_FIGURES, CAPACITY_METRICS, CapacityEvidence, CapacityPoint, CapacitySpec,
                               evaluate_capacity, point_levels, reusable_tokens, sweep_issues, sweep_points, sweep_trace)
from .kit.load import (Counters, G2LoadEvidence, G2LoadParams, LoadAttachParams, LoadPrompts, LoadSpec,
                       LoadPoints, MetricInterval, PointTrial, accounting_counters, emit, evaluate_load,
                       g2_view, load_control_files, load_fields, load_issues, load_prompts, point_invalid, point_metric_unit,
                       read_load_trace, reevaluate_load, token_accounting, trace_error)
from .kit.g2 import G2Procedure, launch_values
from .kit.engine import pool_record
from .kit.phases import PhaseRunner
from .kit.session import EngineSession

ARMS = ("tier", "no_tier")
REFERENCE_GAIN = "+29-40 % (R2, single-instance basis)"


SWEEP_PATH = "(capacity sweep)"   # the load a capacity sweep's points replay: one session trace per point


class GainParams(G2LoadParams):
    """g2-gain's ``params:``: g2-load's (the engine, the load, the SLOs, the bounds of a valid point), the arm
    without the tier, the engine memory both arms get, and what proves the tier arm's reuse was the tier's; or,
    instead of ``load:``, ``capacity:`` (the capacity curve: a working-set sweep on the arm with the tier,
    harness/workloads/kit/capacity.py)."""

    load: LoadSpec | None = None  # type: ignore[assignment]
    capacity: CapacitySpec | None = None
    no_tier_engine: str | None = None      # the arm without the tier (default: engine + its no_tier_flag)
    engine_cache_tokens: int | None = Field(default=None, ge=1)  # both arms' engine memory (engine_cache_flag)
    min_tier_reuse_share: float = Field(default=0.9, ge=0, le=1)  # of the tier arm's reused tokens, from the tier
    # of the reusable tokens the load offers (the trace's ideal at the engine's chunk size, or the ladder's shared
    # prefixes), the share the tier arm's tier must serve: a tier that served 1 token of 24,600 proves nothing
    min_tier_served_share: float = Field(default=0.5, ge=0, le=1)
    # attach mode: the arm without the tier is an engine someone else runs too (``attach:`` is the tier arm's)
    no_tier_attach: LoadAttachParams | None = None
    # keys of the profile's LMCache config replaced for this gate (both arms; e.g. a small max_local_cpu_size, so
    # the pool rather than LMCache's RAM serves the reads)
    lmcache_overrides: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _prefix(self) -> "GainParams":
        if (self.load is None) == (self.capacity is None):
            raise ValueError("give exactly one of load (the gain: the same load with the tier and without) or "
                             "capacity (the capacity curve: a working-set sweep)")
        if self.no_tier_attach is not None or (self.attach is not None and self.capacity is None):
            if self.capacity is not None:
                raise ValueError("no_tier_attach: a capacity sweep runs the tier arm alone")
            if self.attach is None or self.no_tier_attach is None:
                raise ValueError("attach (the engine with the tier) and no_tier_attach (the same engine without it) "
                                 "go together: both arms attached, or both launched")
            if self.attach.url.rstrip("/") == self.no_tier_attach.url.rstrip("/"):
                raise ValueError(f"attach and no_tier_attach both name {self.attach.url}: one engine cannot be both "
                                 "arms (give the URL of a second engine, the same model without the tier)")
            if self.engine_cache_tokens is not None:
                raise ValueError("engine_cache_tokens: an attached engine's memory is its operator's (size both "
                                 "arms alike in their deployments)")
            if self.lmcache_overrides:
                raise ValueError("lmcache_overrides: an attached engine's LMCache is configured by its operator")
        if self.capacity is not None:
            given = [k for k in ("requests_per_point", "prompt_tokens", "shared_prefix_tokens", "prefix_groups",
                                 "no_tier_engine") if k in self.model_fields_set]
            if given:
                raise ValueError(f"{', '.join(given)}: not for a capacity sweep (its sessions are capacity's)")
            return self
        return G2LoadParams._prefix(self)


def sweep_params(p: GainParams) -> GainParams:
    """Pure: a capacity sweep's parameters as g2-load's point runner reads them: each point a trace replay."""
    return p.model_copy(update={"load": LoadSpec(path=SWEEP_PATH)})


# ----------------------------------------------------------------------------------------------- evidence


class GainModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ArmProof(GainModel):
    """Where one arm's prompt tokens came from over all its points and trials (sums of g2-load's accounting)."""

    prompt_tokens: float = 0.0
    memory_hit_tokens: float | None = None
    tier_hit_tokens: float | None = None
    recomputed_tokens: float | None = None
    device_read_bytes: int | None = None
    tier_hit_kv_bytes: float | None = None
    tier_reuse_share: float | None = None   # tier hits / (engine-memory hits + tier hits)
    reusable_tokens: float | None = None    # of its prompt tokens, what the load offers to reuse (the ideal)
    tier_served_share: float | None = None  # tier hits / reusable tokens


class GainTrial(GainModel):
    """One trial × load point, both arms side by side: the paired figures the gain is computed from."""

    label: str
    trial: int
    first: Literal["tier", "no_tier"]
    goodput_rps: dict[str, float] = {}
    request_rate_rps: dict[str, float] = {}
    ttft_p50_s: dict[str, float] = {}
    ttft_p95_s: dict[str, float] = {}


class GainEvidence(G2LoadEvidence):
    """g2-gain's evidence: each arm as g2-load records it (its points, accounting, summary), the pairs, the gain
    figures over trials and each arm's proof."""

    no_tier_engine_profile: str | None = None
    engine_cache_tokens: int | None = None
    min_tier_reuse_share: float | None = None
    min_tier_served_share: float | None = None
    # how the arm without the tier differs from the tier arm (argv and environment as the profiles give them):
    # the tier switch only (arm_difference); None: not recorded (attached arms, a bundle of an older kvgate)
    arm_difference: dict[str, list[str]] | None = None
    reference_gain: str = REFERENCE_GAIN
    arms: dict[str, G2LoadEvidence] = {}
    proofs: dict[str, ArmProof] = {}
    pairs: list[GainTrial] = []
    gain: dict[str, MetricInterval] = {}
    reusable_share: float | None = None      # of the prompt tokens, what any cache could serve
    tier_hit_rate: float | None = None       # of that, what the tier arm's tier served (kvgate cost's hit_rate)
    capacity: CapacityEvidence | None = None  # a capacity sweep's curve (then only the tier arm ran)


GAIN_FIGURES: dict[str, str] = {"goodput_gain": "ratio", "throughput_gain": "ratio", "ttft_p50_ratio": "x",
                                "ttft_p95_ratio": "x"}


SWEEP_LABEL_RE = re.compile(r"x[0-9][0-9.e+-]*")


def gain_metric_unit(name: str) -> str | None:
    """Pure: the unit of a g2-gain per-point metric: each gain figure per point as ``FIGURE@LABEL``, a capacity
    sweep's figures per working set as ``FIGURE@x<working set>`` (``tier_hit_rate@x8``); None for any other."""
    fig, at, label = name.partition("@")
    if at and SWEEP_LABEL_RE.fullmatch(label) and fig in CAPACITY_FIGURES:
        return CAPACITY_FIGURES[fig]
    return point_metric_unit(name, GAIN_FIGURES)


# --------------------------------------------------------------------------------------- pure evaluation


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
                  difference: dict[str, list[str]] | None = None) -> list[ValidityCheck]:
    """Pure: what the gain rests on. Each arm valid by g2-load's rules and without a fall-back in its log (a proof
    of the tier arm the gate turned off carried over NOT CHECKED); the arms equal but for the tier switch
    (``difference``, :func:`arm_difference`, when recorded); the tier arm's reused context served by the tier (not
    engine memory, not a connector that is off) and covering ``min_tier_served_share`` of the reuse the load
    offers; the arm without the tier reading nothing from a tier, so what its engine memory did not hold was
    recomputed."""
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
    ev.validity = gain_validity(arms, ev.proofs, min_tier_reuse_share, fallbacks, served, ev.arm_difference)
    bad = next((c for c in ev.validity if not c.ok), None)
    out.invalid_reason = None if bad is None else f"{bad.name}: {bad.how}"
    errors = [f"{a} arm: {r.error}" for a, r in arms.items() if r.error]
    out.error = errors[0] if errors else None
    return out


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
                            max_failed_share)
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
                     fallback: str | None | bool = False) -> WorkloadResult:
    """Pure: a capacity sweep again from the tier arm's raw files: each point through g2-load's re-evaluation,
    the further counters' deltas from its counters file, then :func:`evaluate_sweep`. ``params``, ``device``,
    ``fallback`` (False: as the run judged it) as :func:`reevaluate_gain` takes them."""
    recorded = {c.name: c.how for c in ev.validity}
    arm_ev = ev.arms["tier"]
    if fallback is False:
        fallback = recorded.get("tier arm valid") if arm_ev.fallback_lines else None
    again = reevaluate_load(arm_ev.model_dump(mode="json"), requests, counters_text, counters, device_reads, fallback,
                            params=params, device=device)
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


def reevaluate_gain(evidence: dict[str, Any], requests: dict[str, dict[str, str]],
                    counters_text: dict[str, dict[str, str]], counters: dict[str, Counters],
                    device_reads: dict[str, bool], params: "GainParams | None" = None,
                    device: dict[str, dict[str, tuple[int | None, int | None]]] | None = None,
                    fallbacks: dict[str, str | None] | None = None) -> WorkloadResult:
    """Pure: a bundle's g2-gain result again from its raw files: each arm's points through g2-load's own
    re-evaluation (``requests`` / ``counters_text``: arm -> file name -> text; ``counters``: arm -> which counters
    are prompt tokens, memory and tier hits), then :func:`evaluate_gain`. ``params``: the gate's params, whose
    bounds (each arm's SLOs and read fraction, ``min_tier_reuse_share``, the reusable share of a synthetic load)
    replace the evidence's; ``device``: arm -> requests file -> the pool device's (read, written) bytes re-parsed
    from the steps; ``fallbacks``: arm -> its engine log's fall-back as re-scanned (None: as the run judged it)."""
    ev = GainEvidence.model_validate(evidence)
    device = device or {}
    if ev.capacity is not None:
        return reevaluate_sweep(ev, requests.get("tier", {}), counters_text.get("tier", {}), counters["tier"],
                                device_reads["tier"], sweep_params(params) if params is not None else None,
                                device.get("tier") if device else None,
                                fallbacks["tier"] if fallbacks is not None else False)
    recorded = {c.name: c.how for c in ev.validity}
    arms = {}
    if fallbacks is None:
        fallbacks = {arm: recorded.get(f"{arm} arm valid") if ev.arms[arm].fallback_lines else None for arm in ARMS}
    for arm in ARMS:
        arms[arm] = reevaluate_load(ev.arms[arm].model_dump(mode="json"), requests.get(arm, {}),
                                    counters_text.get(arm, {}), counters[arm], device_reads[arm], fallbacks[arm],
                                    params=params, device=device.get(arm) if device else None)
    share = params.min_tier_reuse_share if params is not None else (
        ev.min_tier_reuse_share if ev.min_tier_reuse_share is not None else 0.9)
    # a ladder's declared reuse from the config; a trace's ideal (at the engine's chunk) as the run computed it from
    # the trace it replayed (its sha256 recorded; the file need not be where the bundle is re-derived)
    reusable = reusable_share(params, None) if params is not None and params.load.kind != "trace" \
        else ev.reusable_share
    return evaluate_gain(arms, share, fallbacks, ev, reusable=reusable)


# ------------------------------------------------------------------------------------------------ the workload


def no_tier_profile(p: GainParams, prof: EngineProfile) -> EngineProfile:
    """The arm without the tier: ``no_tier_engine``'s profile, or ``engine``'s with its ``no_tier_flag``; both arms
    get ``engine_cache_flag engine_cache_tokens`` where the gate bounds the engine's memory."""
    base = load_profile(p.no_tier_engine) if p.no_tier_engine else prof
    flag = [] if p.no_tier_engine else [prof.capabilities.no_tier_flag]
    return with_cache(p, base, flag)


def engine_cache_value(prof: EngineProfile, tokens: int) -> int:
    """Pure: what the profile's ``engine_cache_flag`` takes for an engine memory of ``tokens`` tokens: the tokens,
    or the KV blocks that hold them (``engine_cache_block_tokens``; the gate gives whole blocks)."""
    per = prof.capabilities.engine_cache_block_tokens
    return tokens if per is None else -(-tokens // per)


def engine_cache_issues(p: GainParams, prof: EngineProfile) -> list[tuple[tuple, str]]:
    """Pure: an engine memory the profile's flag cannot give exactly (not whole KV blocks)."""
    per = prof.capabilities.engine_cache_block_tokens
    if p.engine_cache_tokens is None or per is None or p.engine_cache_tokens % per == 0:
        return []
    return [(("engine_cache_tokens",), f"{p.engine_cache_tokens} tokens is not a whole number of {per}-token KV "
             f"blocks (profile {prof.name!r} sets its engine memory in blocks): give a multiple of {per}")]


def no_tier_engine_issues(p: GainParams, prof: EngineProfile, attached: bool) -> list[tuple[tuple, str]]:
    """The arm without the tier's profile (``no_tier_engine``), when the gate names one: it loads, runs the same
    engine as ``prof`` with the same argv and environment less the tier switch (:func:`unequal_arms`), and is
    launched by kvgate or attached to as the tier arm is."""
    if p.no_tier_engine is None:
        return []
    try:
        other = load_profile(p.no_tier_engine)
    except ConfigError as exc:
        return [(("no_tier_engine",), str(exc.issues[0]))]
    issues = []
    if other.engine != prof.engine:
        issues.append((("no_tier_engine",), f"profile {other.name!r} runs {other.engine}, not {prof.engine}: both "
                       "arms must be the same engine"))
    extra = unequal_arms(prof, other)
    if extra:
        issues.append((("no_tier_engine",), f"profile {other.name!r} is not {prof.name!r} less its tier switch: the "
                       f"arms also differ by {' '.join(extra)} (declare the switch in {prof.name!r}'s "
                       "capabilities.tier_flags / tier_env; a slowed baseline is no gain)"))
    if attached and other.launches:
        issues.append((("no_tier_engine",), f"profile {other.name!r} launches its engine (argv); an attached arm "
                       "takes a profile without argv"))
    return issues


def _argv_words(prof: EngineProfile) -> list[str]:
    """Pure: the profile's argv as written (templates unfilled; a structured value as its JSON)."""
    return [a if isinstance(a, str) else json.dumps(a.json_, sort_keys=True) for a in prof.argv]


def arm_difference(tier: EngineProfile, no_tier: EngineProfile) -> dict[str, list[str]]:
    """Pure: how the arm without the tier's launch differs from the tier arm's, as the profiles write them: argv
    words and environment entries (``NAME=value``) only the tier arm has (``tier_only``) and only the other has
    (``no_tier_only``), each in its profile's order (the evidence records it, the report shows it)."""
    out: dict[str, list[str]] = {}
    for key, mine, other in (("argv", _argv_words(tier), _argv_words(no_tier)),
                             ("env", [f"{k}={v}" for k, v in tier.env.items()],
                              [f"{k}={v}" for k, v in no_tier.env.items()])):
        a, b = Counter(mine), Counter(other)
        out[f"tier_only_{key}"] = [w for w in dict.fromkeys(mine) for _ in range((a - b)[w])]
        out[f"no_tier_only_{key}"] = [w for w in dict.fromkeys(other) for _ in range((b - a)[w])]
    return out


def unequal_arms(tier: EngineProfile, no_tier: EngineProfile) -> list[str]:
    """Pure: what the arm without the tier changes beyond the tier switch: every argv word or environment entry of
    :func:`arm_difference` that is not the tier arm's declared switch (``capabilities.tier_flags`` with their
    values, ``capabilities.tier_env``) or its ``no_tier_flag``. Empty: equal arms."""
    cap = tier.capabilities
    words = _argv_words(tier)
    switch = set(cap.tier_flags)
    for i, w in enumerate(words[:-1]):
        if w in cap.tier_flags and not words[i + 1].startswith("-"):
            switch.add(words[i + 1])
    d = arm_difference(tier, no_tier)
    extra = [w for w in d["tier_only_argv"] if w not in switch]
    extra += [w for w in d["no_tier_only_argv"] if w != cap.no_tier_flag]
    for key in ("tier_only_env", "no_tier_only_env"):
        extra += [e for e in d[key] if e.partition("=")[0] not in cap.tier_env]
    return extra


def with_cache(p: GainParams, prof: EngineProfile, extra: list[str] | None = None) -> EngineProfile:
    """Pure: ``prof`` with ``extra`` argv, its engine memory where the gate bounds it, and its LMCache config with
    the gate's ``lmcache_overrides``."""
    cache = ([prof.capabilities.engine_cache_flag, str(engine_cache_value(prof, p.engine_cache_tokens))]
             if p.engine_cache_tokens else [])
    more = cache + list(extra or [])
    if more:
        prof = prof.model_copy(update={"argv": list(prof.argv) + more})
    if p.lmcache_overrides and prof.lmcache is not None:
        lmc = prof.lmcache.model_copy(update={"config": {**prof.lmcache.config, **p.lmcache_overrides}})
        prof = prof.model_copy(update={"lmcache": lmc})
    return prof


def lmcache_override_issues(p: GainParams, prof: EngineProfile) -> list[tuple[tuple, str]]:
    """Pure: what is wrong with the gate's ``lmcache_overrides`` on ``prof``'s LMCache config (by its pinned
    version's key table), each at ``lmcache_overrides.KEY``."""
    if not p.lmcache_overrides:
        return []
    if prof.lmcache is None:
        return [(("lmcache_overrides",), f"profile {prof.name!r} configures no LMCache to override")]
    cfg = {**prof.lmcache.config, **p.lmcache_overrides}
    return [(("lmcache_overrides",) + tuple(path), msg) for path, msg in check_lmcache_config(cfg, prof.lmcache.version)
            if path and path[0] in p.lmcache_overrides]


def arm_prompts(profs: dict[str, EngineProfile], setups: dict[str, Any], vocab_size: int,
                arm_ev: dict[str, G2LoadEvidence]) -> LoadPrompts:
    """Both arms' prompts, the same tokens on both: token ids, or text built with the tokenizer of the arm whose
    API takes text only (then both arms get that text). ValueError when no prompt would suit both arms."""
    text_arm = next((a for a in ARMS if profs[a].api.text_only), None)
    if text_arm is None:
        for a in ARMS:
            arm_ev[a].prompt_kind = "token_ids"
        return LoadPrompts(vocab_size)
    ids_only = [a for a in ARMS if profs[a].capabilities.token_ids_only]
    if ids_only:
        raise ValueError(f"the {text_arm} arm's profile {profs[text_arm].name!r} takes text prompts only, the "
                         f"{ids_only[0]} arm's {profs[ids_only[0]].name!r} token ids only: no prompt suits both")
    prompts = load_prompts(profs[text_arm], setups[text_arm].ev, vocab_size, arm_ev[text_arm])
    for a in ARMS:
        arm_ev[a].prompt_kind, arm_ev[a].tokenizer = arm_ev[text_arm].prompt_kind, arm_ev[text_arm].tokenizer
    return prompts


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
    return reevaluate_gain(ev, texts["requests"], texts["counters"],
                           {a: accounting_counters(p) for a, p in profs.items()},
                           {a: p.device_reads for a, p in profs.items()}, params=params, device=device,
                           fallbacks=fallbacks)


@register_workload("g2-gain")
class G2Gain(Workload):
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
            for arm in ARMS:
                fallbacks[arm], arm_ev[arm].fallback_lines = session.fallback(
                    session.close(arm), profs[arm].fallback_patterns, arm,
                    profs[arm].in_force_log if arm == "tier" else ())

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

