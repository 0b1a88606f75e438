"""G3 benchmark on the rig: 8-node vs 1-node wall time, start skew, aggregate / shaped ceiling.

Builds its own rig (prefix kvgb-), runs the g3-shared-read workload twice with the same per-node
work: once on 1 reader, once on 8; prints the figures and their goals. Needs root (namespaces).

  python3 benchmarks/g3_bench.py [--rate-mbit 1000] [--chunks 4]

The 1-node run gets a port shaped to rate/8 so each node's share of the port is the same in both
runs: wall(8 nodes) / wall(1 node) then measures orchestration overhead (goal <= 1.10).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.report.bundle import generate_keypair, load_private_key  # noqa: E402
from harness.config import load_config  # noqa: E402
from harness.workloads import WORKLOADS  # noqa: E402
from harness.rigs.netns import RigSpec, rig_down, rig_up  # noqa: E402
from harness.suite.runner import run_suite  # noqa: E402
import harness.workloads.g3_shared_read  # noqa: E402,F401

REPO = Path(__file__).resolve().parents[1]


def one(work: Path, nodes: int, rate_mbit: int, chunks: int, rep: int = 0) -> dict:
    spec = RigSpec(prefix="kvgb-", state_dir=work / f"rig{nodes}-{rep}", node_count=nodes, port_rate_mbit=rate_mbit)
    try:
        state = rig_up(spec)
        data = yaml.safe_load((REPO / "gates" / "g3-rig.yaml").read_text())
        g = data["gates"][0]
        g["nodes"] = spec.node_names() + ["storage"]
        g["params"]["chunks"] = chunks
        suite = work / f"g3-{nodes}-{rep}.yaml"
        suite.write_text(yaml.safe_dump(data, sort_keys=False))
        out = work / f"out{nodes}-{rep}"
        out.mkdir()
        generate_keypair(out / "k")
        cfg = load_config(state.inventory_path, suite, WORKLOADS)
        t0 = time.monotonic()
        res = run_suite(cfg, out, load_private_key(out / "k.key"), known_hosts_path=state.known_hosts,
                        progress=lambda m: None, make_tar=False)
        v = res.verdicts[0]
        res_ev = v.evidence
        win = res_ev.get("aggregate", {})
        launch = res_ev.get("launch", {})
        exits = [e["t_s"] for e in launch.get("events", []) if e["event"] == "exited"]
        read_wall = (max(exits) - launch["go_ref_s"]) if exits and launch.get("go_ref_s") else None
        import json
        gate = json.loads((res.run_dir / "gates" / "G3" / "result.json").read_text())
        return {"nodes": nodes, "outcome": v.outcome.value, "reason": v.reason, "metrics": v.metrics,
                "run_wall_s": time.monotonic() - t0, "read_wall_s": read_wall, "window_s": win.get("window_s"),
                "gate_wall_s": gate["finished_unix_s"] - gate["started_unix_s"]}
    finally:
        rig_down(spec)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate-mbit", type=int, default=1000)
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=1, help="runs of each size; medians are reported")
    a = ap.parse_args()
    r1s, r8s = [], []
    with tempfile.TemporaryDirectory(prefix="kvgate-g3-bench-") as tmp:
        work = Path(tmp)
        for rep in range(a.repeat):
            r8s.append(one(work, 8, a.rate_mbit, a.chunks, rep))
            r1s.append(one(work, 1, a.rate_mbit // 8, a.chunks, rep))
    for r in r1s + r8s:
        m = r["metrics"]
        print(f"{r['nodes']} node(s): {r['outcome']}  read wall {r['read_wall_s']:.2f} s  gate wall {r['gate_wall_s']:.1f} s  "
              f"run wall {r['run_wall_s']:.1f} s  aggregate {m.get('aggregate_read_gb_s', float('nan')):.4f} GB/s  "
              f"ratio {m.get('nic_ceiling_ratio', float('nan')):.3f}  skew {1e3 * m.get('start_skew_s', float('nan')):.1f} ms")

    def med(rs, f):
        return statistics.median(f(r) for r in rs)

    print(f"wall_ratio_8_vs_1 (read phase, go -> last reader exit) = "
          f"{med(r8s, lambda r: r['read_wall_s']) / med(r1s, lambda r: r['read_wall_s']):.3f}   (goal <= 1.10)")
    print(f"gate_wall_ratio_8_vs_1 (whole G3 gate: copy check, clock probes, cache drop, arm, read) = "
          f"{med(r8s, lambda r: r['gate_wall_s']) / med(r1s, lambda r: r['gate_wall_s']):.3f}   (informational)")
    print(f"run_wall_ratio_8_vs_1 (whole kvgate run incl. per-node snapshots and signing) = "
          f"{med(r8s, lambda r: r['run_wall_s']) / med(r1s, lambda r: r['run_wall_s']):.3f}   (informational)")
    print(f"start_skew_ms_8 = {1e3 * med(r8s, lambda r: r['metrics'].get('start_skew_s', float('nan'))):.1f}   (goal <= 20)")
    print(f"aggregate_over_shaped_ceiling_8 = "
          f"{med(r8s, lambda r: r['metrics'].get('nic_ceiling_ratio', float('nan'))):.3f}   (goal >= 0.90)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
