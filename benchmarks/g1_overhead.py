#!/usr/bin/env python3
"""kvgate's G1 figure divided by a direct fio run of the same job on the same target (goal 0.98-1.02).

Both sides run alternately in the same session on one local file target, page cache dropped before each,
so the machine's noise hits both. Prints each pair, then the ratio's median with its exact 95 % interval for the
median (order statistics, harness.stats.median_interval), its spread (min, quartiles, max) and each side's own
median and spread: a ratio below 1 whose interval excludes 1 is kvgate's overhead, one whose interval holds 1 is
the machine's noise.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml  # noqa: E402

from harness.report.bundle import generate_keypair, load_private_key  # noqa: E402
from harness.config import load_config  # noqa: E402
from harness.workloads import WORKLOADS  # noqa: E402
from harness.suite.runner import run_suite  # noqa: E402
from harness.stats import median_interval, percentile  # noqa: E402
from harness.units import parse_size_bytes  # noqa: E402


def spread(xs: list[float]) -> str:
    """min / p25 / median / p75 / max of ``xs``."""
    return " / ".join(f"{percentile(xs, q):.3f}" for q in (0, 25, 50, 75, 100))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--runtime-s", type=float, default=5)
    ap.add_argument("--size", default="1 GiB")
    ap.add_argument("--work-dir", default="/var/tmp/kvgate-bench")
    ap.add_argument("--ram-loop", action="store_true",
                    help="read a loop device over a file in /dev/shm (RAM) instead of a file on the work dir's disk: "
                         "the disk's own swings out of both sides")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="kvgate-g1-bench-"))
    target = {"name": "t", "kind": "file", "path": "bench.bin", "size": args.size}
    loop = None
    if args.ram_loop:
        backing = Path(f"/dev/shm/kvgate-g1-bench-{tmp.name}.img")
        subprocess.run(["fallocate", "-l", str(parse_size_bytes(args.size)), str(backing)], check=True)
        subprocess.run(["dd", "if=/dev/urandom", f"of={backing}", "bs=4M", "conv=notrunc",
                        f"count={parse_size_bytes(args.size) // (4 << 20)}", "status=none"], check=True)
        loop = subprocess.run(["losetup", "-f", "--show", str(backing)], capture_output=True, text=True,
                              check=True).stdout.strip()
        target = {"name": "t", "kind": "block", "path": loop}
    try:
        return compare(args, tmp, target)
    finally:
        if loop:
            subprocess.run(["losetup", "-d", loop], check=False)
            backing.unlink()


def compare(args, tmp: Path, target: dict) -> int:
    """The side-by-side rounds on ``target`` (an inventory target); prints them and the ratio's interval."""
    inv = tmp / "inv.yaml"
    inv.write_text(yaml.safe_dump({"nodes": [{"name": "local", "transport": "local", "work_dir": args.work_dir,
                                              "read_streams": 1, "targets": [target]}]}))
    gates = tmp / "gates.yaml"
    gates.write_text(yaml.safe_dump({"suite": {"name": "bench", "version": 1}, "gates": [{
        "id": "G1", "title": "bench", "workload": "fio-read", "metric": "per_gpu_read_gb_s", "pass": ">= 0 GB/s",
        "params": {"target": "t", "runtime_s": args.runtime_s, "ramp_s": 1, "iodepth": 16}}]}))
    cfg = load_config(inv, gates, WORKLOADS)
    key = load_private_key(generate_keypair(tmp / "k")[0])
    pairs = []
    job = None

    def via_kvgate() -> float | None:
        nonlocal job
        out = run_suite(cfg, tmp / "out", key, progress=lambda m: None, make_tar=False)
        v = out.verdicts[0]
        if v.actual is None:
            print(f"kvgate run failed: {v.reason}")
            return None
        job = out.bundle.path / "gates" / "G1" / "local" / "job.fio"
        return v.actual

    def direct() -> float:
        subprocess.run(["sh", "-c", "sync && echo 3 > /proc/sys/vm/drop_caches"], check=False)
        r = subprocess.run(["fio", "--output-format=json", str(job)], capture_output=True, text=True, check=True)
        return sum(j["read"]["bw_bytes"] for j in json.loads(r.stdout[r.stdout.find("{"):])["jobs"]) / 1e9

    first = via_kvgate()  # also lays out the target and the job file the direct runs reuse
    if first is None:
        return 1
    for i in range(args.rounds):
        # which side goes first alternates, so drift in the disk's state does not favour one side
        if i % 2 == 0:
            ours, theirs = via_kvgate(), direct()
        else:
            theirs, ours = direct(), via_kvgate()
        if ours is None:
            return 1
        pairs.append((ours, theirs))
        print(f"round {i + 1}: kvgate G1 {ours:.4f} GB/s, direct fio {theirs:.4f} GB/s, ratio {ours / theirs:.3f}")
    ratios = [a / b for a, b in pairs]
    iv = median_interval(ratios)
    print(f"target: {target['kind']} {target['path']}; {args.rounds} rounds of {args.runtime_s:g} s each side")
    print(f"ratio kvgate/direct fio: {iv.text()} (goal 0.98-1.02)")
    print(f"  spread (min / p25 / median / p75 / max): ratio {spread(ratios)}; kvgate GB/s "
          f"{spread([a for a, _ in pairs])}; direct fio GB/s {spread([b for _, b in pairs])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
