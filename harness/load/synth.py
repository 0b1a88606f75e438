"""Synthetic session traces of a declared shape (``kvgate trace synth``), in the Mooncake format.

A session is a conversation: a system prompt shared with other sessions (one of ``system_prompts``), then
``turns`` requests, each carrying the whole context so far (system prompt, every earlier user message and
reply) plus a new user message. Blocks are prefix-aware as in Mooncake's traces: a turn shares with the
session's previous turn exactly the blocks that were whole in it, and with every other session exactly the
whole blocks of their common system prompt. Sessions start by a Poisson process (``burstiness`` 1) or a gamma
process (``burstiness`` < 1: burstier, > 1: more regular; the shape of the gaps, mean 1 / ``rate_rps``), turns
follow one another after ``think_time_s`` (exponential, that mean). Same shape and seed, same trace.

:func:`multi_turn_trace` writes another schedule (g2-gain's ``load: {multi_turn: ...}``): sessions served
round-robin, turn by turn, each turn's prompt the session's whole history, requests evenly spaced;
:func:`session_recovery_trace` sessions that arrive once and are resumed with their whole context;
:func:`fan_out_trace` single requests fanning out from shared system prompts. :data:`SHAPES` names them all:
a gate declares one in ``load:`` and ``kvgate trace synth --shape`` writes the same trace.
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass
from typing import Any, Callable

from .traces import Trace, TraceRequest


def bounds_issues(shape: object, at_least_1: tuple[str, ...] = (), at_least_0: tuple[str, ...] = (),
                  above_0: tuple[str, ...] = ()) -> list[str]:
    """Pure: a shape's fields out of their range, as ``field: must be ...`` lines, in the order given."""
    return ([f"{n}: must be >= 1" for n in at_least_1 if getattr(shape, n) < 1]
            + [f"{n}: must be >= 0" for n in at_least_0 if getattr(shape, n) < 0]
            + [f"{n}: must be > 0" for n in above_0 if not getattr(shape, n) > 0])


@dataclass(frozen=True)
class TraceShape:
    sessions: int = 16
    turns: int = 4
    system_prompts: int = 1           # distinct shared system prompts (0: none)
    system_prompt_tokens: int = 1024
    user_tokens: int = 256            # a new user message
    output_tokens: int = 128          # a reply, part of the next turn's context
    rate_rps: float = 1.0             # session starts per second
    burstiness: float = 1.0           # gamma shape of the gaps between session starts (1: Poisson)
    think_time_s: float = 5.0         # mean time between a session's turns
    block_tokens: int = 512
    seed: int = 0

    def check(self) -> list[str]:
        """What is wrong with the shape, as ``field: why`` lines (empty when fine)."""
        return bounds_issues(self, at_least_1=("sessions", "turns", "user_tokens", "block_tokens"),
                             at_least_0=("system_prompts", "system_prompt_tokens", "output_tokens", "think_time_s"),
                             above_0=("rate_rps", "burstiness"))


def synthesize(shape: TraceShape) -> Trace:
    """The trace of ``shape`` (raises ValueError naming the bad fields)."""
    bad = shape.check()
    if bad:
        raise ValueError("; ".join(bad))
    rng = random.Random(f"kvgate-trace:{shape.seed}")
    next_id = 0

    def new_ids(n: int) -> list[int]:
        nonlocal next_id
        ids = list(range(next_id, next_id + n))
        next_id += n
        return ids

    bt = shape.block_tokens
    # A system prompt's whole blocks are shared; its tail is in the session's first partial block.
    systems = [new_ids(shape.system_prompt_tokens // bt) for _ in range(shape.system_prompts)]
    starts, t = [], 0.0
    for _ in range(shape.sessions):
        starts.append(t)
        t += rng.gammavariate(shape.burstiness, 1.0 / (shape.rate_rps * shape.burstiness))
    events: list[tuple[float, int, TraceRequest]] = []
    for s in range(shape.sessions):
        sys_blocks = systems[rng.randrange(len(systems))] if systems else []
        ctx_tokens = shape.system_prompt_tokens if systems else 0
        blocks = list(sys_blocks)          # whole blocks of the context so far, prefix-aware ids
        at = starts[s]
        for turn in range(1, shape.turns + 1):
            prompt = ctx_tokens + shape.user_tokens
            whole = prompt // bt
            ids = blocks[:whole] + new_ids(whole - len(blocks[:whole]))
            if prompt % bt:
                ids += new_ids(1)           # the partial last block: its content is this turn's own
            events.append((at * 1000.0, len(events),
                           TraceRequest(at * 1000.0, prompt, shape.output_tokens, tuple(ids), f"s{s}", turn)))
            blocks = ids[:whole]
            ctx_tokens = prompt + shape.output_tokens
            # the reply completes the partial block: from the next turn on it is whole, with new content
            at += rng.expovariate(1.0 / shape.think_time_s) if shape.think_time_s > 0 else 0.0
    ordered = [r for _, _, r in heapq.nsmallest(len(events), events)]
    return Trace("mooncake", bt, tuple(ordered), source="synth")


@dataclass(frozen=True)
class MultiTurnShape:
    """Multi-turn sessions served round-robin, turn by turn: every session's turn 1, then every session's turn 2,
    ...; turn 1's prompt is ``first_prompt_tokens`` of the session's own, each later turn's the session's whole
    history (the previous turn's prompt, a reply of ``reply_tokens``, a new user message of ``user_tokens``), so
    its prefix is exactly the previous turn's prompt. Requests ``1 / rate_rps`` s apart in that order."""

    sessions: int = 6
    turns: int = 3
    first_prompt_tokens: int = 1024
    user_tokens: int = 192
    reply_tokens: int = 64
    output_tokens: int = 4            # each request's output (the gate's max_tokens may cut it)
    rate_rps: float = 20.0

    def check(self) -> list[str]:
        """What is wrong with the shape, as ``field: why`` lines (empty when fine)."""
        return bounds_issues(self, at_least_1=("sessions", "turns", "first_prompt_tokens", "user_tokens",
                                               "output_tokens"), at_least_0=("reply_tokens",), above_0=("rate_rps",))

    @property
    def block_tokens(self) -> int:
        """The trace's tokens per hash id: the largest block every turn's prompt is a whole number of (turn 1's
        prompt, and what each turn adds), so a turn shares exactly the previous turn's blocks, none partial."""
        return math.gcd(self.first_prompt_tokens, self.reply_tokens + self.user_tokens)

    def prompt_tokens(self, turn: int) -> int:
        """Turn ``turn``'s prompt length (1-based)."""
        return self.first_prompt_tokens + (turn - 1) * (self.reply_tokens + self.user_tokens)


def multi_turn_trace(shape: MultiTurnShape) -> Trace:
    """Pure: the trace of ``shape`` (raises ValueError naming the bad fields), in the Mooncake format: session
    ``s``'s turn ``t`` is request ``(t - 1) * sessions + s``, at that index / ``rate_rps`` s; its hash ids are the
    previous turn's and then new ones (prefix-aware), so the prompts built from them (harness/load/prompts.py)
    extend one another token for token. Same shape, same trace."""
    bad = shape.check()
    if bad:
        raise ValueError("; ".join(bad))
    bt = shape.block_tokens
    first, more = shape.first_prompt_tokens // bt, (shape.reply_tokens + shape.user_tokens) // bt
    per_session = first + (shape.turns - 1) * more   # blocks of a session's last turn
    reqs = []
    for turn in range(1, shape.turns + 1):
        n = first + (turn - 1) * more
        for s in range(shape.sessions):
            j = (turn - 1) * shape.sessions + s
            ids = tuple(range(s * per_session, s * per_session + n))
            reqs.append(TraceRequest(j * 1000.0 / shape.rate_rps, shape.prompt_tokens(turn), shape.output_tokens,
                                     ids, f"s{s}", turn))
    return Trace("mooncake", bt, tuple(reqs), source="multi-turn sessions")


@dataclass(frozen=True)
class SessionRecoveryShape:
    """Sessions that arrive once and are later resumed with their whole context: session ``s`` arrives at
    ``s * gap_s``; from ``resume_at_s`` on, every session is resumed ``resumes`` times in a burst, round-robin
    (every session once, then every session again), ``resume_gap_s`` apart, each resume the same prompt (the same
    hash ids) as its first arrival. The reuse an engine that finds a prompt only by its whole block-aligned prompt
    can serve (vLLM's ExampleConnector): all but the last partial block of a resumed prompt."""

    sessions: int = 4
    resumes: int = 2
    prompt_tokens: int = 2050
    output_tokens: int = 2
    block_tokens: int = 128
    gap_s: float = 0.6
    resume_at_s: float = 4.0
    resume_gap_s: float = 0.1

    def check(self) -> list[str]:
        """What is wrong with the shape, as ``field: why`` lines (empty when fine)."""
        return bounds_issues(self, at_least_1=("sessions", "resumes", "prompt_tokens", "block_tokens"),
                             at_least_0=("output_tokens", "gap_s", "resume_at_s", "resume_gap_s"))


def session_recovery_trace(shape: SessionRecoveryShape) -> Trace:
    """Pure: the trace of ``shape`` (raises ValueError naming the bad fields), in the Mooncake format: session
    ``s``'s blocks are ids ``s * B .. s * B + B - 1`` (B = ceil(prompt_tokens / block_tokens)) at its arrival
    and at every resume. Same shape, same trace."""
    bad = shape.check()
    if bad:
        raise ValueError("; ".join(bad))
    blocks = math.ceil(shape.prompt_tokens / shape.block_tokens)

    def request(t_s: float, s: int, turn: int) -> TraceRequest:
        return TraceRequest(round(t_s * 1000.0, 3), shape.prompt_tokens, shape.output_tokens,
                            tuple(range(s * blocks, (s + 1) * blocks)), f"s{s}", turn)

    first = [request(s * shape.gap_s, s, 1) for s in range(shape.sessions)]
    order = [(r, s) for r in range(shape.resumes) for s in range(shape.sessions)]
    resumed = [request(shape.resume_at_s + i * shape.resume_gap_s, s, r + 2) for i, (r, s) in enumerate(order)]
    reqs = sorted(first + resumed, key=lambda q: q.t_ms)   # stable: a tie keeps first arrivals first
    return Trace("mooncake", shape.block_tokens, tuple(reqs), source="session recovery")


@dataclass(frozen=True)
class FanOutShape:
    """A system-prompt fan-out: ``requests`` single-turn requests, request ``i`` sent at ``i / rate_rps`` s with
    system prompt ``i % system_prompts`` (``system_prompt_tokens`` tokens, shared by every request that names it)
    and a user message of ``user_tokens`` of its own. The shared reuse is the system prompt's whole blocks."""

    requests: int = 32
    system_prompts: int = 1
    system_prompt_tokens: int = 1024
    user_tokens: int = 128
    output_tokens: int = 16
    rate_rps: float = 4.0
    block_tokens: int = 256

    def check(self) -> list[str]:
        """What is wrong with the shape, as ``field: why`` lines (empty when fine)."""
        return bounds_issues(self, at_least_1=("requests", "system_prompts", "system_prompt_tokens", "user_tokens",
                                               "block_tokens"), at_least_0=("output_tokens",), above_0=("rate_rps",))


def fan_out_trace(shape: FanOutShape) -> Trace:
    """Pure: the trace of ``shape`` (raises ValueError naming the bad fields), in the Mooncake format: the first
    ``system_prompt_tokens // block_tokens`` ids of a request are its system prompt's, the rest its own (a system
    prompt's partial last block shares the block with the user message, so it is the request's own)."""
    bad = shape.check()
    if bad:
        raise ValueError("; ".join(bad))
    bt = shape.block_tokens
    shared = shape.system_prompt_tokens // bt
    prompt = shape.system_prompt_tokens + shape.user_tokens
    own = math.ceil(prompt / bt) - shared
    base = shape.system_prompts * shared
    reqs = []
    for i in range(shape.requests):
        k = i % shape.system_prompts
        ids = tuple(range(k * shared, (k + 1) * shared)) + tuple(range(base + i * own, base + (i + 1) * own))
        reqs.append(TraceRequest(i * 1000.0 / shape.rate_rps, prompt, shape.output_tokens, ids, f"r{i}", 1))
    return Trace("mooncake", bt, tuple(reqs), source="system-prompt fan-out")


# Every shape a gate's ``load:`` declares and ``kvgate trace synth --shape`` writes: its name (the gate's key with
# ``_`` for ``-``), its dataclass and the pure function from one to its trace.
SHAPES: dict[str, tuple[type, Callable[[Any], Trace]]] = {
    "sessions": (TraceShape, synthesize),
    "multi-turn": (MultiTurnShape, multi_turn_trace),
    "session-recovery": (SessionRecoveryShape, session_recovery_trace),
    "fan-out": (FanOutShape, fan_out_trace),
}


def shape_trace(name: str, shape: Any) -> Trace:
    """Pure: the trace of a shape named in :data:`SHAPES` (ValueError naming the bad fields)."""
    return SHAPES[name][1](shape)
