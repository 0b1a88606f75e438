"""G2 benchmark on the cpu-reference engine (real LMCache, fs:// pool on this machine's disk). Prints ratios.

1. read-back TTFT / I/O bound, where I/O bound = KV bytes of the prompt / fio sequential read bandwidth
   of the same pool (page cache dropped) + one decode step (median inter-token latency). Goal <= 1.25.
2. kvgate's TTFT vs an independent client (stdlib http.client, first non-empty SSE chunk) on the same
   server and prompts, KV warm in LMCache's CPU tier. Goal: within 2 %.

Usage: python3 benchmarks/g2_bench.py [--tokens 4096] [--prompts 3]   (root, for drop_caches)
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
from harness.workloads.g2_ttft import free_port, make_prompts  # noqa: E402

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


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--client-rounds", type=int, default=10, help="warm TTFT pairs per prompt")
    args = ap.parse_args()
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
