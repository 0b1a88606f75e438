"""Where a client's TTFT clock starts: kvgate's load client against an AIPerf-like send, on one stub server.

The stub (benchmarks/stub_sse_server.py) notes on the system-wide monotonic clock when each request's body was in
and when it wrote the first chunk. Each client reads the same clock. Per request:

- send: from the client's clock start to the stub having the body (what the client counts before the server sees
  anything);
- receive: from the stub writing the first chunk to the client's first-token reading.

Clients, alternating request by request on one keep-alive connection each, the same token-id prompt:

- ``kvgate``: harness.engines.client.stream_completion as the load runner calls it (its clock starts before it
  builds the body and httpx encodes it);
- ``httpx-pre-encoded``: httpx, the body encoded before the clock starts (kvgate's library, AIPerf's clock start);
- ``aiohttp-pre-encoded``: aiohttp (AIPerf's HTTP library), the body encoded before the clock starts, the clock
  read just before the request (as AIPerf's ``request_start_ns``).

Usage: ``python benchmarks/client_send_bench.py [--requests 300] [--prompt-tokens 1000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import aiohttp
import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.engines.client import CompletionRequest, stream_completion  # noqa: E402
from harness.transport.local import free_port  # noqa: E402
from load_client_bench import start_stub  # noqa: E402

CLOCK = time.monotonic  # the stub's


async def kvgate_one(client: httpx.AsyncClient, url: str, rid: str, prompt: list[int]) -> tuple[float, float]:
    """(clock start, first-token reading) of one request sent as kvgate's load runner sends it."""
    first: list[float] = []

    def clock() -> float:
        now = CLOCK()
        first.append(now)
        return now
    rec = await stream_completion(client, url, CompletionRequest(rid, prompt, max_tokens=2, extra={"kvgate_id": rid}),
                                  "m", clock=clock)
    assert rec.error is None, rec.error
    return first[0], first[0] + rec.ttft_s


def body_bytes(rid: str, prompt: list[int]) -> bytes:
    return json.dumps({"model": "m", "prompt": prompt, "max_tokens": 2, "stream": True, "temperature": 0.0,
                       "ignore_eos": True, "kvgate_id": rid}).encode()


async def httpx_one(client: httpx.AsyncClient, url: str, rid: str, prompt: list[int]) -> tuple[float, float]:
    body = body_bytes(rid, prompt)
    t0 = CLOCK()
    first = None
    async with client.stream("POST", url, content=body, headers={"Content-Type": "application/json"}) as resp:
        async for line in resp.aiter_lines():
            if first is None and line.startswith("data: {"):
                first = CLOCK()
    return t0, first


async def aiohttp_one(session: aiohttp.ClientSession, url: str, rid: str, prompt: list[int]) -> tuple[float, float]:
    body = body_bytes(rid, prompt)
    t0 = CLOCK()
    first = None
    async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as resp:
        async for raw in resp.content:
            if first is None and raw.startswith(b"data: {"):
                first = CLOCK()
    return t0, first


async def run(port: int, requests: int, prompt_tokens: int) -> dict[str, list[tuple[float, float]]]:
    url = f"http://127.0.0.1:{port}/v1/completions"
    prompt = [(i * 7919) % 32000 for i in range(prompt_tokens)]
    out: dict[str, list[tuple[float, float]]] = {"kvgate": [], "httpx-pre-encoded": [], "aiohttp-pre-encoded": []}
    marks: dict[str, tuple[str, float, float]] = {}
    async with httpx.AsyncClient(timeout=30) as hx, httpx.AsyncClient(timeout=30) as kv, \
            aiohttp.ClientSession() as ah:
        for i in range(requests + 10):  # the first 10 rounds warm each client up, not counted
            order = ["kvgate", "httpx-pre-encoded", "aiohttp-pre-encoded"]
            order = order[i % 3:] + order[:i % 3]
            for name in order:
                rid = f"{name}-{i}"
                if name == "kvgate":
                    t0, tf = await kvgate_one(kv, url, rid, prompt)
                elif name == "httpx-pre-encoded":
                    t0, tf = await httpx_one(hx, url, rid, prompt)
                else:
                    t0, tf = await aiohttp_one(ah, url, rid, prompt)
                if i >= 10:
                    marks[rid] = (name, t0, tf)
        stats = (await hx.get(f"http://127.0.0.1:{port}/stats")).json()["requests"]
    for rid, (name, t0, tf) in marks.items():
        note = stats[rid]
        out[name].append((note["recv_s"] - t0, tf - note["first_chunk_s"]))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=300, help="per client, after 10 uncounted")
    ap.add_argument("--prompt-tokens", type=int, default=1000)
    a = ap.parse_args()
    port = free_port()
    stub = start_stub(port, 0, itl_ms=0)
    try:
        res = asyncio.run(run(port, a.requests, a.prompt_tokens))
    finally:
        stub.terminate()
        stub.wait(10)
    print(f"{a.requests} requests per client, {a.prompt_tokens}-token prompt, alternating; ms, median (p10-p90)")
    print(f"{'client':>22} {'send':>22} {'receive':>22}")
    for name, rows in res.items():
        cells = []
        for xs in (sorted(r[0] * 1e3 for r in rows), sorted(r[1] * 1e3 for r in rows)):
            n = len(xs)
            cells.append(f"{statistics.median(xs):.3f} ({xs[n // 10]:.3f}-{xs[n * 9 // 10]:.3f})")
        print(f"{name:>22} {cells[0]:>22} {cells[1]:>22}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
