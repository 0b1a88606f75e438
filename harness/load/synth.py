"""Synthetic session traces of a declared shape (``kvgate trace synth``), in the Mooncake format.

A session is a conversation: a system prompt shared with other sessions (one of ``system_prompts``), then
``turns`` requests, each carrying the whole context so far (system prompt, every earlier user message and
reply) plus a new user message. Blocks are prefix-aware as in Mooncake's traces: a turn shares with the
session's previous turn exactly the blocks that were whole in it, and with every other session exactly the
whole blocks of their common system prompt. Sessions start by a Poisson process (``burstiness`` 1) or a gamma
process (``burstiness`` < 1: burstier, > 1: more regular; the shape of the gaps, mean 1 / ``rate_rps``), turns
follow one another after ``think_time_s`` (exponential, that mean). Same shape and seed, same trace.

:func:`multi_turn_trace` writes another schedule (g2-gain's ``load: {multi_turn: ...}``): sessions served
round-robin, turn by turn, each turn's prompt the session's whole history, requests evenly spaced.
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass

from .traces import Trace, TraceRequest


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
        out = []
        for name in ("sessions", "turns", "user_tokens", "block_tokens"):
            if getattr(self, name) < 1:
                out.append(f"{name}: must be >= 1")
        for name in ("system_prompts", "system_prompt_tokens", "output_tokens"):
            if getattr(self, name) < 0:
                out.append(f"{name}: must be >= 0")
        for name in ("rate_rps", "burstiness"):
            if not getattr(self, name) > 0:
                out.append(f"{name}: must be > 0")
        if self.think_time_s < 0:
            out.append("think_time_s: must be >= 0")
        return out


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
        out = []
        for name in ("sessions", "turns", "first_prompt_tokens", "user_tokens", "output_tokens"):
            if getattr(self, name) < 1:
                out.append(f"{name}: must be >= 1")
        if self.reply_tokens < 0:
            out.append("reply_tokens: must be >= 0")
        if not self.rate_rps > 0:
            out.append("rate_rps: must be > 0")
        return out

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
