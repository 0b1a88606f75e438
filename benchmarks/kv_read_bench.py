#!/usr/bin/env python3
"""kv-read's own overhead: its reader (LMCache retrieve into destination memory, every chunk hashed afterwards)
against a plain O_DIRECT read of the same chunk files, in one run, as a ratio.

One kv-read gate through kvgate (run_suite, on a local directory target) lays the KV out and leaves the reader
and its spec on the node. Then, alternately and with the page cache dropped before each: the reader again
(``kv_reader.py read``, fresh processes, one per stream), and a plain reader: one fresh process per stream,
released together, reading the stream's chunk files whole with O_DIRECT, ``chunks_per_retrieve`` files in
flight (the connector's queue depth), into one page-aligned buffer per file. Prints each round and the median
ratio reader / plain of the per-stream minimum (the gate metric) and of the aggregate.

    python3 benchmarks/kv_read_bench.py --rounds 3 --kv-size "512 MiB" --streams 2 \
        --lmcache-extra '{"save_chunk_meta": false, "fs_connector_use_odirect": true}'
"""

from __future__ import annotations

import argparse
import json
import mmap
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml  # noqa: E402

from harness.config import load_config  # noqa: E402
from harness.parsers.kvread import parse_read  # noqa: E402
from harness.report.bundle import generate_keypair, load_private_key  # noqa: E402
from harness.suite.runner import run_suite  # noqa: E402
from harness.workloads import WORKLOADS  # noqa: E402
from harness.workloads.kv_read import READER_ENV  # noqa: E402

ALIGN = 4096


def drop_caches() -> bool:
    return subprocess.run(["sh", "-c", "sync && echo 3 > /proc/sys/vm/drop_caches"], check=False).returncode == 0


def _plain_stream(files: list[str], in_flight: int, ready, go, out) -> None:
    """Read every file whole with O_DIRECT (its block-aligned part), ``in_flight`` files at a time."""
    sizes = [os.path.getsize(f) // ALIGN * ALIGN for f in files]
    bufs = [mmap.mmap(-1, max(sizes)) for _ in range(in_flight)]  # page-aligned, faulted in below
    for b in bufs:
        b.write(b"\0" * len(b))

    def one(i: int) -> int:
        buf = memoryview(bufs[i % in_flight])[:sizes[i]]
        fd = os.open(files[i], os.O_RDONLY | os.O_DIRECT)
        try:
            got = 0
            while got < sizes[i]:
                n = os.readv(fd, [buf[got:]])
                if n <= 0:
                    break
                got += n
            return got
        finally:
            os.close(fd)

    ready.wait(600)
    go.wait(600)
    t0 = time.perf_counter()
    done = 0
    with ThreadPoolExecutor(in_flight) as pool:
        # a window of in_flight files: file i reuses buffer i % in_flight once file i - in_flight is done
        for start in range(0, len(files), in_flight):
            done += sum(pool.map(one, range(start, min(start + in_flight, len(files)))))
    out.put({"bytes": done, "read_s": time.perf_counter() - t0, "start": t0})
    out.close()
    out.join_thread()


def plain_read(streams: list[list[str]], in_flight: int) -> tuple[list[float], float]:
    """Per-stream GB/s and the aggregate GB/s of one plain O_DIRECT pass, one fresh process per stream."""
    ctx = mp.get_context("spawn")
    ready, go, out = ctx.Barrier(len(streams) + 1), ctx.Barrier(len(streams) + 1), ctx.Queue()
    procs = [ctx.Process(target=_plain_stream, args=(files, in_flight, ready, go, out)) for files in streams]
    for p in procs:
        p.start()
    ready.wait(600)
    t0 = time.perf_counter()
    go.wait(600)
    recs = [out.get(timeout=3600) for _ in procs]
    wall = time.perf_counter() - t0
    for p in procs:
        p.join(60)
    return [r["bytes"] / r["read_s"] / 1e9 for r in recs], sum(r["bytes"] for r in recs) / wall / 1e9


def reader_read(python: str, program: str, spec: str) -> tuple[list[float], float]:
    r = subprocess.run([python, program, "read", "--spec", spec], capture_output=True, text=True,
                       env={**os.environ, **READER_ENV}, timeout=7200)
    run = parse_read(r.stdout)
    if run.error or any(s.error for s in run.streams):
        raise SystemExit(f"reader failed: {run.error or [s.error for s in run.streams]}\n{r.stderr[-2000:]}")
    if any(s.mismatches or s.missing for s in run.streams):
        raise SystemExit("reader found chunks that differ from the layout")
    rates = [s.read_gb_s for s in run.streams]
    start = min(s.start_unix_s for s in run.streams)
    end = max(s.end_unix_s for s in run.streams)
    return rates, run.kv_bytes / (end - start) / 1e9


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kv-size", default="512 MiB")
    ap.add_argument("--streams", type=int, default=2)
    ap.add_argument("--chunks-per-retrieve", type=int, default=4)
    ap.add_argument("--model", default="llama-3-8b")
    ap.add_argument("--engine", default="vllm-lmcache")
    ap.add_argument("--backend", default="fs", choices=("fs", "local_disk"))
    ap.add_argument("--lmcache-extra", default="{}", help="JSON merged into the LMCache YAML's extra_config")
    ap.add_argument("--max-local-cpu-gb", type=float, default=1.0)
    ap.add_argument("--work-dir", default="/var/tmp/kvgate-bench-kv")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="kvgate-kv-bench-"))
    (tmp / "inv.yaml").write_text(yaml.safe_dump({"nodes": [{
        "name": "local", "transport": "local", "work_dir": args.work_dir, "read_streams": args.streams,
        "targets": [{"name": "tier", "kind": "directory", "path": "tier"}]}]}))
    lmcache = {"max_local_cpu_size": args.max_local_cpu_gb}
    extra = json.loads(args.lmcache_extra)
    if extra:
        lmcache["extra_config"] = extra
    (tmp / "gates.yaml").write_text(yaml.safe_dump({"suite": {"name": "bench", "version": 1}, "gates": [{
        "id": "KV", "title": "bench", "workload": "kv-read", "metric": "connector_read_gb_s", "pass": ">= 0 GB/s",
        "params": {"target": "tier", "engine": args.engine, "backend": args.backend, "model": args.model,
                   "kv_size": args.kv_size, "chunks_per_retrieve": args.chunks_per_retrieve, "lmcache": lmcache}}]}))
    cfg = load_config(tmp / "inv.yaml", tmp / "gates.yaml", WORKLOADS)
    key = load_private_key(generate_keypair(tmp / "k")[0])
    out = run_suite(cfg, tmp / "out", key, progress=lambda m: None, make_tar=False)
    v = out.verdicts[0]
    print(f"kvgate gate: {v.outcome.value} {v.metric} = {v.actual} ({v.reason})")
    if v.actual is None:
        return 1
    ev = v.evidence
    run_dir = Path(args.work_dir) / "kvgate-kvread-KV-local"
    spec = json.loads((run_dir / "spec.json").read_text())
    manifest = json.loads((Path(spec["pool_dir"]) / "kvgate-kv-manifest.json").read_text())
    by_prompt: dict[int, list[str]] = {}
    for c in sorted(manifest["chunks"], key=lambda c: (c["prompt"], c["index"])):
        by_prompt.setdefault(c["prompt"], []).append(os.path.join(spec["pool_dir"], c["file"]))
    streams = [[f for p in s["prompts"] for f in by_prompt[p]] for s in spec["streams"]]
    python = ev["nodes"]["local"]["python"]
    print(f"{len(streams)} streams x {ev['kv_bytes_per_stream']} bytes, {ev['chunk_bytes']}-byte chunks, "
          f"{args.chunks_per_retrieve} in flight; LMCache {args.backend}: {json.dumps(ev['parallel_read'])}")

    rows = []
    for i in range(args.rounds):
        sides = ["reader", "plain"] if i % 2 == 0 else ["plain", "reader"]  # alternate: drift hits both
        got = {}
        for side in sides:
            if not drop_caches():
                print("warning: page cache not dropped (not root?)")
            got[side] = (reader_read(python, str(run_dir / "kv_reader.py"), str(run_dir / "spec.json"))
                         if side == "reader" else plain_read(streams, args.chunks_per_retrieve))
        (rr, ra), (pr, pa) = got["reader"], got["plain"]
        rows.append((min(rr) / min(pr), ra / pa))
        print(f"round {i + 1}: reader min {min(rr):.3f} GB/s (agg {ra:.3f}), plain O_DIRECT min {min(pr):.3f} GB/s "
              f"(agg {pa:.3f}); ratio min {rows[-1][0]:.3f}, agg {rows[-1][1]:.3f}")
    print(f"median ratio reader / plain O_DIRECT: per-stream min {statistics.median(r[0] for r in rows):.3f}, "
          f"aggregate {statistics.median(r[1] for r in rows):.3f} ({len(rows)} rounds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
