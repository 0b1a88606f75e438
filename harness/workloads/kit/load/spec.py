"""The load a gate sends: g2-load's params and its ``load:`` spec (closed, open, trace, multi-turn)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ....load.synth import FanOutShape, MultiTurnShape, SessionRecoveryShape, TraceShape
from ....paths import given_or_shipped
from ..attach import AttachParams, NodeCommand
from ..g2 import G2EngineParams


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


