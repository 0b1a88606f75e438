"""Controller simulation: kvgate's own control-host cost of a whole G3 run at 128, 512 and 1,024 nodes.

Every node is a scripted transport (harness.transport.doubles.ScriptedTransport) that answers at once with
outputs recorded on the rig: the node facts of a rig node (benchmarks/fixtures/facts-rig-node.txt) and a rig
reader's series (benchmarks/fixtures/g3-reader-rig-slurm-n1.jsonl, which ends READER_EXIT_S = 5 s after it is
spawned, in every run's wall). So what
is measured is kvgate's work alone: opening the nodes, the facts, G3's phases (clock probes over sessions,
cache drops, arming, the go writes, collection, parsing, evaluation), the bundle and its signature. Each size
runs `run_suite` in a fresh Python process:

  python3 benchmarks/controller_sim.py [--sizes 128,512,1024] [--json FILE]

Printed per size: CPU-s (user + system of the process over the run) and per node, peak RSS over the run's
start (VmHWM less VmRSS before) and per node, peak threads and open fds while running, threads and fds left
after it, wall per phase (from the run's progress lines), and the growth exponent of CPU-s and of wall in N
(least squares over log-log). The scripted nodes' own cost (a Python object per node and, per spawned reader,
a timer) is in the figures: an upper bound on kvgate's. The goals of issue 27 are printed beside; nothing here
asserts them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIX = Path(__file__).resolve().parent / "fixtures"
READER_EXIT_S = 5.0
GOALS = {"cpu_s_per_node": 0.05, "rss_mib_per_node": 0.5, "exponent": 1.1}


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def one(n: int) -> dict:
    sys.path.insert(0, str(ROOT))
    import yaml
    from harness.config import load_config
    from harness.report.bundle import generate_keypair, load_private_key
    from harness.suite.runner import run_suite
    from harness.transport.doubles import Reply, ScriptedTransport
    from harness.workloads import WORKLOADS

    facts = (FIX / "facts-rig-node.txt").read_text()
    reader = (FIX / "g3-reader-rig-slurm-n1.jsonl").read_text()
    tmp = Path(tempfile.mkdtemp(prefix="kvgate-sim-"))
    names = [f"n{i}" for i in range(1, n + 1)]
    nodes = [{"name": x, "transport": "local", "work_dir": "/w",
              "targets": [{"name": "kvpool", "kind": "directory", "path": "/mnt/pool"}]} for x in names]
    nodes.append({"name": "storage", "transport": "local", "work_dir": "/w",
                  "nics": [{"name": "st0", "line_rate_gbit_s": 0.5}],
                  "targets": [{"name": "kvpool", "kind": "directory", "path": "/srv/pool"}]})
    (tmp / "i.yaml").write_text(yaml.safe_dump({"nodes": nodes}))
    gates = yaml.safe_load((ROOT / "gates" / "g3-rig.yaml").read_text())
    gates["gates"][0]["params"].update(read_timeout_s=120, arm_timeout_s=120, stall_timeout_s=60)
    (tmp / "g.yaml").write_text(yaml.safe_dump(gates))
    cfg = load_config(tmp / "i.yaml", tmp / "g.yaml", WORKLOADS)
    generate_keypair(tmp / "k")

    def handler(call):
        argv = call.argv
        if argv == ("sh", "-c", "while read -r _; do date +%s.%N; done"):
            return Reply(stdout=f"{time.time():.6f}\n")
        if "kvgate-launch" in argv:
            # Ends a while after it is spawned, long enough that arming (seen in its output) comes first at
            # every size: a reader that exits before it is seen armed is a node failure.
            return Reply(stdout=reader, exit_after_s=READER_EXIT_S)
        if any("kvgate-fact-section" in a for a in argv):
            return Reply(stdout=facts)
        if argv[:1] == ("cat",) and argv[1].endswith("/speed"):
            return Reply(stdout="1000\n")
        if argv[:2] == ("tc", "-j"):
            return Reply(stdout='[{"kind":"tbf","options":{"rate":62500000}}]\n')
        if argv[:1] == ("cat",):
            return Reply(rc=1, stderr="cat: no such file\n")
        return Reply()

    transports = {x: ScriptedTransport(handler, name=x, sessions=True) for x in names + ["storage"]}
    lines: list[tuple[float, str]] = []
    peak = {"threads": 0, "fds": 0}
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak["threads"] = max(peak["threads"], _status("Threads"))
            peak["fds"] = max(peak["fds"], len(os.listdir("/proc/self/fd")))
            time.sleep(0.01)

    base_threads, base_fds = _status("Threads"), len(os.listdir("/proc/self/fd"))
    rss0_kib = _status("VmRSS")
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.monotonic()
    res = run_suite(cfg, tmp / "out", load_private_key(tmp / "k.key"), transports=transports, make_tar=False,
                    progress=lambda m: lines.append((time.monotonic() - t0, m)))
    wall = time.monotonic() - t0
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    done.set()
    sampler.join()
    for t in transports.values():
        t.close()
    time.sleep(0.5)  # let the scripted nodes' timers end
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    hwm_kib = _status("VmHWM")

    def at(pred) -> float | None:
        return next((t for t, m in lines if pred(m)), None)
    marks = {"connect": at(lambda m: m.startswith("connecting")), "facts": at(lambda m: m.startswith("snapshot of")),
             "gate": at(lambda m: m.startswith("G3 ")), "clock": at(lambda m: "clock offsets" in m),
             "drop": at(lambda m: "page cache dropped" in m), "armed": at(lambda m: " armed in " in m),
             "released": at(lambda m: "released at" in m), "verdict": at(lambda m: re.match(r"G3: (PASS|FAIL|ERROR|INVALID|STOP|INFO|SKIPPED):", m) is not None)}
    order = ["connect", "facts", "gate", "clock", "drop", "armed", "released", "verdict"]
    phases, prev = {}, 0.0
    for k in order:
        if marks[k] is not None:
            phases[f"until_{k}_s"] = round(marks[k] - prev, 3)
            prev = marks[k]
    phases["verdict_to_bundle_s"] = round(wall - prev, 3)
    v = res.verdicts[0]
    shutil.rmtree(tmp, ignore_errors=True)  # the run's bundle: ~450 MB at 1,024 nodes, measured already
    return {"nodes": n, "outcome": v.outcome.value, "reason": v.reason, "wall_s": round(wall, 3),
            "cpu_s": round(cpu, 3), "cpu_s_per_node": round(cpu / n, 5),
            "rss_growth_mib": round((hwm_kib - rss0_kib) / 1024, 2),
            "rss_mib_per_node": round((hwm_kib - rss0_kib) / 1024 / n, 4),
            "peak_threads": peak["threads"], "peak_fds": peak["fds"],
            "threads_left": _status("Threads") - base_threads, "fds_left": len(os.listdir("/proc/self/fd")) - base_fds,
            "phases": phases}


def exponent(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of log(y) on log(x): y ~ x^k."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x > 0 and y > 0]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    return sum((a - mx) * (b - my) for a, b in pts) / sum((a - mx) ** 2 for a, _ in pts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="128,512,1024")
    ap.add_argument("--json")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a.one)))
        return 0
    rows = []
    for n in [int(x) for x in a.sizes.split(",")]:
        cp = subprocess.run([sys.executable, __file__, "--one", str(n)], capture_output=True, text=True)
        if cp.returncode != 0:
            print(f"{n} nodes: failed: {cp.stderr[-2000:]}", file=sys.stderr)
            return 1
        rows.append(json.loads(cp.stdout.strip().splitlines()[-1]))
        r = rows[-1]
        print(f"{n:>5} nodes  {r['outcome']:<5} wall {r['wall_s']:7.2f} s  CPU {r['cpu_s']:7.2f} s "
              f"({r['cpu_s_per_node']:.4f}/node)  RSS +{r['rss_growth_mib']:.1f} MiB ({r['rss_mib_per_node']:.3f}/node)  "
              f"threads peak {r['peak_threads']} left {r['threads_left']}  fds peak {r['peak_fds']} left {r['fds_left']}",
              flush=True)
        print("       phases: " + ", ".join(f"{k} {v}" for k, v in r["phases"].items()), flush=True)
        if r["outcome"] != "PASS":
            print(f"       {r['outcome']}: {r['reason'][:300]}", flush=True)
    ns = [r["nodes"] for r in rows]
    k_cpu = exponent(ns, [r["cpu_s"] for r in rows])
    k_wall = exponent(ns, [r["wall_s"] for r in rows])
    k_rss = exponent(ns, [max(r["rss_growth_mib"], 1e-3) for r in rows])
    if k_cpu is not None:  # one size has no slope
        print(f"growth exponent in N: CPU-s {k_cpu:.2f}, wall {k_wall:.2f}, RSS {k_rss:.2f}   (goal: <= {GOALS['exponent']})")
    last = rows[-1]
    print(f"goals at {last['nodes']} nodes: CPU-s/node {last['cpu_s_per_node']:.4f} (<= {GOALS['cpu_s_per_node']}), "
          f"RSS MiB/node {last['rss_mib_per_node']:.3f} (<= {GOALS['rss_mib_per_node']}), threads left "
          f"{last['threads_left']} (0)")
    if a.json:
        Path(a.json).write_text(json.dumps({"rows": rows, "exponent_cpu": k_cpu, "exponent_wall": k_wall,
                                            "exponent_rss": k_rss}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
