"""Token-id prompts for a trace's requests: requests sharing hash ids share exactly those token blocks.

Each hash id stands for one block of token ids drawn deterministically from (seed, hash id), so two requests
whose ``hash_ids`` start alike start with the same tokens, as far as those blocks go, and differ after. A
partial last block is the first tokens of its block. ``tokens_per_block`` re-maps the trace's blocks to another
size (e.g. a Bailian trace's 16-token blocks to an engine's 256-token chunks: every prompt grows by the same
factor and keeps its sharing structure, block for block); without it the trace's own block size is used, and an
engine whose block does not divide it hits only the whole engine blocks within the shared tokens.
"""

from __future__ import annotations

import random

from .traces import Trace, TraceRequest

FIRST_ID = 10  # ids 0..9 are special tokens in most vocabularies


def block_ids(hash_id: int, n: int, vocab_size: int, seed: int) -> list[int]:
    """The ``n`` token ids of hash id ``hash_id`` (same arguments, same ids, any machine)."""
    if vocab_size <= FIRST_ID:
        raise ValueError(f"vocabulary of {vocab_size} tokens leaves no content ids")
    rng = random.Random(f"kvgate-trace-block:{seed}:{hash_id}")
    return [rng.randrange(FIRST_ID, vocab_size) for _ in range(n)]


def prompt_ids(req: TraceRequest, trace_block_tokens: int, vocab_size: int, seed: int,
               tokens_per_block: int | None = None) -> list[int]:
    """The request's prompt: its blocks' ids, the last one cut to the prompt's length."""
    per = tokens_per_block or trace_block_tokens
    length = req.input_tokens if per == trace_block_tokens else -(-req.input_tokens * per // trace_block_tokens)
    out: list[int] = []
    for h in req.hash_ids:
        out += block_ids(h, min(per, length - len(out)), vocab_size, seed)
        if len(out) >= length:
            break
    return out


def trace_prompts(trace: Trace, vocab_size: int, seed: int, tokens_per_block: int | None = None) -> list[list[int]]:
    """Every request's prompt, in the trace's order."""
    return [prompt_ids(r, trace.block_tokens, vocab_size, seed, tokens_per_block) for r in trace.requests]
