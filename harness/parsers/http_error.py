"""An OpenAI-compatible server's HTTP error body, as one bounded line for a verdict (pure).

A server's error body can be large: FastAPI answers a completions request whose ``prompt`` is a list of 1,024 token
ids, sent to a server that takes text only, with a 422 of 1,025 pydantic validation errors (124 kB). The verdict
carries one line of it (what failed, how many, the first), the gate's files the whole body.

Shapes read: FastAPI / pydantic ``{"detail": [{"loc": [...], "msg": ...}, ...]}`` and ``{"detail": "..."}``;
OpenAI's ``{"error": {"message": ..., "type": ...}}`` (vLLM, SGLang, llama.cpp's server; llama-cpp-python's, whose
message lists pydantic's errors one repr per line: counted, the first quoted) and vLLM's older
``{"object": "error", "message": ...}``; anything else: its first non-empty line.
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_LINE_CHARS = 300


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _loc(loc: Any) -> str:
    return ".".join(str(p) for p in loc) if isinstance(loc, list) else str(loc)


def _detail_text(detail: Any) -> str | None:
    """FastAPI's ``detail``: a string, or pydantic's list of validation errors (counted, the first quoted)."""
    if isinstance(detail, str):
        return detail
    if isinstance(detail, list) and detail:
        first = detail[0]
        what = (f"{_loc(first.get('loc'))}: {first.get('msg')}" if isinstance(first, dict) and "msg" in first
                else json.dumps(first)[:200])
        n = len(detail)
        return f"{n} validation error{'s' if n != 1 else ''}; first: {what}"
    return None


# pydantic's errors as a server may put them in a message (llama-cpp-python's error handler: "1025 validation
# errors:" then one Python repr of an error dict per line, 'loc' a tuple)
_COUNT = re.compile(r"(\d+) validation errors?\b")
_LOC_MSG = re.compile(r"'loc': \(([^)]*)\), 'msg': '([^']*)'")


def _validation_text(message: str) -> str | None:
    """A message that lists pydantic validation errors: their count and the first one's field and message."""
    count, first = _COUNT.match(message), _LOC_MSG.search(message)
    if count is None or first is None:
        return None
    loc = ".".join(p.strip().strip("'") for p in first.group(1).split(",") if p.strip())
    n = int(count.group(1))
    return f"{n} validation error{'s' if n != 1 else ''}; first: {loc}: {first.group(2)}"


def _message(err: Any) -> str | None:
    """OpenAI's error object (or a bare string), its type after the message."""
    if isinstance(err, str):
        return _validation_text(err) or err
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        kind = err.get("type")
        said = _validation_text(err["message"]) or err["message"]
        return said + (f" ({kind})" if isinstance(kind, str) and kind else "")
    return None


def body_summary(body: str) -> str:
    """What an error body says, on one line (not yet bounded)."""
    text = body.strip()
    if not text:
        return "(empty body)"
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        said = (_detail_text(doc.get("detail")) if "detail" in doc else None) \
            or (_message(doc.get("error")) if "error" in doc else None) or _message(doc)
        if said:
            return _one_line(said)
    first = next(line for line in text.splitlines() if line.strip())
    return _one_line(first)


def error_line(status: int, body: str, limit: int = MAX_LINE_CHARS) -> str:
    """``HTTP <status>: <summary>``, one line of at most ``limit`` characters (cut with an ellipsis)."""
    line = f"HTTP {status}: {body_summary(body)}"
    return line if len(line) <= limit else line[:limit - 1] + "…"
