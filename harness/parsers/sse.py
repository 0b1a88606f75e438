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
