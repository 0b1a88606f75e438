"""g2-gain's params (both arms, the engine memory, the capacity sweep's spec), its evidence and its metric names."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..kit.capacity import CAPACITY_FIGURES, CapacityEvidence, CapacitySpec
from ..kit.load import G2LoadEvidence, G2LoadParams, LoadAttachParams, LoadSpec, MetricInterval, point_metric_unit


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
    # each launched arm's compute cores (a list per rank) as its engine's log states them
    # (harness.parsers.engine_log.parse_compute_binding; None for an arm whose log states none): the arms must
    # compute on the same cores. None: not recorded (attached arms, a bundle of an older kvgate)
    compute_cores: dict[str, list[list[int]] | None] | None = None
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
