"""A stub OpenAI-compatible streaming server for measuring kvgate's load client, not a server.

One asyncio process, HTTP/1.1 with keep-alive, ``POST /v1/completions`` answered with a chunked SSE stream:
``--tokens`` chunks, the first ``--ttft-ms`` after the request's body arrived, then one every ``--itl-ms``, then
``[DONE]``. It notes, on the system-wide monotonic clock (the one kvgate's multi-process client shares), when
each request's body was in and when its first chunk was written, and counts the TCP connections it accepted;
``GET /stats`` returns those notes (``requests``, keyed by the body's ``kvgate_id``; ``connections``) and
forgets them. Usage: ``python benchmarks/stub_sse_server.py --port N``; prints
``ready`` once it listens. Stop it with SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import time

NOTES: dict[str, dict[str, float]] = {}
CONNECTIONS = [0]  # TCP connections accepted since the last /stats: a client that reuses them opens few


def chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ttft_s: float, itl_s: float,
                 tokens: int) -> None:
    CONNECTIONS[0] += 1
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = {k.strip().lower(): v.strip() for k, v in (x.split(":", 1) for x in lines[1:] if ":" in x)}
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            recv = time.monotonic()
            if method == "GET" and path == "/stats":
                out = json.dumps({"requests": NOTES, "connections": CONNECTIONS[0]}).encode()
                NOTES.clear()
                CONNECTIONS[0] = 0
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                             % (len(out), out))
                await writer.drain()
                continue
            if method == "GET" and path == "/health":
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                await writer.drain()
                continue
            rid = json.loads(body or b"{}").get("kvgate_id", "")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            await writer.drain()
            await asyncio.sleep(ttft_s)
            for i in range(tokens):
                if i:
                    await asyncio.sleep(itl_s)
                writer.write(chunk(b'data: {"choices": [{"index": 0, "text": " t%d"}]}\n\n' % i))
                await writer.drain()
                if i == 0:
                    NOTES[rid] = {"recv_s": recv, "first_chunk_s": time.monotonic()}
            writer.write(chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--ttft-ms", type=float, default=20.0)
    ap.add_argument("--itl-ms", type=float, default=5.0)
    ap.add_argument("--tokens", type=int, default=2)
    a = ap.parse_args()
    server = await asyncio.start_server(lambda r, w: handle(r, w, a.ttft_ms / 1e3, a.itl_ms / 1e3, a.tokens),
                                        "127.0.0.1", a.port, backlog=4096)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print("ready", flush=True)
    async with server:
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(main())
