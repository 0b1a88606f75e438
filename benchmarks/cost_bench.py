"""Benchmark: the costing model over 100,000 random parameter points, vectorized vs a Python loop.

Prints wall time and peak traced memory of one vectorized evaluation of N points (default 100,000), the
time of a per-point Python loop over a sample, and the ratio (loop time per point / vectorized time per point).
Usage: python3 benchmarks/cost_bench.py [N]
"""

from __future__ import annotations

import sys
import time
import tracemalloc

from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from harness.cost import model as cost  # noqa: E402


def random_points(n: int, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "kv_bytes_per_token": rng.choice([70_272.0, 131_072.0, 253_952.0, 262_144.0, 327_680.0], n),
        "context_tokens": rng.uniform(1_000, 200_000, n),
        "gpus_per_instance": rng.choice([1.0, 2.0, 4.0, 8.0], n),
        "prefill_tokens_per_s_per_gpu": rng.uniform(1_000, 40_000, n),
        "per_gpu_read_gb_s": rng.uniform(0.5, 25, n),
        "readback_fixed_s": rng.uniform(0, 0.5, n),
        "decode_tokens_per_session": rng.uniform(100, 4_000, n),
        "decode_tokens_per_s_per_gpu": rng.uniform(100, 2_000, n),
        "gpu_usd_per_hour": rng.uniform(0.5, 6, n),
        "storage_usd_per_tb_month": rng.uniform(2, 60, n),
        "sessions_per_day": rng.uniform(1e3, 1e6, n),
        "revisit_rate": rng.uniform(0, 1, n),
        "hit_rate": rng.uniform(0, 1, n),
        "retention_days": rng.uniform(0.05, 30, n),
        "capacity_overhead_ratio": rng.uniform(0, 0.5, n),
    }


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    points = random_points(n)
    cost.evaluate({k: v[:10] for k, v in points.items()})  # warm-up

    tracemalloc.start()
    t0 = time.perf_counter()
    out = cost.evaluate(points)
    vec_s = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert out["net_usd_per_month"].shape == (n,)

    sample = min(n, 2_000)
    t0 = time.perf_counter()
    for i in range(sample):
        cost.evaluate({k: float(v[i]) for k, v in points.items()})
    loop_s = time.perf_counter() - t0

    # the loop must agree with the vectorized result
    i = sample - 1
    one = cost.evaluate({k: float(v[i]) for k, v in points.items()})
    assert np.isclose(float(one["net_usd_per_month"]), out["net_usd_per_month"][i])

    per_vec = vec_s / n
    per_loop = loop_s / sample
    print(f"points: {n}")
    print(f"vectorized: {vec_s * 1e3:.1f} ms total, {per_vec * 1e9:.0f} ns/point, "
          f"peak traced memory {peak / 1e6:.1f} MB ({peak / n:.0f} B/point)")
    print(f"python loop: {per_loop * 1e6:.1f} us/point over {sample} points "
          f"(projected {per_loop * n:.1f} s for {n})")
    print(f"speedup vectorized/loop: {per_loop / per_vec:.0f}x")
    print(f"net_usd_per_month > 0 at {np.mean(out['net_usd_per_month'] > 0):.1%} of the points")


if __name__ == "__main__":
    main()
