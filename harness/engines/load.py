"""Serving load: requests sent on a schedule (open loop) or by a fixed number of users (closed loop), and the
figures of one load point.

Open loop: request i is sent at ``t0 + offsets_s[i]`` whatever happened to the others — a slow server makes
requests pile up in flight, never makes the client wait (no coordinated omission). Each record keeps when it
was due and when it was sent; the difference is the client's own lag, which must stay small for the point to
measure the server and not the client (``client_lag_p99_s``). Closed loop: ``concurrency`` users, each sending
its next request when its previous one finished.

Arrival schedules are pure and seeded: Poisson (exponential gaps), gamma (shape ``burstiness``: below 1
burstier than Poisson, above 1 more regular; same mean rate), or a trace's own timestamps.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import asdict, dataclass
from typing import Any, Awaitable, Callable, Sequence

import httpx

from ..stats import percentile
from .client import ApiShape, Clock, CompletionRequest, RequestRecord, stream_completion

Sleep = Callable[[float], Awaitable[None]]


def arrival_offsets(n: int, rate_rps: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """``n`` send times (s from the start): gaps drawn from a gamma distribution of mean 1/rate and shape
    ``burstiness`` (1: Poisson). The first request is sent at 0."""
    if n < 0 or not rate_rps > 0 or not burstiness > 0:
        raise ValueError("n >= 0, rate_rps > 0 and burstiness > 0 are required")
    rng = random.Random(f"kvgate-arrivals:{seed}:{rate_rps}:{burstiness}")
    out, t = [], 0.0
    for _ in range(n):
        out.append(t)
        t += rng.gammavariate(burstiness, 1.0 / (rate_rps * burstiness))
    return out


@dataclass(frozen=True)
class LoadRecord:
    """One request under load: when it was due and sent (s from the point's start), and what it measured."""

    due_s: float
    sent_s: float
    record: RequestRecord

    @property
    def lag_s(self) -> float:
        return self.sent_s - self.due_s

    def to_dict(self) -> dict[str, Any]:
        return {"due_s": self.due_s, "sent_s": self.sent_s, "lag_s": self.lag_s, **self.record.to_dict()}


async def open_loop(base_url: str, requests: Sequence[CompletionRequest], offsets_s: Sequence[float], model: str,
                    clock: Clock = time.perf_counter, sleep: Sleep = asyncio.sleep,
                    transport: httpx.AsyncBaseTransport | None = None, timeout_s: float | None = 600.0,
                    path: str = "/v1/completions", api: ApiShape | None = None,
                    max_connections: int = 1024) -> list[LoadRecord]:
    """Send ``requests[i]`` at ``offsets_s[i]`` from now, each on its own task; records in request order."""
    if len(offsets_s) != len(requests):
        raise ValueError(f"{len(requests)} requests but {len(offsets_s)} send times")
    url = base_url.rstrip("/") + path
    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
    async with httpx.AsyncClient(transport=transport, limits=limits, timeout=timeout_s) as client:
        t0 = clock()
        tasks: list[asyncio.Task] = []

        async def one(req: CompletionRequest, due: float) -> LoadRecord:
            sent = clock() - t0
            rec = await stream_completion(client, url, req, model, clock=clock, timeout_s=timeout_s, api=api)
            return LoadRecord(due, sent, rec)

        for req, due in sorted(zip(requests, offsets_s), key=lambda x: x[1]):
            wait = t0 + due - clock()
            if wait > 0:
                await sleep(wait)
            tasks.append(asyncio.ensure_future(one(req, due)))
            await asyncio.sleep(0)  # let the task send before the next one is scheduled
        done = await asyncio.gather(*tasks)
    by_id = {r.record.request_id: r for r in done}
    return [by_id[r.request_id] for r in requests]


async def closed_loop(base_url: str, requests: Sequence[CompletionRequest], concurrency: int, model: str,
                      clock: Clock = time.perf_counter, transport: httpx.AsyncBaseTransport | None = None,
                      timeout_s: float | None = 600.0, path: str = "/v1/completions",
                      api: ApiShape | None = None) -> list[LoadRecord]:
    """``concurrency`` users take the requests in order, each sending its next one when its last finished."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    url = base_url.rstrip("/") + path
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    queue = list(enumerate(requests))
    out: dict[int, LoadRecord] = {}
    async with httpx.AsyncClient(transport=transport, limits=limits, timeout=timeout_s) as client:
        t0 = clock()

        async def user() -> None:
            while queue:
                i, req = queue.pop(0)
                sent = clock() - t0
                rec = await stream_completion(client, url, req, model, clock=clock, timeout_s=timeout_s, api=api)
                out[i] = LoadRecord(sent, sent, rec)  # a closed loop is due when a user is free

        await asyncio.gather(*(user() for _ in range(min(concurrency, len(requests)))))
    return [out[i] for i in range(len(requests))]


@dataclass(frozen=True)
class LoadPoint:
    """The figures of one load point (one rate or concurrency, one trial); times in seconds."""

    requests: int
    ok: int
    failed: int
    duration_s: float
    ttft_p50_s: float | None
    ttft_p90_s: float | None
    ttft_p95_s: float | None
    ttft_p99_s: float | None
    tpot_p50_s: float | None
    e2e_p50_s: float | None
    e2e_p99_s: float | None
    request_rate_rps: float
    output_token_rate_tps: float
    goodput_rps: float
    client_lag_p99_s: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _tpot(r: RequestRecord) -> float | None:
    """Time per output token after the first: (latency - TTFT) / (chunks - 1); None for a single chunk."""
    if r.ttft_s is None or r.latency_s is None or r.output_chunks < 2:
        return None
    return (r.latency_s - r.ttft_s) / (r.output_chunks - 1)


def load_point(records: Sequence[LoadRecord], ttft_slo_s: float | None = None,
               tpot_slo_s: float | None = None) -> LoadPoint:
    """Pure: a point's figures. Its duration runs from the first send to the last stream's end; goodput counts
    the successful requests within both SLOs (an SLO not given always holds)."""
    if not records:
        raise ValueError("a load point needs at least one request")
    ok = [r for r in records if r.record.ok]
    ends = [r.sent_s + (r.record.e2e_s or 0.0) for r in records]
    duration = max(max(ends) - min(r.sent_s for r in records), 1e-9)

    def pct(xs, q):
        xs = [x for x in xs if x is not None]
        return percentile(xs, q) if xs else None

    ttft = [r.record.ttft_s for r in ok]
    tpot = [_tpot(r.record) for r in ok]
    e2e = [r.record.e2e_s for r in ok]
    good = [r for r in ok
            if (ttft_slo_s is None or (r.record.ttft_s is not None and r.record.ttft_s <= ttft_slo_s))
            and (tpot_slo_s is None or (_tpot(r.record) is None or _tpot(r.record) <= tpot_slo_s))]
    return LoadPoint(requests=len(records), ok=len(ok), failed=len(records) - len(ok), duration_s=duration,
                     ttft_p50_s=pct(ttft, 50), ttft_p90_s=pct(ttft, 90), ttft_p95_s=pct(ttft, 95),
                     ttft_p99_s=pct(ttft, 99), tpot_p50_s=pct(tpot, 50), e2e_p50_s=pct(e2e, 50),
                     e2e_p99_s=pct(e2e, 99), request_rate_rps=len(ok) / duration,
                     output_token_rate_tps=sum(r.record.output_chunks for r in ok) / duration,
                     goodput_rps=len(good) / duration,
                     client_lag_p99_s=percentile([max(r.lag_s, 0.0) for r in records], 99))


def knee(points: Sequence[tuple[float, LoadPoint]], slo_s: float, key: str = "ttft_p95_s") -> float | None:
    """Pure: the highest load (the first element of each pair: a rate or a concurrency) whose ``key`` figure
    stays within ``slo_s``, among the loads below the first one that does not; None when the lowest fails."""
    best = None
    for load, p in sorted(points, key=lambda x: x[0]):
        v = getattr(p, key)
        if v is None or v > slo_s or p.failed:
            break
        best = load
    return best
