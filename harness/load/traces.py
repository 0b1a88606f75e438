"""Session traces: the Mooncake FAST'25 JSONL format and the Qwen-Bailian format, read strictly.

Mooncake (``kvcache-ai/Mooncake`` FAST25-release traces), one request per line::

    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48, ...]}

``timestamp`` is the arrival in milliseconds since the first request; ``hash_ids`` name the prompt's blocks of
512 tokens, prefix-aware: two requests whose lists start with the same ids share exactly those blocks (and the
whole prefix before them).

Qwen-Bailian (Alibaba Bailian / Qwen traces, ``qwen_traceA_blksz_16.jsonl``), one request per line::

    {"chat_id": 160, "parent_chat_id": 159, "timestamp": 62.5, "input_length": 400, "output_length": 80,
     "type": "text", "turn": 2, "hash_ids": [1089, 1090, ...]}

``timestamp`` in seconds, ``hash_ids`` over blocks of 16 tokens, ``parent_chat_id`` -1 for a session's first
request; the turns of a session chain through their parents.

Both: ``len(hash_ids) == ceil(input_length / block_tokens)`` (the last block may be partial). Every problem is a
ConfigIssue naming the file, the line and the field, all of them at once.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Literal

from ..errors import ConfigError, ConfigIssue
from ..safeio import InputFileError, read_text

Format = Literal["mooncake", "bailian"]
BLOCK_TOKENS: dict[str, int] = {"mooncake": 512, "bailian": 16}
MAX_TRACE_BYTES = 1 << 30   # the public Mooncake traces are a few MB; a day of a large service fits
MAX_ISSUES = 50             # after this many bad lines the rest is not read line by line


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace (times in ms from the trace's first request)."""

    t_ms: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...]
    session: str | None = None   # Bailian: the chat_id at the root of its parent chain
    turn: int | None = None
    line: int = 0                # where it came from in its file (0: made, not read)


@dataclass(frozen=True)
class Trace:
    """A trace in arrival order; ``block_tokens`` tokens per hash id."""

    format: Format
    block_tokens: int
    requests: tuple[TraceRequest, ...]
    source: str = ""

    @property
    def duration_s(self) -> float:
        return (self.requests[-1].t_ms - self.requests[0].t_ms) / 1000.0 if self.requests else 0.0


def _int(obj: dict, key: str, minimum: int) -> int:
    v = obj.get(key)
    if isinstance(v, bool) or not isinstance(v, int):
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        else:
            raise ValueError(f"expected an integer >= {minimum}, got {json.dumps(v)[:40]}")
    if v < minimum:
        raise ValueError(f"expected an integer >= {minimum}, got {v}")
    return v


def _field(issues: list, source: str, line: int, key: str, fn) -> Any:
    try:
        return fn()
    except ValueError as exc:
        issues.append(ConfigIssue(source, line, key, str(exc)))
        return None


def detect_format(first: dict) -> Format:
    """Bailian lines carry ``chat_id``; Mooncake lines do not."""
    return "bailian" if "chat_id" in first else "mooncake"


def _json_rows(text: str, source: str) -> list[tuple[int, dict]]:
    """Pure: (line number, object) of every non-blank line; ConfigError naming each line that is no JSON object
    (up to MAX_ISSUES), or an empty trace."""
    issues: list[ConfigIssue] = []
    rows: list[tuple[int, dict]] = []
    for n, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            issues.append(ConfigIssue(source, n, "", f"not a JSON object: {str(exc)[:80]}"))
            continue
        if not isinstance(obj, dict):
            issues.append(ConfigIssue(source, n, "", "not a JSON object"))
            continue
        rows.append((n, obj))
        if len(issues) >= MAX_ISSUES:
            break
    if not rows and not issues:
        issues.append(ConfigIssue(source, None, "", "no requests in the trace"))
    if issues:
        raise ConfigError(issues)
    return rows


def _timestamp_ms(obj: dict, fmt: Format) -> float:
    """Pure: a row's timestamp in ms (Mooncake gives ms, Bailian seconds); ValueError unless a number >= 0."""
    v = obj.get("timestamp")
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ValueError(f"expected a number >= 0 ({'ms' if fmt == 'mooncake' else 's'}), got "
                         f"{json.dumps(v)[:40]}")
    return float(v) * (1.0 if fmt == "mooncake" else 1000.0)


def _hash_ids(obj: dict, inp: int | None, bt: int) -> tuple[int, ...]:
    """Pure: a row's block hash ids; ValueError unless integers, one per ``bt``-token block of its input."""
    v = obj.get("hash_ids")
    if not isinstance(v, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in v):
        raise ValueError("expected a list of integers")
    if inp is not None and len(v) != math.ceil(inp / bt):
        raise ValueError(f"{len(v)} hash ids for {inp} input tokens; blocks of {bt} tokens need "
                         f"{math.ceil(inp / bt)}")
    return tuple(v)


def parse_trace(text: str, source: str = "<trace>", fmt: Format | Literal["auto"] = "auto",
                block_tokens: int | None = None) -> Trace:
    """Pure: a trace from its JSONL text. Raises ConfigError listing every bad line (file:line: field: why)."""
    issues: list[ConfigIssue] = []
    rows = _json_rows(text, source)
    if fmt == "auto":
        fmt = detect_format(rows[0][1])
    bt = block_tokens or BLOCK_TOKENS[fmt]
    known = ({"timestamp", "input_length", "output_length", "hash_ids"} if fmt == "mooncake" else
             {"chat_id", "parent_chat_id", "timestamp", "input_length", "output_length", "type", "turn", "hash_ids"})
    parents: dict[int, int] = {}
    reqs: list[tuple[TraceRequest, int | None]] = []
    for n, obj in rows:
        if len(issues) >= MAX_ISSUES:
            break
        extra = sorted(set(obj) - known - {"input_text"})
        if extra:
            issues.append(ConfigIssue(source, n, extra[0], f"not a field of the {fmt} format"))
            continue
        t_ms = _field(issues, source, n, "timestamp", lambda obj=obj: _timestamp_ms(obj, fmt))
        inp = _field(issues, source, n, "input_length", lambda obj=obj: _int(obj, "input_length", 1))
        out = _field(issues, source, n, "output_length", lambda obj=obj: _int(obj, "output_length", 0))
        hids = _field(issues, source, n, "hash_ids", lambda obj=obj, inp=inp: _hash_ids(obj, inp, bt))
        session = turn = parent = None
        if fmt == "bailian":
            cid = _field(issues, source, n, "chat_id", lambda obj=obj: _int(obj, "chat_id", 0))
            parent = _field(issues, source, n, "parent_chat_id",
                            lambda obj=obj: _int({"p": obj.get("parent_chat_id", -1)}, "p", -1))
            turn = _field(issues, source, n, "turn", lambda obj=obj: _int({"t": obj.get("turn", 1)}, "t", 1))
            if cid is not None:
                if cid in parents:
                    issues.append(ConfigIssue(source, n, "chat_id", f"chat_id {cid} appears twice"))
                parents[cid] = parent if parent is not None else -1
                session = str(cid)
        if None in (t_ms, inp, out, hids):
            continue
        reqs.append((TraceRequest(t_ms, inp, out, hids, session, turn, n), parent))
    if issues:
        raise ConfigError(issues)
    if fmt == "bailian":
        reqs = [(replace(r, session=str(_root(int(r.session), parents))), p) for r, p in reqs]  # type: ignore[arg-type]
    ordered = sorted((r for r, _ in reqs), key=lambda r: (r.t_ms, r.line))
    t0 = ordered[0].t_ms
    return Trace(fmt, bt, tuple(replace(r, t_ms=r.t_ms - t0) for r in ordered), source)


def _root(cid: int, parents: dict[int, int]) -> int:
    seen = set()
    while parents.get(cid, -1) != -1 and cid not in seen:
        seen.add(cid)
        cid = parents[cid]
    return cid


def read_trace(path: str | Path, fmt: Format | Literal["auto"] = "auto", block_tokens: int | None = None) -> Trace:
    """A trace file, through kvgate's hardened reader (a regular UTF-8 file of at most 1 GiB)."""
    try:
        text = read_text(path, max_bytes=MAX_TRACE_BYTES, what="trace")
    except InputFileError as exc:
        raise ConfigError([ConfigIssue(exc.file, exc.line, "", exc.message)]) from None
    return parse_trace(text, str(path), fmt, block_tokens)


def trace_lines(trace: Trace) -> Iterable[str]:
    """The trace as JSONL in its own format (timestamps in that format's unit). Bailian: chat ids are the
    requests' positions, each turn's parent the session's previous request."""
    last: dict[str, int] = {}
    for i, r in enumerate(trace.requests):
        if trace.format == "mooncake":
            obj: dict[str, Any] = {"timestamp": round(r.t_ms), "input_length": r.input_tokens,
                                   "output_length": r.output_tokens, "hash_ids": list(r.hash_ids)}
        else:
            parent = last.get(r.session, -1) if r.session is not None else -1
            if r.session is not None:
                last[r.session] = i
            obj = {"chat_id": i, "parent_chat_id": parent, "timestamp": round(r.t_ms / 1000.0, 6),
                   "input_length": r.input_tokens, "output_length": r.output_tokens, "type": "text",
                   "turn": r.turn or 1, "hash_ids": list(r.hash_ids)}
        yield json.dumps(obj, separators=(", ", ": "))


def cut(trace: Trace, max_requests: int | None = None, max_duration_s: float | None = None) -> Trace:
    """The first requests of a trace: at most ``max_requests``, arriving within ``max_duration_s``."""
    reqs = [r for r in trace.requests if max_duration_s is None or r.t_ms <= max_duration_s * 1000.0]
    if max_requests is not None:
        reqs = reqs[:max_requests]
    return replace(trace, requests=tuple(reqs))


def scale_time(trace: Trace, speedup: float) -> Trace:
    """Arrivals ``speedup`` times as fast (2.0: the same requests in half the time)."""
    if not speedup > 0:
        raise ValueError("speedup must be > 0")
    return replace(trace, requests=tuple(replace(r, t_ms=r.t_ms / speedup) for r in trace.requests))
