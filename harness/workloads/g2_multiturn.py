"""G2 single-instance gain: multi-turn sessions that come back after their KV left the engine's memory,
throughput with the KV tier vs without (the reference cites +29-40%). Reported as an informational gate.

Two instances of the engine on one node, side by side, serve the same deterministic conversation; each
request goes to one and then the other, so load from elsewhere on the machine falls on both alike:
1. without the tier: the engine's own bounded KV memory only (``--gpu-cache-tokens``), so a session that
   comes back after others evicted its KV is prefilled again from scratch;
2. with the tier: the same engine memory plus LMCache with a fresh fs:// pool; a returning session's
   earlier context is read back from the tier and only its new tokens are computed.
Sessions are served round-robin, turn by turn (turn 1 of every session, then turn 2, ...), one request at
a time; each turn's prompt is the session's whole history (first prompt, then per turn a deterministic
assistant reply and a new user message) so its prefix is the previous turn's prompt. Throughput is the
prompt plus generated tokens of all requests divided by the sum of their client-side latencies (the
counter reads between requests are not counted).

Proof, from the engine's counters read before and after every request: the returning turns did not find
their context in engine memory (both phases; else the workload did not test what it claims: INVALID), and
in the tier phase at least ``min_tier_hit_rate`` of their earlier context came from the tier (INVALID
otherwise). Greedy outputs of both phases are compared (same KV, same tokens).

Engines: any whose profile declares ``capabilities`` ``engine_cache_flag`` and ``no_tier_flag`` (the two modes)
and ``level_counters`` (the per-level counters), e.g. ``cpu-reference``. Both instances are handles of the one
phase runner (``workloads/phases.py``): opened in turn, one interleaved phase, their logs checked for fall-back
lines.
"""

from __future__ import annotations

import json
import posixpath
import random
import time
import uuid
from typing import Any, Mapping, Sequence

import httpx
from pydantic import Field

from ..engines import DEFAULT_CPU_REF_MODEL, LMCacheSettings, check_lmcache_config, kv_bytes_per_token, load_profile
from ..engines.client import CompletionRequest, RequestRecord, run_requests_sync
from ..engines.preflight import preflight_argv
from ..errors import WorkloadError
from ..execute.cancel import Cancellation
from ..parsers.prometheus import Sample, counter_delta
from .base import (Evidence, GateContext, PlannedStep, StrictModel, ValidityCheck, Workload, WorkloadResult,
                   register_workload, write_gate_file, write_summary)
from .engine import (FREE_PORT_CODE, EngineHandle, LaunchedEngine, client_base_url, engine_node, engine_port,
                     engine_preflight, engine_values, model_config_issues, node_engine_python, profile_issues,
                     stage_engine_files)
from .phases import EngineLog, PhaseRunner, first_fallback

# what the profile must declare (capabilities): the two switches the comparison needs and the level counters
NEEDS = ("engine_cache_flag", "no_tier_flag", "level_counters")
COUNTERS = ("prompt_tokens_total", "prefill_tokens_total", "gpu_hit_tokens_total", "gpu_evicted_tokens_total",
            "external_hit_tokens_total", "external_read_bytes_total", "generation_tokens_total")


class MultiTurnParams(StrictModel):
    engine: str = "cpu-reference"
    model: str = "kvgate-cpu-reference"
    served_model_name: str = "kvgate-g2-multiturn"
    model_config_inline: dict[str, Any] | None = None
    sessions: int = Field(default=6, ge=2, le=10000)
    turns: int = Field(default=3, ge=2, le=100)
    first_prompt_tokens: int = Field(default=1024, ge=2)
    user_tokens: int = Field(default=192, ge=1)
    reply_tokens: int = Field(default=64, ge=0)
    max_tokens: int = Field(default=4, ge=1, le=4096)
    gpu_cache_tokens: int = Field(default=2048, ge=1, description="engine KV memory, in tokens")
    lmcache_overrides: dict[str, Any] = Field(default_factory=dict)
    seed: int = 0
    pool_dir: str = "kvgate-kv-pool"
    host: str = "127.0.0.1"
    port: int = Field(default=0, ge=0, le=65535)
    min_tier_hit_rate: float = Field(default=0.9, ge=0, le=1)
    max_memory_reuse: float = Field(default=0.1, ge=0, le=1,
                                    description="largest share of returning context allowed to come from engine memory")
    request_timeout_s: float = Field(default=1800.0, gt=0)
    python: str | None = None  # default: this interpreter on a local node, python3 on an SSH node
    engine_values: dict[str, str] = Field(default_factory=dict)


class MultiTurnPhase(StrictModel):
    """One instance's run of the conversation (with or without the tier): its wall time and tokens, and what the
    returning turns found in engine memory and in the tier (sums of the engine's level counters around every
    request)."""

    wall_s: float
    tokens: int
    requests: int
    returning_prior_tokens: int
    returning_memory_hit_tokens: float
    returning_tier_hit_tokens: float
    prefill_tokens: float
    memory_evicted_tokens: float
    tier_read_bytes: float
    memory_reuse: float | None = None   # share of the returning turns' prior context still in engine memory
    tier_hit_rate: float | None = None  # share of it the tier served


class MultiTurnEvidence(Evidence):
    """G2-multiturn's evidence: both instances, the conversation's shape, and per phase what the returning
    sessions found in engine memory and in the tier (from the engine's counters around every request)."""

    engine_profile: str | None = None
    versions: dict[str, str] = {}  # the engine's distributions, read by the pre-flight
    base_urls: dict[str, str] = {}
    pool_dir: str | None = None
    sessions: int | None = None
    turns: int | None = None
    gpu_cache_tokens: int | None = None
    kv_bytes_per_token: int | None = None
    context_tokens_per_session_last_turn: int | None = None
    lmcache_config: dict[str, Any] | None = None
    no_tier: MultiTurnPhase | None = None
    tier: MultiTurnPhase | None = None
    outputs_matching: int | None = None


def conversation(p: MultiTurnParams, vocab_size: int) -> list[list[list[int]]]:
    """Pure and deterministic: ``prompts[turn][session]`` token ids; turn t's prompt extends turn t-1's."""
    out: list[list[list[int]]] = [[] for _ in range(p.turns)]
    for s in range(p.sessions):
        rng = random.Random(f"kvgate-g2-multiturn:{p.seed}:{s}")
        hist = [rng.randrange(10, vocab_size) for _ in range(p.first_prompt_tokens)]
        out[0].append(list(hist))
        for t in range(1, p.turns):
            hist += [rng.randrange(10, vocab_size) for _ in range(p.reply_tokens + p.user_tokens)]
            out[t].append(list(hist))
    return out


def request_order(prompts: list[list[list[int]]]) -> list[tuple[int, int, list[int]]]:
    """Round-robin: every session's turn 1, then every session's turn 2, ... as (turn, session, ids)."""
    return [(t, s, ids) for t, per_turn in enumerate(prompts) for s, ids in enumerate(per_turn)]


def evaluate_multiturn(phases: dict[str, dict[str, Any]], min_tier_hit_rate: float, max_memory_reuse: float,
                       evidence: MultiTurnEvidence | None = None, logs: Mapping[str, EngineLog] | None = None,
                       fallback_patterns: Sequence[str] = ()) -> WorkloadResult:
    """Pure. ``phases['no_tier'|'tier']`` = {wall_s, tokens, records: [{turn, prior_tokens, delta: {...}, ok,
    output_text}]} (the interleaved phase's output); ``logs``: each instance's whole log, a line of the built-in
    fall-back rules or the profile's ``fallback_patterns`` in either is INVALID (the first instance's reason).
    Metrics, validity and the evidence summary (added to a copy of ``evidence``)."""
    metrics: dict[str, float] = {}
    ev: dict[str, Any] = {}
    failed = []
    for name, ph in phases.items():
        recs = ph["records"]
        failed += [f"{name}: turn {r['turn']} session {r['session']}: {r['error']}" for r in recs if not r["ok"]]
        back = [r for r in recs if r["turn"] > 0]
        prior = sum(r["prior_tokens"] for r in back)
        mem = sum(r["delta"].get("gpu_hit_tokens_total", 0) for r in back)
        tier = sum(r["delta"].get("external_hit_tokens_total", 0) for r in back)
        if ph["wall_s"] > 0:
            metrics[f"{name}_throughput_tokens_per_s"] = ph["tokens"] / ph["wall_s"]
            metrics[f"{name}_sessions_per_s"] = ph["sessions"] / ph["wall_s"]
        ev[name] = {"wall_s": ph["wall_s"], "tokens": ph["tokens"], "requests": len(recs),
                    "returning_prior_tokens": prior, "returning_memory_hit_tokens": mem,
                    "returning_tier_hit_tokens": tier,
                    "prefill_tokens": sum(r["delta"].get("prefill_tokens_total", 0) for r in recs),
                    "memory_evicted_tokens": sum(r["delta"].get("gpu_evicted_tokens_total", 0) for r in recs),
                    "tier_read_bytes": sum(r["delta"].get("external_read_bytes_total", 0) for r in recs)}
        ev[name]["memory_reuse"] = mem / prior if prior else None
        ev[name]["tier_hit_rate"] = tier / prior if prior else None
    nt, t = metrics.get("no_tier_throughput_tokens_per_s"), metrics.get("tier_throughput_tokens_per_s")
    if nt and t:
        metrics["throughput_gain_ratio"] = t / nt
    if ev.get("tier", {}).get("tier_hit_rate") is not None:
        metrics["tier_hit_rate"] = ev["tier"]["tier_hit_rate"]
    a = [r.get("output_text") for r in phases.get("no_tier", {}).get("records", [])]
    b = [r.get("output_text") for r in phases.get("tier", {}).get("records", [])]
    ev["outputs_matching"] = sum(x == y for x, y in zip(a, b))
    error = f"{len(failed)} requests failed; first: {failed[0]}" if failed else None
    # the engine's own word that the tier did nothing outranks every figure
    invalid, _ = first_fallback(logs or {}, fallback_patterns, lambda name: f"{name} instance's")
    fallback = invalid
    for name in ("no_tier", "tier"):
        reuse = ev.get(name, {}).get("memory_reuse")
        if reuse is not None and reuse > max_memory_reuse:
            invalid = invalid or (f"{name}: {reuse:.0%} of the returning sessions' context was still in engine "
                                  f"memory (limit {max_memory_reuse:.0%}): more sessions or less gpu_cache_tokens")
    if ev.get("no_tier", {}).get("returning_tier_hit_tokens"):
        invalid = invalid or "the run without the tier got tier hits: the modes are not what they claim"
    rate = ev.get("tier", {}).get("tier_hit_rate")
    if rate is None:
        invalid = invalid or "no returning turns in the tier phase: nothing was measured"
    elif rate < min_tier_hit_rate:
        invalid = invalid or (f"the tier served {rate:.1%} of the returning sessions' context "
                              f"(below {min_tier_hit_rate:.0%}): the gain is not the tier's")
    ev["validity"] = multiturn_validity(ev, failed, fallback, min_tier_hit_rate, max_memory_reuse)
    for name in ("no_tier", "tier"):
        if name in ev:
            ev[name] = MultiTurnPhase(**ev[name])
    return WorkloadResult(metrics=metrics, evidence=(evidence or MultiTurnEvidence()).model_copy(update=ev),
                          invalid_reason=invalid, error=error)


def multiturn_validity(ev: dict[str, Any], failed: list[str], fallback: str | None, min_tier_hit_rate: float,
                       max_memory_reuse: float) -> list[ValidityCheck]:
    """Pure: what the gain rests on, as :func:`evaluate_multiturn` judges it: every request served, neither
    instance fell back, the returning sessions' context gone from each instance's engine memory (so it was
    recomputed or read from the tier), no tier hits without the tier, and the tier serving the returning context."""
    out = [ValidityCheck(name="requests", ok=not failed, claim="every turn was served by both instances",
                         how=failed[0] if failed else "every request ok", figure="failed requests",
                         value=float(len(failed)), unit="count"),
           ValidityCheck(name="no fall-back", ok=fallback is None,
                         claim="neither instance fell back to re-computing behind a configured tier",
                         how=fallback or "both instances' whole logs scanned for the built-in and the profile's "
                                         "fall-back patterns: none")]
    for name, words in (("no_tier", "without the tier"), ("tier", "with the tier")):
        reuse = ev.get(name, {}).get("memory_reuse")
        out.append(ValidityCheck(
            name=f"evicted ({words})", ok=reuse is not None and reuse <= max_memory_reuse,
            claim=f"the returning sessions' context was no longer in the engine memory of the instance {words}",
            how=f"the instance's engine-memory hit counter over the returning turns against their prior context "
                f"(at most {max_memory_reuse} allowed)", figure="share of the context still in engine memory",
            value=reuse, unit="ratio"))
    stray = ev.get("no_tier", {}).get("returning_tier_hit_tokens")
    out.append(ValidityCheck(name="no tier without the tier", ok=not stray,
                             claim="the instance without the tier got no tier hits (the two modes are what they claim)",
                             how="its tier hit counter over the returning turns", figure="tier hit tokens",
                             value=stray, unit="count"))
    rate = ev.get("tier", {}).get("tier_hit_rate")
    out.append(ValidityCheck(name="tier served", ok=rate is not None and rate >= min_tier_hit_rate,
                             claim="the tier served the returning sessions' context (the gain is the tier's)",
                             how=f"the tier instance's tier hit counter against the returning turns' prior context "
                                 f"(at least {min_tier_hit_rate} required)", figure="tier hit rate", value=rate,
                             unit="ratio"))
    return out


def _delta(before: list[Sample], after: list[Sample], prefix: str) -> dict[str, float]:
    """How much each of the engine's level counters (``prefix`` + name) grew around one request."""
    out = {}
    for c in COUNTERS:
        d = counter_delta(before, after, [prefix + c])
        if d is not None:
            out[c] = d
    return out


@register_workload("g2-multiturn")
class G2MultiTurn(Workload):
    Params = MultiTurnParams
    EvidenceModel = MultiTurnEvidence
    METRICS = {"throughput_gain_ratio": "x", "tier_throughput_tokens_per_s": "tokens/s",
               "no_tier_throughput_tokens_per_s": "tokens/s", "tier_sessions_per_s": "/s",
               "no_tier_sessions_per_s": "/s", "tier_hit_rate": "ratio"}

    def validate_against(self, params, nodes):
        prof, issues = profile_issues(params.engine, nodes, "g2-multiturn")
        missing = [n for n in NEEDS if prof is not None and not getattr(prof.capabilities, n)]
        if missing:
            issues.append((("engine",), f"g2-multiturn needs an engine whose profile declares capabilities "
                           f"{', '.join(missing)} (a cap on engine-memory KV, a switch for the tier, per-level "
                           f"counters); profile {prof.name!r} does not"))
        kv_dtype = prof.capabilities.kv_dtype if prof is not None else None
        issues = model_config_issues(params.model_config_inline, "model_config_inline", kv_dtype) + issues
        if prof is not None and not missing and prof.lmcache is not None and params.lmcache_overrides:
            cfg = {**prof.lmcache.config, **params.lmcache_overrides}
            for path, msg in check_lmcache_config(cfg, prof.lmcache.version):
                if path and path[0] in params.lmcache_overrides:
                    issues.insert(0, (("lmcache_overrides",) + tuple(path), msg))
        return issues

    def _argv(self, prof, v, p: MultiTurnParams, tier: bool) -> list[str]:
        cap = prof.capabilities
        return prof.render_argv(v) + [cap.engine_cache_flag, str(p.gpu_cache_tokens)] + ([] if tier else [cap.no_tier_flag])

    def _ports_planned(self, p: MultiTurnParams) -> dict[str, Any]:
        """The gate's ports, or placeholders for the free ones the run finds."""
        if p.port:
            return {"no_tier": p.port, "tier": p.port + 1}
        return {"no_tier": "<port>", "tier": "<tier port>"}

    def plan(self, ctx: GateContext) -> list[PlannedStep]:
        """Every command the run sends, in its order (ports ``<port>`` and ``<tier port>`` here unless the gate sets one, free ones in
        the run; the run's tag is ``<run>``)."""
        p: MultiTurnParams = ctx.params
        prof = load_profile(p.engine)
        node = next(iter(ctx.nodes.values()))
        ports = self._ports_planned(p)
        v = self._values(p, prof, node, ctx.gate.id, ports["no_tier"], "<run>")
        n = p.sessions * p.turns
        order = f"{p.sessions} sessions x {p.turns} turns round-robin ({n} requests, one at a time)"
        steps = [PlannedStep(node.name, "pre-flight: the engine's interpreter imports what the profile declares",
                             tuple(preflight_argv(v["python"], prof)))]
        if not p.port and getattr(node, "transport", "local") != "local":  # a local node's ports are found here
            steps += [PlannedStep(node.name, f"a free port on the node for the instance {name}",
                                  (v["python"], "-c", FREE_PORT_CODE)) for name in ("without", "with the tier")]
        steps += [
            PlannedStep(node.name, f"create {v['run_dir']} and a fresh pool {v['pool_dir']}",
                        ("mkdir", "-p", v["run_dir"], v["pool_dir"], posixpath.join(v["run_dir"], "prometheus"))),
            PlannedStep(node.name, "start an instance without the tier",
                        tuple(self._argv(prof, v, p, False))),
            PlannedStep(node.name, "start an instance with the tier (next port)",
                        tuple(self._argv(prof, {**v, "port": ports["tier"]}, p, True))),
            PlannedStep(node.name, f"{order}, each request to both instances in turn; engine counters before and "
                        "after each request (HTTP)"),
            PlannedStep(node.name, "stop both instances (kill their process groups); their logs are checked for "
                        "fall-back lines (a match is INVALID)"),
        ]
        return steps

    @staticmethod
    def _values(p: MultiTurnParams, prof, node, gate_id: str, port: int, run_tag: str) -> dict[str, Any]:
        run_dir = posixpath.join(node.work_dir, f"kvgate-g2-{gate_id}-{run_tag}")
        pool_root = p.pool_dir if p.pool_dir.startswith("/") else posixpath.join(node.work_dir, p.pool_dir)
        longest = p.first_prompt_tokens + (p.turns - 1) * (p.reply_tokens + p.user_tokens)
        return engine_values(prof, python=node_engine_python(p.python, node), host=p.host, port=port,
                             model=p.model, served_model_name=p.served_model_name, seed=p.seed, run_dir=run_dir,
                             pool_dir=posixpath.join(pool_root, f"run-{run_tag}"),
                             max_model_len=longest + p.max_tokens + 16, extra=p.engine_values)

    def run(self, ctx: GateContext) -> WorkloadResult:
        p: MultiTurnParams = ctx.params
        node, transport, prof, python = engine_node(ctx, p.engine, p.python)
        versions, err = engine_preflight(ctx, transport, node.name, prof, python, "g2mt-preflight")
        if err:
            return WorkloadResult(evidence=MultiTurnEvidence(engine_profile=prof.name), error=err)
        ports = {"no_tier": engine_port(ctx, transport, node, p.port, python, "g2mt-port-no-tier")}
        ports["tier"] = p.port + 1 if p.port else engine_port(ctx, transport, node, 0, python, "g2mt-port-tier")
        run_tag = uuid.uuid4().hex[:8]
        v = self._values(p, prof, node, ctx.gate.id, ports["no_tier"], run_tag)
        urls = {n: client_base_url(transport, node, p.host, port)[0] for n, port in ports.items()}
        gate_dir = ctx.gate_dir
        model_cfg = dict(p.model_config_inline) if p.model_config_inline is not None else dict(DEFAULT_CPU_REF_MODEL)
        vocab = int(model_cfg.get("vocab_size", 32000))
        prompts = conversation(p, vocab)
        order = request_order(prompts)
        ev = MultiTurnEvidence(engine_profile=prof.name, base_urls=urls, pool_dir=v["pool_dir"], sessions=p.sessions,
                               turns=p.turns, gpu_cache_tokens=p.gpu_cache_tokens,
                               kv_bytes_per_token=kv_bytes_per_token(model_cfg, prof.capabilities.kv_dtype),
                               context_tokens_per_session_last_turn=len(prompts[-1][0]))
        ev.versions = versions
        settings = None
        if prof.lmcache is not None:
            settings = LMCacheSettings(version=prof.lmcache.version,
                                       config={**prof.lmcache.config, **p.lmcache_overrides})
        err, cfg = stage_engine_files(ctx, transport, prof, v, gate_dir, model_cfg, settings, "g2mt-mkdir")
        if err:
            return WorkloadResult(evidence=ev, error=err)
        ev.lmcache_config = cfg

        # Both instances run side by side and get the same request one after the other (no-tier, then tier),
        # so that load from elsewhere on the machine falls on both alike.
        handles: dict[str, EngineHandle] = {}
        for name, tier in (("no_tier", False), ("tier", True)):
            vv = {**v, "port": ports[name]}
            handles[name] = LaunchedEngine(ctx, transport, prof, self._argv(prof, vv, p, tier), prof.render_env(vv),
                                           urls[name], v["run_dir"], (name,), [])
        # the counters are read around every request, inside the phase (the level counters of each instance)
        runner = PhaseRunner(ctx, handles)
        logs: dict[str, EngineLog] = {}
        try:
            err = runner.open()
            if err:
                return WorkloadResult(evidence=ev, error=err)
            ctx.progress(f"{ctx.gate.id}: {len(order)} requests on each instance, interleaved")
            phases = runner.phase("interleaved", lambda: self._interleaved(
                handles, p, order, prof.capabilities.level_counters, ctx.http, ctx.cancel)).output
        except (httpx.HTTPError, WorkloadError, OSError) as exc:
            return WorkloadResult(evidence=ev, error=f"{type(exc).__name__}: {exc}\n{runner.error_context()}")
        finally:
            logs = runner.close(logs=True)
        for name, ph in phases.items():
            write_gate_file(gate_dir / f"requests-{name}.jsonl", "".join(json.dumps(r) + "\n" for r in ph["records"]))
        result = evaluate_multiturn(phases, p.min_tier_hit_rate, p.max_memory_reuse, ev, logs=logs,
                                    fallback_patterns=prof.fallback_patterns)
        write_summary(gate_dir, "g2-multiturn-summary.json", result)
        return result

    @staticmethod
    def _interleaved(engines: dict[str, EngineHandle], p: MultiTurnParams, order, level_counters: str, http=None,
                     cancel: Cancellation | None = None) -> dict[str, dict[str, Any]]:
        """Each request to every instance in turn, one at a time; counters around each request (their
        reads are outside the measured time). The gate's cancellation ends the loop (Cancelled)."""
        cancel = cancel or Cancellation()
        phases = {n: {"wall_s": 0.0, "tokens": 0, "sessions": p.sessions, "records": []} for n in engines}
        for turn, session, ids in order:
            for name, eng in engines.items():
                cancel.check()
                ph = phases[name]
                before = eng.metrics()
                req = CompletionRequest(f"t{turn}-s{session}", ids, max_tokens=p.max_tokens, prompt_tokens=len(ids))
                t0 = time.perf_counter()
                rec: RequestRecord = run_requests_sync(eng.base_url, [req], p.served_model_name, concurrency=1,
                                                       timeout_s=cancel.bound_timeout_s(p.request_timeout_s),
                                                       transport=http, stop=cancel)[0]
                cancel.check()
                ph["wall_s"] += time.perf_counter() - t0
                after = eng.metrics()
                prior = len(ids) - p.reply_tokens - p.user_tokens if turn > 0 else 0
                ph["tokens"] += len(ids) + (rec.output_chunks if rec.ok else 0)
                ph["records"].append({"turn": turn, "session": session, "prompt_tokens": len(ids),
                                      "prior_tokens": prior, "ok": rec.ok, "error": rec.error, "ttft_s": rec.ttft_s,
                                      "latency_s": rec.latency_s, "output_text": rec.output_text,
                                      "delta": _delta(before, after, level_counters)})
        return phases
