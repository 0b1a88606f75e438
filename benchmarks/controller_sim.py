"""Controller simulation: kvgate's own control-host cost of a whole G3 run at 128, 512 and 1,024 nodes.

Every node is a scripted transport (harness.transport.doubles.ScriptedTransport) that answers at once with
outputs recorded on the rig: the node facts of a rig node (benchmarks/fixtures/facts-rig-node.txt) and a rig
reader's series (benchmarks/fixtures/g3-reader-rig-slurm-n1.jsonl, which ends READER_EXIT_S = 5 s after it is
spawned, in every run's wall). So what is measured is kvgate's work alone: opening the nodes, the facts, G3's
phases (clock probes over sessions, cache drops, arming, the go writes, collection, parsing, evaluation), the
bundle and its signature. Each run is `run_suite` in a fresh Python process:

  python3 benchmarks/controller_sim.py [--sizes 128,512,1024] [--reps 3] [--against CHECKOUT] [--tmp DIR]
                                       [--json FILE]

How it measures, so that one run does not pay for another (docs/g3.md, "Why the second run cost twice"):
every run gets a fresh directory under --tmp, made after `sync`; no run's files are deleted until every run of
the set has ended (this machine's root is ext4 without a journal, where creating an inode skips over every
inode of its group deleted in the last 60 s, 360 s while its inode-table block is dirty: a run right after
another's deleted tree paid two to four times the system time); with --against, a second checkout (e.g.
`git worktree add /tmp/main main`) is measured the same way, the order alternating rep by rep (this, other;
other, this; ...). Before each run a probe times creating 1,000 files in a fresh directory (system µs per
file), so a reader sees the filesystem's state the run met. Printed per run and as the median over the reps:
CPU-s with user and system apart (the process's own, all threads), per node, per phase (user/system from the
run's progress lines), peak RSS over the run's start (VmHWM less VmRSS before) and per node, peak threads and
open fds while running, threads and fds left after it; then the growth exponent in N of the medians' CPU-s,
wall and RSS (least squares over log-log). The scripted nodes' own cost (a Python object per node and, per
spawned reader, a timer) is in the figures: an upper bound on kvgate's. The goals of issue 27 are printed
beside; nothing here asserts them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import resource
import shutil
import statistics
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
# (mark, the phase that ends at it): the run's progress lines in order; the bundle is from the last to the end
PHASES = [("connect", "start"), ("facts", "connect"), ("gate", "facts"), ("clock", "clock"), ("drop", "drop"),
          ("armed", "arm"), ("released", "release"), ("verdict", "collect_evaluate")]


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def _cpu() -> tuple[float, float]:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime, ru.ru_stime


def one(n: int, root: Path, tmp: Path) -> dict:
    """One whole run at ``n`` nodes of the checkout at ``root``, its files under ``tmp`` (left there)."""
    sys.path.insert(0, str(root))
    import yaml
    from harness.config import load_config
    from harness.report.bundle import generate_keypair, load_private_key
    from harness.suite.runner import run_suite
    from harness.transport.doubles import Reply, ScriptedTransport
    from harness.workloads import WORKLOADS

    facts = (FIX / "facts-rig-node.txt").read_text()
    reader = (FIX / "g3-reader-rig-slurm-n1.jsonl").read_text()
    names = [f"n{i}" for i in range(1, n + 1)]
    nodes = [{"name": x, "transport": "local", "work_dir": "/w",
              "targets": [{"name": "kvpool", "kind": "directory", "path": "/mnt/pool"}]} for x in names]
    # Every reader replays one reader of the 8-node rig's 0.5 Gbit/s port: n of them need n/8 of that port, else
    # their aggregate is more than the port can carry (INVALID). The port's node reports the same rate.
    port_gbit_s = 0.5 * n / 8
    nodes.append({"name": "storage", "transport": "local", "work_dir": "/w",
                  "nics": [{"name": "st0", "line_rate_gbit_s": port_gbit_s}],
                  "targets": [{"name": "kvpool", "kind": "directory", "path": "/srv/pool"}]})
    (tmp / "i.yaml").write_text(yaml.safe_dump({"nodes": nodes}))
    gates = yaml.safe_load((root / "gates" / "g3-rig.yaml").read_text())
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
            return Reply(stdout=f"{round(port_gbit_s * 1000)}\n")
        if argv[:2] == ("tc", "-j"):
            return Reply(stdout="[]\n")
        if argv[:1] == ("cat",):
            return Reply(rc=1, stderr="cat: no such file\n")
        return Reply()

    transports = {x: ScriptedTransport(handler, name=x, sessions=True) for x in names + ["storage"]}
    lines: list[tuple[float, str, float, float]] = []
    peak = {"threads": 0, "fds": 0}
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak["threads"] = max(peak["threads"], _status("Threads"))
            peak["fds"] = max(peak["fds"], len(os.listdir("/proc/self/fd")))
            time.sleep(0.01)

    def progress(m: str) -> None:
        lines.append((time.monotonic() - t0, m, *_cpu()))

    base_threads, base_fds = _status("Threads"), len(os.listdir("/proc/self/fd"))
    rss0_kib = _status("VmRSS")
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    u0, s0 = _cpu()
    t0 = time.monotonic()
    res = run_suite(cfg, tmp / "out", load_private_key(tmp / "k.key"), transports=transports, make_tar=False,
                    progress=progress)
    wall = time.monotonic() - t0
    u1, s1 = _cpu()
    done.set()
    sampler.join()
    for t in transports.values():
        t.close()
    time.sleep(0.5)  # let the scripted nodes' timers end
    hwm_kib = _status("VmHWM")

    def at(pred):
        return next(((t, u, s) for t, m, u, s in lines if pred(m)), None)
    marks = {"connect": at(lambda m: m.startswith("connecting")), "facts": at(lambda m: m.startswith("snapshot of")),
             "gate": at(lambda m: m.startswith("G3 ")), "clock": at(lambda m: "clock offsets" in m),
             "drop": at(lambda m: "page cache dropped" in m), "armed": at(lambda m: " armed in " in m),
             "released": at(lambda m: "released at" in m),
             "verdict": at(lambda m: re.match(r"G3: (PASS|FAIL|ERROR|INVALID|STOP|INFO|SKIPPED):", m) is not None)}
    phases, prev = {}, (0.0, u0, s0)
    for k, phase in PHASES:
        if marks[k] is not None:
            phases[phase] = {"wall_s": round(marks[k][0] - prev[0], 3), "user_s": round(marks[k][1] - prev[1], 3),
                         "sys_s": round(marks[k][2] - prev[2], 3)}
            prev = marks[k]
    phases["bundle"] = {"wall_s": round(wall - prev[0], 3), "user_s": round(u1 - prev[1], 3),
                        "sys_s": round(s1 - prev[2], 3)}
    v = res.verdicts[0]
    cpu = (u1 - u0) + (s1 - s0)
    return {"nodes": n, "outcome": v.outcome.value, "reason": v.reason, "wall_s": round(wall, 3),
            "cpu_s": round(cpu, 3), "user_s": round(u1 - u0, 3), "sys_s": round(s1 - s0, 3),
            "cpu_s_per_node": round(cpu / n, 5),
            "rss_growth_mib": round((hwm_kib - rss0_kib) / 1024, 2),
            "rss_mib_per_node": round((hwm_kib - rss0_kib) / 1024 / n, 4),
            "peak_threads": peak["threads"], "peak_fds": peak["fds"],
            "threads_left": _status("Threads") - base_threads, "fds_left": len(os.listdir("/proc/self/fd")) - base_fds,
            "phases": phases}


def fs_probe(base: Path, files: int = 1000) -> float:
    """System µs per file to create ``files`` small files in a fresh directory under ``base`` (left there)."""
    d = Path(tempfile.mkdtemp(prefix="kvgate-sim-probe-", dir=base))
    s0 = resource.getrusage(resource.RUSAGE_SELF).ru_stime
    for i in range(files):
        fd = os.open(f"{d}/{i}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, b"x\n")
        os.close(fd)
    return round((resource.getrusage(resource.RUSAGE_SELF).ru_stime - s0) / files * 1e6, 1)


def exponent(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of log(y) on log(x): y ~ x^k."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x > 0 and y > 0]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    return sum((a - mx) * (b - my) for a, b in pts) / sum((a - mx) ** 2 for a, _ in pts)


def _median_row(rows: list[dict]) -> dict:
    med = {k: round(statistics.median(r[k] for r in rows), 5)
           for k in ("wall_s", "cpu_s", "user_s", "sys_s", "cpu_s_per_node", "rss_growth_mib", "rss_mib_per_node",
                     "fs_probe_us_per_file")}
    med["phases"] = {p: {k: round(statistics.median(r["phases"].get(p, {}).get(k, 0.0) for r in rows), 3)
                         for k in ("wall_s", "user_s", "sys_s")} for p in rows[0]["phases"]}
    med.update(nodes=rows[0]["nodes"], reps=len(rows), outcomes=sorted({r["outcome"] for r in rows}),
               cpu_s_range=[min(r["cpu_s"] for r in rows), max(r["cpu_s"] for r in rows)],
               threads_left=max(r["threads_left"] for r in rows), fds_left=max(r["fds_left"] for r in rows),
               peak_threads=max(r["peak_threads"] for r in rows), peak_fds=max(r["peak_fds"] for r in rows))
    return med


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="128,512,1024")
    ap.add_argument("--reps", type=int, default=3, help="runs per size and checkout; the median is reported")
    ap.add_argument("--against", help="a second checkout measured the same way, order alternating rep by rep")
    ap.add_argument("--tmp", default=tempfile.gettempdir(), help="where each run's fresh directory is made")
    ap.add_argument("--json")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--root", help=argparse.SUPPRESS)
    ap.add_argument("--dir", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a.one, Path(a.root), Path(a.dir))))
        return 0
    checkouts = {"this": ROOT} | ({"other": Path(a.against).resolve()} if a.against else {})
    base = Path(tempfile.mkdtemp(prefix="kvgate-sim-", dir=a.tmp))
    runs: dict[tuple[str, int], list[dict]] = {}
    try:
        for n in [int(x) for x in a.sizes.split(",")]:
            for rep in range(a.reps):
                order = list(checkouts) if rep % 2 == 0 else list(reversed(checkouts))
                for which in order:
                    os.sync()
                    probe = fs_probe(base)
                    d = tempfile.mkdtemp(prefix=f"{which}-{n}-{rep}-", dir=base)
                    la = os.getloadavg()[0]
                    cp = subprocess.run([sys.executable, __file__, "--one", str(n), "--root", str(checkouts[which]),
                                         "--dir", d], capture_output=True, text=True)
                    if cp.returncode != 0:
                        print(f"{which} {n} nodes: failed: {cp.stderr[-2000:]}", file=sys.stderr)
                        return 1
                    r = json.loads(cp.stdout.strip().splitlines()[-1])
                    r.update(checkout=which, rep=rep + 1, fs_probe_us_per_file=probe, load_1min=round(la, 2))
                    runs.setdefault((which, n), []).append(r)
                    ph = ", ".join(f"{k} {v['wall_s']:.1f}s {v['user_s']:.1f}u/{v['sys_s']:.1f}s"
                                   for k, v in r["phases"].items())
                    print(f"{which:<5} {n:>5} nodes rep {rep + 1}  {r['outcome']:<5} wall {r['wall_s']:6.1f} s  "
                          f"CPU {r['cpu_s']:6.1f} s (user {r['user_s']:.1f}, sys {r['sys_s']:.1f}; "
                          f"{r['cpu_s_per_node']:.4f}/node)  RSS {r['rss_mib_per_node']:.3f} MiB/node  "
                          f"threads left {r['threads_left']} fds left {r['fds_left']}  fs probe {probe} µs/file  "
                          f"load {la:.1f}\n      {ph}", flush=True)
                    if r["outcome"] != "PASS":
                        print(f"      {r['outcome']}: {r['reason'][:300]}", flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)  # every run's tree, only now (see the docstring)
        os.sync()
    meds = {k: _median_row(v) for k, v in runs.items()}
    print("median over reps:")
    for (which, n), m in meds.items():
        print(f"{which:<5} {n:>5} nodes x{m['reps']}  {'/'.join(m['outcomes'])}  wall {m['wall_s']:.1f} s  "
              f"CPU {m['cpu_s']:.1f} s [{m['cpu_s_range'][0]:.1f}-{m['cpu_s_range'][1]:.1f}] (user {m['user_s']:.1f}, "
              f"sys {m['sys_s']:.1f}; {m['cpu_s_per_node']:.4f}/node)  RSS {m['rss_mib_per_node']:.3f} MiB/node  "
              f"peak threads {m['peak_threads']} fds {m['peak_fds']}, left {m['threads_left']} / {m['fds_left']}  "
              f"fs probe {m['fs_probe_us_per_file']} µs/file")
        print("      " + ", ".join(f"{k} {v['wall_s']:.1f}s {v['user_s']:.1f}u/{v['sys_s']:.1f}s"
                                   for k, v in m["phases"].items()))
    exps = {}
    for which in checkouts:
        ms = [m for (w, _), m in meds.items() if w == which]
        ns = [m["nodes"] for m in ms]
        exps[which] = {k: exponent(ns, [max(m[f], 1e-3) for m in ms])
                       for k, f in (("cpu", "cpu_s"), ("wall", "wall_s"), ("rss", "rss_growth_mib"))}
        if exps[which]["cpu"] is not None:  # one size has no slope
            e = exps[which]
            print(f"{which}: growth exponent in N: CPU-s {e['cpu']:.2f}, wall {e['wall']:.2f}, RSS {e['rss']:.2f}   "
                  f"(goal: <= {GOALS['exponent']})")
        last = ms[-1]
        print(f"{which}: goals at {last['nodes']} nodes (medians): CPU-s/node {last['cpu_s_per_node']:.4f} "
              f"(<= {GOALS['cpu_s_per_node']}), RSS MiB/node {last['rss_mib_per_node']:.3f} "
              f"(<= {GOALS['rss_mib_per_node']}), threads left {last['threads_left']} (0)")
    if a.json:
        Path(a.json).write_text(json.dumps({"runs": [r for v in runs.values() for r in v],
                                            "medians": list(meds.values()), "exponents": exps}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
