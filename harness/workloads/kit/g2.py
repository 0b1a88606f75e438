"""The G2 procedure every engine workload shares: the engine set up (launched or attached), prompts, the
re-compute and cold read-back phases through the phase runner, the pool and device proofs, and the evaluator.
``G2Procedure`` is not a workload itself: g2-ttft, g2-answer, g2-faults and g2-tenancy are, and g2-load and
g2-gain set their engines up through it. What G2 measures: harness/workloads/g2_ttft.py."""

from __future__ import annotations

import dataclasses
import json
import posixpath
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Sequence

from pydantic import Field, field_validator

from ...engines import DEFAULT_CPU_REF_MODEL, EngineProfile, kv_bytes_per_token, lmcache_config, load_profile, shell_line
from ...engines.client import RequestRecord, run_requests_sync
from ...engines.preflight import preflight_argv
from ...engines.prompts import load_tokenizer, make_prompts, make_text_prompts
from ...endurance import endurance
from ...safeio import load_json
from ...parsers.pooldev import PoolDeviceStat, parse_pool_blockstat, pool_blockstat_argv, read_bytes_between, \
    write_bytes_between
from ...parsers.engine_log import LogHits, count_log_hits, new_log_lines
from ...stats import percentile
from ...units import format_quantity
from .base import (DROP_CACHES_ARGV, ControlFile, Evidence, GateContext, PlannedStep, PoolSnapshot, StrictModel,
                   ValidityCheck, Workload, WorkloadResult, drop_caches, drive_rating, pool_drive_of,
                   write_gate_file, write_summary)
from .attach import AttachedEngine, AttachParams, attach_issues, restarted, text_prompt_issue
from .engine import (EngineHandle, LaunchedEngine, pool_record, client_base_url, engine_node, engine_port, engine_preflight,
                     engine_python, engine_values, model_config_issues, pool_contents, pool_files_argv,
                     profile_issues, random_model_dir, stage_engine_files, stored_kv_tokens,
                     build_random_model, build_random_model_argv)
from .pool import PoolDeviceSpec, cold_regime_of, plan_pool, prepare_pool
from .phases import PhaseRecord, PhaseRunner
from .session import EngineSession


# Warm-up prompts are drawn from seeds this far from the gate's, so they are never among its prompts.
WARMUP_SEED_OFFSET = 1_000_003


class G2EngineParams(StrictModel):
    """The engine a G2 workload measures and how it is run (launched, or attached with ``attach:``): the
    parameters G2's workloads share (g2-ttft, g2-load)."""

    engine: str = "cpu-reference"
    model: str = "kvgate-cpu-reference"
    served_model_name: str = "kvgate-g2"
    model_config_path: str | None = Field(default=None, alias="model_config")
    model_config_inline: dict[str, Any] | None = Field(default=None, alias="model_config_inline")
    seed: int = 0
    pool_dir: str = "kvgate-kv-pool"
    # A launched engine's pool on a block device of its own (``kind: loop``: kvgate makes, mounts and removes it)
    # or where pool_dir is (``directory``); and whether the profile's cold regime runs (``none``: switched off,
    # to show what the node's memory serves; the device proof then decides). harness/workloads/kit/pool.py.
    pool_device: PoolDeviceSpec = Field(default_factory=PoolDeviceSpec)
    cold_regime: Literal["profile", "none"] = "profile"
    host: str = "127.0.0.1"
    port: int = Field(default=0, ge=0, le=65535)
    request_timeout_s: float = Field(default=1800.0, gt=0)
    # the engine's interpreter; default: this interpreter on a local node, python3 on an SSH node
    python: str | None = None
    engine_values: dict[str, str] = Field(default_factory=dict)
    tokenizer: str | None = None  # local tokenizer.json or directory; overrides the profile's
    # Build the served model on the node from model_config with seeded random weights and a locally
    # trained BPE tokenizer (harness/node/make_model.py, run by the engine's interpreter; nothing from a
    # hub). The model directory is cached on the node by config, seed and dtype; {model} is that directory.
    random_weights: bool = False
    random_weights_dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    # One unrelated prompt after each engine start (recorded, excluded from the statistics and taken
    # before the counters and device statistics of the phase), so a first-request effect lands on neither.
    warmup: bool = True
    # Attach mode: the engine already runs (Kubernetes, systemd, Slurm, Docker ...); kvgate sends the prompts
    # to its URL and makes it cold with the operator's commands (harness/workloads/kit/attach.py).
    attach: AttachParams | None = None
    pool_path: str | None = None  # attach: the directory the engine stores KV in, on pool_node
    pool_node: str | None = None  # attach: the node that mounts pool_path (default: the gate's first node)
    # The pool's device must read at least this share of the KV the read-back hits claim (profiles with
    # device_reads): fewer bytes mean the KV came from the engine's memory or a cache, not the tier.
    min_read_fraction: float = Field(default=0.5, ge=0, le=1)


class G2Params(G2EngineParams):
    prompt_tokens: list[int] = Field(default_factory=lambda: [2048], min_length=1)
    prompts_per_length: int = Field(default=2, ge=1, le=1000)
    max_tokens: int = Field(default=2, ge=1, le=4096)
    concurrency: int = Field(default=1, ge=1, le=1024)
    drop_caches: bool = True
    min_hit_rate: float = Field(default=0.95, ge=0, le=1)
    populate_timeout_s: float = Field(default=120.0, gt=0)

    @field_validator("prompt_tokens")
    @classmethod
    def _lengths(cls, v: list[int]) -> list[int]:
        if any(n < 2 for n in v):
            raise ValueError("every prompt length must be >= 2 tokens")
        return v


def launch_values(p: G2Params, profile: EngineProfile, work_dir: str, gate_id: str, port: int, run_tag: str,
                  node_transport: str = "ssh", node_engine_python: str | None = None) -> dict[str, Any]:
    """Pure: the values an engine profile's argv/env templates are filled with for one G2 run."""
    run_dir = posixpath.join(work_dir, f"kvgate-g2-{gate_id}-{run_tag}")
    pool_root = p.pool_dir if p.pool_dir.startswith("/") else posixpath.join(work_dir, p.pool_dir)
    return engine_values(profile, python=engine_python(p.python, node_transport, node_engine_python), host=p.host,
                         port=port,
                         model=p.model, served_model_name=p.served_model_name, seed=p.seed, run_dir=run_dir,
                         pool_dir=posixpath.join(pool_root, f"run-{run_tag}"),
                         max_model_len=max(p.prompt_tokens) + p.max_tokens + 16, extra=p.engine_values)


class G2Evidence(Evidence):
    """G2's evidence: the engine and where it ran, the prompts, both phases' proof (hits from the engine's
    counters, bytes read from the pool's device), and the pool as populated."""

    engine_profile: str | None = None
    engine: str | None = None
    engine_version: str | None = None
    base_url: str | None = None
    client_path: str | None = None
    pool_dir: str | None = None
    run_dir_on_node: str | None = None
    prompt_kind: str | None = None
    tokenizer: str | None = None
    kv_bytes_per_token: int | None = None
    expected_kv_bytes: int | None = None
    prompts: int | None = None
    prompt_tokens: list[int] = []
    seed: int | None = None
    lmcache_version_pinned: str | None = None
    lmcache_config: dict[str, Any] | None = None
    versions: dict[str, str] = {}
    recompute_hit_tokens: float | None = None
    pool_after_populate: PoolSnapshot | None = None
    page_cache_dropped: bool | None = None
    page_cache_drop_error: str | None = None
    pool_device: str | None = None        # as findmnt names it (/dev/mapper/vg-kv, /dev/nvme0n1p1, ...)
    pool_device_maj_min: str | None = None  # the block device counted: /sys/dev/block/MAJ:MIN/stat
    pool_device_error: str | None = None    # why the pool's device could not be read, if it could not
    pool: dict[str, Any] | None = None      # the pool as made for the run: its device kind, loop device, cold regime
    readback_hit_tokens: float | None = None
    readback_query_tokens: float | None = None
    readback_device_read_bytes: int | None = None
    engine_reported_read_bytes: float | None = None
    failed_requests: int = 0
    model_dir_on_node: str | None = None
    random_model: dict[str, Any] | None = None
    warmup: dict[str, Any] = {}
    fallback_lines: list[str] = []
    readback_log_hits: dict[str, Any] | None = None
    # attach mode: the engine kvgate did not launch, and how it was made cold
    attached: bool = False
    prompt_seed: int | None = None
    cold_procedure: list[dict[str, Any]] = []
    engine_restarted: bool | None = None
    pool_before_recompute: PoolSnapshot | None = None
    recompute_log_hit_lines: int | None = None
    # the pool device's bytes written from the re-compute phase's start to the read-back's (the stores, flushed by
    # the sync before the read-back): what serving the re-compute cost the drive (docs/endurance.md)
    recompute_device_write_bytes: int | None = None


def phase_window_s(records: list[RequestRecord]) -> float | None:
    """Pure: a phase's length, first send to last stream end, from its records' wall-clock starts and latencies;
    None when no record has both."""
    spans = [(r.started_unix_s, r.started_unix_s + (r.latency_s or 0.0)) for r in records
             if r.started_unix_s is not None and r.latency_s is not None]
    return None if not spans else max(e for _, e in spans) - min(b for b, _ in spans)


def store_phase_endurance(records: Sequence[RequestRecord], write_bytes: int | None,
                          ev: "G2Evidence") -> dict[str, Any] | None:
    """Pure: what a phase that stores cost the pool's drive: the device bytes it wrote (``write_bytes``), the prompt
    tokens it served, the KV bytes the pool gained after it (``ev.pool_after_populate``) and the phase's length
    (harness.endurance). None for a phase that sent nothing."""
    if not records:
        return None
    pool = ev.pool_after_populate
    stored = None if pool is None else (pool.bytes if pool.bytes_added is None else pool.bytes_added)
    tokens = sum(r.prompt_tokens or 0 for r in records if r.ok)
    return endurance(write_bytes, tokens, stored, phase_window_s(list(records)), drive_rating(ev.pool_drive)).to_dict()


def recompute_endurance(recompute: list[RequestRecord], ev: "G2Evidence") -> dict[str, Any] | None:
    """Pure: what the re-compute phase (the one that stores) cost the pool's drive (:func:`store_phase_endurance`)."""
    return store_phase_endurance(recompute, ev.recompute_device_write_bytes, ev)


def ttft_stats(xs: list[float], prefix: str) -> dict[str, float]:
    """Pure: ``PREFIX_p50_s``, ``_p90_s``, ``_p99_s`` of a list of times (s); nothing for an empty list."""
    if not xs:
        return {}
    return {f"{prefix}_p50_s": percentile(xs, 50), f"{prefix}_p90_s": percentile(xs, 90),
            f"{prefix}_p99_s": percentile(xs, 99)}


@dataclass(frozen=True)
class G2Setup:
    """What the phases need, however the engine is run: its handle, the evidence so far, the prompts (and the two
    warm-up prompts), the KV they should store, and where the pool is (its node's transport and directory)."""

    engine: EngineHandle
    ev: "G2Evidence"
    prompts: list
    warm: list
    expected_bytes: int
    pool_transport: Any
    pool_dir: str


@dataclass(frozen=True)
class LogProof:
    """The read-back phase's hit lines in the engine log (profile ``hit_log``): ``hits`` None when the log
    could not be read; ``requests`` and ``prompt_tokens`` are what the phase sent (the lookups when the
    pattern counts lines, or has no ``query_tokens`` group)."""

    hits: LogHits | None
    requests: int
    prompt_tokens: int

    def hit_rate(self) -> float | None:
        h = self.hits
        if h is None:
            return None
        if h.hit_tokens is not None:
            query = h.query_tokens if h.query_tokens is not None else self.prompt_tokens
            return h.hit_tokens / query if query else None
        return min(h.lines / self.requests, 1.0) if self.requests else None


def _hits_unproven(counters: bool, hit_rate: float | None, min_hit_rate: float, log: LogProof | None,
                   log_rate: float | None) -> str | None:
    """Pure: why the read-back's hits from the tier are not proven by the declared counters or log lines."""
    if counters:
        if hit_rate is None:
            return "the engine exposed no hit counters for the read-back phase: hits from the tier are unproven"
        if hit_rate < min_hit_rate:
            return f"read-back hit rate {hit_rate:.3f} is below {min_hit_rate}: TTFT was not measured on the tier"
    if log is not None:
        if log.hits is None:
            return "the engine log could not be read for the read-back phase: hits from the tier are unproven"
        if log_rate is None or log_rate < min_hit_rate:
            return (f"the engine log's hit lines give a read-back hit rate of "
                    f"{0.0 if log_rate is None else log_rate:.3f} ({log.hits.lines} matching lines for "
                    f"{log.requests} requests), below {min_hit_rate}: TTFT was not measured on the tier")
    return None


def _not_cold(ev: G2Evidence, device_read_bytes: int | None, read_fraction: float | None, claimed: float,
              min_read_fraction: float) -> str | None:
    """Pure: why the read-back is not proven a read of the pool's device (nothing read, or too little of the KV
    the hits claim)."""
    if device_read_bytes is None:
        why = f" ({ev.pool_device_error})" if ev.pool_device_error else ""
        return f"bytes read from the pool's device could not be measured{why}: the read-back is not proven cold"
    if device_read_bytes <= 0:
        return "no bytes were read from the pool's device during read-back: the KV came from a cache, not the tier"
    if read_fraction is not None and read_fraction < min_read_fraction:
        return (f"the pool's device read {device_read_bytes} B during read-back, {read_fraction:.4f} of the "
                f"{claimed:.0f} B of KV the hits claim (at least {min_read_fraction} required): the KV came "
                f"from the engine's memory or a cache, not the tier")
    return None


def _phases_invalid(ev: G2Evidence) -> str | None:
    """Pure: why the phases themselves prove nothing: the re-compute hit (prompts not new), the pool gained
    nothing."""
    if ev.recompute_hit_tokens:
        return f"the re-compute phase hit {ev.recompute_hit_tokens:.0f} tokens: prompts were not new"
    if ev.recompute_log_hit_lines:
        return (f"the engine log has {ev.recompute_log_hit_lines} hit lines in the re-compute phase: "
                "prompts were not new")
    pool = ev.pool_after_populate
    if pool is not None and not (pool.bytes if pool.bytes_added is None else pool.bytes_added):
        return "the pool holds no bytes after populate" if pool.bytes_added is None \
            else "the pool gained no bytes in the re-compute phase: the engine stored nothing on the tier"
    return None


def evaluate_g2(recompute: list[RequestRecord], readback: list[RequestRecord], hit_tokens: float | None,
                query_tokens: float | None, device_read_bytes: int | None, min_hit_rate: float,
                expected_kv_bytes: int, evidence: G2Evidence | None = None,
                fallback: str | None = None, *, counters: bool = True, log: LogProof | None = None,
                device_reads: bool = True, min_read_fraction: float = 0.0) -> WorkloadResult:
    """Pure: metrics and validity from the two phases' records and the read-back proof (added to
    ``evidence``, a copy of which the result carries).

    The proofs a profile declares must all hold: hit counters (``counters``: hit / query token deltas),
    hit lines of the engine log (``log``), and the pool device's read bytes (``device_reads``): more than
    none, and at least ``min_read_fraction`` of the KV the hits claim (hit rate x the prompts' KV bytes;
    all of it when no hit source is declared, the device reads then being the hit proof)."""
    metrics: dict[str, float] = {}
    failed = [r for r in recompute + readback if not r.ok]
    rc = [r.ttft_s for r in recompute if r.ok]
    rb = [r.ttft_s for r in readback if r.ok]
    metrics.update(ttft_stats(rc, "ttft_recompute"))
    metrics.update(ttft_stats(rb, "ttft_readback"))
    if rc and rb and metrics["ttft_readback_p50_s"] > 0:
        metrics["readback_speedup_p50"] = metrics["ttft_recompute_p50_s"] / metrics["ttft_readback_p50_s"]
    hit_rate = None
    if counters and hit_tokens is not None and query_tokens:
        hit_rate = hit_tokens / query_tokens
        metrics["hit_rate"] = hit_rate
    log_rate = log.hit_rate() if log is not None else None
    if log_rate is not None:
        metrics["log_hit_rate"] = log_rate
    claimed = expected_kv_bytes * (hit_rate if hit_rate is not None else log_rate if log_rate is not None else 1.0)
    read_fraction = None
    if device_read_bytes is not None:
        metrics["readback_device_read_bytes"] = float(device_read_bytes)
        if claimed > 0:
            read_fraction = device_read_bytes / claimed
            metrics["readback_read_fraction"] = read_fraction
    ev = (evidence or G2Evidence()).model_copy(update=dict(
        readback_hit_tokens=hit_tokens, readback_query_tokens=query_tokens,
        readback_device_read_bytes=device_read_bytes, expected_kv_bytes=expected_kv_bytes,
        failed_requests=len(failed)))
    if log is not None:
        ev.readback_log_hits = None if log.hits is None else dataclasses.asdict(log.hits)
    ev.endurance = recompute_endurance(recompute, ev)
    error = None
    if failed:
        error = (f"{len(failed)} of {len(recompute) + len(readback)} requests failed; first: "
                 f"{failed[0].request_id}: {failed[0].error}")
    invalid = (fallback  # the engine's own log says the tier was not used: nothing else counts
               or _hits_unproven(counters, hit_rate, min_hit_rate, log, log_rate)
               or (_not_cold(ev, device_read_bytes, read_fraction, claimed, min_read_fraction) if device_reads
                   else None)
               or (None if counters or log is not None or device_reads
                   else "no proof of hits or cold reads was declared (profile hit_metrics, hit_log, device_reads)")
               or _phases_invalid(ev))
    ev.validity = g2_validity(ev, fallback, min_hit_rate, hit_rate if counters else None, counters,
                              log, log_rate, device_reads, read_fraction, claimed, min_read_fraction)
    return WorkloadResult(metrics=metrics, evidence=ev, invalid_reason=invalid, error=error)


def cold_check(ev: Any, dev: float | None, claimed_bytes: float, read_fraction: float | None,
               min_read_fraction: float, around: str, claim: str, figure: str) -> ValidityCheck:
    """Pure: the "cold" check: the pool's own device (``ev.pool_device``, ``ev.pool_device_maj_min``,
    ``ev.pool_device_error``) read ``dev`` bytes ``around`` a phase, against the KV its hits claim."""
    where = ev.pool_device or "the pool's device"
    how = (f"{where}'s read counters (/sys/dev/block/{ev.pool_device_maj_min or 'MAJ:MIN'}/stat) {around}, against "
           f"the {format_quantity(int(claimed_bytes), 'B')} of KV its hits claim (at least {min_read_fraction} of it "
           "required)")
    if dev is None:
        how += f"; not measured ({ev.pool_device_error or 'no block device'})"
    return ValidityCheck(name="cold", ok=dev is not None and dev > 0 and (
        read_fraction is None or read_fraction >= min_read_fraction), claim=claim, how=how, figure=figure, value=dev,
        unit="B")


def g2_validity(ev: G2Evidence, fallback: str | None, min_hit_rate: float, hit_rate: float | None, counters: bool,
                log: "LogProof | None", log_rate: float | None, device_reads: bool, read_fraction: float | None,
                claimed_bytes: float, min_read_fraction: float) -> list[ValidityCheck]:
    """Pure: G2's proofs as :func:`evaluate_g2` judges them, one check per proof the profile declares (hit
    counters, the log's hit lines, the pool device's read bytes), then the engine's log free of fall-backs,
    prompts new to the re-compute phase and the pool populated by it."""
    out = []
    if counters:
        q, h = ev.readback_query_tokens, ev.readback_hit_tokens
        seen = f"{h:.0f} of {q:.0f} read-back prompt tokens hit the tier" if h is not None and q else \
            "the engine exposed no hit counters"
        out.append(ValidityCheck(name="hits", ok=hit_rate is not None and hit_rate >= min_hit_rate,
                                 claim="the read-back prompts' KV came from the tier",
                                 how=f"the engine's hit counters before and after the read-back: {seen} "
                                     f"(at least {min_hit_rate} required)",
                                 figure="read-back hit rate", value=hit_rate, unit="ratio"))
    if log is not None:
        lines = "unreadable" if log.hits is None else f"{log.hits.lines} matching line(s)"
        out.append(ValidityCheck(name="hits (log)", ok=log_rate is not None and log_rate >= min_hit_rate,
                                 claim="the engine's log shows the read-back prompts hit the tier",
                                 how=f"hit lines the read-back added to the engine log: {lines} for {log.requests} "
                                     f"request(s) (at least {min_hit_rate} required)",
                                 figure="read-back hit rate from the log", value=log_rate, unit="ratio"))
    if device_reads:
        drop = {True: "yes", False: "no", None: "not recorded"}[ev.page_cache_dropped]
        out.append(cold_check(ev, ev.readback_device_read_bytes, claimed_bytes, read_fraction, min_read_fraction,
                              f"before and after the read-back (page cache dropped: {drop})",
                              "the read-back read the pool's device, not the engine's memory or a cache",
                              "bytes the pool device read during read-back"))
    if not (counters or log is not None or device_reads):
        out.append(ValidityCheck(name="proof declared", ok=False, claim="the profile declares a proof of hits or "
                                 "cold reads", how="profile hit_metrics, hit_log, device_reads: none"))
    out.append(ValidityCheck(name="no fall-back", ok=fallback is None,
                             claim="the engine used the tier throughout (no fall-back, no connector failure)",
                             how=fallback or "the engine log of both phases scanned for the profile's fall-back "
                                             "patterns: none", figure="fall-back lines",
                             value=float(len(ev.fallback_lines)), unit="count"))
    recompute_hits = (ev.recompute_hit_tokens or 0) + (ev.recompute_log_hit_lines or 0)
    out.append(ValidityCheck(name="new prompts", ok=not recompute_hits,
                             claim="the re-compute phase computed every prompt (none was in the tier before)",
                             how="the engine's hit counters" + (" and log" if log is not None else "")
                                 + " over the re-compute phase",
                             figure="re-compute hit tokens", value=ev.recompute_hit_tokens, unit="count"))
    pool = ev.pool_after_populate
    if pool is not None:
        added = pool.bytes if pool.bytes_added is None else pool.bytes_added
        out.append(ValidityCheck(name="populated", ok=bool(added),
                                 claim="the re-compute phase stored the prompts' KV on the tier",
                                 how=f"finished chunk files in {pool.dir} on {pool.node}: {pool.files} file(s), "
                                     f"{format_quantity(pool.expected_kv_bytes, 'B')} expected",
                                 figure="bytes the re-compute phase stored", value=added, unit="B"))
    return out


def _json_object(path: str) -> dict[str, Any]:
    obj = load_json(path, what="model config", follow_symlinks=True)
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object (a model's config.json)")
    return obj


def model_config_files(p: G2EngineParams) -> list[ControlFile]:
    """Pure: the model config file a G2 gate names (``model_config:``), a JSON object on the control host."""
    return ([] if p.model_config_path is None
            else [ControlFile(("model_config",), "model config", p.model_config_path, _json_object)])


def records_from_text(text: str) -> list[RequestRecord]:
    """Pure: a phase's ``requests-<phase>.jsonl`` back into its records (as RequestRecord.to_dict wrote them)."""
    fields = set(RequestRecord.__dataclass_fields__)
    out = []
    for line in text.splitlines():
        if line.strip():
            rec = {k: v for k, v in json.loads(line).items() if k in fields}
            for k in ("itl_s", "tokens", "token_logprobs", "top_logprobs"):
                rec[k] = tuple(rec.get(k) or ())
            out.append(RequestRecord(**rec))
    return out


def reevaluate_g2(evidence: dict[str, Any], recompute: list[RequestRecord], readback: list[RequestRecord],
                  device_read_bytes: int | None, fallback: str | None, p: "G2Params", prof: EngineProfile,
                  model: type["G2Evidence"] | None = None) -> WorkloadResult:
    """Pure: a bundle's g2-ttft result again: both phases' records from their raw files, the read-back's device
    bytes re-parsed from the run's probe steps, the fall-back from the engine logs re-scanned, the bounds
    (``min_hit_rate``, ``min_read_fraction``) from the gate's params and the proofs the profile declares; the hit
    counters and the log's hit lines as the run recorded them (the engine's counters are read over HTTP, kept
    only in the evidence). Then :func:`evaluate_g2`, as the run. ``model``: the evidence's class (a workload
    built on G2's phases, g2-answer, keeps its own fields)."""
    ev = (model or G2Evidence).model_validate({k: v for k, v in evidence.items() if k != "validity"})
    log = None
    if prof.hit_log is not None and readback:
        hits = ev.readback_log_hits
        log = LogProof(None if hits is None else LogHits(**hits), len(readback),
                       sum(r.prompt_tokens or 0 for r in readback))
    return evaluate_g2(recompute, readback, ev.readback_hit_tokens, ev.readback_query_tokens, device_read_bytes,
                       p.min_hit_rate, ev.expected_kv_bytes or 0, ev, fallback, counters=prof.hit_metrics is not None,
                       log=log, device_reads=prof.device_reads, min_read_fraction=p.min_read_fraction)


class G2Procedure(Workload):
    """The G2 procedure's parts, for the workloads built on it (not registered: see g2_ttft.G2Ttft)."""

    # what its endurance prices (docs/endurance.md), for `kvgate plan`
    ENDURANCE = ("the re-compute phase, which stores: the pool device's bytes written from its start to the read-back's "
                 "(after the sync), per million prompt tokens, per byte the pool gained, over the phase")
    Params = G2Params
    EvidenceModel = G2Evidence
    METRICS = {
        "ttft_recompute_p50_s": "s", "ttft_recompute_p90_s": "s", "ttft_recompute_p99_s": "s",
        "ttft_readback_p50_s": "s", "ttft_readback_p90_s": "s", "ttft_readback_p99_s": "s",
        "readback_speedup_p50": "x", "hit_rate": "ratio", "readback_device_read_bytes": "B",
        "log_hit_rate": "ratio", "readback_read_fraction": "ratio",
    }

    # -------------------------------------------------------------------------------- preparation

    # parameters only a launched engine uses: set with attach:, they would be accepted and ignored
    LAUNCH_ONLY = ("python", "host", "port", "engine_values", "pool_dir", "random_weights", "random_weights_dtype",
                   "pool_device", "cold_regime")

    def validate_against(self, params, nodes):
        prof, issues = profile_issues(params.engine, nodes, "g2-ttft", node_count=len(nodes))
        issues += attach_issues(params.attach, prof, nodes, params.pool_node, params.pool_path,
                                params.tokenizer)
        if params.attach is not None:
            issues += [((name,), "a launch parameter: kvgate does not launch an attached engine")
                       for name in self.LAUNCH_ONLY if name in params.model_fields_set]
        else:
            issues += [((name,), "only with attach: (a launched engine's pool is kvgate's own pool_dir)")
                       for name in ("pool_path", "pool_node") if getattr(params, name) is not None]
            if prof is not None and (why := text_prompt_issue(prof, params.tokenizer, params.random_weights)):
                issues.append((("tokenizer",), why))
        if prof is not None and not prof.capabilities.builds_model and (
                params.model_config_inline is None and params.model_config_path is None):
            issues.insert(0, (("model_config",), "needs the model's config.json (for KV bytes per token and vocab size)"))
        kv_dtype = prof.capabilities.kv_dtype if prof is not None else None
        return model_config_issues(params.model_config_inline, "model_config_inline", kv_dtype) + issues

    def control_files(self, params) -> list[ControlFile]:
        return model_config_files(params)

    def _model_config(self, p: G2Params) -> dict[str, Any]:
        if p.model_config_inline is not None:
            return dict(p.model_config_inline)
        if p.model_config_path is not None:
            return json.loads(Path(p.model_config_path).read_text())
        return dict(DEFAULT_CPU_REF_MODEL)

    def _plan_launched(self, ctx: GateContext, p: G2Params, prof: EngineProfile):
        """The plan's head for an engine kvgate launches on the gate's node: (node, launch values, argv, env,
        prompt count, the set-up steps)."""
        node = next(iter(ctx.nodes.values()))
        v = launch_values(p, prof, node.work_dir, ctx.gate.id, p.port or 8000, "<run>", node.transport,
                          node.engine_python)
        n = len(p.prompt_tokens) * p.prompts_per_length
        return node, v, prof.render_argv(v), prof.render_env(v), n, self.plan_launch_setup(p, prof, node, v)

    def plan(self, ctx: GateContext) -> list[PlannedStep]:
        p: G2Params = ctx.params
        prof = load_profile(p.engine)
        if p.attach is not None:
            return self._plan_attached(p, prof, ctx)
        node, v, argv, env, n, steps = self._plan_launched(ctx, p, prof)
        warm = "; one unrelated warm-up prompt first (recorded, not in the statistics)" if p.warmup else ""
        check = "; its log is checked for fall-back / connector-failure lines (a match is INVALID)"
        steps += [
            PlannedStep(node.name, f"start {prof.name} in its own process group: {shell_line(argv, env)}", tuple(argv)),
            PlannedStep(node.name, "the pool device's write counters before the re-compute (what storing its KV "
                        "costs the drive, counted to the read-back's: docs/endurance.md)",
                        pool_blockstat_argv(v["pool_dir"])),
            PlannedStep(node.name, f"re-compute: {n} never-seen prompts of {p.prompt_tokens} tokens, TTFT each "
                        f"(this also stores their KV in the pool){warm}"),
            PlannedStep(node.name, "the pool device's counters after the re-compute phase",
                        pool_blockstat_argv(v["pool_dir"])),
            PlannedStep(node.name, f"wait until the finished chunk files in {v['pool_dir']} hold the expected KV bytes",
                        tuple(pool_files_argv(v["pool_dir"], prof.pool_files)), repeats=True),
            PlannedStep(node.name, f"stop the engine (kill its process group){check}"),
            PlannedStep(node.name, "sync and drop the page cache (recorded whether permitted)", DROP_CACHES_ARGV),
            PlannedStep(node.name, "start the engine again", tuple(argv)),
            PlannedStep(node.name, "the pool's block device and its read counters before the read-back",
                        pool_blockstat_argv(v["pool_dir"])),
            PlannedStep(node.name, f"read back: the same {n} prompts, TTFT each{warm}; hit counters and "
                        f"/sys/dev/block/MAJ:MIN/stat of the pool's device before and after{check}"),
            PlannedStep(node.name, "the pool device's read counters after the read-back",
                        pool_blockstat_argv(v["pool_dir"])),
        ]
        return steps

    def plan_launch_setup(self, p: G2EngineParams, prof: EngineProfile, node: Any,
                           v: dict[str, Any]) -> list[PlannedStep]:
        """What a launched engine's set-up sends before its start (pre-flight, directories and files, the
        random-weight model): the plan of every G2 workload that launches its engine."""
        files = {}
        if prof.lmcache is not None:
            files[v["lmcache_config"]] = json.dumps(lmcache_config(prof.lmcache, v), indent=1)
        steps = [
            PlannedStep(node.name, "pre-flight: the engine's interpreter imports what the profile declares and "
                        "reports its versions", tuple(preflight_argv(v["python"], prof))),
            PlannedStep(node.name, f"create {v['run_dir']} and a fresh pool {v['pool_dir']}",
                        ("mkdir", "-p", v["run_dir"], v["pool_dir"], posixpath.join(v["run_dir"], "prometheus")),
                        files=files)]
        steps += plan_pool(node.name, p.pool_device, cold_regime_of(prof.cold_regime, p.cold_regime), v["python"],
                           v["pool_dir"], v["run_dir"], prof.pool_files)
        if p.random_weights:
            try:
                model_dir = random_model_dir(node.work_dir, self._model_config(p), p.seed, p.random_weights_dtype)
            except (OSError, ValueError):
                model_dir = posixpath.join(node.work_dir, "kvgate-models", "<config hash>")
            steps.append(PlannedStep(node.name, f"build (or find) the random-weight model and its tokenizer in {model_dir}",
                                     build_random_model_argv(v["python"], v["run_dir"], v["model_config"], model_dir,
                                                             p.seed, p.random_weights_dtype)))
        return steps

    def _plan_attached(self, p: G2Params, prof: EngineProfile, ctx: GateContext) -> list[PlannedStep]:
        a = p.attach
        pool_node = p.pool_node or next(iter(ctx.nodes))
        n = len(p.prompt_tokens) * p.prompts_per_length
        warm = "; one unrelated warm-up prompt first (recorded, not in the statistics)" if p.warmup else ""
        proofs = []
        if prof.hit_metrics:
            proofs.append("hit counters " + " / ".join(prof.hit_metrics.hit_tokens + prof.hit_metrics.query_tokens))
        if prof.hit_log:
            proofs.append(f"engine-log lines /{prof.hit_log.pattern}/")
        if prof.device_reads:
            proofs.append(f"the pool device's read bytes (at least {p.min_read_fraction} of the KV the hits claim)")
        proofs_text = "; ".join(proofs)
        lines = "fall-back lines" + (", hit lines" if prof.hit_log else "")

        def log(where: str) -> list[PlannedStep]:  # the log is read wherever the run marks it (none: not read)
            return [PlannedStep(a.log.node, f"the engine's log {where} ({lines})", ("sh", "-c", a.log.run))] \
                if a.log else []

        files = tuple(pool_files_argv(p.pool_path, prof.pool_files))
        steps = [PlannedStep("(control host)", f"attach: {prof.name} already running at {a.url}; its "
                             f"{prof.health_path} must answer 200 within {a.connect_timeout_s:.0f} s (else ERROR)")]
        steps += log("where it stands at the start (fall-backs count from here)")
        steps += [PlannedStep(pool_node, "the pool device's write counters before the re-compute (what storing its "
                              "KV costs the drive, counted to the read-back's: docs/endurance.md)",
                              pool_blockstat_argv(p.pool_path))]
        steps += log("before the re-compute phase")
        steps += [
            PlannedStep(pool_node, f"the chunk files already in {p.pool_path} (earlier runs'; only what this run "
                        "adds counts)", files),
            PlannedStep("(control host)", f"re-compute: {n} prompts of {p.prompt_tokens} tokens new to the engine "
                        f"(seed {p.seed} + a per-run nonce, recorded){warm}; hit counters before and after must not move")]
        steps += [PlannedStep(pool_node, "the pool device's counters after the re-compute phase",
                              pool_blockstat_argv(p.pool_path))]
        steps += log("after the re-compute phase")
        steps += [PlannedStep(pool_node, f"wait until the finished chunk files in {p.pool_path} grew by the expected "
                              "KV bytes", files, repeats=True)]
        steps += [PlannedStep(c.node, f"cold procedure {i + 1}/{len(a.restart)} (timeout {c.timeout_s:.0f} s; "
                              "a failure is ERROR with its output)", ("sh", "-c", c.run))
                  for i, c in enumerate(a.restart)]
        if p.drop_caches:
            steps += [PlannedStep(node, "sync and drop the page cache (recorded whether permitted)", DROP_CACHES_ARGV)
                      for node in (a.drop_caches_on or [pool_node])]
        ready = a.ready_timeout_s or prof.ready_timeout_s
        steps += [PlannedStep("(control host)", f"wait until {a.url}{prof.health_path} answers 200 again (at most "
                              f"{ready:.0f} s)")]
        steps += log("where the restarted engine's log starts")
        steps += [PlannedStep(pool_node, "the pool's block device and its read counters before the read-back",
                              pool_blockstat_argv(p.pool_path))]
        steps += log("before the read-back phase")
        steps += [
            PlannedStep("(control host)", f"read back: the same {n} prompts, TTFT each{warm}; proofs: {proofs_text}"),
            PlannedStep(pool_node, "the pool device's read counters after the read-back",
                        pool_blockstat_argv(p.pool_path)),
        ]
        steps += log("after the read-back phase")
        return steps

    # ------------------------------------------------------------------------------------------ run

    def run(self, ctx: GateContext) -> WorkloadResult:
        p: G2Params = ctx.params
        prof = load_profile(p.engine)
        setup = (self.setup_attached if p.attach is not None else self.setup_launched)(ctx, p, prof)
        if isinstance(setup, WorkloadResult):
            return setup
        return self._phases(ctx, p, prof, setup)

    # ---------------------------------------------------------------------------- shared by both modes

    def kv_shape(self, p: G2Params, prof: EngineProfile) -> tuple[dict[str, Any], int, int]:
        """The model config, its KV bytes per token and vocabulary size (ValueError on a bad config)."""
        model_cfg = self._model_config(p)
        bpt = kv_bytes_per_token(model_cfg, prof.capabilities.kv_dtype)
        vocab = int(model_cfg.get("vocab_size") or model_cfg.get("text_config", {}).get("vocab_size", 32000))
        return model_cfg, bpt, vocab

    def _prompts(self, p: G2Params, prof: EngineProfile, tok_spec: str | None, vocab: int, seed: int,
                 ev: G2Evidence) -> tuple[list, list]:
        """The measured prompts and two warm-up prompts (never among them); text when a tokenizer is known
        (and the engine takes text), token ids otherwise. Sets the evidence's prompt fields."""
        if tok_spec and not prof.capabilities.token_ids_only:
            tokenizer = load_tokenizer(tok_spec)
            prompts = make_text_prompts(seed, p.prompt_tokens, p.prompts_per_length, tokenizer)
            warm = [make_text_prompts(seed + WARMUP_SEED_OFFSET + i, [min(p.prompt_tokens)], 1, tokenizer)[0]
                    for i in range(2)]
            ev.prompt_kind, ev.tokenizer = "text", tok_spec
        elif prof.api.text_only:
            raise ValueError(text_prompt_issue(prof, None, False))
        else:
            prompts = make_prompts(seed, p.prompt_tokens, p.prompts_per_length, vocab)
            warm = [make_prompts(seed + WARMUP_SEED_OFFSET + i, [min(p.prompt_tokens)], 1, vocab)[0]
                    for i in range(2)]
            ev.prompt_kind = "token_ids"
        ev.prompts, ev.prompt_tokens, ev.seed, ev.prompt_seed = len(prompts), list(p.prompt_tokens), p.seed, seed
        return prompts, warm

    def _send(self, ctx: GateContext, p: G2Params, prof: EngineProfile, base_url: str, requests: list,
              concurrency: int | None = None) -> list[RequestRecord]:
        """Send a phase's requests; the gate's cancellation drops them (nothing is sent after the gate's end, no
        request outlives its deadline) and then raises Cancelled, so no later phase starts."""
        ctx.cancel.check()
        records = run_requests_sync(base_url, requests, p.served_model_name, concurrency=concurrency or p.concurrency,
                                    timeout_s=ctx.cancel.bound_timeout_s(p.request_timeout_s), transport=ctx.http,
                                    path=prof.api.request_path, api=prof.api.shape(), stop=ctx.cancel)
        ctx.cancel.check()
        return records

    def warm_up(self, ctx: GateContext, p: G2Params, prof: EngineProfile, base_url: str, label: str, request,
                 ev: G2Evidence) -> None:
        """One unrelated prompt right after the (re)start: recorded, never in the statistics."""
        if not p.warmup:
            return
        recs = self._send(ctx, p, prof, base_url, [request], concurrency=1)
        self._save(ctx.gate_dir / f"requests-warmup-{label}.jsonl", recs)
        ev.warmup[label] = {"request_id": recs[0].request_id, "ttft_s": recs[0].ttft_s, "error": recs[0].error}

    @staticmethod
    def _log_proof(prof: EngineProfile, before: str | None, after: str | None, requests: list) -> LogProof | None:
        """The hit lines a phase added to the engine log (profile ``hit_log``), None without one."""
        if prof.hit_log is None:
            return None
        sent = len(requests)
        tokens = sum(r.prompt_tokens or 0 for r in requests)
        if before is None or after is None:
            return LogProof(None, sent, tokens)
        lines, _continuous = new_log_lines(before, after)
        return LogProof(count_log_hits(lines, prof.hit_log.pattern), sent, tokens)

    def _finish(self, ctx: GateContext, p: G2Params, prof: EngineProfile, rc: PhaseRecord | None,
                rb: PhaseRecord | None, log: LogProof | None, expected_bytes: int, ev: G2Evidence, fallback: str | None) -> WorkloadResult:
        """Pure evaluation of the phase records with the profile's proofs; the summary written."""
        counters = prof.hit_metrics is not None
        recompute = rc.output if rc is not None else []
        readback = rb.output if rb is not None else []
        hit = query = None
        read_bytes = None
        if rb is not None and readback:
            r = rb.engines["engine"]
            if counters:
                ev.engine_reported_read_bytes = r.delta(prof.hit_metrics.read_bytes)
                hit = r.delta(prof.hit_metrics.hit_tokens)
                query = r.delta(prof.hit_metrics.query_tokens)
        if rb is not None:
            read_bytes = read_bytes_between(rb.device_before, rb.device_after)
        result = evaluate_g2(recompute, readback, hit, query, read_bytes, p.min_hit_rate, expected_bytes, ev,
                             fallback=fallback, counters=counters, log=log if readback else None,
                             device_reads=prof.device_reads, min_read_fraction=p.min_read_fraction)
        write_summary(ctx.gate_dir, "g2-summary.json", result)
        return result

    # ------------------------------------------------------------------------- an engine kvgate launches

    def setup_launched(self, ctx: GateContext, p: G2Params, prof: EngineProfile,
                        labels: tuple[str, ...] = ("recompute", "readback")) -> "G2Setup | WorkloadResult":
        """An engine kvgate launches: pre-flight, a port, the run's files on the node, the random-weight model
        when asked, the prompts; the engine itself starts in the phases (``labels``: its starts' log names)."""
        node, transport, _, python = engine_node(ctx, p.engine, p.python)  # the profile as the caller gives it
        # Can the node's interpreter run this engine at all? (and the engine's versions, for the evidence)
        versions, err = engine_preflight(ctx, transport, node.name, prof, python, "g2-preflight")
        if err:
            return WorkloadResult(evidence=G2Evidence(engine_profile=prof.name, engine=prof.engine, versions=versions),
                                  error=err)
        port = engine_port(ctx, transport, node, p.port, python, "g2-port")
        run_tag = uuid.uuid4().hex[:8]
        v = launch_values(p, prof, node.work_dir, ctx.gate.id, port, run_tag, node.transport, node.engine_python)
        base_url, client_path = client_base_url(transport, node, p.host, port)
        ev = G2Evidence(engine_profile=prof.name, engine=prof.engine, engine_version=prof.engine_version,
                        base_url=base_url, client_path=client_path, pool_dir=v["pool_dir"], run_dir_on_node=v["run_dir"],
                        pool_drive=pool_drive_of(ctx, node.name))
        try:
            model_cfg, bpt, vocab = self.kv_shape(p, prof)
        except ValueError as exc:  # a model_config file read only now
            return WorkloadResult(evidence=ev, error=f"model config {p.model_config_path or ''}: {exc}")
        ev.versions = versions
        # Files for the node: LMCache YAML (strictly checked), model config, the engine's program.
        err, cfg = stage_engine_files(ctx, transport, prof, v, ctx.gate_dir, model_cfg, prof.lmcache, "g2-mkdir")
        if err:
            return WorkloadResult(evidence=ev, error=err)
        if prof.lmcache is not None:
            ev.lmcache_version_pinned, ev.lmcache_config = prof.lmcache.version, cfg
        err, pool = prepare_pool(ctx, transport, node.name, p.pool_device, cold_regime_of(prof.cold_regime,
                                 p.cold_regime), python, v["pool_dir"], v["run_dir"], prof.pool_files, "g2-pool")
        tok_spec = p.tokenizer or prof.tokenizer
        if err is None and p.random_weights:
            err, tok_spec = self._build_model(ctx, transport, python, node, v, p, model_cfg, ev)
        if err:  # no engine will close the pool: close it here
            pool.close()
            ev.pool = pool.record.to_dict()
            return WorkloadResult(evidence=ev, error=err)
        engine = LaunchedEngine(ctx, transport, prof, prof.render_argv(v), prof.render_env(v), base_url, v["run_dir"],
                                labels, [node.name], pool=pool)
        ev.pool = pool.record.to_dict()
        return self._setup(p, prof, ev, engine, tok_spec, vocab, bpt, p.seed, transport, v["pool_dir"])

    def setup_attached(self, ctx: GateContext, p: G2Params, prof: EngineProfile) -> "G2Setup | WorkloadResult":
        """An engine someone else runs: its URL, the operator's cold procedure, the pool on a named node."""
        a = p.attach
        pool_node = p.pool_node or next(iter(ctx.nodes))
        ev = G2Evidence(engine_profile=prof.name, engine=prof.engine, engine_version=prof.engine_version,
                        base_url=a.url, client_path="direct (attached)", pool_dir=p.pool_path, attached=True,
                        pool_drive=pool_drive_of(ctx, pool_node))
        try:
            model_cfg, bpt, vocab = self.kv_shape(p, prof)
        except ValueError as exc:
            return WorkloadResult(evidence=ev, error=f"model config {p.model_config_path or ''}: {exc}")
        engine = AttachedEngine(ctx, prof, a, pool_node)
        # The engine and its pool outlive this run: prompts are new to it by a per-run seed (recorded).
        seed = p.seed + int(uuid.uuid4().hex[:8], 16)
        return self._setup(p, prof, ev, engine, p.tokenizer or prof.tokenizer, vocab, bpt, seed,
                           ctx.transports[pool_node], p.pool_path)

    def _setup(self, p: G2Params, prof: EngineProfile, ev: G2Evidence, engine: EngineHandle, tok_spec: str | None,
               vocab: int, bpt: int, seed: int, pool_transport: Any, pool_dir: str) -> "G2Setup | WorkloadResult":
        try:
            prompts, warm = self._prompts(p, prof, tok_spec, vocab, seed, ev)
        except (OSError, ValueError) as exc:
            return WorkloadResult(evidence=ev, error=f"tokenizer {tok_spec}: {exc}" if tok_spec else str(exc))
        expected_bytes = sum(stored_kv_tokens(r.prompt_tokens, prof.kv_block_tokens) for r in prompts) * bpt
        ev.kv_bytes_per_token, ev.expected_kv_bytes = bpt, expected_bytes
        return G2Setup(engine, ev, prompts, warm, expected_bytes, pool_transport, pool_dir)

    def _phases(self, ctx: GateContext, p: G2Params, prof: EngineProfile, s: "G2Setup") -> WorkloadResult:
        """The one G2 procedure, on any engine handle, through the shared phase runner: re-compute phase
        (never-seen prompts, which stores their KV) -> the pool holds it -> the engine forgets (stop / the
        operator's restart) and the page cache is dropped -> the engine serves again -> read-back phase. Counters,
        log and the pool device's bytes are read around each phase; a fall-back in the log ends the gate INVALID
        before the next step."""
        eng, ev, prompts = s.engine, s.ev, s.prompts
        counters = prof.hit_metrics is not None
        where = " on the attached engine" if eng.persistent else ""
        warm = dict(zip(("recompute", "readback"), s.warm))
        runner = PhaseRunner(ctx, {"engine": eng}, counters=counters, warm_up=(
            lambda _n, h, label: self.warm_up(ctx, p, prof, h.base_url, label, warm[label], ev)))
        session = EngineSession({"engine": runner})

        def recompute() -> list[RequestRecord]:
            if eng.persistent:  # earlier runs' chunks are in the pool: only what this run adds counts
                ev.pool_before_recompute = pool_contents(ctx, s.pool_transport, s.pool_dir, 0, 0, "g2-pool-before",
                                                         prof.pool_files)
            ctx.progress(f"{ctx.gate.id}: re-compute phase{where}, {len(prompts)} prompts")
            return self._send(ctx, p, prof, eng.base_url, prompts)

        def readback() -> list[RequestRecord]:
            ctx.progress(f"{ctx.gate.id}: cold read-back phase{where}, {len(prompts)} prompts")
            return self._send(ctx, p, prof, eng.base_url, prompts)

        def phases() -> tuple | WorkloadResult:
            rb = log = None
            rc = runner.phase("recompute", recompute,
                              device=lambda: self.pool_stat(ctx, s.pool_transport, s.pool_dir, ev))
            r = rc.engines["engine"]
            ev.recompute_device_write_bytes = write_bytes_between(rc.device_before, rc.device_after)  # until the sync
            if counters:
                ev.recompute_hit_tokens = r.delta(prof.hit_metrics.hit_tokens)
            self._recompute_log_hits(prof, r.log_before.text, r.log_after.text, prompts, ev)
            self._save(ctx.gate_dir / "requests-recompute.jsonl", rc.output)
            before = ev.pool_before_recompute.bytes if ev.pool_before_recompute is not None else 0
            pool = pool_contents(ctx, s.pool_transport, s.pool_dir, before + s.expected_bytes,
                                 p.populate_timeout_s, "g2-pool-after-populate", prof.pool_files)
            # a pool that held earlier runs' chunks: what this run's re-compute added is the figure
            ev.pool_after_populate = pool.model_copy(update={"bytes_added": pool.bytes - before}) \
                if eng.persistent else pool
            fallback, ev.fallback_lines = session.fallback(rc.engines, prof.fallback_patterns, "re-compute",
                                                           prof.in_force_log)
            if fallback is None and any(x.ok for x in rc.output):  # all failed: an ERROR, nothing to read back
                err = runner.forget()
                if err:
                    return WorkloadResult(evidence=ev, error=err)
                self._between_phases(ctx, p, prof, s)
                if p.drop_caches:
                    drops = [drop_caches(ctx, ctx.transports[n], f"g2-drop-caches-{n}") for n in eng.drop_nodes()]
                    ev.page_cache_dropped = all(d.dropped for d in drops)
                    ev.page_cache_drop_error = "; ".join(d.error for d in drops if d.error) or None
                else:
                    ev.page_cache_dropped = False
                err = runner.resume()
                if err:
                    return WorkloadResult(evidence=ev, error=err)
                rb = runner.phase("readback", readback,
                                  device=lambda: self.pool_stat(ctx, s.pool_transport, s.pool_dir, ev))
                if eng.persistent:  # its process start time is the marker of a restart
                    ev.engine_restarted = restarted(r.metrics_after, rb.engines["engine"].metrics_before)
                rr = rb.engines["engine"]
                ev.recompute_device_write_bytes = write_bytes_between(rc.device_before, rb.device_before)
                log = self._log_proof(prof, rr.log_before.text, rr.log_after.text, prompts)
                self._save(ctx.gate_dir / "requests-readback.jsonl", rb.output)
                fallback, lines = session.fallback(rb.engines, prof.fallback_patterns, "read-back", prof.in_force_log)
                ev.fallback_lines += lines
            return rc, rb, log, fallback

        def after() -> None:
            if eng.persistent:
                ev.cold_procedure = eng.cold_steps
            ev.pool = pool_record(eng) or ev.pool

        out = session.run(phases, lambda why: WorkloadResult(evidence=ev, error=why), after=after)
        if isinstance(out, WorkloadResult):
            return out
        rc, rb, log, fallback = out
        return self._finish(ctx, p, prof, rc, rb, log, s.expected_bytes, ev, fallback)

    def _between_phases(self, ctx: GateContext, p: G2Params, prof: EngineProfile, s: "G2Setup") -> None:
        """What a workload built on this procedure does to the pool while the engine is stopped, after the store and
        before the page cache is dropped and the read-back starts (g2-answer's corruption); here nothing."""

    def _recompute_log_hits(self, prof: EngineProfile, before: str | None, after: str | None, prompts: list,
                            ev: G2Evidence) -> None:
        proof = self._log_proof(prof, before, after, prompts)
        if proof is not None and proof.hits is not None:
            ev.recompute_log_hit_lines = proof.hits.lines

    def _build_model(self, ctx, transport, python: str, node, v: dict[str, Any], p: G2Params,
                     model_cfg: dict[str, Any], ev: G2Evidence) -> tuple[str | None, str | None]:
        """Build (or find, cached) the random-weight model on the node; fetch its tokenizer. Sets {model}."""
        err, model_dir, ev.random_model = build_random_model(ctx, transport, python, node, v["run_dir"],
                                                             v["model_config"], model_cfg, p.seed,
                                                             p.random_weights_dtype, "g2-make-model")
        if err:
            return err, None
        local_tok = ctx.gate_dir / "tokenizer.json"
        transport.get(posixpath.join(model_dir, "tokenizer.json"), local_tok)
        v["model"] = model_dir
        ev.model_dir_on_node = model_dir
        return None, str(local_tok)

    # --------------------------------------------------------------------------------------- helpers

    @staticmethod
    def _save(path: Path, records: list[RequestRecord]) -> None:
        write_gate_file(path, "".join(json.dumps(r.to_dict()) + "\n" for r in records))

    def pool_stat(self, ctx, transport, pool_dir: str, ev: "G2Evidence") -> PoolDeviceStat | None:
        """The pool's block device and its counters now (the one probe kv-read uses too); why not, in the
        evidence."""
        res = ctx.steps.run(transport, "g2-pool-blockstat", pool_blockstat_argv(pool_dir), timeout_s=30)
        try:
            dev = parse_pool_blockstat(res.stdout)
        except ValueError as exc:
            ev.pool_device_error = f"{exc} ({res.summary()})" if not res.ok else str(exc)
            return None
        ev.pool_device, ev.pool_device_maj_min = dev.source, dev.maj_min
        return dev
