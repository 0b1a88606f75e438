"""PD hand-off: prefill on one engine instance, decode on another, the KV cache handed over through the tier.

The reference's own subject (prefill/decode disaggregation, "prefill and decode pools can share one external
tier") as a gate. Two engine instances, on one node or two, share one pool directory on the tier:
- the **producer** (prefill instance, e.g. vLLM with a KV connector in role ``kv_producer``) computes a prompt's
  KV and stores it in the pool;
- the **consumer** (decode instance, role ``kv_consumer``) serves the same prompt with that KV loaded from the
  pool instead of computing it.
Per prompt, one at a time (the route a disaggregated proxy takes for each request):
1. the producer's pool bytes now (so only what this prompt adds counts); the producer serves the prompt with one
   output token (its TTFT is the prefill TTFT), counters, log mark and the pool device's counters around it;
   kvgate waits until the pool holds the prompt's KV (store complete), then (``drop_caches``) ``sync`` and drops
   the page cache of both nodes, so the consumer reads the tier's device, not this machine's memory;
2. the consumer serves the same prompt (hand-off TTFT), its counters and the pool device's counters around it;
3. the consumer serves a fresh prompt of the same length, never stored (recompute TTFT: what decode costs without
   the hand-off, on the same instance).
Figures (percentiles over the prompts): prefill, hand-off and recompute TTFT, the hand-off speed-up (recompute /
hand-off p50), the time from the store completing to the consumer's first token, KV bytes per request (what the
pool gained per prefill), the pool device's write bytes on the producer's side and read bytes on the consumer's
side, and the hand-off bandwidth (a prompt's KV bytes over its hand-off TTFT).

Proofs (:func:`pd_validity`, every one a ValidityCheck; any that fails is INVALID, never PASS): the two
instances are distinct processes (node and pid, URLs); neither engine's log has a fall-back line; the prompts
were new to the producer (no hits); each prompt's KV reached the pool; the producer's pool device wrote at least
``min_write_fraction`` of it; the consumer's external-prefix hits cover the prompt (counter deltas, at least
``min_hit_rate`` of the looked-up tokens); the consumer's pool device read at least ``min_read_fraction`` of the
KV its hits claim; the fresh prompt was computed (no hits). A consumer that re-computed (hit counters flat, or a
fall-back line in its log) makes the gate INVALID. Where the nodes mount the pool over the network (no block device
on them), ``pool_storage`` names the node that holds it: both roles' device counters (one device, attributed by phase:
the producer's around its prefill, the consumer's around its hand-off), the sync and the page-cache drop run there.
Both instances are handles of the one phase runner
(``workloads/kit/phases.py``); requests go through the streaming client (``engines/client.py``).
"""

from __future__ import annotations

from pathlib import Path

import dataclasses
import json
import posixpath
import uuid
from typing import Any, ClassVar, Literal, Mapping, Sequence

from pydantic import Field, field_validator, model_validator

from ..errors import HarnessError
from .kit.rederive import pool_device_steps, raw_text, rescanned_fallback
from .kit.g2 import records_from_text
from ..engines import EngineProfile, kv_bytes_per_token, load_profile, shell_line
from ..engines.client import CompletionRequest, RequestRecord, run_requests_sync
from ..engines.preflight import preflight_argv
from ..engines.prompts import make_prompts
from ..endurance import DriveRating, combined, endurance
from ..parsers.pooldev import PoolDeviceStat, pool_blockstat_argv, pool_device_probe, read_bytes_between, \
    write_bytes_between
from ..parsers.prometheus import metric_total
from ..redact import redact_url
from ..stats import percentile
from ..units import format_quantity
from .kit.base import (DROP_CACHES_ARGV, Evidence, GateContext, PlannedStep, PoolSnapshot, StrictModel, TtftEvidence,
                   ValidityCheck, Workload, WorkloadResult, drop_caches, drive_rating, pool_drive_of, register_workload,
                   target_path, write_gate_file, write_summary)
from .kit.g2 import ttft_stats
from .kit.attach import AttachedEngine, NodeCommand, engine_url
from .kit.engine import (FREE_PORT_CODE, LaunchedEngine, build_random_model, build_random_model_argv, client_base_url,
                     engine_port, engine_preflight, engine_values, model_config_issues, node_engine_python,
                     pool_contents, pool_files_argv, profile_issues, random_model_dir, stage_engine_files,
                     stored_kv_tokens)
from .kit.phases import PhaseRunner
from .kit.session import EngineSession
from .kit.pool import PoolDeviceSpec, PoolHandle, plan_pool, prepare_pool
from .kit.probes import run_probe

ROLES = ("producer", "consumer")
# Fresh (recompute) and warm-up prompts are drawn from seeds this far from the gate's: never among its prompts.
FRESH_SEED_OFFSET = 2_000_003
WARMUP_SEED_OFFSET = 1_000_003
SYNC_ARGV = ("sync",)


class PdEndpoint(StrictModel):
    """An instance someone else runs (attach mode): where kvgate reaches it, and a command that prints its log
    (fall-back lines). kvgate never starts, restarts or stops it."""

    url: str
    metrics_url: str | None = None  # default: url + the profile's metrics_path
    log: NodeCommand | None = None
    connect_timeout_s: float = Field(default=30.0, gt=0)
    # what attach.AttachedEngine reads of an attach block beyond these: a hand-off restarts nothing
    restart: ClassVar[tuple] = ()
    drop_caches_on: ClassVar[None] = None
    ready_timeout_s: ClassVar[None] = None

    _url = field_validator("url", "metrics_url")(classmethod(lambda cls, v: engine_url(v)))


class PdAttach(StrictModel):
    """Attach mode: the prefill and the decode instance of a deployment, by URL, and the directory on the tier
    both store KV in (on the producer's and the consumer's node: the pool's chunk files and its device)."""

    producer: PdEndpoint
    consumer: PdEndpoint
    pool_path: str = Field(min_length=1)


class PdParams(StrictModel):
    producer_engine: str = "vllm-cpu-producer"
    consumer_engine: str = "vllm-cpu-consumer"
    producer: str | None = None  # the prefill instance's node (default: the gate's first node)
    consumer: str | None = None  # the decode instance's node (default: the gate's second node, else the first)
    pool_target: str = "kvpool"  # a directory target on both nodes: the shared pool's mount
    pool_subdir: str = "kvgate-pd"
    model: str = "kvgate-pd"  # the served model's path on the nodes (random_weights: built there instead)
    served_model_name: str = "kvgate-pd"
    model_config_inline: dict[str, Any]  # KV bytes per token and the vocabulary come from it
    random_weights: bool = True
    random_weights_dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    prompt_tokens: list[int] = Field(default_factory=lambda: [4098], min_length=1)
    prompts_per_length: int = Field(default=2, ge=1, le=1000)
    decode_tokens: int = Field(default=2, ge=1, le=4096)  # the consumer's output tokens (the producer's: 1)
    seed: int = 0
    python: str | None = None  # default: the node's engine_python, else python3 on the node
    drop_caches: bool = True
    warmup: bool = True
    min_hit_rate: float = Field(default=0.95, ge=0, le=1)
    min_read_fraction: float = Field(default=0.5, ge=0, le=1)
    min_write_fraction: float = Field(default=0.5, ge=0, le=1)
    populate_timeout_s: float = Field(default=120.0, gt=0)
    request_timeout_s: float = Field(default=600.0, gt=0)
    attach: PdAttach | None = None  # the two instances already run (a deployment's prefill and decode workers)
    # NODE:TARGET, the pool where it lives: a node of the gate on the storage side and its directory target, the
    # directory the producer's and the consumer's `pool_target` mount (sshfs, NFS). Both roles' pool device
    # counters, and the sync and page-cache drop, run there too: a network mount has no block device on the nodes.
    pool_storage: str | None = None
    # Launched on one node: the shared pool on a loop device kvgate makes for the run (``kind: loop``, as the serving
    # gates' pool_device), so both roles' device counters are the pool's alone; ``directory`` keeps it where the
    # target is (an operator's array mount). PD's own cold step (sync, page-cache drop) runs either way.
    pool_device: PoolDeviceSpec = Field(default_factory=PoolDeviceSpec)

    @model_validator(mode="after")
    def _lengths(self):
        if any(n < 2 for n in self.prompt_tokens):
            raise ValueError("every prompt length must be >= 2 tokens")
        return self

    @field_validator("pool_storage")
    @classmethod
    def _node_target(cls, v: str | None) -> str | None:
        if v is not None and (v.count(":") != 1 or not all(v.split(":"))):
            raise ValueError(f"expected NODE:TARGET (e.g. storage:kvpool), got {v!r}")
        return v

    @property
    def storage(self) -> tuple[str, str] | None:
        """(node, directory target) of ``pool_storage``, or None: the pool is counted on the roles' nodes."""
        return tuple(self.pool_storage.split(":")) if self.pool_storage else None  # type: ignore[return-value]


class PdInstance(StrictModel):
    """One engine instance of the hand-off: its role, where it ran, its profile and KV role, its URL and process."""

    role: str
    node: str
    profile: str
    base_url: str
    run_dir: str | None = None  # on its node (launched)
    pid: int | None = None      # of the process kvgate launched
    start_time_s: float | None = None  # its process_start_time_seconds, where it exposes one


class PdPrompt(StrictModel):
    """One prompt's hand-off: the three requests' TTFTs, the store, and what each side's counters and pool device
    showed around its request."""

    request_id: str
    prompt_tokens: int
    errors: list[str] = []
    prefill_ttft_s: float | None = None
    handoff_ttft_s: float | None = None
    recompute_ttft_s: float | None = None
    expected_kv_bytes: int = 0           # the whole blocks the connector stores, x KV bytes per token
    pool_bytes_added: int | None = None  # what the pool gained from the producer's store
    store_wait_s: float | None = None    # from the producer's first token to the pool holding the KV
    cold_s: float | None = None          # the page-cache drop between the store and the hand-off
    store_to_first_token_s: float | None = None
    producer_hit_tokens: float | None = None
    handoff_hit_tokens: float | None = None
    handoff_query_tokens: float | None = None
    recompute_hit_tokens: float | None = None
    producer_write_bytes: int | None = None
    consumer_read_bytes: int | None = None


class PdEvidence(Evidence, TtftEvidence):
    """The hand-off's evidence: both instances, the pool, per prompt the three TTFTs and both sides' proofs;
    ``ttft_recompute_s`` / ``ttft_readback_s`` (the hand-off's) for the report's TTFT chart."""

    producer_profile: str | None = None
    consumer_profile: str | None = None
    versions: dict[str, dict[str, str]] = {}  # role -> the engine's distributions, read by the pre-flight
    instances: dict[str, PdInstance] = {}
    route: str | None = None
    attached: bool = False
    pool_dir: str | None = None
    kv_bytes_per_token: int | None = None
    model_dir_on_node: dict[str, str] = {}
    random_model: dict[str, Any] | None = None
    prompt_seed: int | None = None
    warmup: dict[str, Any] = {}
    page_cache_dropped: bool | None = None
    page_cache_drop_error: str | None = None
    pool_device: dict[str, str] = {}        # role -> the device counted (findmnt SOURCE, MAJ:MIN)
    pool_device_node: dict[str, str] = {}   # role -> the node its device counters were read on
    pool_device_side: str | None = None     # "storage": on the pool's storage-side node (pool_storage); "nodes"
    pool_device_dir: dict[str, str] = {}    # role -> the pool directory the device probe was given, on that node
    pool_device_error: str | None = None
    pool: dict[str, Any] | None = None      # the pool as made for the run (pool_device): its kind and loop device
    pool_end: PoolSnapshot | None = None
    prompts: list[PdPrompt] = []
    fallback_lines: list[str] = []


# ------------------------------------------------------------------------------------------ evaluation


def _sum(xs: Sequence[float | None]) -> float | None:
    """The sum, or None when any part was not measured (a partial sum would prove too little as if it proved all)."""
    return None if not xs or any(x is None for x in xs) else float(sum(xs))  # type: ignore[arg-type]


def distinct_instances(instances: Mapping[str, PdInstance]) -> tuple[bool, str]:
    """Pure: whether the producer and the consumer are two engine processes, and what shows it."""
    p, c = instances.get("producer"), instances.get("consumer")
    if p is None or c is None:
        return False, "an instance was not recorded"
    if p.base_url == c.base_url:
        return False, f"both roles were served at one URL ({p.base_url})"
    if p.pid is not None and c.pid is not None:  # launched: kvgate started both processes
        if p.node == c.node and p.pid == c.pid:
            return False, f"both roles are process {p.pid} on {p.node}"
        return True, (f"producer pid {p.pid} on {p.node} at {p.base_url}; consumer pid {c.pid} on {c.node} at "
                      f"{c.base_url}")
    # attached: the engines' own restart markers (process_start_time_seconds) must tell them apart
    if p.start_time_s is None or c.start_time_s is None:
        return False, "no process ids, and an instance exposes no process start time to tell the two apart"
    if p.start_time_s == c.start_time_s:
        return False, f"both URLs report one process start time ({p.start_time_s})"
    return True, (f"producer at {p.base_url} started at {p.start_time_s}, consumer at {c.base_url} at "
                  f"{c.start_time_s} (process_start_time_seconds)")


def pd_validity(prompts: Sequence[PdPrompt], instances: Mapping[str, PdInstance], fallback: str | None,
                bpt: int, min_hit_rate: float, min_read_fraction: float,
                min_write_fraction: float, where: Mapping[str, str] | None = None) -> list[ValidityCheck]:
    """Pure: what the hand-off figures rest on, in the order :func:`evaluate_pd` takes the first failure as its
    reason. ``where``: role -> where its pool device was counted (or why it could not be), for the checks' text."""
    where = where or {}

    def on(role: str) -> str:
        return f" ({where[role]})" if where.get(role) else ""

    distinct, seen = distinct_instances(instances)
    hit = _sum([x.handoff_hit_tokens for x in prompts])
    query = _sum([x.handoff_query_tokens for x in prompts])
    rate = hit / query if hit is not None and query else None
    claimed = hit * bpt if hit is not None else None
    read = _sum([x.consumer_read_bytes for x in prompts])
    read_fraction = read / claimed if read is not None and claimed else None
    stored = _sum([x.pool_bytes_added for x in prompts])
    wrote = _sum([x.producer_write_bytes for x in prompts])
    write_fraction = wrote / stored if wrote is not None and stored else None
    short = [x.request_id for x in prompts if x.pool_bytes_added is None or x.pool_bytes_added < x.expected_kv_bytes]
    new_hits = _sum([x.producer_hit_tokens for x in prompts])
    fresh_hits = _sum([x.recompute_hit_tokens for x in prompts])
    expected = sum(x.expected_kv_bytes for x in prompts)
    return [
        ValidityCheck(name="two instances", ok=distinct, claim="the producer and the consumer are distinct engine "
                      "processes (the KV crossed between them, not inside one)", how=seen),
        ValidityCheck(name="no fall-back", ok=fallback is None,
                      claim="neither engine fell back to re-computing behind its connector",
                      how=fallback or "both engines' whole logs scanned for the built-in and the profiles' fall-back "
                                      "patterns: none"),
        ValidityCheck(name="hand-off hits", ok=rate is not None and rate >= min_hit_rate,
                      claim="the consumer loaded the prompts' KV from the tier instead of computing it",
                      how=(f"the consumer's external-prefix hit and lookup counters around each hand-off request: "
                           f"{hit:.0f} of {query:.0f} tokens" if rate is not None else
                           "the consumer exposed no hit/lookup counters for its hand-off requests")
                          + f" (at least {min_hit_rate} required)",
                      figure="hand-off hit rate", value=rate, unit="ratio"),
        ValidityCheck(name="consumer read the tier", ok=read_fraction is not None and read > 0
                      and read_fraction >= min_read_fraction,
                      claim="the consumer's KV came from the pool's device, not from memory or a cache",
                      how=f"the consumer's pool device read counters around each hand-off request{on('consumer')}, "
                          f"against the {format_quantity(claimed, 'B')} of KV its hits claim (at least "
                          f"{min_read_fraction} of it required)",
                      figure="bytes the consumer's pool device read", value=read, unit="B"),
        ValidityCheck(name="producer wrote the tier",
                      ok=write_fraction is not None and write_fraction >= min_write_fraction,
                      claim="the producer's store reached the pool's device",
                      how=f"the producer's pool device write counters around each prefill{on('producer')} (a sync "
                          f"before the after read), against the {format_quantity(stored, 'B')} the pool gained "
                          f"(at least {min_write_fraction} of it required)",
                      figure="bytes the producer's pool device wrote", value=wrote, unit="B"),
        ValidityCheck(name="stored", ok=not short and stored is not None,
                      claim="every prompt's KV was in the pool before the consumer was asked for it",
                      how=(f"finished chunk files the pool gained per prefill, {format_quantity(expected, 'B')} "
                           "expected in all" + (f"; short: {', '.join(short)}" if short else "")),
                      figure="bytes the producer stored", value=stored, unit="B"),
        ValidityCheck(name="new prompts", ok=new_hits == 0,
                      claim="the prompts were new to the producer (it computed every one)",
                      how="the producer's hit counters around each prefill", figure="producer hit tokens",
                      value=new_hits, unit="count"),
        ValidityCheck(name="recompute computed", ok=fresh_hits == 0,
                      claim="the consumer computed the fresh prompts (the recompute figure is a re-compute)",
                      how="the consumer's hit counters around each fresh prompt", figure="recompute hit tokens",
                      value=fresh_hits, unit="count"),
    ]


def device_where(ev: PdEvidence) -> dict[str, str]:
    """Pure: role -> where the evidence says its pool device was counted (node, device, side), or the probe's error."""
    out = {}
    for role in ROLES:
        node, dev = ev.pool_device_node.get(role), ev.pool_device.get(role)
        if node and dev:
            side = ("the pool's storage side, one device for both roles, attributed by phase"
                    if ev.pool_device_side == "storage" else "the role's own node")
            out[role] = f"{dev} on {node}, {side}"
        elif ev.pool_device_error:  # the first probe that failed (either role's)
            out[role] = f"no device counted: {ev.pool_device_error}"
    return out


def pd_endurance(prompts: Sequence[PdPrompt], drive: DriveRating | None) -> dict[str, Any] | None:
    """Pure: what the producer's stores cost the pool's drive (harness.endurance): per prompt, the pool device's
    bytes written around the producer's request, its prompt tokens, the KV the pool gained, over the store's
    window (the producer's TTFT plus the wait until the pool held the KV)."""
    if not prompts:
        return None
    return combined([endurance(x.producer_write_bytes, x.prompt_tokens, x.pool_bytes_added,
                               None if x.prefill_ttft_s is None or x.store_wait_s is None
                               else x.prefill_ttft_s + x.store_wait_s) for x in prompts], drive).to_dict()


def evaluate_pd(prompts: Sequence[PdPrompt], instances: Mapping[str, PdInstance], bpt: int, min_hit_rate: float,
                min_read_fraction: float, min_write_fraction: float, evidence: PdEvidence | None = None,
                fallback: str | None = None) -> WorkloadResult:
    """Pure: the hand-off's metrics and validity from its per-prompt records, the two instances and the engines'
    fall-back verdict (``fallback``: the first engine's reason, or None). The result carries a copy of
    ``evidence`` with the prompts, the validity and the TTFT lists."""
    pre = [x.prefill_ttft_s for x in prompts if x.prefill_ttft_s is not None]
    hand = [x.handoff_ttft_s for x in prompts if x.handoff_ttft_s is not None]
    rec = [x.recompute_ttft_s for x in prompts if x.recompute_ttft_s is not None]
    gap = [x.store_to_first_token_s for x in prompts if x.store_to_first_token_s is not None]
    metrics: dict[str, float] = {}
    metrics.update(ttft_stats(pre, "ttft_prefill"))
    metrics.update(ttft_stats(hand, "ttft_handoff"))
    metrics.update(ttft_stats(rec, "ttft_recompute"))
    metrics.update(ttft_stats(gap, "store_to_first_token"))
    if hand and rec and metrics["ttft_handoff_p50_s"] > 0:
        metrics["handoff_speedup_p50"] = metrics["ttft_recompute_p50_s"] / metrics["ttft_handoff_p50_s"]
    added = [x.pool_bytes_added for x in prompts if x.pool_bytes_added is not None]
    if added:
        metrics["kv_bytes_per_request"] = sum(added) / len(added)
    bw = [x.pool_bytes_added / x.handoff_ttft_s / 1e9 for x in prompts
          if x.pool_bytes_added and x.handoff_ttft_s]
    if bw:
        metrics["handoff_gb_s_p50"] = percentile(bw, 50)
    wrote, read = _sum([x.producer_write_bytes for x in prompts]), _sum([x.consumer_read_bytes for x in prompts])
    if wrote is not None:
        metrics["producer_device_write_bytes"] = wrote
    if read is not None:
        metrics["consumer_device_read_bytes"] = read
    hit, query = _sum([x.handoff_hit_tokens for x in prompts]), _sum([x.handoff_query_tokens for x in prompts])
    if hit is not None and query:
        metrics["hit_rate"] = hit / query
        if read is not None and hit:
            metrics["read_fraction"] = read / (hit * bpt)
    checks = pd_validity(prompts, instances, fallback, bpt, min_hit_rate, min_read_fraction, min_write_fraction,
                         device_where(evidence) if evidence is not None else None)
    base = evidence or PdEvidence()
    ev = base.model_copy(update=dict(prompts=list(prompts), ttft_recompute_s=rec or None, ttft_readback_s=hand or None,
                                     endurance=pd_endurance(prompts, drive_rating(base.pool_drive)), validity=checks))
    failed = [f"{x.request_id}: {e}" for x in prompts for e in x.errors]
    error = f"{len(failed)} request(s) failed; first: {failed[0]}" if failed else None
    if not prompts:
        error = error or "no prompt was handed off"
    # the engine's own word that the tier did nothing outranks every figure; then the first proof that failed
    invalid = fallback or next((f"{c.name}: not shown that {c.claim} ({c.how})" for c in checks if not c.ok), None)
    return WorkloadResult(metrics=metrics, evidence=ev, invalid_reason=invalid, error=error)


def reevaluate_pd(evidence: dict[str, Any], requests: Mapping[str, Sequence[RequestRecord]],
                  device: Sequence[tuple[int | None, int | None]], fallback: str | None, p: "PdParams",
                  prof: EngineProfile) -> WorkloadResult:
    """Pure: a bundle's pd-handoff result again: per prompt its three requests' TTFTs and errors from the raw
    records (``requests``: phase -> records in prompt order, as many as the evidence's prompts, the prefill and
    hand-off ones named by the prompt's id), the producer's written and the consumer's read bytes (``device``: per
    prompt, re-parsed from the run's probe steps), the KV each prompt stores from its prompt tokens and the
    model (``p.model_config_inline``, ``prof``: the producer's profile), the engines' fall-back as re-scanned and
    the bounds of the gate's params; the engines' hit counters and the pool's listings as recorded. Then
    :func:`evaluate_pd`, as the run. ValueError when the raw records do not match the evidence's prompts."""
    ev = PdEvidence.model_validate({k: v for k, v in evidence.items() if k != "validity"})
    n = len(ev.prompts)
    counts = {ph: len(requests.get(ph, ())) for ph in ("prefill", "handoff", "recompute")}
    if any(c != n for c in counts.values()) or len(device) != n:
        got = ", ".join(f"{ph} {c}" for ph, c in counts.items())
        raise ValueError(f"the raw request records ({got}) and device probes ({len(device)}) are not the "
                         f"evidence's {n} prompts")
    bpt = kv_bytes_per_token(dict(p.model_config_inline), prof.capabilities.kv_dtype)
    prompts = []
    for i, x in enumerate(ev.prompts):
        pre, hand, rec = (requests[ph][i] for ph in ("prefill", "handoff", "recompute"))
        if pre.request_id != x.request_id or hand.request_id != x.request_id:
            raise ValueError(f"prompt {i}: the raw records name {pre.request_id} / {hand.request_id}, the evidence "
                             f"{x.request_id}")
        prompts.append(x.model_copy(update=dict(
            errors=[f"{ph}: {r.error}" for ph, r in (("prefill", pre), ("handoff", hand), ("recompute", rec))
                    if not r.ok],
            prefill_ttft_s=pre.ttft_s, handoff_ttft_s=hand.ttft_s, recompute_ttft_s=rec.ttft_s,
            expected_kv_bytes=stored_kv_tokens(pre.prompt_tokens or 0, prof.kv_block_tokens) * bpt,
            producer_write_bytes=device[i][0], consumer_read_bytes=device[i][1])))
    return evaluate_pd(prompts, ev.instances, bpt, p.min_hit_rate, p.min_read_fraction, p.min_write_fraction, ev,
                       fallback=fallback)


# -------------------------------------------------------------------------------------------- workload


def rederive(gate_dir: Path, result: dict[str, Any], params: Any, ctx: dict[str, Any]):
    """pd-handoff from its raw request records (``requests-prefill.jsonl``, ``requests-handoff.jsonl``,
    ``requests-recompute.jsonl``), each prompt's producer-written and consumer-read bytes re-parsed from the run's
    probe steps (``*-pd-producer-blockstat-I``, ``*-pd-consumer-blockstat-I``: before and after), launched engines'
    logs (``engine-producer.log``, ``engine-consumer.log``) re-scanned, the KV per prompt from the model and the
    bounds from config/gates.yaml, through the workload's own pure functions
    (harness.workloads.pd_handoff.reevaluate_pd)."""
    ev = result.get("evidence") or {}
    requests = {ph: records_from_text(raw_text(gate_dir, f"requests-{ph}.jsonl", f"the {ph} requests"))
                for ph in ("prefill", "handoff", "recompute")}
    profs = {r: load_profile(getattr(params, f"{r}_engine")) for r in ("producer", "consumer")}
    bundle = Path(ctx["bundle_dir"])
    device = []
    for i in range(len(ev.get("prompts") or [])):
        got = {}
        for role, between in (("producer", write_bytes_between), ("consumer", read_bytes_between)):
            steps = pool_device_steps(bundle, None, f"pd-{role}-blockstat-{i}", need_ok=True)
            if len(steps) != 2:
                raise HarnessError(f"{gate_dir.name}: prompt {i}: {len(steps)} {role} pool-device probe steps (two "
                                   "expected: before and after): the device bytes cannot be re-derived")
            got[role] = between(steps[0], steps[1])
        device.append((got["producer"], got["consumer"]))
    if params.attach is None:
        patterns = list(dict.fromkeys(profs["producer"].fallback_patterns + profs["consumer"].fallback_patterns))
        fallback = (rescanned_fallback(gate_dir, "engine-producer.log", patterns, "producer engine's")
                    or rescanned_fallback(gate_dir, "engine-consumer.log", patterns, "consumer engine's"))
    else:
        fallback = result.get("invalid_reason") if ev.get("fallback_lines") else None
    return reevaluate_pd(ev, requests, device, fallback, params, profs["producer"])


@register_workload("pd-handoff")
class PdHandoff(Workload):
    rederive = staticmethod(rederive)  # the gate re-judged from the bundle's raw files
    # what its endurance prices (docs/endurance.md), for `kvgate plan`
    ENDURANCE = ("the producer's stores: the pool device's bytes written around each producer request, per million "
                 "prompt tokens, per byte the pool gained, over its TTFT and store wait")
    Params = PdParams
    EvidenceModel = PdEvidence
    METRICS = {
        "ttft_prefill_p50_s": "s", "ttft_prefill_p90_s": "s", "ttft_prefill_p99_s": "s",
        "ttft_handoff_p50_s": "s", "ttft_handoff_p90_s": "s", "ttft_handoff_p99_s": "s",
        "ttft_recompute_p50_s": "s", "ttft_recompute_p90_s": "s", "ttft_recompute_p99_s": "s",
        "store_to_first_token_p50_s": "s", "store_to_first_token_p90_s": "s", "store_to_first_token_p99_s": "s",
        "handoff_speedup_p50": "x", "kv_bytes_per_request": "B", "handoff_gb_s_p50": "GB/s",
        "producer_device_write_bytes": "B", "consumer_device_read_bytes": "B", "hit_rate": "ratio",
        "read_fraction": "ratio",
    }

    # parameters only launched instances use: set with attach:, they would be accepted and ignored
    LAUNCH_ONLY = ("python", "random_weights", "random_weights_dtype", "model", "pool_target", "pool_subdir",
                   "pool_device", "pool_storage")

    # ------------------------------------------------------------------------------------ validation

    def roles(self, p: PdParams, nodes: Mapping[str, Any]) -> dict[str, str | None]:
        """role -> node: the producer on the gate's first node unless named, the consumer on the second (the
        first when the gate has one node); the ``pool_storage`` node is neither unless named."""
        st = p.storage[0] if p.storage else None
        names = [n for n in nodes if n != st]
        producer = p.producer or (names[0] if names else None)
        consumer = p.consumer or next((n for n in names if n != producer), producer)
        return {"producer": producer, "consumer": consumer}

    def validate_against(self, params, nodes):
        issues: list[tuple[tuple, str]] = []
        profs = {}
        for role, key in (("producer", "producer_engine"), ("consumer", "consumer_engine")):
            prof, found = profile_issues(getattr(params, key), nodes, "pd-handoff", node_count=len(nodes))
            issues += [((key,) + path[1:], msg) for path, msg in found]
            if prof is None:
                continue
            profs[role] = prof
            if params.attach is None and not prof.launches:
                issues.append(((key,), f"profile {prof.name!r} has no argv (kvgate does not launch it): give "
                                       "attach: with both instances' URLs"))
            if params.attach is not None and prof.launches:
                issues.append(((key,), f"profile {prof.name!r} launches its engine (argv); attach: takes a "
                                       "profile without argv, which describes an engine someone else runs"))
            if prof.hit_metrics is None:
                issues.append(((key,), f"pd-handoff proves hits from counters: profile {prof.name!r} declares no "
                                       "hit_metrics"))
        st = params.storage
        engine_nodes = [n for n in nodes if st is None or n != st[0]]
        if not 1 <= len(engine_nodes) <= 2:
            issues.append((("nodes",), f"pd-handoff runs on one node or two, got {len(engine_nodes)}"
                           + (f" besides the pool_storage node {st[0]!r}" if st else "")))
        if st is not None:
            if st[0] not in nodes:
                issues.append((("pool_storage",), f"node {st[0]!r} is not one of the gate's nodes "
                               f"({', '.join(nodes)}): add it to the gate's nodes"))
            else:
                t = nodes[st[0]].target(st[1])
                if t is None or t.kind != "directory":
                    issues.append((("pool_storage",), f"node {st[0]!r} has no directory target {st[1]!r}"))
        kv_dtype = profs["producer"].capabilities.kv_dtype if "producer" in profs else None
        issues += model_config_issues(params.model_config_inline, "model_config_inline", kv_dtype)
        if params.producer and params.consumer and params.producer == params.consumer and len(nodes) == 2:
            issues.append((("consumer",), "producer and consumer name one node of a two-node gate"))
        if params.pool_device.kind == "loop" and params.attach is None and (len(engine_nodes) != 1 or st is not None):
            issues.append((("pool_device", "kind"), "a loop pool is made on the one node that runs both roles: not "
                           "with two nodes or pool_storage (mount the shared pool on both nodes instead)"))
        if params.attach is not None:
            issues += [((name,), "a launch parameter: kvgate does not launch attached instances")
                       for name in self.LAUNCH_ONLY if name in params.model_fields_set]
            for role in ROLES:
                log = getattr(params.attach, role).log
                if log is not None and log.node not in nodes:
                    issues.append((("attach", role, "log", "node"), f"node {log.node!r} is not one of the gate's "
                                   f"nodes ({', '.join(nodes)})"))
        for role, n in self.roles(params, nodes).items():
            if n is None or n not in nodes:
                issues.append(((role,), f"{role} {n!r} is not among the gate's nodes ({', '.join(nodes)})"))
                continue
            t = nodes[n].target(params.pool_target)
            if params.attach is None and (t is None or t.kind != "directory"):
                issues.append((("pool_target",), f"node {n!r} has no directory target {params.pool_target!r}"))
        return issues

    # ---------------------------------------------------------------------------------------- layout

    def _layout(self, ctx: GateContext, p: PdParams, prof: EngineProfile, role: str, node: Any, port: Any,
                tag: str) -> dict[str, Any]:
        run_dir = posixpath.join(node.work_dir, f"kvgate-pd-{ctx.gate.id}-{tag}-{role}")
        pool = posixpath.join(target_path(node, node.target(p.pool_target)), p.pool_subdir, f"run-{tag}")
        return engine_values(prof, python=node_engine_python(p.python, node), host="127.0.0.1", port=port,
                             model=p.model, served_model_name=p.served_model_name, seed=p.seed, run_dir=run_dir,
                             pool_dir=pool, max_model_len=max(p.prompt_tokens) + p.decode_tokens + 16)

    @staticmethod
    def _preflight_key(node: str, v: dict[str, Any], prof: EngineProfile) -> tuple:
        """One pre-flight per node, interpreter and declared check (two roles of one engine on one node share it)."""
        return node, v["python"], json.dumps(prof.preflight.model_dump() if prof.preflight else None, sort_keys=True)

    @staticmethod
    def counted_at(p: PdParams, nodes: Mapping[str, Any], roles: Mapping[str, str],
                   pools: Mapping[str, str]) -> dict[str, tuple[str, str]]:
        """role -> (node, pool directory there) where its pool device is counted: the role's own node and pool
        directory, or with ``pool_storage`` the storage-side node and the run's pool directory as stored there (the
        same ``<pool_subdir>/run-<tag>`` under that node's target)."""
        if p.storage is None or p.attach is not None:
            return {r: (roles[r], pools[r]) for r in ROLES}
        node, target = p.storage
        n = nodes[node]
        where = posixpath.join(target_path(n, n.target(target)), p.pool_subdir, posixpath.basename(pools["producer"]))
        return {r: (node, where) for r in ROLES}

    def route(self, p: PdParams, roles: Mapping[str, str], urls: Mapping[str, str],
              pools: Mapping[str, str]) -> str:
        """The route every prompt takes, as the plan and the evidence say it."""
        return (f"prompt -> producer on {roles['producer']} ({redact_url(urls['producer'])}, 1 output token; stores "
                f"the KV in {pools['producer']}) -> consumer on {roles['consumer']} ({redact_url(urls['consumer'])}, "
                f"{p.decode_tokens} output tokens; loads the KV from {pools['consumer']})")

    def plan(self, ctx: GateContext) -> list[PlannedStep]:
        """Every command the run sends, per node in the run's order (an engine's port is ``<port>``: a free one in the
        run; the run's tag ``<run>``)."""
        p: PdParams = ctx.params
        roles = self.roles(p, ctx.nodes)
        profs = {"producer": load_profile(p.producer_engine), "consumer": load_profile(p.consumer_engine)}
        if p.attach is not None:
            out, urls, pools = self._plan_attached(p, profs)
        else:
            out, urls, pools = self._plan_launched(ctx, p, roles, profs)
        route = self.route(p, roles, urls, pools)
        out.append(PlannedStep("(control host)", f"route: {route}"))
        n = len(p.prompt_tokens) * p.prompts_per_length
        warm = "; one unrelated warm-up prompt to each instance first (recorded, not in the statistics)" \
            if p.warmup else ""
        out.append(PlannedStep("(control host)", f"{n} prompts of {p.prompt_tokens} tokens, one at a time{warm}"))
        pn, cn = roles["producer"], roles["consumer"]
        at = self.counted_at(p, ctx.nodes, roles, pools)
        # the chunk files are listed where the pool is counted: a network mount's listing can lag another node's files
        ln, files = at["producer"][0], tuple(pool_files_argv(at["producer"][1], profs["producer"].pool_files))
        drop_on = list(dict.fromkeys([pn, cn, at["producer"][0], at["consumer"][0]]))
        side = " (on the pool's storage side)" if at["producer"][0] not in (pn, cn) else ""

        def log(role: str, where: str) -> list[PlannedStep]:  # an attached instance's log, where the run marks it
            cmd = getattr(p.attach, role).log if p.attach is not None else None
            return [PlannedStep(cmd.node, f"the {role}'s log {where} (fall-back lines)", ("sh", "-c", cmd.run))] \
                if cmd is not None else []

        for i in range(n):
            out += [PlannedStep(d, f"prompt {i + 1}/{n}: sync (what earlier requests stored, the consumer's fresh "
                                "prompts included, reaches the device before the producer's writes are counted)",
                                SYNC_ARGV) for d in drop_on]
            out.append(PlannedStep(ln, "the pool's chunk files before the prefill", files))
            out.append(PlannedStep(at["producer"][0], f"the producer's pool device counters before the prefill{side}",
                                   pool_blockstat_argv(at["producer"][1])))
            out += log("producer", "before the prefill")
            out.append(PlannedStep("(control host)", "producer: the prompt, 1 output token (prefill TTFT); its "
                                   "counters before and after"))
            out.append(PlannedStep(ln, "wait until the pool holds the prompt's KV (store complete)", files,
                                   repeats=True))
            if p.drop_caches:
                out += [PlannedStep(d, "sync and drop the page cache (recorded whether permitted)", DROP_CACHES_ARGV)
                        for d in drop_on]
            else:
                out += [PlannedStep(d, "sync (the store's writes reach the device before they are counted)",
                                    SYNC_ARGV) for d in dict.fromkeys([pn, at["producer"][0]])]
            out.append(PlannedStep(at["producer"][0], f"the producer's pool device counters after the prefill "
                                   f"(writes){side}", pool_blockstat_argv(at["producer"][1])))
            out += log("producer", "after the prefill")
            out.append(PlannedStep(at["consumer"][0], f"the consumer's pool device counters before the hand-off{side}",
                                   pool_blockstat_argv(at["consumer"][1])))
            out += log("consumer", "before the hand-off")
            out.append(PlannedStep("(control host)", f"consumer: the same prompt, {p.decode_tokens} output tokens "
                                   "(hand-off TTFT); its hit and lookup counters before and after"))
            out.append(PlannedStep(at["consumer"][0], f"the consumer's pool device counters after the hand-off "
                                   f"(reads){side}", pool_blockstat_argv(at["consumer"][1])))
            out += log("consumer", "after the hand-off")
            out += log("consumer", "before the fresh prompt")
            out.append(PlannedStep("(control host)", "consumer: a fresh prompt of the same length (recompute TTFT); "
                                   "its hit counters must not move"))
            out += log("consumer", "after the fresh prompt")
        out.append(PlannedStep(ln, "the pool's chunk files at the end", files))
        if p.attach is None:
            out.append(PlannedStep("(control host)", "stop both engines (process groups); their whole logs are "
                                   "checked for fall-back / connector-failure lines (a match is INVALID)"))
        else:
            out += log("producer", "at the end (what it gained over the run is checked for fall-back lines)")
            out += log("consumer", "at the end")
        return out

    def _plan_launched(self, ctx: GateContext, p: PdParams, roles: dict[str, str],
                       profs: dict[str, EngineProfile]) -> tuple[list[PlannedStep], dict[str, str], dict[str, str]]:
        """What a launched pair's set-up sends: pre-flight, directories, the model, both starts."""
        out: list[PlannedStep] = []
        lay: dict[str, dict[str, Any]] = {}
        checked: set[tuple] = set()
        built: set[str] = set()
        for role in ROLES:
            name, prof = roles[role], profs[role]
            node = ctx.nodes[name]
            local = getattr(node, "transport", "local") == "local"
            v = lay[role] = self._layout(ctx, p, prof, role, node, "<port>", "<run>")
            key = self._preflight_key(name, v, prof)
            if key not in checked:
                checked.add(key)
                out.append(PlannedStep(name, f"{role}: pre-flight: the engine's interpreter imports what the profile "
                                       "declares and reports its versions", tuple(preflight_argv(v["python"], prof))))
            if not local:
                out.append(PlannedStep(name, f"{role}: a free port on the node's loopback",
                                       (v["python"], "-c", FREE_PORT_CODE)))
            out.append(PlannedStep(name, f"{role}: create {v['run_dir']} and the shared pool directory {v['pool_dir']}",
                                   ("mkdir", "-p", v["run_dir"], v["pool_dir"],
                                    posixpath.join(v["run_dir"], "prometheus"))))
            if role == "producer":
                out += plan_pool(name, p.pool_device, "none", v["python"], v["pool_dir"], v["run_dir"], prof.pool_files)
            if p.random_weights:
                model_dir = random_model_dir(node.work_dir, p.model_config_inline, p.seed, p.random_weights_dtype)
                if name not in built:
                    built.add(name)
                    out.append(PlannedStep(name, f"{role}: build (or find) the random-weight model in {model_dir}",
                                           build_random_model_argv(v["python"], v["run_dir"], v["model_config"],
                                                                   model_dir, p.seed, p.random_weights_dtype)))
                v["model"] = model_dir
        one_node = roles["producer"] == roles["consumer"]
        for role in ROLES:
            prof, v = profs[role], lay[role]
            argv, env = prof.render_argv(v), prof.render_env(v)
            what = f"{role} ({_kv_role(argv)}): start a fresh {prof.name} (both at once): {shell_line(argv, env)}"
            # both start at once on one node: their spawns may reach it in either order
            if one_node and role == "producer":
                out.append(PlannedStep(roles[role], what + " (sent before or after the consumer's start)", tuple(argv),
                                       optional=True))
            else:
                out.append(PlannedStep(roles[role], what, tuple(argv)))
        if one_node:
            out.append(PlannedStep(roles["producer"], "producer: (its start, when sent after the consumer's)",
                                   tuple(profs["producer"].render_argv(lay["producer"])), optional=True))
        return (out, {r: f"http://127.0.0.1:{lay[r]['port']}" for r in ROLES},
                {r: lay[r]["pool_dir"] for r in ROLES})

    def _plan_attached(self, p: PdParams, profs: dict[str, EngineProfile]
                       ) -> tuple[list[PlannedStep], dict[str, str], dict[str, str]]:
        """An attached pair: each must answer its health endpoint; where each one's log stands at the start."""
        a = p.attach
        out = [PlannedStep("(control host)", f"attach: the {role} ({profs[role].name}) already running at "
                           f"{redact_url(getattr(a, role).url)}; its {profs[role].health_path} must answer 200 within "
                           f"{getattr(a, role).connect_timeout_s:.0f} s (else ERROR); prompts new to it (seed "
                           f"{p.seed} + a per-run nonce, recorded)") for role in ROLES]
        for role in ROLES:
            cmd = getattr(a, role).log
            if cmd is not None:
                out.append(PlannedStep(cmd.node, f"the {role}'s log where it stands at the start (fall-backs count "
                                       "from here)", ("sh", "-c", cmd.run)))
        return out, {r: getattr(a, r).url for r in ROLES}, {r: a.pool_path for r in ROLES}

    # ------------------------------------------------------------------------------------------- run

    def run(self, ctx: GateContext) -> WorkloadResult:
        p: PdParams = ctx.params
        roles = self.roles(p, ctx.nodes)
        profs = {"producer": load_profile(p.producer_engine), "consumer": load_profile(p.consumer_engine)}
        model_cfg = dict(p.model_config_inline)
        bpt = kv_bytes_per_token(model_cfg, profs["producer"].capabilities.kv_dtype)
        vocab = int(model_cfg.get("vocab_size", 4096))
        # attached instances and their pool outlive the run: prompts are new to them by a per-run nonce (recorded)
        seed = p.seed + (int(uuid.uuid4().hex[:8], 16) if p.attach is not None else 0)
        prompts = make_prompts(seed, p.prompt_tokens, p.prompts_per_length, vocab)
        fresh = make_prompts(seed + FRESH_SEED_OFFSET, p.prompt_tokens, p.prompts_per_length, vocab)
        warm = [make_prompts(seed + WARMUP_SEED_OFFSET + i, [min(p.prompt_tokens)], 1, vocab)[0] for i in range(2)]
        ev = PdEvidence(producer_profile=profs["producer"].name, consumer_profile=profs["consumer"].name,
                        kv_bytes_per_token=bpt, prompt_seed=seed, attached=p.attach is not None,
                        pool_drive=pool_drive_of(ctx, p.storage[0] if p.storage else roles["producer"]))
        pool: PoolHandle | None = None
        if p.attach is not None:
            a = p.attach
            handles: dict[str, Any] = {r: AttachedEngine(ctx, profs[r], getattr(a, r), roles[r]) for r in ROLES}
            lay = {r: {"pool_dir": a.pool_path, "run_dir": None} for r in ROLES}
        else:
            setup = self._setup_launched(ctx, p, roles, profs, model_cfg, ev)
            if isinstance(setup, WorkloadResult):
                return setup
            lay, handles, pool = setup
        ev.pool_dir = lay["producer"]["pool_dir"]
        at = self.counted_at(p, ctx.nodes, roles, {r: lay[r]["pool_dir"] for r in ROLES})
        ev.pool_device_side = "storage" if p.storage is not None and p.attach is None else "nodes"
        ev.pool_device_dir = {r: at[r][1] for r in ROLES}
        for r in ROLES:
            lay[r]["counted_at"] = at[r]
        ev.route = self.route(p, roles, {r: handles[r].base_url for r in ROLES}, {r: lay[r]["pool_dir"] for r in ROLES})
        expected = [stored_kv_tokens(r.prompt_tokens or 0, profs["producer"].kv_block_tokens) * bpt for r in prompts]

        runner = PhaseRunner(ctx, dict(handles), counters=True)
        records: list[PdPrompt] = []
        requests: dict[str, list[RequestRecord]] = {"prefill": [], "handoff": [], "recompute": []}
        # Both instances ready (launched: fresh, started at once; their start-up dominates the gate's time), stopped
        # at once, their logs read for fall-backs.
        session = EngineSession({"engines": runner}, parallel=True, logs=True)

        def handoffs() -> None:
            for role, h in handles.items():
                proc = h.current.proc if isinstance(h, LaunchedEngine) else None
                ev.instances[role] = PdInstance(role=role, node=roles[role], profile=profs[role].name,
                                                base_url=h.base_url, run_dir=lay[role]["run_dir"],
                                                pid=getattr(proc, "pid", None))
            if p.warmup:
                for role, req in zip(ROLES, warm):
                    rec = self._send(ctx, p, handles[role].base_url, req, 1)
                    ev.warmup[role] = {"request_id": rec.request_id, "ttft_s": rec.ttft_s, "error": rec.error}
            # Per prompt: prefill on the producer -> store complete -> cold -> hand-off -> a fresh prompt.
            for i, (req, new, exp) in enumerate(zip(prompts, fresh, expected)):
                ctx.progress(f"{ctx.gate.id}: prompt {i + 1}/{len(prompts)}: prefill -> tier -> decode")
                records.append(self._one(ctx, p, profs, roles, lay, runner, handles, i, req, new, exp, ev, requests))
            ln, ldir = lay["producer"]["counted_at"]
            ev.pool_end = pool_contents(ctx, ctx.transports[ln], ldir, 0, 0,
                                        "pd-pool-end", profs["producer"].pool_files)

        def after() -> None:
            if pool is not None:  # after both engines stopped (the loop device itself: the run's undo log)
                pool.close()
                ev.pool = pool.record.to_dict()
            for phase, recs in requests.items():
                write_gate_file(ctx.gate_dir / f"requests-{phase}.jsonl",
                                "".join(json.dumps(r.to_dict()) + "\n" for r in recs))

        def failed(why: str) -> WorkloadResult:  # the prompts handed off so far; the pool's record once it is closed
            ev.prompts = records
            return WorkloadResult(evidence=ev, error=why)

        stopped = session.run(handoffs, failed, after=after)
        if stopped is not None:
            return stopped
        logs = session.logs["engines"]
        patterns = list(dict.fromkeys(profs["producer"].fallback_patterns + profs["consumer"].fallback_patterns))
        fallback, ev.fallback_lines = session.fallback(logs, patterns, lambda role: f"{role} engine's")
        res = evaluate_pd(records, ev.instances, bpt, p.min_hit_rate, p.min_read_fraction, p.min_write_fraction, ev,
                          fallback=fallback)
        write_summary(ctx.gate_dir, "pd-summary.json", res)
        return res

    def _setup_launched(self, ctx: GateContext, p: PdParams, roles: dict[str, str], profs: dict[str, EngineProfile],
                        model_cfg: dict[str, Any], ev: PdEvidence
                        ) -> tuple[dict[str, dict[str, Any]], dict[str, LaunchedEngine], PoolHandle | None] | WorkloadResult:
        """Per role: pre-flight (once per node and check), a port, directories and files, the pool's device (after
        the producer's directories), the model (once per node); the two engines' handles (they start in the phase
        runner) and the pool's (closed once they have stopped)."""
        tag = uuid.uuid4().hex[:8]
        lay: dict[str, dict[str, Any]] = {}
        checked: dict[tuple, dict[str, str]] = {}
        built: dict[str, str] = {}
        pool: PoolHandle | None = None

        def failed(err: str) -> WorkloadResult:  # the pool made so far is closed: no engine will close it
            if pool is not None:
                pool.close()
                ev.pool = pool.record.to_dict()
            return WorkloadResult(evidence=ev, error=err)

        for role in ROLES:
            name, prof = roles[role], profs[role]
            t, node = ctx.transports[name], ctx.nodes[name]
            python = node_engine_python(p.python, node)
            v = self._layout(ctx, p, prof, role, node, 0, tag)
            key = self._preflight_key(name, v, prof)
            if key not in checked:
                versions, err = engine_preflight(ctx, t, name, prof, python, f"pd-{role}-preflight")
                if err:
                    return failed(err)
                checked[key] = versions
            ev.versions[role] = checked[key]
            v["port"] = engine_port(ctx, t, node, 0, python, f"pd-{role}-port")
            if role == "consumer" and name == roles["producer"] and v["port"] == lay["producer"]["port"]:
                v["port"] = engine_port(ctx, t, node, 0, python, "pd-consumer-port-again")  # the kernel gave it twice
            err, _ = stage_engine_files(ctx, t, prof, v, ctx.gate_dir / role, model_cfg, prof.lmcache,
                                        f"pd-{role}-mkdir")
            if err:
                return failed(err)
            if role == "producer":  # the shared pool directory exists now: make its device (loop) on it
                err, pool = prepare_pool(ctx, t, name, p.pool_device, "none", python, v["pool_dir"], v["run_dir"],
                                         prof.pool_files, "pd-pool")
                ev.pool = pool.record.to_dict()
                if err:
                    return failed(err)
            if p.random_weights:
                if name not in built:
                    err, built[name], desc = build_random_model(ctx, t, python, node, v["run_dir"], v["model_config"],
                                                                model_cfg, p.seed, p.random_weights_dtype,
                                                                f"pd-{role}-make-model")
                    if err:
                        return failed(err)
                    ev.random_model = desc
                v["model"] = ev.model_dir_on_node[role] = built[name]
            lay[role] = v
        handles: dict[str, LaunchedEngine] = {}
        for role in ROLES:
            name, prof, v = roles[role], profs[role], lay[role]
            url, _ = client_base_url(ctx.transports[name], ctx.nodes[name], "127.0.0.1", v["port"])
            handles[role] = LaunchedEngine(ctx, ctx.transports[name], prof, prof.render_argv(v), prof.render_env(v),
                                           url, v["run_dir"], (role,), [])
        return lay, handles, pool

    def _one(self, ctx: GateContext, p: PdParams, profs: dict[str, EngineProfile], roles: dict[str, str],
             lay: dict[str, dict[str, Any]], runner: PhaseRunner, handles: dict[str, Any], i: int,
             req: CompletionRequest, new: CompletionRequest, expected: int, ev: PdEvidence,
             requests: dict[str, list[RequestRecord]]) -> PdPrompt:
        """One prompt's hand-off, as the module's docstring describes it."""
        pn, cn = roles["producer"], roles["consumer"]
        pattern = profs["producer"].pool_files
        clock = ctx.clock
        # earlier stores (the warm-ups', the consumer's of its fresh prompts) reach the device now, so the producer's
        # write counters around its prefill count its own store
        (dpn, dir_p), (dcn, dir_c) = lay["producer"]["counted_at"], lay["consumer"]["counted_at"]
        # the pool's chunk files are listed where its device is counted (the storage side, with pool_storage): a
        # network mount's listing on the producer's node can lag the files the consumer's node wrote (sshfs caches it)
        pt, pool_p = ctx.transports[dpn], dir_p
        on = list(dict.fromkeys([pn, cn, dpn, dcn]))  # the storage side's too: its writes reach its device
        for n in on:
            ctx.steps.run(ctx.transports[n], f"pd-sync-before-{i}-{n}", SYNC_ARGV, timeout_s=300)
        before = pool_contents(ctx, pt, pool_p, 0, 0, f"pd-pool-before-{i}", pattern)
        store: dict[str, Any] = {}

        def prefill() -> RequestRecord:
            t0 = clock.now()
            rec = self._send(ctx, p, handles["producer"].base_url, req, 1)
            first = t0 + (rec.ttft_s or 0.0)
            pool = pool_contents(ctx, pt, pool_p, before.bytes + expected, p.populate_timeout_s, f"pd-pool-store-{i}",
                                 pattern)
            store["t"] = clock.now()
            store["wait_s"] = store["t"] - first if rec.ok else None
            store["added"] = pool.bytes - before.bytes
            if p.drop_caches:  # the consumer is to read the tier's device, not this machine's page cache
                drops = [drop_caches(ctx, ctx.transports[n], f"pd-drop-caches-{i}-{n}") for n in on]
                ev.page_cache_dropped = all(d.dropped for d in drops) and ev.page_cache_dropped is not False
                ev.page_cache_drop_error = ev.page_cache_drop_error or \
                    ("; ".join(d.error for d in drops if d.error) or None)
            else:  # the store's writes reach the device before the producer's counters are read again
                ev.page_cache_dropped = False
                for n in dict.fromkeys([pn, dpn]):
                    ctx.steps.run(ctx.transports[n], f"pd-sync-{i}" + ("" if n == pn else f"-{n}"), SYNC_ARGV,
                                  timeout_s=300)
            store["cold_s"] = clock.now() - store["t"]
            return rec

        def handoff() -> RequestRecord:
            t0 = clock.now()
            rec = self._send(ctx, p, handles["consumer"].base_url, req, p.decode_tokens)
            store["gap_s"] = t0 - store["t"] + rec.ttft_s if rec.ttft_s is not None else None
            return rec

        # both roles' device phases bracket only their own request: on one storage-side device the producer's store
        # phase and the consumer's hand-off phase are attributed by when they ran
        pre = runner.phase(f"prefill-{i}", prefill, on=["producer"],
                           device=lambda: self._device(ctx, dpn, dir_p, "producer", f"pd-producer-blockstat-{i}", ev))
        hand = runner.phase(f"handoff-{i}", handoff, on=["consumer"],
                            device=lambda: self._device(ctx, dcn, dir_c, "consumer", f"pd-consumer-blockstat-{i}", ev))
        rec = runner.phase(f"recompute-{i}", lambda: self._send(ctx, p, handles["consumer"].base_url, new,
                                                                 p.decode_tokens), on=["consumer"])
        if i == 0:
            for role, phase in (("producer", pre), ("consumer", hand)):
                start = metric_total(phase.engines[role].metrics_before or [], ["process_start_time_seconds"])
                ev.instances[role] = ev.instances[role].model_copy(update={"start_time_s": start})
        for phase, ph in (("prefill", pre), ("handoff", hand), ("recompute", rec)):
            requests[phase].append(ph.output)
        hm = profs["consumer"].hit_metrics
        c = hand.engines["consumer"]
        return PdPrompt(
            request_id=req.request_id, prompt_tokens=req.prompt_tokens or 0,
            errors=[f"{phase}: {ph.output.error}" for phase, ph in (("prefill", pre), ("handoff", hand),
                                                                    ("recompute", rec)) if not ph.output.ok],
            prefill_ttft_s=pre.output.ttft_s, handoff_ttft_s=hand.output.ttft_s, recompute_ttft_s=rec.output.ttft_s,
            expected_kv_bytes=expected, pool_bytes_added=store.get("added"), store_wait_s=store.get("wait_s"),
            cold_s=store.get("cold_s"), store_to_first_token_s=store.get("gap_s"),
            producer_hit_tokens=pre.engines["producer"].delta(profs["producer"].hit_metrics.hit_tokens),
            handoff_hit_tokens=c.delta(hm.hit_tokens), handoff_query_tokens=c.delta(hm.query_tokens),
            recompute_hit_tokens=rec.engines["consumer"].delta(hm.hit_tokens),
            producer_write_bytes=write_bytes_between(pre.device_before, pre.device_after),
            consumer_read_bytes=read_bytes_between(hand.device_before, hand.device_after))

    # -------------------------------------------------------------------------------------- helpers

    def _send(self, ctx: GateContext, p: PdParams, base_url: str, req: CompletionRequest,
              max_tokens: int) -> RequestRecord:
        """One request, alone; the gate's cancellation drops it (and then raises Cancelled)."""
        ctx.cancel.check()
        rec = run_requests_sync(base_url, [dataclasses.replace(req, max_tokens=max_tokens)], p.served_model_name,
                                concurrency=1, timeout_s=ctx.cancel.bound_timeout_s(p.request_timeout_s),
                                transport=ctx.http, stop=ctx.cancel)[0]
        ctx.cancel.check()
        return rec

    @staticmethod
    def _device(ctx: GateContext, node: str, pool_dir: str, role: str, step: str,
                ev: PdEvidence) -> PoolDeviceStat | None:
        """The pool's block device and its counters for a role, on the node where they are counted (its own, or the
        pool's storage side): the one probe G2 and kv-read use."""
        dev, res = run_probe(ctx, ctx.transports[node], pool_device_probe(pool_dir), step)
        if dev is None:
            ev.pool_device_error = ev.pool_device_error or f"{role}: on {node}: {res.summary()}"
            return None
        ev.pool_device = {**ev.pool_device, role: f"{dev.source} ({dev.maj_min})"}
        ev.pool_device_node = {**ev.pool_device_node, role: node}
        return dev


def _kv_role(argv: Sequence[str]) -> str:
    """Pure: the KV role a launch command gives its connector (``kv_role`` in vLLM's --kv-transfer-config), for
    the plan; "role not in argv" for an engine configured otherwise."""
    for a in argv:
        if a.startswith("{") and "kv_role" in a:
            try:
                return str(json.loads(a).get("kv_role"))
            except ValueError:
                break
    return "role not in argv"
