"""Server-sent events of the OpenAI-compatible completions stream (pure)."""

from __future__ import annotations

import json
from typing import Iterable

DONE = "[DONE]"


def sse_data(line: str) -> str | None:
    """The payload of a ``data:`` line (``"[DONE]"`` included), None for any other line of the stream."""
    line = line.strip()
    if not line.startswith("data:"):
        return None
    return line[5:].strip()


def parse_sse_lines(lines: Iterable[str]) -> list[dict | str]:
    """The ``data:`` payloads of an SSE stream, JSON-decoded, with ``"[DONE]"`` kept as a string.

    Raises ValueError on a data line that is neither JSON nor ``[DONE]``.
    """
    out: list[dict | str] = []
    for line in lines:
        data = sse_data(line)
        if data is not None:
            out.append(DONE if data == DONE else json.loads(data))
    return out


def is_token_chunk(event: dict) -> bool:
    """Whether a stream event carries generated tokens, even ones whose text is empty (a special token, or a
    byte of a multi-byte character: the token was generated, so it counts for TTFT, as ``vllm bench serve``
    counts it). A completions choice carries ``text``; a chat choice carries ``delta.content``, except the
    role-only preamble (``{"role": "assistant", "content": ""}``) some servers send before any token. The
    usage-only event at the end (no choices) carries none."""
    for c in event.get("choices") or []:
        if isinstance(c.get("text"), str):
            return True
        delta = c.get("delta") or {}
        content = delta.get("content")
        if isinstance(content, str) and not ("role" in delta and content == ""):
            return True
    return False


def chunk_text(event: dict) -> str:
    """Text carried by one completions or chat-completions stream event ('' when none)."""
    choices = event.get("choices") or []
    parts = []
    for c in choices:
        if c.get("text"):
            parts.append(c["text"])
        delta = c.get("delta") or {}
        if delta.get("content"):
            parts.append(delta["content"])
    return "".join(parts)


def chunk_logprobs(event: dict) -> list[tuple[str, float | None, dict[str, float]]]:
    """The tokens one completions stream event carries with their log-probabilities: ``(token, logprob, top)`` per
    token, ``top`` the event's ``top_logprobs`` entry for it (token -> logprob; {} when the server sent none).
    Empty for an event without a ``logprobs`` object (the request did not ask, a chat event, the usage event).
    A token is written as the server writes it (``token_id:123`` with vLLM's ``return_tokens_as_token_ids``);
    a logprob that is not a number (JSON null, or a string) is None: never a guess."""
    out: list[tuple[str, float | None, dict[str, float]]] = []
    for c in event.get("choices") or []:
        lp = c.get("logprobs")
        if not isinstance(lp, dict):
            continue
        tokens = lp.get("tokens") or []
        values = lp.get("token_logprobs") or []
        tops = lp.get("top_logprobs") or []
        for i, tok in enumerate(tokens):
            value = values[i] if i < len(values) else None
            top = tops[i] if i < len(tops) and isinstance(tops[i], dict) else {}
            out.append((str(tok), _number(value), {str(k): v for k, v in top.items() if _number(v) is not None}))
    return out


def _number(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
