"""The capacity curve of the gain gate (``g2-gain`` with ``capacity:``): a working-set sweep on the arm with the
tier, from below the engine's memory to many times it, with every point's prompt tokens split by the level that
served them.

A point is a session-recovery trace (:func:`sweep_trace`): ``sessions`` distinct sessions, each a context of
``context_tokens`` tokens resumed whole ``rounds`` times, round-robin (session 1, 2, ..., S, then again), sent on
a fixed schedule (``rate_rps``). Its working set is sessions x context; ``working_set_x`` names each point as a
multiple of the engine memory both arms get (``engine_cache_tokens``), so ``x2`` holds twice what the engine can.
Round-robin is the order an LRU cache serves worst: once the working set outgrows a level, that level serves
nothing, so each level's knee is sharp. Every point's prompts are new (seeded by its label and trial).

Per point × trial, from the engine's own counters read before and after it (harness/workloads/g2_load.py's
phase), the prompt tokens that could be reused (every resumed context but its last token) split by level:
``memory`` (the engine's own prefix cache), ``ram`` (the RAM level: LMCache's local_cpu on cpu-reference),
``tier`` (the pool: the connector's hits less the RAM level's) and ``recomputed``; each as a share of the
reusable tokens (``*_hit_rate``). The tier's hits are reconciled with the pool device's read bytes as every
g2-load point is (``min_read_fraction``; RAM-level hits read no device). Tier evictions are counted where the
engine exposes ``<level_counters>tier_evicted_tokens_total``.

The curve: the knee (the first working set at which engine memory serves under half of the reusable tokens and
the levels below it serve more than it does) and the point where the tier's own capacity runs out (the first at
which the tier evicted and at least half of the reusable tokens were recomputed). A requirement (``require: {levels: [tier], up_to_x: 8}``) gives ``capacity_hit_rate``: the lowest
hit rate of those levels together over the points past engine memory (x > 1) up to ``up_to_x``, the figure a
gate's ``pass:`` judges (``>= 0.9``).

Proofs (any failing makes the gate INVALID): every point valid by g2-load's rules and no fall-back in the log;
every level counted (prompt, engine-memory, connector and RAM-level counters exposed) and adding up (nothing
served twice); engine memory held the smallest working set (the sweep really starts below engine memory).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ...load.traces import Trace, TraceRequest
from ...stats import median
from .base import ValidityCheck

LEVELS = ("memory", "ram", "tier", "recomputed")
LEVEL_NAMES = {"memory": "engine memory", "ram": "RAM level", "tier": "tier", "recomputed": "recomputed"}
# per point (FIGURE@x<working set>): the curve's figures and their units
CAPACITY_FIGURES: dict[str, str] = {"memory_hit_rate": "ratio", "ram_hit_rate": "ratio", "tier_hit_rate": "ratio",
                                    "recomputed_rate": "ratio", "goodput_rps": "/s", "ttft_p95_s": "s",
                                    "tier_evicted_tokens": "count"}
CAPACITY_METRICS: dict[str, str] = {"capacity_hit_rate": "ratio", "knee_x": "x", "tier_exhausted_x": "x"}
KNEE_SHARE = 0.5   # engine memory "stops holding" below half of the reusable tokens


class CapacityRequire(BaseModel):
    """``capacity.require``: which levels together must serve the reuse, up to which working set."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    levels: list[Literal["memory", "ram", "tier"]] = Field(default=["tier"], min_length=1)
    up_to_x: float = Field(gt=1)

    @model_validator(mode="after")
    def _unique(self) -> "CapacityRequire":
        if len(set(self.levels)) != len(self.levels):
            raise ValueError("levels: a level appears twice")
        return self


class CapacitySpec(BaseModel):
    """g2-gain's ``capacity:`` block: the sweep (working sets as multiples of engine memory), each point's
    sessions' shape and schedule, and the requirement a gate may judge."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    working_set_x: list[float] = Field(min_length=2)
    context_tokens: int = Field(ge=2, le=1_000_000)   # each session's context, resumed whole every round
    rounds: int = Field(default=3, ge=2, le=100)
    rate_rps: float = Field(default=4.0, gt=0)
    max_requests_per_point: int = Field(default=2000, ge=1)
    require: CapacityRequire | None = None

    @model_validator(mode="after")
    def _sweep(self) -> "CapacitySpec":
        xs = self.working_set_x
        if any(not x > 0 for x in xs):
            raise ValueError("working_set_x: every working set must be > 0 (a multiple of engine memory)")
        if list(xs) != sorted(set(xs)):
            raise ValueError("working_set_x: give the working sets once each, ascending")
        if not (xs[0] < 1 < xs[-1]):
            raise ValueError(f"working_set_x: the sweep must start below engine memory (x < 1) and end above it "
                             f"(x > 1); got {xs[0]:g} .. {xs[-1]:g}")
        r = self.require
        if r is not None:
            if r.up_to_x > xs[-1]:
                raise ValueError(f"require.up_to_x: {r.up_to_x:g} is beyond the sweep's largest working set "
                                 f"({xs[-1]:g})")
        return self


class CapacityModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CapacityPoint(CapacityModel):
    """One working set × trial: its shape, its prompt tokens by level (engine counters) and its load figures."""

    label: str                       # x<working_set_x as given>: the suffix of its metrics
    trial: int
    working_set_x: float             # sessions x context / engine memory, as run
    sessions: int
    working_set_tokens: int
    requests: int
    prompt_tokens: float | None = None
    reusable_tokens: float | None = None
    memory_hit_tokens: float | None = None
    ram_hit_tokens: float | None = None
    tier_hit_tokens: float | None = None      # the pool's: the connector's hits less the RAM level's
    recomputed_tokens: float | None = None    # of the reusable tokens: what no level served
    memory_hit_rate: float | None = None      # each of the reusable tokens
    ram_hit_rate: float | None = None
    tier_hit_rate: float | None = None
    recomputed_rate: float | None = None
    tier_evicted_tokens: float | None = None  # None: the engine does not count them
    device_read_bytes: int | None = None
    goodput_rps: float | None = None
    ttft_p95_s: float | None = None
    invalid_reason: str | None = None


class CapacityCurvePoint(CapacityModel):
    """One working set over its trials: each figure's median (the curve the report draws)."""

    label: str
    working_set_x: float
    sessions: int
    figures: dict[str, float] = {}


class CapacityEvidence(CapacityModel):
    """The sweep as run and judged: its shape, every point × trial, the curve, the knee, where the tier ran out,
    and the requirement's figure."""

    engine_cache_tokens: int
    context_tokens: int
    rounds: int
    rate_rps: float
    require_levels: list[str] | None = None
    ram_counter: str | None = None       # the engine counters the RAM level's hits and the tier's evictions are read from
    evicted_counter: str | None = None
    require_up_to_x: float | None = None
    points: list[CapacityPoint] = []
    curve: list[CapacityCurvePoint] = []
    knee_x: float | None = None
    knee_note: str = ""
    tier_exhausted_x: float | None = None
    tier_evictions_counted: bool = False
    capacity_hit_rate: float | None = None


# --------------------------------------------------------------------------------------- the sweep, pure


def point_label(x: float) -> str:
    """Pure: a sweep point's label (``x0.5``, ``x8``): the suffix of its files and metrics."""
    return f"x{x:g}"


def sessions_for(x: float, engine_tokens: int, context_tokens: int) -> int:
    """Pure: how many sessions of ``context_tokens`` make a working set of ``x`` times the engine memory."""
    return max(1, round(x * engine_tokens / context_tokens))


def sweep_points(spec: CapacitySpec, engine_tokens: int) -> list[tuple[str, float, int]]:
    """Pure: the sweep in the order it runs: (label, working set as run / engine memory, sessions)."""
    out = []
    for x in spec.working_set_x:
        s = sessions_for(x, engine_tokens, spec.context_tokens)
        out.append((point_label(x), s * spec.context_tokens / engine_tokens, s))
    return out


def sweep_issues(spec: CapacitySpec, engine_tokens: int | None) -> list[tuple[tuple, str]]:
    """Pure: what makes a sweep unrunnable against the engine memory the gate gives (param path, message)."""
    if engine_tokens is None:
        return [(("engine_cache_tokens",), "a capacity sweep needs the engine memory it is a multiple of: set "
                 "engine_cache_tokens")]
    issues: list[tuple[tuple, str]] = []
    pts = sweep_points(spec, engine_tokens)
    for (a, xa, sa), (b, _, sb) in zip(pts, pts[1:]):
        if sa == sb:
            issues.append((("capacity", "working_set_x"), f"{a} and {b} both give {sa} session(s) of "
                           f"{spec.context_tokens} tokens: give working sets further apart or a smaller "
                           "context_tokens"))
    if pts and pts[0][1] >= 1:
        issues.append((("capacity", "working_set_x"), f"the smallest point {pts[0][0]} is {pts[0][2]} session(s) of "
                       f"{spec.context_tokens} tokens, not below engine memory ({engine_tokens} tokens): give a "
                       "smaller context_tokens"))
    big = [(lab, s) for lab, _, s in pts if s * spec.rounds > spec.max_requests_per_point]
    if big:
        issues.append((("capacity", "max_requests_per_point"), f"{big[0][0]} sends {big[0][1] * spec.rounds} "
                       f"requests, more than max_requests_per_point ({spec.max_requests_per_point})"))
    r = spec.require
    if r is not None and not any(1 < x <= r.up_to_x for _, x, _ in pts):
        issues.append((("capacity", "require", "up_to_x"), f"no point of the sweep lies past engine memory and "
                       f"within {r.up_to_x:g}x: nothing to judge"))
    return issues


def sweep_trace(sessions: int, context_tokens: int, rounds: int, rate_rps: float, block_tokens: int = 256) -> Trace:
    """Pure: a point's session-recovery trace: each of ``sessions`` contexts (``context_tokens``, its own blocks)
    resumed whole ``rounds`` times, round-robin, one request every 1 / ``rate_rps`` s, one output token each."""
    per = -(-context_tokens // block_tokens)
    reqs = []
    for r in range(rounds):
        for s in range(sessions):
            j = r * sessions + s
            reqs.append(TraceRequest(j * 1000.0 / rate_rps, context_tokens, 1,
                                     tuple(range(s * per, (s + 1) * per)), f"s{s}", r + 1))
    return Trace("mooncake", block_tokens, tuple(reqs), source="capacity sweep")


def reusable_tokens(trace: Trace) -> int:
    """Pure: what any cache could serve of a trace's prompts: every request whose whole context came before, but
    its last token (an engine computes at least one)."""
    seen: set[tuple[int, ...]] = set()
    out = 0
    for r in trace.requests:
        if r.hash_ids in seen:
            out += r.input_tokens - 1
        seen.add(r.hash_ids)
    return out


# ------------------------------------------------------------------------------------------ levels, pure


def point_levels(pt: CapacityPoint, prompt: float | None, memory: float | None, connector: float | None,
                 ram: float | None, evicted: float | None) -> CapacityPoint:
    """Pure: a point's tokens by level from its counter deltas: the tier's are the connector's hits less the RAM
    level's; recomputed is what no level served of the reusable tokens; each rate a share of the reusable tokens
    (at most 1: a connector counts whole chunks, one token past the reusable)."""
    tier = None if connector is None or ram is None else connector - ram
    reuse = pt.reusable_tokens or 0.0
    served = None if memory is None or connector is None or ram is None else memory + connector
    rec = None if served is None else max(0.0, reuse - served)

    def rate(v: float | None) -> float | None:
        return None if v is None or reuse <= 0 else min(1.0, v / reuse)

    return pt.model_copy(update=dict(
        prompt_tokens=prompt, memory_hit_tokens=memory, ram_hit_tokens=ram, tier_hit_tokens=tier,
        recomputed_tokens=rec, memory_hit_rate=rate(memory), ram_hit_rate=rate(ram), tier_hit_rate=rate(tier),
        recomputed_rate=rate(rec), tier_evicted_tokens=evicted))


def capacity_curve(points: list[CapacityPoint]) -> list[CapacityCurvePoint]:
    """Pure: each working set's figures (``CAPACITY_FIGURES``) as the median over its trials, in sweep order."""
    order: list[str] = []
    by: dict[str, list[CapacityPoint]] = {}
    for p in points:
        if p.label not in by:
            order.append(p.label)
        by.setdefault(p.label, []).append(p)
    out = []
    for label in order:
        pts = by[label]
        figs = {}
        for name in CAPACITY_FIGURES:
            vals = [getattr(p, name) for p in pts if getattr(p, name) is not None]
            if vals:
                figs[name] = median(vals)
        out.append(CapacityCurvePoint(label=label, working_set_x=pts[0].working_set_x, sessions=pts[0].sessions,
                                      figures=figs))
    return out


def capacity_knee(curve: list[CapacityCurvePoint]) -> tuple[float | None, str]:
    """Pure: the working set at which engine memory stops holding and the levels below take over: the first
    point (ascending) whose engine-memory hit rate is under half and below the RAM level's and tier's together.
    None, with why, when engine memory holds the whole sweep or nothing below it takes over."""
    for c in curve:
        f = c.figures
        mem = f.get("memory_hit_rate")
        below = (f.get("ram_hit_rate") or 0.0) + (f.get("tier_hit_rate") or 0.0)
        if mem is None:
            continue
        if mem < KNEE_SHARE and below > mem:
            return c.working_set_x, (f"at {c.working_set_x:g}x engine memory ({c.sessions} sessions) engine memory "
                                     f"served {mem:.2f} of the reusable tokens, the levels below it {below:.2f}")
    if curve and all((c.figures.get("memory_hit_rate") or 0.0) >= KNEE_SHARE for c in curve):
        return None, "engine memory held every working set of the sweep: no knee within it"
    return None, "engine memory stopped holding but no level below it took over: no tier knee"


def tier_exhausted(curve: list[CapacityCurvePoint]) -> float | None:
    """Pure: the first working set at which the tier's own capacity ran out: it evicted while serving the point
    and at least half of the reusable tokens were recomputed (evicting what earlier points left is not running
    out). None when that never happened or the engine does not count the tier's evictions."""
    return next((c.working_set_x for c in curve if (c.figures.get("tier_evicted_tokens") or 0) > 0
                 and (c.figures.get("recomputed_rate") or 0.0) >= KNEE_SHARE), None)


def requirement_rate(curve: list[CapacityCurvePoint], levels: list[str], up_to_x: float) -> float | None:
    """Pure: the lowest hit rate of ``levels`` together over the points past engine memory (x > 1) up to
    ``up_to_x``; None when a point in that range lacks one of the levels' figures (or none is in range)."""
    vals = []
    for c in curve:
        if not 1 < c.working_set_x <= up_to_x + 1e-9:
            continue
        parts = [c.figures.get(f"{lv}_hit_rate") for lv in levels]
        if any(v is None for v in parts):
            return None
        vals.append(min(1.0, sum(parts)))
    return min(vals) if vals else None


def capacity_validity(points: list[CapacityPoint], curve: list[CapacityCurvePoint], arm_invalid: str | None,
                      fallback: str | None) -> list[ValidityCheck]:
    """Pure: what the curve rests on: the arm valid by g2-load's rules with no fall-back in its log; every level
    counted and adding up at every point; engine memory holding the smallest working set."""
    why = fallback or arm_invalid
    out = [ValidityCheck(name="tier arm valid", ok=why is None,
                         claim="every point of the sweep is valid by g2-load's rules and the engine's log shows no "
                               "fall-back",
                         how=why or "client lag within its bound, the tier's hits reconciled with the pool device's "
                                    "read bytes, the whole log scanned for fall-back lines")]
    missing = next((p for p in points if None in (p.memory_hit_tokens, p.ram_hit_tokens, p.tier_hit_tokens)), None)
    twice = next((p for p in points if p.tier_hit_tokens is not None and p.tier_hit_tokens < 0), None)
    over = next((p for p in points if None not in (p.memory_hit_tokens, p.ram_hit_tokens, p.tier_hit_tokens,
                                                   p.prompt_tokens)
                 and p.memory_hit_tokens + p.ram_hit_tokens + p.tier_hit_tokens > p.prompt_tokens), None)
    if not points:
        how, ok = "no point of the sweep ran", False
    elif missing is not None:
        how, ok = (f"{missing.label}, trial {missing.trial}: the engine exposes no counter for "
                   f"{', '.join(n for n, v in (('engine memory', missing.memory_hit_tokens), ('the RAM level', missing.ram_hit_tokens), ('the tier', missing.tier_hit_tokens)) if v is None)}"
                   " hits: the levels are unproven"), False
    elif twice is not None:
        how, ok = (f"{twice.label}, trial {twice.trial}: the RAM level's hits ({twice.ram_hit_tokens:.0f}) exceed the "
                   f"connector's ({twice.ram_hit_tokens + twice.tier_hit_tokens:.0f})"), False
    elif over is not None:
        how, ok = (f"{over.label}, trial {over.trial}: the levels served {over.memory_hit_tokens + over.ram_hit_tokens + over.tier_hit_tokens:.0f} "
                   f"of {over.prompt_tokens:.0f} prompt tokens: a token counted at two levels"), False
    else:
        how, ok = (f"{len(points)} points: engine-memory, RAM-level and tier hits from the engine's counters, none "
                   "over its prompt tokens"), True
    out.append(ValidityCheck(name="levels counted", ok=ok, claim="every prompt token is counted at one level: "
                             "engine memory, the RAM level, the tier, or recomputed", how=how))
    first = curve[0] if curve else None
    mem = first.figures.get("memory_hit_rate") if first is not None else None
    ok = mem is not None and mem >= KNEE_SHARE
    out.append(ValidityCheck(
        name="engine memory held the smallest working set", ok=ok,
        claim="the sweep starts below engine memory: the engine's own memory served its smallest working set",
        how=("no point ran" if first is None else
             f"at {first.working_set_x:g}x engine memory ({first.sessions} session(s)) engine memory served "
             f"{0.0 if mem is None else mem:.2f} of the reusable tokens (at least {KNEE_SHARE} needed: otherwise the "
             "engine's memory is not the size the gate gives it)"),
        figure="engine-memory hit rate at the smallest working set", value=mem, unit="ratio"))
    return out


def evaluate_capacity(points: list[CapacityPoint], ev: CapacityEvidence, arm_invalid: str | None,
                      fallback: str | None) -> tuple[CapacityEvidence, dict[str, float], list[ValidityCheck]]:
    """Pure: the curve, its knee, where the tier ran out and the requirement's figure from every point × trial;
    the metrics (``CAPACITY_METRICS`` and ``FIGURE@LABEL`` per point) and the validity checks."""
    ev = ev.model_copy(deep=True)
    ev.points = list(points)
    ev.curve = capacity_curve(points)
    ev.knee_x, ev.knee_note = capacity_knee(ev.curve)
    ev.tier_evictions_counted = bool(points) and all(p.tier_evicted_tokens is not None for p in points)
    ev.tier_exhausted_x = tier_exhausted(ev.curve)
    metrics: dict[str, float] = {}
    for c in ev.curve:
        for name, v in c.figures.items():
            metrics[f"{name}@{c.label}"] = v
    if ev.knee_x is not None:
        metrics["knee_x"] = ev.knee_x
    if ev.tier_exhausted_x is not None:
        metrics["tier_exhausted_x"] = ev.tier_exhausted_x
    if ev.require_levels and ev.require_up_to_x is not None:
        ev.capacity_hit_rate = requirement_rate(ev.curve, ev.require_levels, ev.require_up_to_x)
        if ev.capacity_hit_rate is not None:
            metrics["capacity_hit_rate"] = ev.capacity_hit_rate
    return ev, metrics, capacity_validity(points, ev.curve, arm_invalid, fallback)

