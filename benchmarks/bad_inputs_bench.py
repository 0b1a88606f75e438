"""Benchmark: how fast and how small ``kvgate validate`` fails on each bad input (goal: under 2 s each).

Runs the CLI (a fresh interpreter per case, as a user runs it) on every YAML file of
tests/fixtures/bad_inputs/yaml/ as the gate suite, plus generated cases (4 KiB of random bytes, a 50 MB
file, a FIFO with no writer, a near-budget alias bomb, a legal file just under the size cap), and
prints wall seconds, peak RSS and the exit code of each, beside the same for a good suite.
Usage: python3 benchmarks/bad_inputs_bench.py [ROUNDS]   (median of ROUNDS runs each, default 3)
"""

from __future__ import annotations

import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from harness.safeio import MAX_CONFIG_BYTES  # noqa: E402

CORPUS = ROOT / "tests" / "fixtures" / "bad_inputs" / "yaml"
GOAL_S = 2.0


def run_once(gates: Path) -> tuple[float, int, int]:
    argv = [sys.executable, "-m", "harness", "validate", "-i", str(ROOT / "inventory" / "localhost.yaml"),
            "-g", str(gates)]
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return time.perf_counter() - t0, usage.ru_maxrss * 1024, p.returncode


def generated(d: Path) -> dict[str, Path]:
    out = {}
    out["random_bytes"] = d / "random.yaml"
    out["random_bytes"].write_bytes(random.Random(1).randbytes(4096))
    out["big_50mb"] = d / "big.yaml"
    with open(out["big_50mb"], "wb") as f:
        f.truncate(50_000_000)
    out["fifo"] = d / "fifo.yaml"
    os.mkfifo(out["fifo"])
    # 5 levels of 10 aliases: about 111,111 values, just past the alias budget after 4 levels
    lines = ["l0: &l0 [" + ", ".join(["x"] * 10) + "]"]
    lines += [f"l{k}: &l{k} [" + ", ".join([f"*l{k - 1}"] * 10) + "]" for k in range(1, 5)]
    out["near_budget_bomb"] = d / "near.yaml"
    out["near_budget_bomb"].write_text("\n".join(lines) + "\n")
    # legal YAML just under the size cap: the slowest parse a file that is read at all can cost
    out["under_cap"] = d / "under_cap.yaml"
    item = "  - {index: 0, numa_node: 0}\n"
    out["under_cap"].write_text("suite:\n  name: x\n  version: '1'\ngates:\n"
                                + item * (MAX_CONFIG_BYTES // len(item) - 2))
    return out


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    with tempfile.TemporaryDirectory() as td:
        cases = {"(good) gates/local.yaml": ROOT / "gates" / "local.yaml"}
        cases.update({p.stem: p for p in sorted(CORPUS.glob("*.yaml"))})
        cases.update(generated(Path(td)))
        print(f"{'case':28} {'median s':>9} {'max s':>7} {'peak RSS MiB':>13} {'exit':>5}")
        slow = []
        for name, path in cases.items():
            runs = [run_once(path) for _ in range(rounds)]
            walls = [w for w, _, _ in runs]
            rss = max(r for _, r, _ in runs) / (1 << 20)
            med = statistics.median(walls)
            print(f"{name:28} {med:9.2f} {max(walls):7.2f} {rss:13.1f} {runs[0][2]:5}")
            if med > GOAL_S:
                slow.append(name)
        print(f"goal: each under {GOAL_S} s; " + (f"over it: {', '.join(slow)}" if slow else "all met"))


if __name__ == "__main__":
    main()
