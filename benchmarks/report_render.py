#!/usr/bin/env python3
"""Time to render every report file of a bundle (report.md/html, charts, tables, JUnit).

Renders the fixed 3-gate fixture and a large synthetic one (64 GPU streams, 2 x 1000 TTFTs, 8 nodes x 600 s
series) and prints seconds per render and the ratio to a 5 s budget. Run from the repository root:
    python3 benchmarks/report_render.py
"""

import copy
import json
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness.report.render import write_reports  # noqa: E402

FIXED = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "reports"
BUDGET_S = 5.0


def big_predicate(pred: dict) -> dict:
    p = copy.deepcopy(pred)
    g1, g2, g3 = p["verdicts"]
    g1["evidence"]["streams"] = [{"node": f"n{i // 8}", "label": f"gpu{i % 8}", "gpu": i % 8,
                                  "read_gb_s": 5 + 0.3 * math.sin(i)} for i in range(64)]
    g2["evidence"]["ttft_recompute_s"] = [11.85 + math.sin(i) for i in range(1000)]
    g2["evidence"]["ttft_readback_s"] = [0.94 + 0.1 * math.cos(i) for i in range(1000)]
    g3["evidence"]["series"] = {f"n{k}": [[t + 0.01 * k, 1.45 + 0.05 * math.sin(t + k)] for t in range(600)]
                                for k in range(8)}
    return p


def main() -> None:
    pred = json.loads((FIXED / "predicate.json").read_text())
    with tempfile.TemporaryDirectory() as td:
        run = Path(td) / "run"
        shutil.copytree(FIXED / "fixed_run", run)
        write_reports("KVG-20260101-00000000", run, pred, Path(td) / "warm")  # imports matplotlib once
        for name, p in (("fixed 3-gate bundle", pred), ("large bundle", big_predicate(pred))):
            t0 = time.perf_counter()
            files = write_reports("KVG-20260101-00000000", run, p, Path(td) / name.replace(" ", "-"))
            dt = time.perf_counter() - t0
            print(f"{name}: {len(files)} files in {dt:.2f} s; {dt / BUDGET_S:.2f} x the {BUDGET_S:g} s budget")


if __name__ == "__main__":
    main()
