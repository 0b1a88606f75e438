"""The load client must not be what is measured: kvgate's open-loop client against a stub SSE server on this
machine (benchmarks/stub_sse_server.py, its own process, started here and stopped by its PID).

Per rate and number of client loops (``open_loop_processes``: 1 = one event loop in this process): the client's
lag (send time minus due time) p50/p99/max, and the client's own share of TTFT: its TTFT minus the server's gap
between the request's body arriving and its first chunk leaving (both clocks are this machine's monotonic clock,
but only differences are used). A loop count's ceiling is the highest rate whose lag p99 stays within the bound
(default 1 ms) with no failed request. Next to each point, the machine's floor: the lag p99 of bare asyncio
timers on the same schedule sending nothing (on a machine shared with other work the floor alone can pass the
bound). Prints a table; ``--json`` writes the rows.

Usage: flock /work/heavy.lock python3 benchmarks/load_client_bench.py [--rates 50,100,200,400,800]
       [--loops 1,2] [--duration-s 4] [--ttft-ms 20] [--bound-ms 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from harness.engines.client import CompletionRequest  # noqa: E402
from harness.engines.load import SPIN_S, arrival_offsets, load_point, open_loop, open_loop_processes  # noqa: E402
from harness.stats import percentile  # noqa: E402
from harness.transport.local import free_port  # noqa: E402


def start_stub(port: int, ttft_ms: float, itl_ms: float | None = None) -> subprocess.Popen:
    """The stub server on ``port``, ready (its own session: stopped by its PID); ``itl_ms`` None: the stub's own."""
    itl = ["--itl-ms", str(itl_ms)] if itl_ms is not None else []
    p = subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "stub_sse_server.py"), "--port", str(port),
                          "--ttft-ms", str(ttft_ms), *itl], stdout=subprocess.PIPE, text=True, start_new_session=True)
    if p.stdout.readline().strip() != "ready":
        p.kill()
        raise SystemExit(f"stub server did not start (rc {p.poll()})")
    return p


async def timer_floor(offsets: list[float]) -> list[float]:
    """The machine's own floor: the lag of bare asyncio timers on the same schedule (the open loop's wake-early-
    and-yield wait, no request sent). A client's lag cannot be judged below what the machine gives an idle loop."""
    lags = []
    t0 = time.monotonic()
    for due in offsets:
        while (wait := t0 + due - time.monotonic()) > 0:
            await (asyncio.sleep(0) if wait <= SPIN_S else asyncio.sleep(wait - SPIN_S))
        lags.append(time.monotonic() - t0 - due)
    return lags


def one_point(base: str, rate: float, loops: int, duration_s: float, seed: int) -> dict:
    n = max(int(rate * duration_s), 50)
    reqs = [CompletionRequest(f"q{rate:g}-{loops}-{i}", [1, 2, 3], max_tokens=2,
                              extra={"kvgate_id": f"q{rate:g}-{loops}-{i}"}) for i in range(n)]
    offsets = arrival_offsets(n, rate, seed=seed)
    httpx.get(base + "/stats")  # forget earlier notes
    cpu0 = time.process_time()
    if loops == 1:
        recs = asyncio.run(open_loop(base, reqs, offsets, "m", clock=time.monotonic))
    else:
        recs = open_loop_processes(base, reqs, offsets, "m", loops=loops)
    cpu_ms = (time.process_time() - cpu0) * 1e3 / n if loops == 1 else None  # child processes: not counted
    stats = httpx.get(base + "/stats").json()
    notes = stats["requests"]
    floor = asyncio.run(timer_floor(offsets))
    p = load_point(recs)
    lags = [max(r.lag_s, 0.0) for r in recs]
    inside = [r.record.ttft_s - (notes[r.record.request_id]["first_chunk_s"] - notes[r.record.request_id]["recv_s"])
              for r in recs if r.record.ok and r.record.request_id in notes]
    return {"rate_rps": rate, "loops": loops, "requests": n, "failed": p.failed,
            "achieved_rps": n / max(offsets[-1], 1e-9),
            "lag_p50_ms": percentile(lags, 50) * 1e3, "lag_p99_ms": p.client_lag_p99_s * 1e3,
            "lag_max_ms": max(lags) * 1e3, "timer_floor_p99_ms": percentile(floor, 99) * 1e3, "connections": stats["connections"] - 1,  # less the /stats one
            "client_cpu_ms_per_request": cpu_ms,
            "client_in_ttft_p50_ms": percentile(inside, 50) * 1e3 if inside else None,
            "client_in_ttft_p99_ms": percentile(inside, 99) * 1e3 if inside else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="50,100,200,400,800,1200")
    ap.add_argument("--loops", default="1,2")
    ap.add_argument("--duration-s", type=float, default=4.0)
    ap.add_argument("--ttft-ms", type=float, default=20.0)
    ap.add_argument("--bound-ms", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the rows here")
    a = ap.parse_args()
    port = free_port()
    stub = start_stub(port, a.ttft_ms)
    base = f"http://127.0.0.1:{port}"
    rows = []
    try:
        one_point(base, 20, 1, 1.0, a.seed)  # warm imports and the stub's first connections; not reported
        for loops in (int(x) for x in a.loops.split(",")):
            over = 0
            for rate in (float(x) for x in a.rates.split(",")):
                row = one_point(base, rate, loops, a.duration_s, a.seed)
                rows.append(row)
                print(f"  loops {loops} rate {rate:g}: lag p99 {row['lag_p99_ms']:.3f} ms", file=sys.stderr, flush=True)
                over = over + 1 if row["lag_p99_ms"] > a.bound_ms or row["failed"] else 0
                if over >= 2:
                    break  # two rates past the bound in a row: past the ceiling
    finally:
        os.killpg(stub.pid, signal.SIGTERM)
        stub.wait(10)
    print(f"kvgate open-loop client vs stub SSE server (TTFT {a.ttft_ms:g} ms, 2 tokens), {a.duration_s:g} s per "
          f"point, Poisson arrivals, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the end, "
          f"nice {os.nice(0)}; floor: bare asyncio timers on the same schedule, no request")
    print(f"{'loops':>5} {'rate/s':>7} {'reqs':>5} {'conns':>5} {'fail':>4} {'lag p50 ms':>10} {'lag p99 ms':>10} "
          f"{'lag max ms':>10} {'floor p99 ms':>12} {'client-in-TTFT p50/p99 ms':>26} {'CPU ms/req':>10}")
    for r in rows:
        inside = (f"{r['client_in_ttft_p50_ms']:.3f} / {r['client_in_ttft_p99_ms']:.3f}"
                  if r["client_in_ttft_p50_ms"] is not None else "-")
        print(f"{r['loops']:>5} {r['rate_rps']:>7g} {r['requests']:>5} {r['connections']:>5} {r['failed']:>4} {r['lag_p50_ms']:>10.3f} "
              f"{r['lag_p99_ms']:>10.3f} {r['lag_max_ms']:>10.3f} {r['timer_floor_p99_ms']:>12.3f} {inside:>26} "
              f"{r['client_cpu_ms_per_request'] or float('nan'):>10.3f}")
    for loops in sorted({r["loops"] for r in rows}):
        ok = [r["rate_rps"] for r in rows if r["loops"] == loops and r["lag_p99_ms"] <= a.bound_ms and not r["failed"]]
        print(f"ceiling with {loops} loop(s): {max(ok):g} requests/s (lag p99 <= {a.bound_ms:g} ms)" if ok else
              f"ceiling with {loops} loop(s): below the lowest rate tried")
    at50 = [r for r in rows if r["rate_rps"] == 50 and r["loops"] == 1]
    if at50:
        print(f"lag p99 at 50 requests/s, one loop: {at50[0]['lag_p99_ms']:.3f} ms (target <= {a.bound_ms:g} ms)")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
