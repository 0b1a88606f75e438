"""G2 tenant isolation: can one tenant's request hit another tenant's KV on the tier?

Tenants are values of the request field the engine profile declares as its tenant key (``tenant_key``: vLLM's
``cache_salt``, with which vLLM salts its own prefix cache). One engine kvgate launches, its pool fresh for the run
(on a loop device of its own with ``pool_device: {kind: loop}``), four phases, each a :class:`PhaseRunner` phase
with the engine's hit counters read around it:

1. ``store-a``: the prompts under tenant A (never seen: no hits), which stores their KV on the tier; kvgate waits
   until the pool holds it;
2. cold: (``restart_between``: the engine stopped and started again, so its memory holds nothing), ``sync`` and the
   page cache dropped (the profile's cold regime keeps it so as stores land);
3. ``cross-b``: the same prompts under tenant B. The tier's hits here must be zero. The pool device's read
   bytes are counted around it (reported: a leak reads the device);
4. ``fresh-b``: as many fresh prompts of the same lengths under tenant B: the timing probe's baseline (B's TTFT
   for A's prompts against fresh ones; a hit visible by timing is a side channel: reported, never judged);
5. cold again, then ``control-a``: A's prompts under tenant A again, the positive control: they must hit the tier
   (``min_hit_rate`` of the looked-up tokens), and the pool's device must read at least ``min_read_fraction`` of
   the KV the hits claim. A tier that hits nothing cannot show isolation: INVALID, never PASS.

Judged by :func:`evaluate_tenancy` (pure): tenant B's tier hits above zero are FAIL, named ("the connector's storage
keys ignore cache_salt"), whatever else; a failed request is an ERROR listing it (never dropped); missing proofs
(the positive control's hits or device reads, prompts not new, the pool not populated, a fall-back in the engine's
log) are INVALID; otherwise the gate's metric ``cross_tenant_hit_tokens`` is judged (pass ``<= 0``).
"""

from __future__ import annotations

from pathlib import Path

import dataclasses
from typing import Any, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..errors import HarnessError
from .kit.rederive import pool_device_steps, raw_text, rescanned_fallback
from .kit.g2 import records_from_text
from ..engines import EngineProfile, load_profile, shell_line
from ..engines.client import CompletionRequest, RequestRecord
from ..errors import ConfigError
from ..parsers.pooldev import (PoolDeviceStat, pool_blockstat_argv, pool_device_probe, read_bytes_between,
                                 write_bytes_between)
from ..stats import percentile
from ..units import format_quantity
from .kit.base import (DROP_CACHES_ARGV, GateContext, PlannedStep, ValidityCheck, WorkloadResult,
                   drop_caches, register_workload, write_summary)
from .kit.engine import pool_contents, pool_files_argv, pool_record, stored_kv_tokens
from .kit.g2 import G2Evidence, G2Params, G2Setup, G2Procedure, cold_check, store_phase_endurance
from .kit.phases import PhaseRecord, PhaseRunner
from .kit.probes import run_probe
from .kit.session import EngineSession

# The phases in the order they run: (label, tenant)
PHASES = (("store-a", "A"), ("cross-b", "B"), ("fresh-b", "B"), ("control-a", "A"))
# the pool device's counters are read around these; store-a's "before" and cross-b's "before" (after the sync of the
# cold step) bound what storing tenant A's prompts wrote (its endurance window, docs/endurance.md)
DEVICE_PHASES = ("store-a", "cross-b", "control-a")
WARMUP_TENANT = "warmup"


def engine_log(phase: str, restart_between: bool) -> str:
    """Pure: the label of the engine start that serves ``phase`` (its log is ``engine-LABEL.log``): one start for
    the run, or with ``restart_between`` one per tenant switch (fresh-b is served by cross-b's)."""
    if not restart_between:
        return "tenancy"
    return "cross-b" if phase == "fresh-b" else phase


def engine_logs(restart_between: bool) -> tuple[str, ...]:
    """Pure: the labels of the engine's starts, in order (the launched engine's log names)."""
    return tuple(dict.fromkeys(engine_log(ph, restart_between) for ph, _ in PHASES))


class TenancyParams(G2Params):
    """g2-tenancy's parameters: G2's (the engine, its model, the pool and its device, the prompts) and whether the
    engine is restarted between tenants (``restart_between``: an engine that keeps KV in its own memory across
    requests, e.g. prefix caching on, would otherwise serve the positive control from memory: INVALID)."""

    prompt_tokens: list[int] = Field(default_factory=lambda: [1026], min_length=1)
    restart_between: bool = False

    @model_validator(mode="after")
    def _launched(self) -> "TenancyParams":
        if self.attach is not None:
            raise ValueError("g2-tenancy launches its engine (attach: is not supported)")
        return self


class TenancyPhase(BaseModel):
    """One phase as measured: its tenant and salt, what was sent and failed, the engine's tier-hit counters around it,
    the pool device's read bytes (where counted) and the TTFT median of its answered requests."""

    model_config = ConfigDict(extra="forbid")

    phase: str
    tenant: str
    salt: str
    requests: int = 0
    failed: int = 0
    hit_tokens: float | None = None
    query_tokens: float | None = None
    device_read_bytes: int | None = None
    ttft_p50_s: float | None = None
    cold_before: bool | None = None  # the page cache was dropped right before it (None: no drop asked)


class TenancyEvidence(G2Evidence):
    """G2's engine evidence plus the tenants: the profile's tenant key, each tenant's salt (a per-run nonce in it),
    every phase's figures, the KV of tenant A's prompts and what the pool held after they were stored."""

    tenant_key: str | None = None
    salts: dict[str, str] = {}
    phases: list[TenancyPhase] = []
    tenant_a_kv_bytes: int | None = None
    restart_between: bool = False
    # the pool device's bytes written from store-a's start to cross-b's (after the cold step's sync): what storing
    # tenant A's prompts cost the drive
    store_device_write_bytes: int | None = None


# ------------------------------------------------------------------------------------------ evaluation


def _p50(records: Sequence[RequestRecord]) -> float | None:
    xs = [r.ttft_s for r in records if r.ok and r.ttft_s is not None]
    return percentile(xs, 50) if xs else None


def phase_figures(phases: Sequence[TenancyPhase], records: Mapping[str, Sequence[RequestRecord]]
                  ) -> list[TenancyPhase]:
    """Pure: each phase's request counts and TTFT median recomputed from its request records (the counters and the
    device bytes as given)."""
    out = []
    for ph in phases:
        recs = records.get(ph.phase, [])
        out.append(ph.model_copy(update=dict(requests=len(recs), failed=sum(not r.ok for r in recs),
                                             ttft_p50_s=_p50(recs))))
    return out


def _figure(phases: Mapping[str, TenancyPhase]):
    """A phase's figure by name, None for a phase that did not run."""
    def get(name: str, attr: str) -> Any:
        return getattr(phases[name], attr) if name in phases else None
    return get


def failed_requests_text(records: Mapping[str, Sequence[RequestRecord]]) -> str | None:
    """Pure: every failed request, named by phase and id, with the first one's error; None when all answered."""
    failed = [(ph, r) for ph, recs in records.items() for r in recs if not r.ok]
    if not failed:
        return None
    total = sum(len(recs) for recs in records.values())
    names = ", ".join(f"{ph}/{r.request_id}" for ph, r in failed[:20]) + (" ..." if len(failed) > 20 else "")
    return f"{len(failed)} of {total} requests failed ({names}); first: {failed[0][1].error}"


def evaluate_tenancy(records: Mapping[str, Sequence[RequestRecord]], ev: TenancyEvidence, *, fallback: str | None,
                     counters: bool, device_reads: bool, min_hit_rate: float,
                     min_read_fraction: float) -> WorkloadResult:
    """Pure: the tenancy verdict's inputs from each phase's request records and ``ev`` (its ``phases`` carry the
    hit counters and device bytes). Order: tenant B hit the tier -> ``failed_check`` (FAIL, named); a failed request
    -> error; a missing proof -> ``invalid_reason``. A copy of ``ev`` with the figures and ``validity`` is returned."""
    phases = {ph.phase: ph for ph in phase_figures(ev.phases, records)}
    ev = ev.model_copy(update={"phases": list(phases.values())})
    get = _figure(phases)
    b_hit, b_query = get("cross-b", "hit_tokens"), get("cross-b", "query_tokens")
    c_hit, c_query = get("control-a", "hit_tokens"), get("control-a", "query_tokens")
    c_rate = c_hit / c_query if c_hit is not None and c_query else None
    claimed = (ev.tenant_a_kv_bytes or 0) * (c_rate or 0.0)
    c_read = get("control-a", "device_read_bytes")
    read_fraction = c_read / claimed if c_read is not None and claimed > 0 else None
    metrics: dict[str, float] = {}
    if b_hit is not None:
        metrics["cross_tenant_hit_tokens"] = float(b_hit)
        if b_query:
            metrics["cross_tenant_hit_rate"] = b_hit / b_query
    if c_rate is not None:
        metrics["control_hit_rate"] = c_rate
    for name, metric in (("cross-b", "cross_tenant_device_read_bytes"), ("control-a", "control_device_read_bytes")):
        if get(name, "device_read_bytes") is not None:
            metrics[metric] = float(get(name, "device_read_bytes"))
    if read_fraction is not None:
        metrics["control_read_fraction"] = read_fraction
    for name in ("cross-b", "fresh-b", "control-a"):
        if get(name, "ttft_p50_s") is not None:
            metrics[f"ttft_{name.replace('-', '_')}_p50_s"] = get(name, "ttft_p50_s")
    if metrics.get("ttft_fresh_b_p50_s") and "ttft_cross_b_p50_s" in metrics:
        metrics["timing_probe_ratio"] = metrics["ttft_cross_b_p50_s"] / metrics["ttft_fresh_b_p50_s"]
    failed_check = None
    if b_hit:
        key = ev.tenant_key or "the tenant key"
        dev = get("cross-b", "device_read_bytes")
        seen = f", the pool's device read {format_quantity(dev, 'B')} meanwhile" if dev is not None else ""
        failed_check = (f"tenant B ({key} {ev.salts.get('B', '?')!r}) hit {b_hit:.0f} of {b_query or 0:.0f} prompt "
                        f"tokens of the KV tenant A stored on the tier{seen}: the connector's storage keys ignore "
                        f"{key}")
    # what storing tenant A's prompts cost the drive (the pool's growth holds the warm-up prompt's KV too)
    ev.endurance = store_phase_endurance(records.get("store-a") or [], ev.store_device_write_bytes, ev)
    ev.validity = tenancy_validity(ev, phases, fallback, counters, device_reads, min_hit_rate, min_read_fraction,
                                   c_rate, claimed, read_fraction)
    bad = next((c for c in ev.validity if not c.ok and c.name != "isolated"), None)  # isolated: the verdict itself
    invalid = None if bad is None else f"{bad.name}: {bad.how}"
    ev.failed_requests = sum(ph.failed for ph in phases.values())
    return WorkloadResult(metrics=metrics, evidence=ev, invalid_reason=invalid,
                          error=failed_requests_text(records), failed_check=failed_check)


def tenancy_validity(ev: TenancyEvidence, phases: Mapping[str, TenancyPhase], fallback: str | None, counters: bool,
                     device_reads: bool, min_hit_rate: float, min_read_fraction: float, c_rate: float | None,
                     claimed: float, read_fraction: float | None) -> list[ValidityCheck]:
    """Pure: what the isolation verdict rests on, in the order :func:`evaluate_tenancy` takes the first failure (after
    ``isolated``, which is the verdict itself) as its INVALID reason."""
    get = _figure(phases)
    out = [ValidityCheck(name="no fall-back", ok=fallback is None,
                         claim="the engine used the tier throughout (no fall-back, no connector failure)",
                         how=fallback or "the engine's log scanned after every phase for the profile's fall-back "
                                         "patterns: none", figure="fall-back lines",
                         value=float(len(ev.fallback_lines)), unit="count")]
    if not counters:
        out.append(ValidityCheck(name="hit counters", ok=False, claim="the engine counts its tier hits",
                                 how="the profile declares no hit_metrics: tenant B's hits cannot be counted"))
    b_hit, b_query = get("cross-b", "hit_tokens"), get("cross-b", "query_tokens")
    out.append(ValidityCheck(
        name="isolated", ok=b_hit is not None and b_hit == 0,
        claim="tenant B's requests for tenant A's prompts hit none of tenant A's KV on the tier",
        how=(f"the engine's tier-hit counters around tenant B's {get('cross-b', 'requests') or 0} request(s): "
             + ("not read" if b_hit is None else f"{b_hit:.0f} of {b_query or 0:.0f} looked-up tokens hit")),
        figure="tenant B's tier hit tokens", value=b_hit, unit="count"))
    new = [(n, get(n, "hit_tokens")) for n in ("store-a", "fresh-b")]
    out.append(ValidityCheck(
        name="new prompts", ok=all(h is not None and h == 0 for _, h in new),
        claim="tenant A's prompts and tenant B's fresh prompts were new to the tier when first sent",
        how="the engine's tier-hit counters: " + ", ".join(f"{n} {'not read' if h is None else f'{h:.0f}'} hit tokens"
                                                            for n, h in new),
        figure="hit tokens of never-seen prompts", value=sum(h or 0 for _, h in new), unit="count"))
    pool = ev.pool_after_populate
    added = None if pool is None else (pool.bytes if pool.bytes_added is None else pool.bytes_added)
    out.append(ValidityCheck(
        name="populated", ok=bool(added) and added >= (ev.tenant_a_kv_bytes or 0),
        claim="tenant A's prompts stored their KV on the tier",
        how=("the pool was not listed" if pool is None else
             f"finished chunk files in {pool.dir} on {pool.node}: {pool.files} file(s), "
             f"{format_quantity(ev.tenant_a_kv_bytes or 0, 'B')} of KV expected"),
        figure="bytes tenant A's prompts stored", value=added, unit="B"))
    c_hit, c_query = get("control-a", "hit_tokens"), get("control-a", "query_tokens")
    out.append(ValidityCheck(
        name="positive control", ok=c_rate is not None and c_rate >= min_hit_rate,
        claim="tenant A's prompts, sent again under tenant A after tenant B's, hit the tier (a tier that hits "
              "nothing cannot show isolation)",
        how=("the engine's tier-hit counters around the control: "
             + ("not read" if c_hit is None else f"{c_hit:.0f} of {c_query or 0:.0f} looked-up tokens hit")
             + f" (at least {min_hit_rate} required)"),
        figure="the control's tier hit rate", value=c_rate, unit="ratio"))
    if device_reads:
        out.append(cold_check(ev, get("control-a", "device_read_bytes"), claimed, read_fraction, min_read_fraction,
                              "around the control", "the control's hits were read from the pool's device, not the "
                              "engine's memory or a cache", "bytes the pool device read during the control"))
    return out


def salted(requests: Sequence[CompletionRequest], field: str, salt: str, tag: str) -> list[CompletionRequest]:
    """Pure: ``requests`` sent as one tenant: the tenant key's field set to ``salt``, ids tagged by phase."""
    return [dataclasses.replace(r, request_id=f"{r.request_id}-{tag}", extra={**r.extra, field: salt})
            for r in requests]


def split_fresh(prompts: Sequence[CompletionRequest], lengths: int, per_length: int
                ) -> tuple[list[CompletionRequest], list[CompletionRequest]]:
    """Pure: prompts drawn ``2 x per_length`` a length (in length order) split into tenant A's and the fresh ones."""
    mine, fresh = [], []
    for i in range(lengths):
        block = list(prompts[i * 2 * per_length:(i + 1) * 2 * per_length])
        mine += block[:per_length]
        fresh += block[per_length:]
    return mine, fresh


def rederive(gate_dir: Path, result: dict[str, Any], params: Any, ctx: dict[str, Any]):
    """g2-tenancy from every phase's raw request records (``requests-store-a.jsonl``, ``requests-cross-b.jsonl``,
    ``requests-fresh-b.jsonl``, ``requests-control-a.jsonl``: those the run's evidence lists), tenant B's and the
    control's pool-device bytes re-parsed from the run's probe steps (``*-tenancy-blockstat-PHASE``: before and
    after), the engine's logs (``engine-LABEL.log``) re-scanned for fall-backs, the bounds from config/gates.yaml,
    through the workload's own pure functions (harness.workloads.g2_tenancy.reevaluate_tenancy); the hit counters as
    recorded."""
    ev = result.get("evidence") or {}
    prof = load_profile(params.engine)
    phases = [ph.get("phase") for ph in ev.get("phases") or [] if isinstance(ph, dict)]
    records = {ph: records_from_text(raw_text(gate_dir, f"requests-{ph}.jsonl", f"the {ph} phase's requests"))
               for ph in phases}
    bundle = Path(ctx["bundle_dir"])
    device: dict[str, int | None] = {}
    probed = {}
    for ph in DEVICE_PHASES:
        if ph not in phases:
            continue
        steps = pool_device_steps(bundle, None, f"tenancy-blockstat-{ph}")
        if ph == "store-a" and not steps:  # a kvgate that did not count tenant A's stores
            continue
        if len(steps) != 2:
            raise HarnessError(f"{gate_dir.name}: {len(steps)} pool-device probe steps around {ph} (two expected: "
                               "before and after): the device bytes cannot be re-derived")
        device[ph], probed[ph] = read_bytes_between(steps[0], steps[1]), steps
    # tenant A's stores: from store-a's "before" to cross-b's (after the cold step's sync)
    store_writes = (write_bytes_between(probed["store-a"][0], probed["cross-b"][0])
                    if "store-a" in probed and "cross-b" in probed else None)
    fallback = None
    started = {engine_log(ph, params.restart_between) for ph in phases}  # the starts that served a phase
    for label in engine_logs(params.restart_between):
        if label in started and fallback is None:
            fallback = rescanned_fallback(gate_dir, f"engine-{label}.log", prof.fallback_patterns, label,
                                          prof.in_force_log)
    return reevaluate_tenancy(ev, records, device, fallback, params, prof, store_writes)


@register_workload("g2-tenancy")
class G2Tenancy(G2Procedure):
    """Tenant isolation on the tier (docs/g2.md, "Tenant isolation"); the launched engine's set-up is G2's."""
    rederive = staticmethod(rederive)  # the gate re-judged from the bundle's raw files

    Params = TenancyParams
    EvidenceModel = TenancyEvidence
    ENDURANCE = ("store-a, tenant A's stores: the pool device's bytes written from its start to cross-b's (after the "
                 "cold step's sync), per million prompt tokens, per byte the pool held after it, over the phase")
    METRICS = {"cross_tenant_hit_tokens": "count", "cross_tenant_hit_rate": "ratio", "control_hit_rate": "ratio",
               "cross_tenant_device_read_bytes": "B", "control_device_read_bytes": "B",
               "control_read_fraction": "ratio", "ttft_cross_b_p50_s": "s", "ttft_fresh_b_p50_s": "s",
               "ttft_control_a_p50_s": "s", "timing_probe_ratio": "x"}

    def validate_against(self, params: TenancyParams, nodes: dict[str, Any]) -> list[tuple[tuple, str]]:
        issues = super().validate_against(params, nodes)
        try:
            prof = load_profile(params.engine)
        except ConfigError:  # the profile's own error is among the issues already
            return issues
        if prof.tenant_key is None:
            issues.append((("engine",), f"profile {prof.name}: no tenant_key (the request field that names a tenant, "
                                        "e.g. {field: cache_salt}): tenants cannot be told apart"))
        if prof.hit_metrics is None:
            issues.append((("engine",), f"profile {prof.name}: no hit_metrics (tenant B's tier hits are counted by "
                                        "the engine's hit counters)"))
        return issues

    def plan(self, ctx: GateContext) -> list[PlannedStep]:
        p: TenancyParams = ctx.params
        prof = load_profile(p.engine)
        node, v, argv, env, n, steps = self._plan_launched(ctx, p, prof)
        key = prof.tenant_key.field if prof.tenant_key else "<tenant key>"
        blockstat = pool_blockstat_argv(v["pool_dir"])
        warm = "; one unrelated warm-up prompt first (recorded, not in the figures)" if p.warmup else ""

        def cold(what: str) -> list[PlannedStep]:
            out = []
            if p.restart_between:
                out.append(PlannedStep(node.name, f"stop the engine (its process group) and start it again ({what})",
                                       tuple(argv)))
            if p.drop_caches:
                out.append(PlannedStep(node.name, f"sync and drop the page cache ({what}; recorded whether "
                                                  "permitted)", DROP_CACHES_ARGV))
            return out

        steps += [
            PlannedStep(node.name, f"start {prof.name} in its own process group: {shell_line(argv, env)}", tuple(argv)),
            PlannedStep(node.name, "the pool device's counters before tenant A's stores (their writes, to cross-b's "
                                   "counters after the sync: the endurance window)", blockstat),
            PlannedStep(node.name, f"store-a: {n} never-seen prompts of {p.prompt_tokens} tokens under tenant A "
                                   f"({key}: a per-run salt){warm}; hit counters before and after (none may hit)"),
            PlannedStep(node.name, "the pool device's counters after tenant A's stores", blockstat),
            PlannedStep(node.name, f"wait until the finished chunk files in {v['pool_dir']} hold tenant A's KV",
                        tuple(pool_files_argv(v["pool_dir"], prof.pool_files)), repeats=True)]
        steps += cold("between tenant A and tenant B")
        steps += [
            PlannedStep(node.name, "the pool device's read counters before tenant B", blockstat),
            PlannedStep(node.name, f"cross-b: the same {n} prompts under tenant B (another {key}){warm}; its tier "
                                   "hits must be zero (any is FAIL: the connector's keys ignore the tenant key)"),
            PlannedStep(node.name, "the pool device's read counters after tenant B", blockstat),
            PlannedStep(node.name, f"fresh-b: {n} fresh prompts of the same lengths under tenant B (the timing "
                                   f"probe's baseline; none may hit){warm}")]
        steps += cold("before the positive control")
        steps += [
            PlannedStep(node.name, "the pool device's read counters before the positive control", blockstat),
            PlannedStep(node.name, f"control-a: tenant A's {n} prompts under tenant A again{warm}; they must hit the "
                                   f"tier (at least {p.min_hit_rate}) and the pool's device read at least "
                                   f"{p.min_read_fraction} of the KV the hits claim"),
            PlannedStep(node.name, "the pool device's read counters after the positive control", blockstat),
            PlannedStep(node.name, "stop the engine (kill its process group); its log checked for fall-back lines")]
        return steps

    def run(self, ctx: GateContext) -> WorkloadResult:
        p: TenancyParams = ctx.params
        prof = load_profile(p.engine)
        # twice the prompts a length: the first half tenant A's, the second the timing probe's fresh ones
        both = p.model_copy(update={"prompts_per_length": 2 * p.prompts_per_length})
        setup = self.setup_launched(ctx, both, prof, labels=engine_logs(p.restart_between))
        if isinstance(setup, WorkloadResult):
            return setup
        return self._tenants(ctx, p, prof, setup)

    def _tenants(self, ctx: GateContext, p: TenancyParams, prof: EngineProfile, s: G2Setup) -> WorkloadResult:
        """The four phases on the launched engine, as the module's docstring describes them."""
        eng = s.engine
        mine, fresh = split_fresh(s.prompts, len(p.prompt_tokens), p.prompts_per_length)
        key = prof.tenant_key.field
        nonce = (s.ev.run_dir_on_node or "").rsplit("-", 1)[-1]  # the run's tag: salts new to any earlier pool
        salts = {"A": f"kvgate-tenant-a-{nonce}", "B": f"kvgate-tenant-b-{nonce}", WARMUP_TENANT: f"kvgate-w-{nonce}"}
        bpt = s.ev.kv_bytes_per_token or 0
        ev = TenancyEvidence.model_validate({
            **s.ev.model_dump(), "tenant_key": key, "salts": {k: v for k, v in salts.items() if k != WARMUP_TENANT},
            "tenant_a_kv_bytes": sum(stored_kv_tokens(r.prompt_tokens, prof.kv_block_tokens) for r in mine) * bpt,
            "restart_between": p.restart_between, "prompts": len(mine)})
        ev.expected_kv_bytes = ev.tenant_a_kv_bytes  # set-up drew the fresh prompts too: only A's are stored first
        # store-a's warm-up prompt is stored too: the pool is awaited until it holds both
        stored = ev.tenant_a_kv_bytes + (stored_kv_tokens(s.warm[0].prompt_tokens, prof.kv_block_tokens) * bpt
                                         if p.warmup else 0)
        sends = {"store-a": salted(mine, key, salts["A"], "a"), "cross-b": salted(mine, key, salts["B"], "b"),
                 "fresh-b": salted(fresh, key, salts["B"], "b"), "control-a": salted(mine, key, salts["A"], "a2")}
        warm = dict(zip(("store-a", "cross-b", "fresh-b", "control-a"),
                        salted([s.warm[0]] + [s.warm[1]] * 3, key, salts[WARMUP_TENANT], "w")))
        runner = PhaseRunner(ctx, {"engine": eng}, counters=True, warm_up=(
            lambda _n, h, label: self.warm_up(ctx, p, prof, h.base_url, label, warm[label], ev)))
        recs: dict[str, PhaseRecord] = {}
        cold: dict[str, bool | None] = {}
        session = EngineSession({"engine": runner})

        def tenants() -> str | None | WorkloadResult:
            fallback = None
            for label, tenant in PHASES:
                if label in ("cross-b", "control-a"):
                    err = self._cold(ctx, p, runner, eng, label, cold)
                    if err:
                        return WorkloadResult(evidence=ev, error=err)
                ctx.progress(f"{ctx.gate.id}: {label}, {len(sends[label])} prompts under tenant {tenant}")
                device = (lambda label=label: self._device(ctx, s, label, ev)) if label in DEVICE_PHASES else None
                recs[label] = runner.phase(label, lambda label=label: self._send(ctx, p, prof, eng.base_url,
                                                                                  sends[label]), device=device)
                self._save(ctx.gate_dir / f"requests-{label}.jsonl", recs[label].output)
                log = engine_log(label, p.restart_between)  # as kvgate report names it re-scanning that log
                fallback, found = session.fallback(recs[label].engines, prof.fallback_patterns, log, prof.in_force_log)
                ev.fallback_lines = list(dict.fromkeys(ev.fallback_lines + found))
                if fallback is not None:
                    break
                if label == "store-a":
                    ev.pool_after_populate = pool_contents(ctx, s.pool_transport, s.pool_dir, stored,
                                                           p.populate_timeout_s, "tenancy-pool-after-store",
                                                           prof.pool_files)
            return fallback

        def after() -> None:
            ev.pool = pool_record(eng) or ev.pool

        fallback = session.run(tenants, lambda why: WorkloadResult(evidence=ev, error=why), after=after)
        if isinstance(fallback, WorkloadResult):
            return fallback
        ev.phases = [self._phase_record(label, tenant, salts[tenant], recs[label], prof, cold.get(label))
                     for label, tenant in PHASES if label in recs]
        if "store-a" in recs and "cross-b" in recs:
            ev.store_device_write_bytes = write_bytes_between(recs["store-a"].device_before,
                                                              recs["cross-b"].device_before)
        result = evaluate_tenancy({k: r.output for k, r in recs.items()}, ev, fallback=fallback, counters=True,
                                  device_reads=prof.device_reads, min_hit_rate=p.min_hit_rate,
                                  min_read_fraction=p.min_read_fraction)
        write_summary(ctx.gate_dir, "g2-tenancy-summary.json", result)
        return result

    def _cold(self, ctx: GateContext, p: TenancyParams, runner: PhaseRunner, eng: Any, label: str,
              cold: dict[str, bool | None]) -> str | None:
        """Between tenants: the engine restarted (``restart_between``) and the page cache dropped."""
        if p.restart_between:
            err = runner.forget() or runner.resume()
            if err:
                return err
        if p.drop_caches:
            node = next(iter(ctx.nodes))
            cold[label] = drop_caches(ctx, ctx.transports[node], f"tenancy-drop-caches-{label}").dropped
        return None

    @staticmethod
    def _phase_record(label: str, tenant: str, salt: str, rec: PhaseRecord, prof: EngineProfile,
                      cold: bool | None) -> TenancyPhase:
        r = rec.engines["engine"]
        return TenancyPhase(phase=label, tenant=tenant, salt=salt, hit_tokens=r.delta(prof.hit_metrics.hit_tokens),
                            query_tokens=r.delta(prof.hit_metrics.query_tokens),
                            device_read_bytes=read_bytes_between(rec.device_before, rec.device_after),
                            cold_before=cold)

    @staticmethod
    def _device(ctx: GateContext, s: G2Setup, label: str, ev: TenancyEvidence) -> PoolDeviceStat | None:
        """The pool's block device and its counters now (the one probe G2 and pd-handoff use), as a step named by
        the phase (``tenancy-blockstat-LABEL``: ``kvgate report`` re-parses them)."""
        dev, res = run_probe(ctx, s.pool_transport, pool_device_probe(s.pool_dir), f"tenancy-blockstat-{label}")
        if dev is None:
            ev.pool_device_error = ev.pool_device_error or f"{label}: {res.summary()}"
            return None
        ev.pool_device, ev.pool_device_maj_min = dev.source, dev.maj_min
        return dev


def reevaluate_tenancy(evidence: dict[str, Any], records: Mapping[str, Sequence[RequestRecord]],
                       device: Mapping[str, int | None], fallback: str | None, p: TenancyParams,
                       prof: EngineProfile, store_write_bytes: int | None = None) -> WorkloadResult:
    """Pure: a bundle's g2-tenancy result again: every phase's records from its raw file, the device bytes of
    ``cross-b`` and ``control-a`` re-parsed from the run's probe steps, the fall-back re-scanned, the bounds from the
    gate's params; the hit counters as the run recorded them. Then :func:`evaluate_tenancy`, as the run."""
    ev = TenancyEvidence.model_validate({k: v for k, v in evidence.items() if k != "validity"})
    ev.phases = [ph.model_copy(update={"device_read_bytes": device.get(ph.phase)}) if ph.phase in device
                 else ph for ph in ev.phases]
    ev.store_device_write_bytes = store_write_bytes
    return evaluate_tenancy(records, ev, fallback=fallback, counters=prof.hit_metrics is not None,
                            device_reads=prof.device_reads, min_hit_rate=p.min_hit_rate,
                            min_read_fraction=p.min_read_fraction)
