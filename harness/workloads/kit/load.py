"""The load kit: g2-load's spec and params, its evidence and token accounting, its evaluator and re-derivation,
the requests of a point (synthetic, trace, multi-turn), and the load-point runner (:class:`LoadPoints`) that g2-load,
both arms of g2-gain and its capacity sweep call. What a load gate measures and how it is judged:
harness/workloads/g2_load.py."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import re
import time
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ...engines import EngineProfile
from ...engines.client import STOP_POLL_S, CompletionRequest, RequestRecord
from ...engines.prompts import IdsAsText, load_tokenizer
from ...engines.load import (LoadPoint, LoadRecord, arrival_offsets, client_priority, closed_loop, knee, load_point,
                            open_loop)
from ...endurance import DriveRating, combined, endurance
from ...errors import ConfigError
from ...load.prompts import block_ids, prompt_ids
from ...load.reuse import reuse_stats
from ...load.synth import FanOutShape, MultiTurnShape, SessionRecoveryShape, TraceShape, shape_trace
from ...load.traces import MAX_TRACE_BYTES, Trace, cut, read_trace, scale_time, trace_lines
from ...paths import given_or_shipped
from ...parsers.pooldev import PoolDeviceStat, read_bytes_between
from ...parsers.prometheus import Sample, counter_delta, metric_total
from ...safeio import read_bytes
from ...stats import Interval, median_interval
from .attach import AttachParams, NodeCommand
from .base import ControlFile, Evidence, GateContext, ValidityCheck, WorkloadResult, drive_rating, file_error_text, \
    write_gate_file
from .phases import PhaseRunner
from .g2 import G2EngineParams, G2Evidence, G2Params, G2Procedure, model_config_files

# ------------------------------------------------------------------------------------------------- params


class MultiTurnLoad(BaseModel):
    """``load: {multi_turn: ...}``: multi-turn sessions served round-robin, turn by turn (every session's turn 1,
    then every session's turn 2, ...), each turn's prompt the session's whole history (the previous turn's prompt,
    a reply of ``reply_tokens``, a new user message of ``user_tokens``), requests ``1 / rate_rps`` s apart in that
    order. Replayed as a trace (one point, ``trace``) synthesised from these numbers
    (harness.load.synth.multi_turn_trace): pure, the same trace in the plan and the run, its prompts seeded as any
    trace's (by the gate's seed, the point and the trial)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sessions: int = Field(ge=2, le=10_000)
    turns: int = Field(ge=2, le=100)
    first_prompt_tokens: int = Field(ge=2, le=1_000_000)
    user_tokens: int = Field(ge=1, le=1_000_000)
    reply_tokens: int = Field(default=0, ge=0, le=1_000_000)
    rate_rps: float = Field(default=20.0, gt=0)   # the round-robin's requests per second (above the engine's pace:
                                                  # the throughput is then the engine's, not the schedule's)

    def shape(self) -> MultiTurnShape:
        # every request's output is the gate's max_tokens (the trace's 4096, the most max_tokens allows, is cut to it)
        return MultiTurnShape(sessions=self.sessions, turns=self.turns, first_prompt_tokens=self.first_prompt_tokens,
                              user_tokens=self.user_tokens, reply_tokens=self.reply_tokens, output_tokens=4096,
                              rate_rps=self.rate_rps)


MULTI_TURN_PATH = "(multi-turn sessions)"  # the trace's name in the evidence: synthesised, not read from a file
# ``load:``'s declared shapes: the key in the gate -> the shape's name in harness.load.synth.SHAPES
SHAPE_KEYS = {"multi_turn": "multi-turn", "session_recovery": "session-recovery", "fan_out": "fan-out",
              "sessions": "sessions"}


class LoadSpec(BaseModel):
    """The ``load:`` block: exactly one of a concurrency ladder, a rate ladder, a trace file, or a declared shape
    (``multi_turn``, ``session_recovery``, ``fan_out``, ``sessions``: a trace synthesised from it by
    harness.load.synth, the same one ``kvgate trace synth --shape`` writes). A trace ``path`` that is not there as
    given is kvgate's shipped trace of that name (``traces/mooncake-conversation-3000.jsonl``, harness.paths)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    concurrency: list[int] | None = Field(default=None, min_length=1)
    rates_rps: list[float] | None = Field(default=None, min_length=1)
    burstiness: float | None = Field(default=None, gt=0)  # open loop: gamma shape of the gaps (1: Poisson)
    path: str | None = None                                # trace: its file on the control host
    format: Literal["mooncake", "bailian"] | None = None   # trace: its format (default: from its first line)
    time_scale: float | None = Field(default=None, gt=0)   # trace: timestamps x this (0.5: twice as fast)
    max_requests: int | None = Field(default=None, ge=1)   # trace: its first requests only
    max_duration_s: float | None = Field(default=None, gt=0)  # trace: the requests arriving within this time
    block_tokens: int | None = Field(default=None, ge=1)  # trace: its tokens per hash id (default: the format's)
    tokens_per_block: int | None = Field(default=None, ge=1)  # trace: re-mapped to this many tokens per hash id
    # trace: replayed in its order by this many users, each sending its next request when its previous one finished
    # (a closed loop: the timestamps are not used, so a slower machine serves the same sequence, not an overload)
    users: int | None = Field(default=None, ge=1, le=1024)
    multi_turn: MultiTurnLoad | None = None                # multi-turn sessions, replayed as a trace
    session_recovery: SessionRecoveryShape | None = None   # sessions resumed with their whole context
    fan_out: FanOutShape | None = None                     # single requests fanning out from shared system prompts
    sessions: TraceShape | None = None                     # sessions sharing system prompts, Poisson starts

    @field_validator("path")
    @classmethod
    def _shipped(cls, v: str | None) -> str | None:
        return None if v is None else str(given_or_shipped(v, "traces"))

    @model_validator(mode="after")
    def _one_shape(self) -> "LoadSpec":
        given = [k for k in ("concurrency", "rates_rps", "path", *SHAPE_KEYS) if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of concurrency (closed loop), rates_rps (open loop), path (a trace) "
                             "or a shape (multi_turn, session_recovery, fan_out, sessions)"
                             + (f"; got {', '.join(given)}" if given else ""))
        shape = self.shape
        if shape is not None and shape[0] != "multi-turn":
            bad = shape[1].check()
            if bad:
                raise ValueError(f"{given[0]}: {'; '.join(bad)}")
        if self.concurrency is not None and any(c < 1 for c in self.concurrency):
            raise ValueError("concurrency: every level must be >= 1")
        if self.rates_rps is not None and any(not r > 0 for r in self.rates_rps):
            raise ValueError("rates_rps: every rate must be > 0")
        for ladder in (self.concurrency, self.rates_rps):
            if ladder is not None and len(set(ladder)) != len(ladder):
                raise ValueError("a load appears twice in the ladder")
        if self.burstiness is not None and self.rates_rps is None:
            raise ValueError("burstiness belongs to an open loop (rates_rps)")
        # a declared shape is cut like a file (max_requests, max_duration_s); its format and blocks are its own
        file_only = [k for k in ("format", "block_tokens") + (() if self.shape is not None else
                                                             ("max_requests", "max_duration_s"))
                     if getattr(self, k) is not None]
        if file_only and self.path is None:
            raise ValueError(f"{', '.join(file_only)}: only for a trace file (path)")
        trace_only = [k for k in ("time_scale", "tokens_per_block", "users") if getattr(self, k) is not None]
        if trace_only and self.kind != "trace":
            raise ValueError(f"{', '.join(trace_only)}: only for a trace (path or a shape)")
        if self.users is not None and self.time_scale is not None:
            raise ValueError("time_scale: a trace replayed by users does not use its timestamps")
        return self

    @property
    def shape(self) -> tuple[str, Any] | None:
        """The declared shape: (its name in harness.load.synth.SHAPES, its dataclass), or None."""
        for key, name in SHAPE_KEYS.items():
            v = getattr(self, key)
            if v is not None:
                return name, (v.shape() if key == "multi_turn" else v)
        return None

    @property
    def kind(self) -> Literal["closed", "open", "trace"]:
        """A trace file and a declared shape are both a trace replay."""
        return "closed" if self.concurrency is not None else "open" if self.rates_rps is not None else "trace"

    def points(self) -> list[tuple[str, float]]:
        """The ladder in ascending load: (label, load); a trace is one point."""
        if self.concurrency is not None:
            return [(f"c{c}", float(c)) for c in sorted(self.concurrency)]
        if self.rates_rps is not None:
            return [(f"r{r:g}", float(r)) for r in sorted(self.rates_rps)]
        return [("trace", 0.0)]


class LoadAttachParams(BaseModel):
    """g2-load's ``attach:``: the engine's URL (and metrics URL), its log command, how soon it must answer. No cold
    procedure: g2-load never makes the engine cold (its prompts are new at every point instead)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str
    metrics_url: str | None = None
    log: NodeCommand | None = None
    connect_timeout_s: float = Field(default=30.0, gt=0)

    _url = field_validator("url", "metrics_url")(AttachParams._url.__func__)

    def as_g2(self) -> AttachParams:
        """The same engine as g2-ttft's set-up takes it (an empty cold procedure, never run)."""
        return AttachParams.model_construct(url=self.url, metrics_url=self.metrics_url, restart=[], log=self.log,
                                            drop_caches_on=None, connect_timeout_s=self.connect_timeout_s,
                                            ready_timeout_s=None)


class G2LoadParams(G2EngineParams):
    """g2-load's ``params:``: the engine (as every G2 workload: launched or ``attach:``), the load, the SLOs and
    the bounds that make a point valid, and the shape of the synthetic prompts."""

    attach: LoadAttachParams | None = None  # type: ignore[assignment]
    load: LoadSpec
    requests_per_point: int = Field(default=16, ge=1, le=100_000)  # closed and open loops
    trials: int = Field(default=6, ge=1, le=100)  # 6: the fewest that give a 95 % interval for the median
    ttft_slo_s: float = Field(gt=0)
    tpot_slo_s: float | None = Field(default=None, gt=0)
    knee_percentile: Literal[50, 90, 95, 99] = 95
    max_client_lag_p99_s: float = Field(default=0.001, gt=0)
    # the share of a point's requests that may fail before the point is INVALID (0: one failed request is enough);
    # within it a failed request still counts, as an infinite TTFT in the percentiles
    max_failed_share: float = Field(default=0.0, ge=0, le=1)
    # attempts the gate may set aside as spoiled by its own client (client lag over the bound) and repeat with new
    # prompts, per engine (g2-gain: per arm); 0: a spoiled attempt makes the gate INVALID
    repeat_spoiled: int = Field(default=0, ge=0, le=20)
    prompt_tokens: int = Field(default=512, ge=2)
    shared_prefix_tokens: int = Field(default=256, ge=0)  # per prefix group, at the start of every prompt
    prefix_groups: int = Field(default=1, ge=1)           # distinct shared prefixes, requests round-robin
    max_tokens: int = Field(default=16, ge=1, le=4096)    # output tokens per request (a trace's are cut to it)

    @model_validator(mode="after")
    def _prefix(self) -> "G2LoadParams":
        synthetic = ("requests_per_point", "prompt_tokens", "shared_prefix_tokens", "prefix_groups")
        given = [k for k in synthetic if k in self.model_fields_set]
        if self.load.kind == "trace" and given:
            raise ValueError(f"{', '.join(given)}: shape synthetic prompts; a trace's requests are its own")
        if self.shared_prefix_tokens >= self.prompt_tokens:
            raise ValueError(f"shared_prefix_tokens ({self.shared_prefix_tokens}) must be below prompt_tokens "
                             f"({self.prompt_tokens}): every prompt has tokens of its own")
        return self


# ----------------------------------------------------------------------------------------------- evidence


class LoadModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TokenAccounting(LoadModel):
    """One point × trial's prompt tokens by where their KV came from, from the engine's counters read before and
    after it: ``prompt_tokens`` = ``memory_hit_tokens`` + ``tier_hit_tokens`` + ``recomputed_tokens`` (None where
    the engine does not expose the counter; recomputed then unknown). The tier's hits are reconciled with the
    pool device's read bytes over the same window (``read_fraction``); its write bytes while serving give the
    store bandwidth."""

    prompt_tokens: float
    prompt_tokens_source: Literal["engine", "sent"]  # the engine's counter, or the prompts kvgate sent
    memory_hit_tokens: float | None = None
    tier_hit_tokens: float | None = None
    recomputed_tokens: float | None = None
    memory_hit_share: float | None = None
    tier_hit_share: float | None = None
    recomputed_share: float | None = None
    kv_bytes_per_token: int | None = None
    tier_hit_kv_bytes: float | None = None     # tier hit tokens x KV bytes per token
    device_read_bytes: int | None = None       # the pool's device over the point's window
    read_fraction: float | None = None         # device_read_bytes / tier_hit_kv_bytes
    device_write_bytes: int | None = None
    window_s: float | None = None              # the point's duration (first send to last stream end)
    store_write_gb_s: float | None = None      # device_write_bytes / window_s, decimal GB/s
    # the tier's hits by level, where the engine counts its RAM level (LMCache's local_cpu): RAM + device = tier
    ram_hit_tokens: float | None = None
    device_hit_tokens: float | None = None
    device_hit_share_of_tier: float | None = None  # device_hit_tokens / tier_hit_tokens
    # what serving costs the pool's drives: bytes written per million prompt tokens served
    device_write_bytes_per_mtok: float | None = None


class PointTrial(LoadModel):
    """One load point in one trial: its load, its figures (harness.engines.load.LoadPoint), its token
    accounting, the file of its requests, and why it is INVALID (or failed), if it is."""

    label: str                                   # c4, r2.5, trace: the suffix of its metrics (ttft_p95_s@c4)
    load: float                                  # users (closed), requests/s (open), the trace's mean rate
    load_kind: Literal["concurrency", "rate_rps", "trace"]
    trial: int                                   # 1-based
    attempt: int = 0                             # 0; k: the k-th repeat of an attempt set aside as spoiled
    seed: int                                    # of its prompts (and of its arrivals, open loop)
    requests: int
    requests_file: str                           # requests-<label>-t<trial>.jsonl in the gate's directory
    counters_file: str | None = None             # counters-<label>-t<trial>.json: the engine's counters read
                                                 # before and after (what the accounting is computed from)
    extra_counters: dict[str, float | None] | None = None  # deltas of the caller's further counters
    started_unix_s: float | None = None          # wall clock at the point's start (sent_s counts from it)
    figures: LoadPoint | None = None
    accounting: TokenAccounting | None = None
    invalid_reason: str | None = None
    error: str | None = None


# A figure over trials: its median, its 95 % confidence interval for the median (none from too few trials), the
# trials that gave it and the trials asked for (harness.stats.Interval; the evidence's name for it)
MetricInterval = Interval


class PointSummary(LoadModel):
    """One load point over its trials: each figure (``FIGURES``) as a :class:`MetricInterval`."""

    label: str
    load: float
    load_kind: Literal["concurrency", "rate_rps", "trace"]
    figures: dict[str, MetricInterval] = {}
    invalid_trials: int = 0


class TraceInfo(LoadModel):
    """The trace replayed: where from, how it was cut and scaled, and its shape after that."""

    path: str
    format: str
    block_tokens: int
    tokens_per_block: int
    time_scale: float
    requests: int
    duration_s: float
    sha256: str
    # the hit rate of an unbounded prefix cache over the trace (harness/load/reuse.py): the bound the measured
    # memory + tier hit shares are compared with
    unbounded_hit_rate: float | None = None
    multi_turn: MultiTurnLoad | None = None   # the sessions' shape when the trace was synthesised from it
    shape: str | None = None                  # the declared shape it was synthesised from (harness.load.synth)
    shape_params: dict[str, Any] | None = None
    users: int | None = None                  # replayed in order by this many users (closed loop), not by its times


class G2LoadEvidence(Evidence):
    """g2-load's evidence: the engine, the load and its bounds, every point × trial (figures, accounting, its
    requests file, why INVALID) and the points over trials (median, CI), the knee per trial and over trials."""

    # the engine, as g2-ttft records it
    engine_profile: str | None = None
    engine: str | None = None
    engine_version: str | None = None
    versions: dict[str, str] = {}
    base_url: str | None = None
    client_path: str | None = None
    attached: bool = False
    pool_dir: str | None = None
    pool_device: str | None = None
    pool_device_maj_min: str | None = None
    pool_device_error: str | None = None
    kv_bytes_per_token: int | None = None
    random_model: dict[str, Any] | None = None
    warmup: dict[str, Any] = {}
    fallback_lines: list[str] = []
    # the load
    load_kind: Literal["closed", "open", "trace"] | None = None
    loads: list[float] = []
    burstiness: float | None = None
    trace: TraceInfo | None = None
    trials: int | None = None
    requests_per_point: int | None = None
    prompt_tokens: int | None = None
    shared_prefix_tokens: int | None = None
    prefix_groups: int | None = None
    max_tokens: int | None = None
    prompt_seed: int | None = None
    prompt_kind: Literal["token_ids", "text"] | None = None  # text: the API takes text only (api.prompt_format)
    tokenizer: str | None = None                 # what built the text prompts
    # the bounds
    ttft_slo_s: float | None = None
    tpot_slo_s: float | None = None
    knee_percentile: int | None = None
    knee_figure: str | None = None               # the figure the knee is judged on: ttft_p95_s
    max_client_lag_p99_s: float | None = None
    max_failed_share: float | None = None        # None in a bundle of an older kvgate: failures were not bounded
    min_read_fraction: float | None = None
    pool: dict[str, Any] | None = None           # the pool as made for the run (device kind, loop device, cold regime)
    device_reads: bool | None = None             # the profile proves tier hits by the pool device's read bytes
    repeat_spoiled: int | None = None            # attempts that may be set aside as spoiled by the client
    client_priority: str | None = None           # how the load client's thread was scheduled (its nice value)
    # the results
    points: list[PointTrial] = []
    spoiled: list[PointTrial] = []               # attempts set aside (client lag over the bound), each repeated
    summary: list[PointSummary] = []
    knee_per_trial: list[float | None] = []      # None: even the lowest load missed the SLO
    knee: MetricInterval | None = None
    max_goodput_per_trial: list[float] = []
    max_goodput: MetricInterval | None = None


# ------------------------------------------------------------------------------------------------ metrics


# Per point (FIGURE@LABEL) -> unit. The LoadPoint figures, then the accounting's.
FIGURES: dict[str, str] = {
    "ttft_p50_s": "s", "ttft_p90_s": "s", "ttft_p95_s": "s", "ttft_p99_s": "s", "tpot_p50_s": "s",
    "e2e_p50_s": "s", "e2e_p99_s": "s", "request_rate_rps": "/s", "output_token_rate_tps": "tokens/s",
    "goodput_rps": "/s", "client_lag_p99_s": "s",
    "memory_hit_share": "ratio", "tier_hit_share": "ratio", "recomputed_share": "ratio", "read_fraction": "ratio",
    "device_write_bytes": "B", "store_write_gb_s": "GB/s",
}
SUMMARY_METRICS: dict[str, str] = {"knee_concurrency": "count", "knee_rate_rps": "/s", "max_goodput_rps": "/s",
                                   # a trace's cache-served share over its ideal (hit_efficiency_per_trial)
                                   "hit_efficiency": "ratio"}
LABEL_RE = re.compile(r"c[0-9]+|r[0-9][0-9.e+-]*|trace")


def point_metric_unit(name: str, figures: dict[str, str]) -> str | None:
    """Pure: the unit of a per-point metric ``FIGURE@LABEL`` (``ttft_p95_s@c4``: closed loop, 4 users;
    ``goodput_rps@r2.5``; ``ttft_p99_s@trace``) from ``figures`` (figure -> unit); None for any other name."""
    fig, at, label = name.partition("@")
    return figures.get(fig) if at and LABEL_RE.fullmatch(label) else None


# --------------------------------------------------------------------------------------- pure evaluation


@dataclass(frozen=True)
class Counters:
    """The engine counter names g2-load's accounting reads (empty: not exposed)."""

    prompt_tokens: list[str]
    memory_hit_tokens: list[str]
    tier_hit_tokens: list[str]
    extra: tuple[str, ...] = ()   # more counters recorded per point (their deltas: PointTrial.extra_counters)
    ram_hit_tokens: tuple[str, ...] = ()  # of the tier's hits, those its RAM level served (per-level counters)

    @property
    def any(self) -> bool:
        return bool(self.prompt_tokens or self.memory_hit_tokens or self.tier_hit_tokens)


def accounting_counters(prof: EngineProfile) -> Counters:
    """Pure: what the profile declares: ``hit_metrics`` (tier hits; prompt tokens and engine-memory hits where
    it names them), else its per-level counters (``capabilities.level_counters``)."""
    hm = prof.hit_metrics
    level = prof.capabilities.level_counters
    prompt = list(hm.prompt_tokens) if hm and hm.prompt_tokens else [level + "prompt_tokens_total"] if level else []
    memory = (list(hm.memory_hit_tokens) if hm and hm.memory_hit_tokens
              else [level + "gpu_hit_tokens_total"] if level else [])
    tier = list(hm.hit_tokens) if hm else [level + "external_hit_tokens_total"] if level else []
    ram = (level + "ram_hit_tokens_total",) if level else ()
    return Counters(prompt, memory, tier, ram_hit_tokens=ram)


def token_accounting(sent_prompt_tokens: int, prompt_delta: float | None, memory_delta: float | None,
                     tier_delta: float | None, kv_bytes_per_token: int | None, read_bytes: int | None,
                     write_bytes: int | None, window_s: float | None,
                     ram_delta: float | None = None) -> TokenAccounting:
    """Pure: a point's accounting from its counter deltas and device bytes. Prompt tokens are the engine's
    count, or what was sent when it has none; recomputed = prompt - memory hits - tier hits (known only when
    both hit counters are); shares of the prompt tokens."""
    prompt = prompt_delta if prompt_delta is not None else float(sent_prompt_tokens)
    recomputed = None if memory_delta is None or tier_delta is None else prompt - memory_delta - tier_delta

    def share(x: float | None) -> float | None:
        return None if x is None or prompt <= 0 else x / prompt

    tier_bytes = None if tier_delta is None or kv_bytes_per_token is None else tier_delta * kv_bytes_per_token
    fraction = None if read_bytes is None or not tier_bytes else read_bytes / tier_bytes
    store = None if write_bytes is None or not window_s else write_bytes / window_s / 1e9
    device_hits = None if ram_delta is None or tier_delta is None else max(tier_delta - ram_delta, 0.0)
    return TokenAccounting(
        ram_hit_tokens=ram_delta, device_hit_tokens=device_hits,
        device_hit_share_of_tier=None if device_hits is None or not tier_delta else device_hits / tier_delta,
        device_write_bytes_per_mtok=endurance(write_bytes, prompt, None, window_s).write_bytes_per_mtok,
        prompt_tokens=prompt, prompt_tokens_source="engine" if prompt_delta is not None else "sent",
        memory_hit_tokens=memory_delta, tier_hit_tokens=tier_delta, recomputed_tokens=recomputed,
        memory_hit_share=share(memory_delta), tier_hit_share=share(tier_delta), recomputed_share=share(recomputed),
        kv_bytes_per_token=kv_bytes_per_token, tier_hit_kv_bytes=tier_bytes, device_read_bytes=read_bytes,
        read_fraction=fraction, device_write_bytes=write_bytes, window_s=window_s, store_write_gb_s=store)


def points_endurance(points: list[PointTrial], drive: DriveRating | None) -> dict[str, Any] | None:
    """Pure: what the run's points cost the pool's drive, over every point x trial that was served (docs/endurance
    .md): the pool device's bytes written over each point's window, the prompt tokens served in it. The KV the tier
    stored is not counted per point (the pool's growth is read only where a gate waits for it), so no write
    amplification here. None when no point has its accounting."""
    accs = [pt.accounting for pt in points if pt.accounting is not None]
    if not accs:
        return None
    return combined([endurance(a.device_write_bytes, a.prompt_tokens, None, a.window_s) for a in accs],
                    drive).to_dict()


def hits_by_level(points: list[PointTrial], pool: dict[str, Any] | None) -> str | None:
    """Pure: where a serving gate's tier hits came from, over every point × trial, in one sentence (the first line
    of its report section): the device's share of the tier's hits (its read bytes over the KV they claim), the
    engine's RAM level where it counts one, and the pool's device and cold regime. None when nothing claimed a
    tier hit."""
    accs = [pt.accounting for pt in points if pt.accounting is not None and pt.accounting.tier_hit_tokens]
    if not accs:
        return None
    tier = sum(a.tier_hit_tokens or 0.0 for a in accs)
    claimed = sum(a.tier_hit_kv_bytes or 0.0 for a in accs)
    read = [a.device_read_bytes for a in accs]
    ram = [a.ram_hit_tokens for a in accs]
    where = ""
    if pool:
        loop = pool.get("loop") or {}
        regime = {"evict": "pages dropped on store and after each read", "odirect": "O_DIRECT",
                  "none": "none declared"}.get(pool.get("cold_regime") or "none", str(pool.get("cold_regime")))
        dev = f"{loop['device']}, a loop device of its own" if loop.get("device") else "the pool directory's device"
        where = f" ({dev}; cold regime: {regime})"
    if any(r is None for r in read):
        dev_part = f"the pool's device{where} could not be read for every point: the tier's hits are unproven"
    else:
        share = min(sum(read) / claimed, 1.0) if claimed else 0.0
        dev_part = (f"the pool's device{where} served {100 * share:.0f} % of the tier's hits "
                    f"({sum(read):,} B read for {claimed:,.0f} B of KV claimed)")
    ram_part = ""
    if all(r is not None for r in ram):
        ram_part = f"; the engine's RAM level {100 * sum(ram) / tier:.0f} %" if tier else ""
    return f"Where the tier's {tier:,.0f} hit tokens came from: {dev_part}{ram_part}."


def failed_issue(fig: LoadPoint, max_failed_share: float) -> str | None:
    """Pure: why a point's failed requests make it INVALID: a failed share above ``max_failed_share`` (None when
    within it)."""
    if not fig.failed or fig.failed <= max_failed_share * fig.requests:
        return None
    return (f"{fig.failed} of {fig.requests} requests failed ({fig.failed / fig.requests:.0%}; {fig.ok} served), "
            f"above the gate's max_failed_share {max_failed_share:g}: a failed request is an infinite TTFT, not a "
            "faster one")


def point_invalid(fig: LoadPoint, acc: TokenAccounting | None, max_client_lag_p99_s: float,
                  min_read_fraction: float, device_reads: bool, device_error: str | None = None,
                  max_failed_share: float = 0.0) -> str | None:
    """Pure: why a point's figures would not mean what they claim: failed requests above ``max_failed_share``, the
    client's lag, or tier hits the pool's device did not read (None when valid)."""
    failed = failed_issue(fig, max_failed_share)
    if failed:
        return failed
    if fig.client_lag_p99_s > max_client_lag_p99_s:
        return (f"client lag p99 {fig.client_lag_p99_s * 1e3:.3f} ms exceeds the {max_client_lag_p99_s * 1e3:g} ms "
                f"bound: requests left later than scheduled, so the client, not the server, set the load")
    return read_issue(acc, min_read_fraction, device_reads, device_error)


def read_issue(acc: TokenAccounting | None, min_read_fraction: float, device_reads: bool,
               device_error: str | None = None) -> str | None:
    """Pure: tier hits the pool's device did not read (None when reconciled, when there are none, or when the
    gate turns the proof off: ``min_read_fraction`` 0 or a profile without device reads)."""
    if acc is None or not device_reads or min_read_fraction <= 0 or not acc.tier_hit_tokens:
        return None
    if acc.device_read_bytes is None:
        why = f" ({device_error})" if device_error else ""
        return (f"bytes read from the pool's device could not be measured{why}: {acc.tier_hit_tokens:.0f} tier hit "
                f"tokens are unproven")
    if acc.read_fraction is None or acc.read_fraction < min_read_fraction:
        ram = (f"; the engine's RAM level served {acc.ram_hit_tokens:.0f} of them" if acc.ram_hit_tokens
               else "")
        return (f"read fraction {0.0 if acc.read_fraction is None else acc.read_fraction:.4f} is below "
                f"{min_read_fraction}: the pool's device read {acc.device_read_bytes} B for "
                f"{acc.tier_hit_kv_bytes or 0:.0f} B of KV the {acc.tier_hit_tokens:.0f} tier hit tokens claim{ram} "
                f"(the KV came from RAM or the page cache, not the tier's device)")
    return None


def figure_values(pt: PointTrial) -> dict[str, float]:
    """Pure: a point × trial's figures (``FIGURES``) that it has."""
    out: dict[str, float] = {}
    src: dict[str, Any] = {}
    if pt.figures is not None:
        src.update(pt.figures.to_dict())
    if pt.accounting is not None:
        src.update(pt.accounting.model_dump())
    for name in FIGURES:
        v = src.get(name)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[name] = float(v)
    return out


def interval(values: list[float], asked: int | None = None) -> Interval:
    """Pure: a figure over the trials that gave it (harness.stats.median_interval); ``asked``: the trials the gate
    asked for."""
    return median_interval(values, asked=asked)


def emit(result: WorkloadResult, name: str, iv: Interval) -> None:
    """A figure over trials onto a result: its median as the metric, the interval typed beside it."""
    result.metrics[name] = iv.median
    result.intervals[name] = iv


def evaluate_load(points: list[PointTrial], kind: Literal["closed", "open", "trace"], ttft_slo_s: float,
                  knee_percentile: int = 95, evidence: G2LoadEvidence | None = None,
                  fallback: str | None = None) -> WorkloadResult:
    """Pure: metrics and validity from every point × trial. Each point's figures over trials as median and exact
    95 % interval (``FIGURE@LABEL``, typed in ``intervals``; the trials asked for: ``evidence.trials``); per trial
    the knee (the highest load whose TTFT percentile stays within ``ttft_slo_s`` with every request served; 0 when
    even the lowest misses it) and the highest goodput, then their median and interval over trials. INVALID: the
    engine's log says the tier fell back (``fallback``), or a point is INVALID (the first one named); ERROR only
    when not one request of the run succeeded. The validity as named checks (:func:`load_validity`)."""
    ev = (evidence or G2LoadEvidence()).model_copy(deep=True)
    out = WorkloadResult(metrics={}, evidence=ev)
    ev.endurance = points_endurance(points, drive_rating(ev.pool_drive))
    order: list[str] = []
    by_label: dict[str, list[PointTrial]] = {}
    for pt in points:
        if pt.label not in by_label:
            order.append(pt.label)
        by_label.setdefault(pt.label, []).append(pt)
    trials = sorted({p.trial for p in points})
    asked = ev.trials or len(trials)
    ev.summary = []
    for label in order:
        pts = by_label[label]
        values: dict[str, list[float]] = {}
        for pt in pts:
            for name, v in figure_values(pt).items():
                values.setdefault(name, []).append(v)
        figs = {name: interval(vs, asked) for name, vs in values.items()}
        for name, iv in figs.items():
            emit(out, f"{name}@{label}", iv)
        ev.summary.append(PointSummary(label=label, load=pts[0].load, load_kind=pts[0].load_kind, figures=figs,
                                       invalid_trials=sum(1 for p in pts if p.invalid_reason)))
    key = f"ttft_p{knee_percentile}_s"
    ev.knee_figure = key
    if kind != "trace":
        ev.knee_per_trial, ev.max_goodput_per_trial = [], []
        for t in trials:
            ladder = [(p.load, p.figures) for p in points if p.trial == t and p.figures is not None]
            ev.knee_per_trial.append(knee(ladder, ttft_slo_s, key=key) if ladder else None)
            goodputs = [f.goodput_rps for _, f in ladder]
            if goodputs:
                ev.max_goodput_per_trial.append(max(goodputs))
        ev.knee = (interval([k if k is not None else 0.0 for k in ev.knee_per_trial], asked)
                   if ev.knee_per_trial else None)
        if ev.knee is not None:
            emit(out, "knee_concurrency" if kind == "closed" else "knee_rate_rps", ev.knee)
        if ev.max_goodput_per_trial:
            ev.max_goodput = interval(ev.max_goodput_per_trial, asked)
            emit(out, "max_goodput_rps", ev.max_goodput)
    eff = hit_efficiency_per_trial(points, ev.trace)
    if eff:
        emit(out, "hit_efficiency", interval(eff, asked))
    ev.points = list(points)
    spoiled = spoiled_issue(ev.spoiled, points, ev.repeat_spoiled or 0, ev.max_client_lag_p99_s or 0.001)
    ev.validity = load_validity(points, ev, fallback, spoiled)
    invalid = fallback or spoiled
    if invalid is None:
        bad = next((p for p in points if p.invalid_reason), None)
        if bad is not None:
            n = sum(1 for p in points if p.invalid_reason)
            more = f" ({n - 1} more INVALID points)" if n > 1 else ""
            invalid = f"load point {bad.label}, trial {bad.trial}: {bad.invalid_reason}{more}"
    out.invalid_reason = invalid
    ok = sum(p.figures.ok for p in points if p.figures is not None)
    if not ok:  # the engine served nothing: not a measurement of load
        errs = [p for p in points if p.error]
        out.error = f"not one request of the run succeeded; first: {errs[0].error if errs else 'no request was sent'}"
    return out


def load_validity(points: list[PointTrial], ev: G2LoadEvidence, fallback: str | None,
                  spoiled: str | None) -> list[ValidityCheck]:
    """Pure: what g2-load's figures rest on, one named check each (pd_handoff's shape): every request served
    (failed share within ``max_failed_share``), the client kept its schedule, the tier's hits read from the pool's
    device (NOT CHECKED where the gate turns it off: ``min_read_fraction`` 0, or a profile without device reads),
    no fall-back in the engine's log, the attempts set aside justified."""
    figs = [p.figures for p in points if p.figures is not None]
    sent, failed = sum(f.requests for f in figs), sum(f.failed for f in figs)
    share = ev.max_failed_share if ev.max_failed_share is not None else 0.0
    worst = max(figs, key=lambda f: f.failed / f.requests, default=None)
    over = [p for p in points if p.figures is not None and failed_issue(p.figures, share)]
    out = [ValidityCheck(
        name="requests served", ok=not over and bool(figs),
        claim=f"every point served its requests (failed share at most {share:g}; a failed request counts as an "
              "infinite TTFT)",
        how=(f"{sent} requests sent, {sent - failed} served, {failed} failed over {len(figs)} points"
             + (f"; worst point {worst.failed} of {worst.requests} failed" if worst is not None and failed else "")
             + (f"; {len(over)} points above the bound" if over else "")),
        figure="failed requests", value=float(failed), unit="count")]
    lag = max((f.client_lag_p99_s for f in figs), default=0.0)
    bound = ev.max_client_lag_p99_s or 0.001
    out.append(ValidityCheck(
        name="client kept the schedule", ok=lag <= bound,
        claim="requests left when scheduled: the server, not the client, set the load",
        how=f"worst client lag p99 {lag * 1e3:.3f} ms, bound {bound * 1e3:g} ms",
        figure="client lag p99", value=lag, unit="s"))
    out.append(read_check(points, ev))
    out.append(ValidityCheck(
        name="no fall-back", ok=fallback is None,
        claim="the engine's log shows no fall-back of the tier (recompute, connector failure)",
        how=fallback or f"the whole log scanned: {len(ev.fallback_lines)} fall-back lines"))
    if ev.spoiled or spoiled:
        out.append(ValidityCheck(
            name="attempts set aside justified", ok=spoiled is None,
            claim="every attempt set aside was spoiled by the client and repeated",
            how=spoiled or f"{len(ev.spoiled)} set aside, at most {ev.repeat_spoiled or 0} allowed, each repeated"))
    return out


def read_check(points: list[PointTrial], ev: G2LoadEvidence) -> ValidityCheck:
    """Pure: the tier hits reconciled with the pool device's read bytes over the run, or NOT CHECKED where the
    gate turns the proof off (``min_read_fraction`` 0, a profile without device reads)."""
    name, claim = "tier hits read from the pool", "the KV the tier hits claim was read from the pool's device"
    accs = [p.accounting for p in points if p.accounting is not None]
    hits = sum(a.tier_hit_tokens or 0 for a in accs)
    reads = sum(a.device_read_bytes or 0 for a in accs)
    kv = sum(a.tier_hit_kv_bytes or 0 for a in accs)
    seen = f"{hits:.0f} tier hit tokens, {reads} B read from the pool's device for {kv:.0f} B of KV they claim"
    if ev.device_reads is False or not (ev.min_read_fraction or 0) > 0:
        why = ("the engine's profile proves no hit by device reads" if ev.device_reads is False
               else "the gate sets min_read_fraction 0")
        return ValidityCheck(name=name, ok=True, checked=False, claim=claim, how=f"not checked: {why} ({seen})",
                             figure="pool device read bytes", value=float(reads), unit="B")
    if accs and all(a.tier_hit_tokens is None for a in accs):
        return ValidityCheck(name=name, ok=True, checked=False, claim=claim,
                             how=(f"not checked: the engine counts no tier hits (its profile declares no tier hit "
                                  f"counter: hit_metrics), so none is claimed; the pool's device read {reads} B over "
                                  "the run"),
                             figure="pool device read bytes", value=float(reads), unit="B")
    bad = [p for p in points if read_issue(p.accounting, ev.min_read_fraction or 0.0, True, ev.pool_device_error)]
    return ValidityCheck(name=name, ok=not bad, claim=claim,
                         how=(f"{seen}; each point at least {ev.min_read_fraction:g} of its claim"
                              + (f"; {len(bad)} points short" if bad else "") if hits else
                              "no point claimed tier hits: nothing to reconcile"),
                         figure="pool device read bytes", value=float(reads), unit="B")


def hit_efficiency_per_trial(points: list[PointTrial], trace: "TraceInfo | None") -> list[float]:
    """Pure: per trial, the share of the trace's prompt tokens served from cache (engine memory and the tier)
    over the trace's ideal, an unbounded prefix cache's hit rate at the replayed block size (``kvgate trace
    stats``): a tier or connector that loses reuse the trace offers shows below 1. Empty without a trace ideal
    or without both hit counters."""
    if trace is None or not trace.unbounded_hit_rate:
        return []
    out = []
    for t in sorted({p.trial for p in points}):
        accs = [p.accounting for p in points if p.trial == t and p.accounting is not None]
        if not accs or any(a.tier_hit_tokens is None for a in accs):
            continue
        prompt = sum(a.prompt_tokens for a in accs)
        served = sum((a.memory_hit_tokens or 0.0) + (a.tier_hit_tokens or 0.0) for a in accs)
        if prompt > 0:
            out.append(served / prompt / trace.unbounded_hit_rate)
    return out


def spoiled_by_client(pt: PointTrial, max_client_lag_p99_s: float) -> bool:
    """Pure: whether an attempt's own records show that the client missed its schedule (client lag p99 over the
    bound): the one reason an attempt may be set aside and repeated. A slow server never is: its attempt counts."""
    return pt.figures is not None and pt.figures.client_lag_p99_s > max_client_lag_p99_s


def spoiled_issue(spoiled: list[PointTrial], points: list[PointTrial], repeat_spoiled: int,
                  max_client_lag_p99_s: float) -> str | None:
    """Pure: why the attempts set aside as spoiled are not all justified (None when they are): more of them than
    ``repeat_spoiled`` allows, one whose records keep the schedule (set aside without cause), or one with no
    repeat after it (attempt k of a point and trial is followed by attempt k + 1, spoiled or counted)."""
    if len(spoiled) > repeat_spoiled:
        return f"{len(spoiled)} attempts were set aside as spoiled by the client; the gate allows {repeat_spoiled}"
    have = {(p.label, p.trial, p.attempt) for p in list(spoiled) + list(points)}
    for pt in spoiled:
        where = f"load point {pt.label}, trial {pt.trial}, attempt {pt.attempt}"
        if not spoiled_by_client(pt, max_client_lag_p99_s):
            lag = "no figures" if pt.figures is None else f"client lag p99 {pt.figures.client_lag_p99_s * 1e3:.3f} ms"
            return (f"{where} was set aside as spoiled by the client, but its records keep the schedule ({lag}, "
                    f"bound {max_client_lag_p99_s * 1e3:g} ms): an attempt set aside without cause")
        if (pt.label, pt.trial, pt.attempt + 1) not in have:
            return f"{where} was set aside as spoiled, but no attempt {pt.attempt + 1} follows it"
    for pt in points:
        missing = [k for k in range(pt.attempt) if (pt.label, pt.trial, k) not in have]
        if missing:
            return (f"load point {pt.label}, trial {pt.trial} counts attempt {pt.attempt}, but attempt {missing[0]} "
                    "before it is not recorded")
    return None


def records_from_jsonl(text: str) -> list[LoadRecord]:
    """Pure: a point's ``requests-<point>-t<trial>.jsonl`` back into its records (as LoadRecord.to_dict wrote
    them)."""
    out = []
    fields = set(RequestRecord.__dataclass_fields__)
    for line in text.splitlines():
        if not line.strip():
            continue
        d = json.loads(line)
        rec = {k: v for k, v in d.items() if k in fields}
        rec["itl_s"] = tuple(rec.get("itl_s") or ())
        out.append(LoadRecord(float(d["due_s"]), float(d["sent_s"]), RequestRecord(**rec)))
    return out


# The bounds a re-evaluation takes from the gate's params (the bundle's config/gates.yaml), never from the evidence.
BOUND_FIELDS = ("load_kind", "ttft_slo_s", "tpot_slo_s", "knee_percentile", "knee_figure", "max_client_lag_p99_s",
                "min_read_fraction", "repeat_spoiled")


def raw_records(pt: PointTrial, requests: dict[str, str]) -> list[LoadRecord]:
    """Pure: an attempt's records from its raw requests file; ValueError when the file is missing, or empty or
    short while the attempt records figures (signed figures with no raw basis are not kept)."""
    text = requests.get(pt.requests_file)
    if text is None:
        raise ValueError(f"{pt.requests_file}: missing from the bundle")
    records = records_from_jsonl(text)
    if not records and pt.figures is not None:
        raise ValueError(f"{pt.requests_file}: empty, yet the evidence records figures for point {pt.label} trial "
                         f"{pt.trial}")
    if records and len(records) != pt.requests:
        raise ValueError(f"{pt.requests_file}: {len(records)} request records for the {pt.requests} requests point "
                         f"{pt.label} trial {pt.trial} sent")
    return records


def reevaluate_load(evidence: dict[str, Any], requests: dict[str, str], counters_text: dict[str, str],
                    counters: Counters, device_reads: bool, fallback: str | None = None,
                    params: "G2LoadParams | None" = None,
                    device: dict[str, tuple[int | None, int | None]] | None = None) -> WorkloadResult:
    """Pure: a bundle's g2-load result again from its raw files: every point's figures from its requests file
    (``requests``: file name -> text), its accounting from the engine counters before and after
    (``counters_text``: file name -> text; ``counters``: which of them are prompt tokens, memory and tier hits)
    with the pool device's bytes (``device``: requests file name -> (read, written) bytes, re-parsed from the run's
    steps; None: as the run recorded them), then the same evaluation as the run (:func:`evaluate_load`).
    ``params``: the gate's params, whose bounds (SLOs, knee percentile, client lag, read fraction) replace the
    ones the evidence records; ``fallback``: the engine log's fall-back, as re-scanned."""
    ev = G2LoadEvidence.model_validate(evidence)
    ev.device_reads = device_reads
    if params is not None:
        fields = load_fields(params)
        ev = ev.model_copy(update={k: fields[k] for k in BOUND_FIELDS})
    spoiled = []
    for pt in ev.spoiled:  # the attempts set aside: their figures again, so their cause is judged on the records
        records = raw_records(pt, requests)
        spoiled.append(pt.model_copy(update={"figures": load_point(records, ev.ttft_slo_s, ev.tpot_slo_s)
                                             if records else None}))
    ev.spoiled = spoiled
    points = []
    for pt in ev.points:
        records = raw_records(pt, requests)
        if not records:
            if pt.requests and pt.figures is not None:  # figures recorded from records the file no longer holds
                raise ValueError(f"{pt.requests_file}: empty, but the point recorded figures of {pt.requests} "
                                 "requests")
            points.append(pt)
            continue
        fig = load_point(records, ev.ttft_slo_s, ev.tpot_slo_s)
        acc = pt.accounting
        if acc is not None:
            deltas: dict[str, float | None] = {"prompt": None, "memory": None, "tier": None, "ram": None}
            if pt.counters_file is not None:
                c = json.loads(counters_text[pt.counters_file])

                def delta(names: list[str]) -> float | None:
                    for n in names:
                        a, b = c["before"].get(n), c["after"].get(n)
                        if a is not None and b is not None:
                            return b - a
                    return None
                deltas = {"prompt": delta(counters.prompt_tokens), "memory": delta(counters.memory_hit_tokens),
                          "tier": delta(counters.tier_hit_tokens),
                          "ram": delta(list(counters.ram_hit_tokens)) if counters.ram_hit_tokens else None}
            sent = sum(r.record.prompt_tokens or 0 for r in records if r.record.ok)
            read_b, write_b = (acc.device_read_bytes, acc.device_write_bytes) if device is None \
                else device.get(pt.requests_file, (None, None))
            acc = token_accounting(sent, deltas["prompt"], deltas["memory"], deltas["tier"], acc.kv_bytes_per_token,
                                   read_b, write_b, fig.duration_s, deltas["ram"])
        invalid = point_invalid(fig, acc, ev.max_client_lag_p99_s or 0.001,
                                ev.min_read_fraction if ev.min_read_fraction is not None else 0.5,
                                device_reads, ev.pool_device_error, ev.max_failed_share or 0.0)
        points.append(pt.model_copy(update={"figures": fig, "accounting": acc, "invalid_reason": invalid}))
    return evaluate_load(points, ev.load_kind or "closed", ev.ttft_slo_s or 0.0, ev.knee_percentile or 95, ev,
                         fallback=fallback)


# ----------------------------------------------------------------------------------------------- prompts


def point_seed(seed: int, label: str, trial: int) -> int:
    """Pure: the seed of a point × trial's prompts (and arrivals): new prompts at every point and trial."""
    return int(hashlib.sha256(f"kvgate-g2-load:{seed}:{label}:{trial}".encode()).hexdigest()[:12], 16)


@dataclass(frozen=True)
class LoadPrompts:
    """How a run's prompts reach the engine: the token ids drawn from a vocabulary of ``vocab_size``, sent as they
    are, or (``text``: the profile's API takes text only) as text the model's tokenizer encodes back to them, so
    prompts sharing ids still share their tokens (harness.engines.prompts.IdsAsText)."""

    vocab_size: int
    text: IdsAsText | None = None

    def finish(self, reqs: list[CompletionRequest]) -> list[CompletionRequest]:
        """The requests as sent (ValueError when the tokenizer cannot carry their ids as text)."""
        if self.text is None:
            return reqs
        t = self.text
        return [dataclasses.replace(r, prompt=t.text(r.prompt), prompt_tokens=t.tokens(r.prompt)) for r in reqs]


def load_prompts(prof: EngineProfile, setup_ev: Any, vocab_size: int,
                 ev: "G2LoadEvidence | None" = None) -> LoadPrompts:
    """The prompts a run sends, from the engine set-up's evidence (its tokenizer, when G2 built text prompts);
    records their kind in ``ev``. ValueError: the API takes text only and no tokenizer is known, or it cannot be
    read or used."""
    if not prof.api.text_only:
        if ev is not None:
            ev.prompt_kind = "token_ids"
        return LoadPrompts(vocab_size)
    tok = getattr(setup_ev, "tokenizer", None)
    if not tok:
        raise ValueError(f"profile {prof.name!r} takes text prompts only: give the model's tokenizer.json (tokenizer:)")
    try:
        text = IdsAsText(load_tokenizer(tok))
    except (OSError, ValueError) as exc:
        raise ValueError(f"tokenizer {tok}: {exc}") from None
    if ev is not None:
        ev.prompt_kind, ev.tokenizer = "text", tok
    return LoadPrompts(vocab_size, text)


def synthetic_requests(p: G2LoadParams, label: str, trial: int, seed: int, vocab_size: int) -> list[CompletionRequest]:
    """Pure: a point × trial's prompts: ``prompt_tokens`` token ids each, the first ``shared_prefix_tokens`` shared
    by the requests of one prefix group (round-robin), the rest the request's own."""
    out = []
    own = p.prompt_tokens - p.shared_prefix_tokens
    for j in range(p.requests_per_point):
        prefix = block_ids(j % p.prefix_groups, p.shared_prefix_tokens, vocab_size, seed)
        ids = prefix + block_ids(1_000_000 + j, own, vocab_size, seed)
        out.append(CompletionRequest(request_id=f"{label}-t{trial}-{j}", prompt=ids, max_tokens=p.max_tokens,
                                     prompt_tokens=len(ids)))
    return out


def trace_requests(p: G2LoadParams, trace: Trace, tokens_per_block: int, label: str, trial: int, seed: int,
                   vocab_size: int) -> tuple[list[CompletionRequest], list[float]]:
    """Pure: a trace's requests (prompts from its hash ids, outputs cut to ``max_tokens``) and send times (s)."""
    reqs, offsets = [], []
    for j, r in enumerate(trace.requests):
        ids = prompt_ids(r, trace.block_tokens, vocab_size, seed, tokens_per_block)
        reqs.append(CompletionRequest(request_id=f"{label}-t{trial}-{j}", prompt=ids,
                                      max_tokens=max(1, min(r.output_tokens, p.max_tokens)), prompt_tokens=len(ids)))
        offsets.append(r.t_ms / 1000.0)
    return reqs, offsets


def load_trace(spec: LoadSpec) -> Trace:
    """The trace of a ``load:`` block, cut and time-scaled (ConfigError naming file:line: field); multi-turn
    sessions' trace synthesised from their shape (pure)."""
    shape = spec.shape
    if shape is not None:
        return scale_time(cut(shape_trace(*shape), spec.max_requests, spec.max_duration_s),
                          1.0 / (spec.time_scale or 1.0))
    trace = read_trace(spec.path, spec.format or "auto", spec.block_tokens)
    trace = cut(trace, spec.max_requests, spec.max_duration_s)
    if not trace.requests:
        raise ValueError(f"{spec.path}: no requests left after max_requests / max_duration_s")
    return scale_time(trace, 1.0 / (spec.time_scale or 1.0))


def read_load_trace(spec: LoadSpec) -> tuple[Trace, TraceInfo]:
    """The trace of a ``load:`` block, cut and time-scaled, and what the evidence records of it (its sha256, its
    shape, its unbounded-cache hit rate); ConfigError, InputFileError or ValueError when it cannot be read."""
    trace = load_trace(spec)
    shape = spec.shape
    if shape is not None:  # its digest: of the trace as `kvgate trace synth` would write it
        raw = "".join(line + "\n" for line in trace_lines(trace)).encode()
    else:
        raw = read_bytes(spec.path, max_bytes=MAX_TRACE_BYTES, what="trace")
    path = spec.path or (MULTI_TURN_PATH if spec.multi_turn is not None else f"(synthesised: {shape[0]})")
    return trace, TraceInfo(path=path, format=trace.format, block_tokens=trace.block_tokens,
                            tokens_per_block=spec.tokens_per_block or trace.block_tokens,
                            time_scale=spec.time_scale or 1.0, requests=len(trace.requests),
                            duration_s=trace.duration_s, sha256=hashlib.sha256(raw).hexdigest(),
                            unbounded_hit_rate=reuse_stats(trace).unbounded_hit_rate,
                            multi_turn=spec.multi_turn, shape=shape[0] if shape else None,
                            shape_params=dataclasses.asdict(shape[1]) if shape else None, users=spec.users)


def trace_source_text(spec: LoadSpec) -> str:
    """Pure: where a trace load's requests come from, in words (a file and its cuts, or a declared shape)."""
    shape = spec.shape
    if shape is not None:
        if spec.multi_turn is not None:
            return multi_turn_text(spec.multi_turn)
        fields = ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}"
                           for k, v in dataclasses.asdict(shape[1]).items())
        return f"the {shape[0]} shape ({fields}; harness/load/synth.py, as `kvgate trace synth --shape {shape[0]}`)"
    cuts = [f"first {spec.max_requests} requests" if spec.max_requests else "",
            f"within {spec.max_duration_s:g} s" if spec.max_duration_s else "",
            f"{spec.tokens_per_block} tokens per hash id" if spec.tokens_per_block else ""]
    return (f"{spec.path} ({spec.format or 'format from its first line'}"
            f"{', ' + ', '.join(c for c in cuts if c) if any(cuts) else ''})")


def trace_error(spec: LoadSpec, exc: Exception) -> str:
    """Pure: why a ``load:`` trace could not be read, on one line naming its path once (the run's ERROR)."""
    return file_error_text("trace", spec.path or "(synthesised)", exc)


def multi_turn_text(m: MultiTurnLoad) -> str:
    """Pure: multi-turn sessions' replay in words (the plan's and the report's)."""
    shape = m.shape()
    return (f"multi-turn sessions: {m.sessions} sessions x {m.turns} turns round-robin ({m.sessions * m.turns} "
            f"requests, {1 / m.rate_rps:g} s apart), turn 1 {m.first_prompt_tokens} tokens, each later turn the "
            f"session's whole history plus a {m.reply_tokens}-token reply and a {m.user_tokens}-token user message "
            f"(turn {m.turns}: {shape.prompt_tokens(m.turns)} tokens)")


def load_fields(p: G2LoadParams) -> dict[str, Any]:
    """Pure: the load and its bounds as g2-load's evidence records them (the fields of :class:`G2LoadEvidence`)."""
    synthetic = p.load.kind != "trace"
    return dict(load_kind=p.load.kind, loads=[load for _, load in p.load.points()] if synthetic else [],
                burstiness=(p.load.burstiness or 1.0) if p.load.kind == "open" else None, trials=p.trials,
                requests_per_point=p.requests_per_point if synthetic else None,
                prompt_tokens=p.prompt_tokens if synthetic else None,
                shared_prefix_tokens=p.shared_prefix_tokens if synthetic else None,
                prefix_groups=p.prefix_groups if synthetic else None, max_tokens=p.max_tokens,
                ttft_slo_s=p.ttft_slo_s, tpot_slo_s=p.tpot_slo_s, knee_percentile=p.knee_percentile,
                knee_figure=f"ttft_p{p.knee_percentile}_s", max_client_lag_p99_s=p.max_client_lag_p99_s,
                max_failed_share=p.max_failed_share, min_read_fraction=p.min_read_fraction,
                repeat_spoiled=p.repeat_spoiled)


# ------------------------------------------------------------------------------------------------ the workload


def g2_view(p: G2LoadParams, longest_prompt: int) -> G2Params:
    """The G2 parameters g2-ttft's engine set-up reads, for this run: the engine as given (only the fields the
    gate set, so validation says what it says for g2-ttft) and one prompt as long as the longest of the run."""
    given = {name: getattr(p, name) for name in p.model_fields_set if name in G2EngineParams.model_fields}
    if p.attach is not None:
        given["attach"] = p.attach.as_g2()
    if "model_config_path" in given:
        given["model_config"] = given.pop("model_config_path")
    return G2Params.model_validate({**given, "prompt_tokens": [longest_prompt], "prompts_per_length": 1,
                                    "max_tokens": p.max_tokens})


async def _until_stopped(coro, stop) -> list[LoadRecord]:
    """Run a load point's requests; once the gate's cancellation is set, drop them (Cancelled raised by the
    caller's check)."""
    task = asyncio.ensure_future(coro)
    while not task.done():
        if stop.is_set():
            task.cancel()
            break
        await asyncio.wait({task}, timeout=STOP_POLL_S)
    try:
        return await task
    except asyncio.CancelledError:
        return []


def load_control_files(params: G2LoadParams) -> list[ControlFile]:
    """The control-host files a load gate reads: its trace (checked by `kvgate validate` and `run`
    (Workload.file_issues), not when a suite is loaded, so a bundle re-evaluated on a machine without the trace still
    loads its suite: the run recorded its sha256) and the model's config."""
    trace = ([ControlFile(("load", "path"), "trace", params.load.path, lambda _: load_trace(params.load))]
             if params.load is not None and params.load.path is not None else [])   # g2-gain's capacity: has none
    return trace + model_config_files(params)


def load_issues(params: G2LoadParams, nodes) -> list[tuple[tuple, str]]:
    """A load gate's engine and pool checked as G2's are, for the longest prompt it sends, named as g2-load's."""
    g2 = G2Procedure().validate_against(g2_view(params, params.prompt_tokens), nodes)
    return [(path, msg.replace("g2-ttft", "g2-load")) for path, msg in g2]


class LoadPoints:
    """The load-point runner g2-load, both arms of g2-gain and its capacity sweep call: the schedule of
    points x trials, the requests of a point, its attempts (a spoiled one repeated), the sends, the
    counters settled around it and the pool device read over it."""

    def schedule(self, p: G2LoadParams) -> list[tuple[int, str, float]]:
        """Every point × trial in the order the run sends them: trial by trial, each the whole ladder."""
        return [(t, label, load) for t in range(1, p.trials + 1) for label, load in p.load.points()]

    def point_text(self, p: G2LoadParams, label: str, load: float, trial: int) -> str:
        k = p.load.kind
        if k == "closed":
            what = f"closed loop: {int(load)} user{'s' if load != 1 else ''}, {p.requests_per_point} requests"
        elif k == "open":
            what = (f"open loop: {p.requests_per_point} requests at {load:g} requests/s, gamma arrivals (burstiness "
                    f"{p.load.burstiness or 1.0:g}), sent on schedule")
        elif p.load.multi_turn is not None and not p.load.users and not p.load.time_scale:
            what = multi_turn_text(p.load.multi_turn)
        else:
            how = (f"in its order by {p.load.users} user{'s' if p.load.users != 1 else ''}, each sending its next "
                   "request when its previous one finished (its timestamps not used)" if p.load.users
                   else f"timestamps x {p.load.time_scale or 1.0:g}")
            what = f"trace replay of {trace_source_text(p.load)}, {how}"
        shape = ("" if k == "trace" else f", prompts of {p.prompt_tokens} tokens sharing {p.shared_prefix_tokens} "
                 f"per {p.prefix_groups} prefix group(s)")
        again = (f"; an attempt its own client spoils (client lag p99 over {p.max_client_lag_p99_s * 1e3:g} ms) is set "
                 f"aside and repeated with new prompts ({p.repeat_spoiled} repeat{'s' if p.repeat_spoiled != 1 else ''} "
                 "at most per engine)" if p.repeat_spoiled else "")
        return (f"{what}{shape}, {p.max_tokens} output tokens at most; the engine's counters before and after; "
                f"every request to requests-{label}-t{trial}.jsonl{again}")

    @staticmethod
    def longest_prompt(p: G2LoadParams) -> int:
        if p.load.kind != "trace":
            return p.prompt_tokens
        try:
            trace = load_trace(p.load)
        except (ConfigError, ValueError):
            return p.prompt_tokens
        per = p.load.tokens_per_block or trace.block_tokens
        return max(-(-r.input_tokens * per // trace.block_tokens) for r in trace.requests)

    @staticmethod
    def engine_evidence(ev: G2LoadEvidence, g: G2Evidence | None) -> None:
        if g is None:
            return
        for name in ("engine_profile", "engine", "engine_version", "versions", "base_url", "client_path", "attached",
                     "pool_dir", "kv_bytes_per_token", "random_model", "pool"):
            setattr(ev, name, getattr(g, name))

    def _requests(self, p: G2LoadParams, label: str, load: float, t: int, seed: int, prompts: LoadPrompts,
                  trace: Trace | None) -> tuple[list[CompletionRequest], list[float] | None]:
        if trace is not None:
            per = p.load.tokens_per_block or trace.block_tokens
            reqs, offsets = trace_requests(p, trace, per, label, t, seed, prompts.vocab_size)
            return prompts.finish(reqs), (None if p.load.users else offsets)  # by users: in order, one by one
        reqs = prompts.finish(synthetic_requests(p, label, t, seed, prompts.vocab_size))
        if p.load.kind == "open":
            return reqs, arrival_offsets(len(reqs), load, p.load.burstiness or 1.0, seed)
        return reqs, None

    def _point(self, ctx: GateContext, p: G2LoadParams, prof: EngineProfile, runner: PhaseRunner, setup,
               counters: Counters, t: int, label: str, load: float, trace: Trace | None, seed: int,
               prompts: LoadPrompts, ev: G2LoadEvidence, attempt: int = 0) -> PointTrial:
        """One point × trial, a phase of the runner: counters, pool device and log before, the requests (and the
        engine's counting of them), the same after. ``attempt`` k > 0 (a repeat of a spoiled attempt): new prompts
        (no KV of the attempt before can be reused) and files of its own (``requests-LABEL-tT-aK.jsonl``)."""
        pseed = point_seed(seed, label if not attempt else f"{label}+{attempt}", t)
        reqs, offsets = self._requests(p, label, load, t, pseed, prompts, trace)
        kind = {"closed": "concurrency", "open": "rate_rps", "trace": "trace"}[p.load.kind]
        if trace is not None:
            load = len(reqs) / trace.duration_s if trace.duration_s > 0 else 0.0
        tag = f"{label}-t{t}" + (f"-a{attempt}" if attempt else "")
        name = f"requests-{tag}.jsonl"
        pt = PointTrial(label=label, load=load, load_kind=kind, trial=t, attempt=attempt, seed=pseed,
                        requests=len(reqs), requests_file=name)
        eng = setup.engine

        def send() -> list[LoadRecord]:
            base = eng.metrics() if counters.any else None
            pt.started_unix_s = time.time()
            out = self._send(ctx, p, prof, eng.base_url, reqs, offsets, load, ev)
            # the runner reads the counters after this returns: once the engine has counted these requests
            self.settled_metrics(ctx, eng, counters, base, sum(r.record.prompt_tokens or 0 for r in out
                                                                 if r.record.ok))
            return out

        rec = runner.phase(tag, send, device=lambda: self._pool_stat(ctx, setup, ev))
        records, reading = rec.output, rec.engines["engine"]
        m0, m1, s0, s1 = reading.metrics_before, reading.metrics_after, rec.device_before, rec.device_after
        write_gate_file(ctx.gate_dir / name, "".join(json.dumps(r.to_dict()) + "\n" for r in records))
        if m0 is not None and m1 is not None:
            names = (counters.prompt_tokens + counters.memory_hit_tokens + counters.tier_hit_tokens
                     + list(counters.ram_hit_tokens) + list(counters.extra))
            pt.counters_file = f"counters-{tag}.json"
            write_gate_file(ctx.gate_dir / pt.counters_file, json.dumps(
                {when: {n: metric_total(m, [n]) for n in names} for when, m in (("before", m0), ("after", m1))},
                indent=1))
        if not records:
            pt.error = "no request was sent"
            return pt
        fig = load_point(records, p.ttft_slo_s, p.tpot_slo_s)
        pt.figures = fig

        delta = reading.delta
        if counters.extra:
            pt.extra_counters = {n: delta([n]) for n in counters.extra}
        sent = sum(r.record.prompt_tokens or 0 for r in records if r.record.ok)
        writes = None if s0 is None or s1 is None or s0.maj_min != s1.maj_min \
            else s1.stat.write_bytes - s0.stat.write_bytes
        pt.accounting = token_accounting(sent, delta(counters.prompt_tokens), delta(counters.memory_hit_tokens),
                                         delta(counters.tier_hit_tokens), setup.ev.kv_bytes_per_token,
                                         read_bytes_between(s0, s1), writes, fig.duration_s,
                                         delta(list(counters.ram_hit_tokens)) if counters.ram_hit_tokens else None)
        pt.invalid_reason = point_invalid(fig, pt.accounting, p.max_client_lag_p99_s, p.min_read_fraction,
                                          prof.device_reads, ev.pool_device_error, p.max_failed_share)
        if not fig.ok:
            first = next(r.record.error for r in records if not r.record.ok)
            pt.error = f"every request failed; first: {first}"
        return pt

    def attempts(self, ctx: GateContext, p: G2LoadParams, prof: EngineProfile, runner: PhaseRunner, setup,
                  counters: Counters, t: int, label: str, load: float, trace: Trace | None, seed: int,
                  prompts: LoadPrompts, ev: G2LoadEvidence) -> PointTrial:
        """One point × trial as :meth:`_point`, repeated with new prompts while its attempt was spoiled by the client
        (:func:`spoiled_by_client`) and ``repeat_spoiled`` allows one more (counted over ``ev``: the run, or one
        arm); every attempt set aside goes to ``ev.spoiled`` with its files, and the last attempt counts."""
        attempt = 0
        while True:
            pt = self._point(ctx, p, prof, runner, setup, counters, t, label, load, trace, seed, prompts, ev,
                             attempt)
            if not spoiled_by_client(pt, p.max_client_lag_p99_s) or len(ev.spoiled) >= p.repeat_spoiled:
                return pt
            ev.spoiled.append(pt)
            ctx.progress(f"{ctx.gate.id}: trial {t}, load point {label}: attempt {attempt} set aside, spoiled by the "
                         f"client ({pt.invalid_reason}); repeating with new prompts "
                         f"({len(ev.spoiled)} of {p.repeat_spoiled} repeats used)")
            attempt += 1

    def _send(self, ctx: GateContext, p: G2LoadParams, prof: EngineProfile, base_url: str,
              reqs: list[CompletionRequest], offsets: list[float] | None, load: float,
              ev: G2LoadEvidence | None = None) -> list[LoadRecord]:
        """A point's requests, open loop on their schedule or closed loop by users, from a thread of raised priority
        (harness.engines.load.client_priority, what it did in ``ev.client_priority``); the gate's cancellation
        drops them and raises Cancelled."""
        ctx.cancel.check()
        kw = dict(transport=ctx.http, timeout_s=ctx.cancel.bound_timeout_s(p.request_timeout_s),
                  path=prof.api.request_path, api=prof.api.shape())
        if offsets is not None:
            coro = open_loop(base_url, reqs, offsets, p.served_model_name, **kw)
        else:  # a ladder's users, or a trace replayed in order by its users
            users = p.load.users if p.load.kind == "trace" and p.load.users else int(load)
            coro = closed_loop(base_url, reqs, users, p.served_model_name, **kw)
        with client_priority() as how:
            if ev is not None:
                ev.client_priority = how
            records = asyncio.run(_until_stopped(coro, ctx.cancel))
        ctx.cancel.check()
        return records

    @staticmethod
    def settled_metrics(ctx: GateContext, eng, counters: Counters, m0: list[Sample] | None, sent: int,
                         tries: int = 10) -> list[Sample] | None:
        """The engine's counters after requests of ``sent`` prompt tokens (those that succeeded). An engine may
        answer the last token before it counts the request (vLLM records its statistics after the output is
        sent): read again, 0.2 s apart on the gate's clock and ``tries`` times at most, until its prompt-token
        counter grew by what was sent since ``m0``."""
        if m0 is None:
            return None
        m1 = eng.metrics()
        for _ in range(tries):
            got = counter_delta(m0, m1, counters.prompt_tokens)
            if got is None or got >= sent:
                break
            ctx.cancel.sleep(0.2)
            m1 = eng.metrics()
        return m1

    @staticmethod
    def _pool_stat(ctx: GateContext, setup, ev: G2LoadEvidence) -> PoolDeviceStat | None:
        if not setup.pool_dir:
            return None
        dev = G2Procedure().pool_stat(ctx, setup.pool_transport, setup.pool_dir, setup.ev)
        ev.pool_device, ev.pool_device_maj_min = setup.ev.pool_device, setup.ev.pool_device_maj_min
        ev.pool_device_error = setup.ev.pool_device_error
        return dev
