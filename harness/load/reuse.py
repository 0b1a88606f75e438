"""What a trace's reuse allows (``kvgate trace stats``): the bound a measured hit rate is compared with.

A request finds in a prefix cache the longest prefix of its blocks that the cache holds (a block is found only
after every block before it: prefix-aware ids name a block together with everything before it), and then
holds all its blocks (the engine stores what it computed). Hit tokens are the tokens of the found prefix,
at most the prompt minus one token (an engine computes at least the last one), rounded down to whole blocks of
the engine (``engine_block_tokens``: vLLM's block, LMCache's chunk): vLLM hits at most (n-1) // B blocks. For a cache of ``capacity`` tokens:

- ``unbounded``: every block ever seen is held (the hit rate of an infinite cache, the trace's own reuse);
- ``lru``: least recently used blocks are evicted first (what engines and LMCache do);
- ``ideal``: the block needed again farthest in the future is evicted first (Belady's offline rule; with
  prefix lookups a close bound, not a proven optimum).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass, field

from .traces import Trace

INF = float("inf")


@dataclass(frozen=True)
class CapacityPoint:
    capacity_tokens: int
    lru_hit_rate: float
    ideal_hit_rate: float


@dataclass(frozen=True)
class ReuseStats:
    requests: int
    sessions: int | None
    duration_s: float
    prompt_tokens: int
    output_tokens: int
    block_tokens: int
    engine_block_tokens: int
    distinct_blocks: int
    working_set_tokens: int            # distinct blocks x block size: what an infinite cache would hold
    unbounded_hit_rate: float           # hit tokens / prompt tokens with an infinite cache
    capacities: tuple[CapacityPoint, ...] = field(default_factory=tuple)


def _hit_tokens(req, found_blocks: int, block_tokens: int, engine_block: int) -> int:
    tokens = min(found_blocks * block_tokens, req.input_tokens - 1)   # the last token is always computed
    return max(0, tokens // engine_block * engine_block)


def _prefix_found(hash_ids: tuple[int, ...], held) -> int:
    """How many of a request's leading blocks the cache holds (a block counts only after all before it)."""
    found = 0
    while found < len(hash_ids) and hash_ids[found] in held:
        found += 1
    return found


class _Lru:
    """Evicts the least recently used block."""

    def __init__(self, trace: Trace):
        self.held: OrderedDict[int, None] = OrderedDict()

    def store(self, h: int, pos: int) -> None:
        self.held[h] = None
        self.held.move_to_end(h)

    def evict(self) -> None:
        self.held.popitem(last=False)


class _Ideal:
    """Evicts the block whose next use is farthest in the future (Belady)."""

    def __init__(self, trace: Trace):
        seq = [h for r in trace.requests for h in r.hash_ids]
        self.next_use = [INF] * len(seq)
        last: dict[int, int] = {}
        for i in range(len(seq) - 1, -1, -1):
            self.next_use[i] = last.get(seq[i], INF)
            last[seq[i]] = i
        self.held: dict[int, float] = {}
        self.heap: list[tuple[float, int]] = []

    def store(self, h: int, pos: int) -> None:
        self.held[h] = self.next_use[pos]
        heapq.heappush(self.heap, (-self.next_use[pos], h))

    def evict(self) -> None:
        while True:
            neg, h = heapq.heappop(self.heap)
            if self.held.get(h) == -neg:  # not a stale entry
                del self.held[h]
                return


def _simulate(trace: Trace, capacity_blocks: float, policy: str, engine_block: int) -> int:
    """Hit tokens of the whole trace through one cache (pure)."""
    cache = (_Ideal if policy == "ideal" else _Lru)(trace)
    hits, pos = 0, 0
    for r in trace.requests:
        hits += _hit_tokens(r, _prefix_found(r.hash_ids, cache.held), trace.block_tokens, engine_block)
        for h in r.hash_ids:
            cache.store(h, pos)
            pos += 1
        while len(cache.held) > capacity_blocks:
            cache.evict()
    return hits


def reuse_stats(trace: Trace, capacities_tokens: list[int] = (), engine_block_tokens: int | None = None) -> ReuseStats:
    """Pure: the trace's reuse, and the hit rates of caches of the given capacities (tokens)."""
    eb = engine_block_tokens or trace.block_tokens
    if eb < 1:
        raise ValueError("engine_block_tokens must be >= 1")
    prompt = sum(r.input_tokens for r in trace.requests)
    distinct = len({h for r in trace.requests for h in r.hash_ids})

    def rate(hit: int) -> float:
        return hit / prompt if prompt else 0.0

    points = tuple(CapacityPoint(c, rate(_simulate(trace, c // trace.block_tokens, "lru", eb)),
                                 rate(_simulate(trace, c // trace.block_tokens, "ideal", eb)))
                   for c in capacities_tokens)
    sessions = {r.session for r in trace.requests if r.session is not None}
    return ReuseStats(requests=len(trace.requests), sessions=len(sessions) or None, duration_s=trace.duration_s,
                      prompt_tokens=prompt, output_tokens=sum(r.output_tokens for r in trace.requests),
                      block_tokens=trace.block_tokens, engine_block_tokens=eb, distinct_blocks=distinct,
                      working_set_tokens=distinct * trace.block_tokens,
                      unbounded_hit_rate=rate(_simulate(trace, INF, "lru", eb)), capacities=points)
