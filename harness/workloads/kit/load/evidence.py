"""What a load gate records: each point x trial with its figures and token accounting, the trace, the summary over
trials; the metric names and their units."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from ....engines.load import LoadPoint
from ....parsers.poolloop import EvictWindow
from ....stats import Interval
from ..base import Evidence
from .spec import MultiTurnLoad


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
    # the cold regime over it (an evicting one: the reads that came before their store was dropped, up to the
    # point's mark; harness.parsers.poolloop.EvictWindow); None: no evictor
    cold: EvictWindow | None = None
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


