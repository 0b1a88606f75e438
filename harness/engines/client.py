"""Async streaming client for the OpenAI-compatible completions API: TTFT, inter-token latencies, e2e.

Timing model (one request):
- ``queue_s``: from submission to the moment a concurrency slot is free and the request is sent.
  Client-side waiting is measured here and never inside TTFT.
- ``ttft_s``: from just before the request is sent to the arrival of the first stream chunk that
  carries non-empty text (role-only or empty chunks do not count).
- ``itl_s``: gaps between consecutive non-empty chunks.
- ``latency_s``: from send to the last non-empty chunk, so ``latency_s - ttft_s == sum(itl_s)``.
- ``e2e_s``: from send to the end of the stream (after ``[DONE]``), >= ``latency_s``.
- ``first_event_s``: from send to the first stream event that has choices, a token in it or not (what
  ``vllm bench serve`` calls TTFT: a chat server's role-only preamble counts there); ``<= ttft_s``.
- ``usage_prompt_tokens`` / ``usage_completion_tokens``: the server's own count from the stream's ``usage``
  object (the last one seen; sent when the API shape asks for ``stream_options.include_usage``), None when the
  server sent none. The usage-only event carries no token: it never moves TTFT or the inter-token latencies.
- ``tokens`` / ``token_logprobs`` / ``top_logprobs``: each generated token with its log-probability and the top
  alternatives, in order, when the request asked for ``logprobs`` (g2-answer compares them between a read-back
  from the tier and a re-compute); empty otherwise. Taken from every event that carries them, a token whose text
  is empty included.

A failed request (connection error, HTTP error, malformed or empty stream) is a record whose ``error``
says what happened, on one bounded line (an HTTP error body summarised: harness/parsers/http_error.py); the body
itself, up to ``MAX_ERROR_BODY_BYTES``, is the record's ``error_body``. Nothing here raises for a request that
went wrong. The clock is injectable so the
arithmetic can be tested with a scripted clock.

Stopping: ``stop`` (anything with ``is_set()``: a ``threading.Event``, a gate's Cancellation) is watched while
requests run. Once it is set no request is sent any more and those in flight are dropped (their connections
closed); each becomes a record whose ``error`` starts with ``cancelled``.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Protocol, Sequence

import httpx

from ..parsers.http_error import error_line
from ..parsers.sse import DONE, chunk_logprobs, chunk_text, is_token_chunk, sse_data
from ..stats import percentile

Clock = Callable[[], float]

# The most of an HTTP error body a record keeps (a 422 of 1,025 validation errors is 124 kB): the rest is counted.
MAX_ERROR_BODY_BYTES = 256 * 1024

# How often a running batch of requests looks at its stop flag: the longest a request goes on after the stop.
STOP_POLL_S = 0.02


class StopFlag(Protocol):
    """What ``run_requests`` watches: set means send nothing more and drop what is in flight."""

    def is_set(self) -> bool: ...


CANCELLED = "cancelled: the gate was stopped before this request completed"


@dataclass(frozen=True)
class CompletionRequest:
    """One prompt to send. ``prompt`` is text or a list of token ids (both accepted by vLLM)."""

    request_id: str
    prompt: str | list[int]
    max_tokens: int = 1
    prompt_tokens: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def payload(self, model: str, api: "ApiShape | None" = None) -> dict[str, Any]:
        """The request body: a completions prompt (text or token ids) or, for a chat API, one user message
        (text only); greedy, streamed, ``ignore_eos`` unless the API shape says the server refuses it."""
        api = api or ApiShape()
        if api.kind == "chat":
            if not isinstance(self.prompt, str):
                raise ValueError("a chat API takes text prompts: give the model's tokenizer")
            body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": self.prompt}]}
        else:
            body = {"model": model, "prompt": self.prompt}
        body.update({"max_tokens": self.max_tokens, "stream": True, "temperature": 0.0})
        if api.ignore_eos:
            body["ignore_eos"] = True
        if api.include_usage:
            body["stream_options"] = {"include_usage": True}
        body.update(api.extra_body)
        body.update(self.extra)
        return body


@dataclass(frozen=True)
class ApiShape:
    """What differs between OpenAI-compatible servers (an engine profile's ``api``): completions or chat,
    whether ``ignore_eos`` is sent, extra body fields, whether the stream must end with ``[DONE]``, and whether
    the server is asked for a closing ``usage`` event (``stream_options.include_usage``; off by default, so a
    strict server that refuses ``stream_options`` is not sent one unasked)."""

    kind: str = "completions"
    ignore_eos: bool = True
    require_done: bool = True
    extra_body: dict[str, Any] = field(default_factory=dict)
    include_usage: bool = False


@dataclass(frozen=True)
class RequestRecord:
    """The measured outcome of one request; ``error`` is None only for a stream that produced text."""

    request_id: str
    prompt_tokens: int | None
    queue_s: float
    ttft_s: float | None
    itl_s: tuple[float, ...]
    latency_s: float | None
    e2e_s: float | None
    output_chunks: int
    output_text: str
    http_status: int | None
    error: str | None = None
    started_unix_s: float | None = None
    usage_prompt_tokens: int | None = None
    usage_completion_tokens: int | None = None
    first_event_s: float | None = None
    tokens: tuple[str, ...] = ()
    token_logprobs: tuple[float | None, ...] = ()
    top_logprobs: tuple[dict[str, float], ...] = ()
    error_body: str | None = None  # an HTTP error's body (up to MAX_ERROR_BODY_BYTES, then a note of its size)

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("itl_s", "tokens", "token_logprobs", "top_logprobs"):
            d[k] = list(getattr(self, k))
        return d


@dataclass
class _StreamTally:
    """One request's progress: what its stream delivered so far and when, from which its record is built."""

    request: CompletionRequest
    queue_s: float
    started_unix: float
    t_send: float
    status: int | None = None
    ttft: float | None = None
    first_event: float | None = None
    last: float | None = None
    chunks: int = 0
    itl: list[float] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    usage: dict[str, Any] = field(default_factory=dict)
    logprobs: list[tuple[str, float | None, dict[str, float]]] = field(default_factory=list)

    def take(self, event: Any, now: float) -> None:
        """Count an event with choices that arrived at ``now``: its logprobs, and its text when it is a token."""
        if self.first_event is None:
            self.first_event = now - self.t_send
        self.logprobs += chunk_logprobs(event)
        if not is_token_chunk(event):
            return
        piece = chunk_text(event)
        if self.ttft is None:
            self.ttft = now - self.t_send
        else:
            self.itl.append(now - self.last)
        self.last = now
        self.chunks += 1
        self.text.append(piece)

    def record(self, error: str | None, end: float | None, error_body: str | None = None) -> RequestRecord:
        """The request's record as the stream stands, ended at ``end`` (None: never sent) with ``error``."""
        latency = None if self.last is None else self.last - self.t_send
        return RequestRecord(
            request_id=self.request.request_id, prompt_tokens=self.request.prompt_tokens, queue_s=self.queue_s,
            ttft_s=self.ttft, itl_s=tuple(self.itl), latency_s=latency,
            e2e_s=None if end is None else end - self.t_send, output_chunks=self.chunks,
            output_text="".join(self.text), http_status=self.status, error=error, started_unix_s=self.started_unix,
            usage_prompt_tokens=_count(self.usage.get("prompt_tokens")),
            usage_completion_tokens=_count(self.usage.get("completion_tokens")), first_event_s=self.first_event,
            tokens=tuple(t for t, _, _ in self.logprobs), token_logprobs=tuple(v for _, v, _ in self.logprobs),
            top_logprobs=tuple(top for _, _, top in self.logprobs), error_body=error_body)


def _parse_event(data: str) -> tuple[Any, str | None]:
    """A stream event's JSON and, when it is malformed or the server's error, the record's error for it."""
    try:
        event = json.loads(data)
    except json.JSONDecodeError:
        return None, f"malformed stream event: {data[:200]!r}"
    if isinstance(event, dict) and event.get("error"):
        return event, f"server error in stream: {json.dumps(event['error'])[:500]}"
    return event, None


async def stream_completion(client: httpx.AsyncClient, url: str, request: CompletionRequest, model: str,
                            clock: Clock = time.perf_counter, queue_s: float = 0.0,
                            timeout_s: float | None = 600.0, api: ApiShape | None = None) -> RequestRecord:
    """Send one streaming completion and time it. Never raises for a failed request."""
    started_unix = time.time()
    t_send = clock()
    tally = _StreamTally(request, queue_s, started_unix, t_send)
    api = api or ApiShape()
    try:
        body = request.payload(model, api)
    except ValueError as exc:
        return tally.record(str(exc), None)
    try:
        async with client.stream("POST", url, json=body, timeout=timeout_s) as resp:
            tally.status = resp.status_code
            if resp.status_code != 200:
                read, kept = await _error_body(resp)
                return tally.record(error_line(resp.status_code, read), clock(), kept)
            done = False
            end = None
            async for line in resp.aiter_lines():
                if done:
                    # read on past [DONE] to the body's end, outside the timing: a response left unread is
                    # closed, and the next request would pay a new TCP connection inside its TTFT
                    continue
                data = sse_data(line)
                if data is None:
                    continue
                if data == DONE:
                    done = True
                    end = clock()
                    continue
                event, problem = _parse_event(data)
                if problem is not None:
                    return tally.record(problem, clock())
                if isinstance(event, dict) and isinstance(event.get("usage"), dict):
                    tally.usage = event["usage"]
                # one clock read per event with choices: the first such event and the first token share it
                now = clock() if isinstance(event, dict) and event.get("choices") else None
                if now is not None:
                    tally.take(event, now)
            if end is None:
                end = clock()
            if tally.ttft is None:
                return tally.record("stream ended without a token chunk", end)
            if not done and api.require_done:
                return tally.record("stream ended without [DONE]", end)
            return tally.record(None, end)
    except httpx.TimeoutException as exc:
        return tally.record(f"timeout: {type(exc).__name__}: {exc}", clock())
    except httpx.HTTPError as exc:
        return tally.record(f"{type(exc).__name__}: {exc}", clock())


async def _error_body(resp: httpx.Response) -> tuple[str, str]:
    """An error response's body: the text read (at most MAX_ERROR_BODY_BYTES: a server's error page cannot fill
    the client's memory, nor hold the request past that) and what the record keeps of it (that text, and a note
    when the body went on past it)."""
    buf = bytearray()
    cut = False
    async for chunk in resp.aiter_bytes():
        buf += chunk
        if len(buf) > MAX_ERROR_BODY_BYTES:
            cut = True
            del buf[MAX_ERROR_BODY_BYTES:]
            break
    text = buf.decode(errors="replace")
    return text, (text + f"\n[... cut at {MAX_ERROR_BODY_BYTES} bytes; the body went on]" if cut else text)


def _count(v: Any) -> int | None:
    """A token count from a server's usage object: a non-negative int, else None (never a guess)."""
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def _cancelled_record(req: CompletionRequest, queue_s: float) -> RequestRecord:
    return RequestRecord(request_id=req.request_id, prompt_tokens=req.prompt_tokens, queue_s=queue_s, ttft_s=None,
                         itl_s=(), latency_s=None, e2e_s=None, output_chunks=0, output_text="", http_status=None,
                         error=CANCELLED)


async def run_requests(base_url: str, requests: Sequence[CompletionRequest], model: str, concurrency: int = 1,
                       clock: Clock = time.perf_counter, transport: httpx.AsyncBaseTransport | None = None,
                       timeout_s: float | None = 600.0, path: str = "/v1/completions",
                       api: ApiShape | None = None, stop: StopFlag | None = None) -> list[RequestRecord]:
    """Send all requests with at most ``concurrency`` in flight; records come back in request order. Once
    ``stop`` is set, nothing more is sent and requests in flight are dropped (records with ``error`` CANCELLED)."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    sem = asyncio.Semaphore(concurrency)
    url = base_url.rstrip("/") + path
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    stopped = stop is not None and stop.is_set()
    async with httpx.AsyncClient(transport=transport, limits=limits, timeout=timeout_s) as client:
        async def one(req: CompletionRequest, t_submit: float) -> RequestRecord:
            async with sem:
                queue_s = clock() - t_submit
                if stop is not None and stop.is_set():  # a slot freed after the stop: not sent
                    return _cancelled_record(req, queue_s)
                return await stream_completion(client, url, req, model, clock=clock, queue_s=queue_s,
                                               timeout_s=timeout_s, api=api)
        # Every request is submitted now; a request's wait for a free slot is its queue_s.
        t_submit = clock()
        if stopped:
            return [_cancelled_record(r, 0.0) for r in requests]
        tasks = [asyncio.ensure_future(one(r, t_submit)) for r in requests]
        if stop is not None:
            pending = set(tasks)
            while pending and not stop.is_set():
                _done, pending = await asyncio.wait(pending, timeout=STOP_POLL_S)
            for t in pending:  # the stop came: drop what is in flight (the client's exit closes its connections)
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        else:
            await asyncio.gather(*tasks)
        return [_cancelled_record(r, 0.0) if t.cancelled() else t.result() for r, t in zip(requests, tasks)]


def run_requests_sync(base_url: str, requests: Sequence[CompletionRequest], model: str, concurrency: int = 1,
                      **kw) -> list[RequestRecord]:
    """``run_requests`` from synchronous code (a workload's ``run``)."""
    return asyncio.run(run_requests(base_url, requests, model, concurrency=concurrency, **kw))


def summarize(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """p50/p90/p99 TTFT over the successful records, with counts of failed ones."""
    ok = [r.ttft_s for r in records if r.ok and r.ttft_s is not None]
    out: dict[str, Any] = {"requests": len(records), "ok": len(ok), "failed": len(records) - len(ok)}
    if ok:
        out.update(ttft_p50_s=percentile(ok, 50), ttft_p90_s=percentile(ok, 90), ttft_p99_s=percentile(ok, 99),
                   ttft_mean_s=sum(ok) / len(ok))
    return out
