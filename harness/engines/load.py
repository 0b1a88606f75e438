"""Serving load: requests sent on a schedule (open loop) or by a fixed number of users (closed loop), and the
figures of one load point.

Open loop: request i is sent at ``t0 + offsets_s[i]`` whatever happened to the others — a slow server makes
requests pile up in flight, never makes the client wait (no coordinated omission). Each record keeps when it
was due and when it was sent; the difference is the client's own lag, which must stay small for the point to
measure the server and not the client (``client_lag_p99_s``). Closed loop: ``concurrency`` users, each sending
its next request when its previous one finished.

Arrival schedules are pure and seeded: Poisson (exponential gaps), gamma (shape ``burstiness``: below 1
burstier than Poisson, above 1 more regular; same mean rate), or a trace's own timestamps.

Stopping (``stop``: a gate's Cancellation or anything with ``is_set()``): from the moment it is set no request is
sent any more, the streams in flight are closed (their records say ``cancelled``, with their due and send times)
and the records already made are returned; a request that was never sent has no record.

More than one event loop: ``open_loop_processes`` deals the schedule round-robin (in send order) to ``loops``
client processes, each running ``open_loop`` on its share from one common start on the system-wide monotonic
clock, and merges their records back in request order; see benchmarks/load_client_bench.py for the rates one
loop reaches.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import random
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Awaitable, Callable, Iterator, Sequence

import httpx

from ..stats import percentile, percentile_with_failures
from .client import (CANCELLED, STOP_POLL_S, ApiShape, Clock, CompletionRequest, RequestRecord, StopFlag,
                     stream_completion)

Sleep = Callable[[float], Awaitable[None]]

# The open loop's timer wakes it this long before a send is due and it yields to the event loop until the due
# time: asyncio's selector rounds a timeout up to whole milliseconds, so a timer alone sends up to 1 ms late.
SPIN_S = 0.002


# How much the load client's thread raises its scheduling priority while it sends a schedule (nice value lowered
# by this much): a client that shares a node's cores with the engine it measures (or with anything else) must not
# wait behind them to send a request on time. It sleeps between sends, so the priority costs the others little.
CLIENT_NICE_DELTA = -5


@contextlib.contextmanager
def client_priority(nice_delta: int = CLIENT_NICE_DELTA) -> Iterator[str]:
    """Lower the calling thread's nice value by ``-nice_delta`` (Linux: nice is per thread; threads it starts
    inherit it) for the ``with`` block, then put it back; yields what was done, for the evidence. Lowering nice
    needs CAP_SYS_NICE (root): where it is refused the schedule runs at the thread's own priority and the text
    says so."""
    tid = threading.get_native_id()
    try:
        before = os.getpriority(os.PRIO_PROCESS, tid)
    except OSError as exc:
        yield f"unchanged (its nice value could not be read: {exc.strerror or exc})"
        return
    target = max(-20, before + nice_delta)
    try:
        os.setpriority(os.PRIO_PROCESS, tid, target)
    except OSError as exc:
        yield f"nice {before}, unchanged: lowering it to {target} was refused ({exc.strerror or exc})"
        return
    try:
        yield f"nice {target} while sending (the thread's own: {before})"
    finally:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, tid, before)


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


def _warm_imports() -> None:
    """Import now what httpx imports on its first request (its anyio backend: 40 ms and more), so that import
    does not hold up the first sends of a schedule."""
    import anyio._backends._asyncio  # noqa: F401
    import httpcore._backends.anyio  # noqa: F401


def _cancelled(req: CompletionRequest, due: float, sent: float) -> LoadRecord:
    """A request the stop caught in flight: its times kept, its stream closed, no measurement."""
    return LoadRecord(due, sent, RequestRecord(
        request_id=req.request_id, prompt_tokens=req.prompt_tokens, queue_s=0.0, ttft_s=None, itl_s=(),
        latency_s=None, e2e_s=None, output_chunks=0, output_text="", http_status=None, error=CANCELLED))


async def _finish(tasks: "dict[str, asyncio.Task]", stop: StopFlag | None) -> None:
    """Wait for the requests in flight; once ``stop`` is set, cancel those still running (closing their
    streams: httpx closes a response whose reader is cancelled)."""
    if stop is None:
        await asyncio.gather(*tasks.values())
        return
    pending = set(tasks.values())
    while pending and not stop.is_set():
        _done, pending = await asyncio.wait(pending, timeout=STOP_POLL_S)
    for t in pending:
        t.cancel()
    await asyncio.gather(*tasks.values(), return_exceptions=True)


def _collect(requests: Sequence[CompletionRequest], tasks: "dict[str, asyncio.Task]",
             sent: dict[str, tuple[float, float]]) -> list[LoadRecord]:
    """The records of the requests that were sent, in request order (a cancelled one from its kept times)."""
    out = []
    for r in requests:
        t = tasks.get(r.request_id)
        if t is None:
            continue
        if t.cancelled():
            if r.request_id in sent:  # cancelled before its first step: it never went out
                out.append(_cancelled(r, *sent[r.request_id]))
        else:
            out.append(t.result())  # stream_completion makes a failure a record: anything raised here is a bug
    return out


async def open_loop(base_url: str, requests: Sequence[CompletionRequest], offsets_s: Sequence[float], model: str,
                    clock: Clock = time.perf_counter, sleep: Sleep = asyncio.sleep,
                    transport: httpx.AsyncBaseTransport | None = None, timeout_s: float | None = 600.0,
                    path: str = "/v1/completions", api: ApiShape | None = None,
                    max_connections: int = 1024, stop: StopFlag | None = None,
                    start_at: float | None = None, client: httpx.AsyncClient | None = None) -> list[LoadRecord]:
    """Send ``requests[i]`` at ``offsets_s[i]`` from now (or from ``start_at`` on ``clock``, a start shared by
    several client processes), each on its own task; records in request order. Once ``stop`` is set nothing more
    is sent, the streams in flight are closed, and only the requests sent have records (see the module doc).
    ``client``: an HTTP client made beforehand (its set-up, e.g. the TLS context, kept out of the schedule; it is
    left open); by default one is made here with ``transport``, ``timeout_s`` and ``max_connections``."""
    if len(offsets_s) != len(requests):
        raise ValueError(f"{len(requests)} requests but {len(offsets_s)} send times")
    if len({r.request_id for r in requests}) != len(requests):
        raise ValueError("request ids must be unique: records are matched to requests by id")
    if client is None:
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        async with httpx.AsyncClient(transport=transport, limits=limits, timeout=timeout_s) as own:
            return await open_loop(base_url, requests, offsets_s, model, clock=clock, sleep=sleep,
                                   timeout_s=timeout_s, path=path, api=api, stop=stop, start_at=start_at,
                                   client=own)
    url = base_url.rstrip("/") + path
    tasks: dict[str, asyncio.Task] = {}
    sent_at: dict[str, tuple[float, float]] = {}
    _warm_imports()
    t0 = clock() if start_at is None else start_at

    async def one(req: CompletionRequest, due: float) -> LoadRecord:
        sent = clock() - t0
        sent_at[req.request_id] = (due, sent)
        rec = await stream_completion(client, url, req, model, clock=clock, timeout_s=timeout_s, api=api)
        return LoadRecord(due, sent, rec)

    spin_s = SPIN_S if sleep is asyncio.sleep else 0.0  # a scripted sleep is exact: nothing to spin for
    for req, due in sorted(zip(requests, offsets_s), key=lambda x: x[1]):
        while not (stop is not None and stop.is_set()):
            wait = t0 + due - clock()
            if wait <= 0:
                break
            if wait <= spin_s:
                await asyncio.sleep(0)  # the last stretch: other tasks run, the send is not late by a tick
                continue
            # with a stop to watch, wait in slices: a stop is seen within STOP_POLL_S, not at the next send
            wait -= spin_s
            await sleep(wait if stop is None else min(wait, STOP_POLL_S))
        if stop is not None and stop.is_set():
            break
        tasks[req.request_id] = asyncio.ensure_future(one(req, due))
        await asyncio.sleep(0)  # let the task send before the next one is scheduled
    await _finish(tasks, stop)
    return _collect(requests, tasks, sent_at)


async def closed_loop(base_url: str, requests: Sequence[CompletionRequest], concurrency: int, model: str,
                      clock: Clock = time.perf_counter, transport: httpx.AsyncBaseTransport | None = None,
                      timeout_s: float | None = 600.0, path: str = "/v1/completions",
                      api: ApiShape | None = None, stop: StopFlag | None = None) -> list[LoadRecord]:
    """``concurrency`` users take the requests in order, each sending its next one when its last finished.
    Once ``stop`` is set no user takes another request and the streams in flight are closed; only the requests
    sent have records."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    url = base_url.rstrip("/") + path
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    queue = list(enumerate(requests))
    out: dict[int, LoadRecord] = {}
    sent_at: dict[int, float] = {}
    async with httpx.AsyncClient(transport=transport, limits=limits, timeout=timeout_s) as client:
        t0 = clock()

        async def user() -> None:
            while queue and not (stop is not None and stop.is_set()):
                i, req = queue.pop(0)
                sent = sent_at[i] = clock() - t0
                rec = await stream_completion(client, url, req, model, clock=clock, timeout_s=timeout_s, api=api)
                out[i] = LoadRecord(sent, sent, rec)  # a closed loop is due when a user is free

        users = {str(u): asyncio.ensure_future(user()) for u in range(min(concurrency, len(requests)))}
        await _finish(users, stop)
    for i, sent in sent_at.items():
        if i not in out:
            out[i] = _cancelled(requests[i], sent, sent)
    return [out[i] for i in sorted(out)]


def split_schedule(offsets_s: Sequence[float], loops: int) -> list[list[int]]:
    """Pure: request indices dealt to ``loops`` client loops round-robin in send order, so each loop sends every
    ``loops``-th request (its share of the rate) and no loop holds a burst the others do not."""
    if loops < 1:
        raise ValueError(f"loops must be >= 1, got {loops}")
    order = sorted(range(len(offsets_s)), key=lambda i: (offsets_s[i], i))
    return [order[k::loops] for k in range(loops)]


def merge_records(requests: Sequence[CompletionRequest], parts: Sequence[Sequence[LoadRecord]]) -> list[LoadRecord]:
    """Pure: the records of several client loops, back in request order (a request no loop sent has none);
    refuses a record for a request not asked for or one recorded twice."""
    by_id: dict[str, LoadRecord] = {}
    for part in parts:
        for r in part:
            rid = r.record.request_id
            if rid in by_id:
                raise ValueError(f"request {rid!r} recorded by two client loops")
            by_id[rid] = r
    unknown = set(by_id) - {r.request_id for r in requests}
    if unknown:
        raise ValueError(f"records for requests not asked for: {sorted(unknown)[:5]}")
    return [by_id[r.request_id] for r in requests if r.request_id in by_id]


def _loop_process(conn, base_url: str, requests: list[CompletionRequest], offsets_s: list[float], model: str,
                  stop_event, kw: dict[str, Any]) -> None:
    """One client process: say it is ready, take the common start, run its share, send back its records (or the
    error that ended it, as text: failures are data)."""
    async def run() -> list[LoadRecord]:
        n = kw.pop("max_connections", 1024)
        limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
        # the client (its TLS context: 0.1 s and more) made before "ready", so no share starts late
        async with httpx.AsyncClient(limits=limits, timeout=kw.get("timeout_s", 600.0)) as client:
            _warm_imports()
            conn.send("ready")
            start_at = conn.recv()
            return await open_loop(base_url, requests, offsets_s, model, clock=time.monotonic,
                                   start_at=start_at, stop=stop_event, client=client, **kw)

    try:
        conn.send(("ok", asyncio.run(run())))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises it there
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


def _wait_ready(conns: list, procs: list) -> None:
    """Wait for each client process's "ready" in turn; RuntimeError for one that died or sent anything else."""
    for c, p in zip(conns, procs):
        while not c.poll(STOP_POLL_S):
            if not p.is_alive():
                raise RuntimeError(f"client process {p.pid} exited ({p.exitcode}) before it was ready")
        try:
            msg = c.recv()
        except EOFError:
            msg = "exited before it was ready (a program that starts client processes needs the " \
                  "`if __name__ == '__main__':` guard: they are spawned and import its main module)"
        if msg != "ready":
            raise RuntimeError(f"client process {p.pid}: {msg[1] if isinstance(msg, tuple) else msg}")


def open_loop_processes(base_url: str, requests: Sequence[CompletionRequest], offsets_s: Sequence[float],
                        model: str, loops: int, stop: StopFlag | None = None, lead_s: float = 0.2,
                        **kw: Any) -> list[LoadRecord]:
    """``open_loop`` spread over ``loops`` client processes (each its own interpreter and event loop): the schedule
    dealt by ``split_schedule``, one common start ``lead_s`` after every process said it is ready (times on the
    system-wide monotonic clock, so due and send times of all processes share one origin), the records merged by
    ``merge_records``. ``kw`` goes to each ``open_loop`` (path, api, timeout_s, max_connections). One loop runs
    in this process."""
    if len(offsets_s) != len(requests):
        raise ValueError(f"{len(requests)} requests but {len(offsets_s)} send times")
    own = sorted(set(kw) & {"clock", "sleep", "transport", "client", "start_at"})
    if own:  # each process has its own: the monotonic clock, real sleep, an HTTP client it makes
        raise ValueError(f"open_loop_processes sets {', '.join(own)} itself")
    if loops == 1:
        return asyncio.run(open_loop(base_url, requests, offsets_s, model, stop=stop, **kw))
    ctx = multiprocessing.get_context("spawn")  # no fork of a threaded parent (the runner's gate threads)
    stop_event = ctx.Event()
    shares = split_schedule(offsets_s, loops)
    procs, conns = [], []
    try:
        for share in shares:
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_loop_process, daemon=True,
                            args=(child, base_url, [requests[i] for i in share], [offsets_s[i] for i in share],
                                  model, stop_event, kw))
            p.start()
            child.close()
            procs.append(p)
            conns.append(parent)
        _wait_ready(conns, procs)
        start_at = time.monotonic() + lead_s
        for c in conns:
            c.send(start_at)
        parts: list[list[LoadRecord] | None] = [None] * loops
        while any(x is None for x in parts):
            if stop is not None and stop.is_set():
                stop_event.set()
            for k, (c, p) in enumerate(zip(conns, procs)):
                if parts[k] is None and c.poll(STOP_POLL_S / loops):
                    status, payload = c.recv()
                    if status != "ok":
                        raise RuntimeError(f"client process {p.pid}: {payload}")
                    parts[k] = payload
                elif parts[k] is None and not p.is_alive() and not c.poll():
                    raise RuntimeError(f"client process {p.pid} exited ({p.exitcode}) without its records")
        return merge_records(requests, parts)  # type: ignore[arg-type]
    finally:
        stop_event.set()
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join(5)
        for c in conns:
            c.close()


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


def output_tokens(r: RequestRecord) -> int:
    """Tokens a request generated: the server's own count (usage) when it sent one, else the stream's token
    events (one per token on vLLM's completions stream; its chat stream skips tokens whose text is held back)."""
    return r.usage_completion_tokens if r.usage_completion_tokens is not None else r.output_chunks


def _tpot(r: RequestRecord) -> float | None:
    """Time per output token after the first: (latency - TTFT) / (tokens - 1), as ``vllm bench serve`` counts
    it; None for a single token."""
    n = output_tokens(r)
    if r.ttft_s is None or r.latency_s is None or n < 2:
        return None
    return (r.latency_s - r.ttft_s) / (n - 1)


def load_point(records: Sequence[LoadRecord], ttft_slo_s: float | None = None,
               tpot_slo_s: float | None = None) -> LoadPoint:
    """Pure: a point's figures: its requests sent (``requests``), served (``ok``) and failed (``failed``); TTFT and
    end-to-end percentiles with every failed request as an infinite time (None where a percentile falls on one:
    a tier that errors never looks faster). Its duration runs from the first send to the last stream's end;
    goodput counts the successful requests within both SLOs (an SLO not given always holds)."""
    if not records:
        raise ValueError("a load point needs at least one request")
    ok = [r for r in records if r.record.ok]
    ends = [r.sent_s + (r.record.e2e_s or 0.0) for r in records]
    duration = max(max(ends) - min(r.sent_s for r in records), 1e-9)

    def pct(xs, q):
        xs = [x for x in xs if x is not None]
        return percentile(xs, q) if xs else None

    failed = len(records) - len(ok)

    def pct_failed(xs, q):  # a failed request is an infinite TTFT (and end-to-end time): it never came
        return percentile_with_failures([x for x in xs if x is not None], failed, q)

    ttft = [r.record.ttft_s for r in ok]
    tpot = [_tpot(r.record) for r in ok]
    e2e = [r.record.e2e_s for r in ok]
    good = [r for r in ok
            if (ttft_slo_s is None or (r.record.ttft_s is not None and r.record.ttft_s <= ttft_slo_s))
            and (tpot_slo_s is None or (_tpot(r.record) is None or _tpot(r.record) <= tpot_slo_s))]
    return LoadPoint(requests=len(records), ok=len(ok), failed=len(records) - len(ok), duration_s=duration,
                     ttft_p50_s=pct_failed(ttft, 50), ttft_p90_s=pct_failed(ttft, 90),
                     ttft_p95_s=pct_failed(ttft, 95), ttft_p99_s=pct_failed(ttft, 99), tpot_p50_s=pct(tpot, 50),
                     e2e_p50_s=pct_failed(e2e, 50), e2e_p99_s=pct_failed(e2e, 99), request_rate_rps=len(ok) / duration,
                     output_token_rate_tps=sum(output_tokens(r.record) for r in ok) / duration,
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
