"""G3 benchmark on the rig: kvgate's cost as nodes grow, at 1, 8, 16 and 32 nodes on one shaped port.

Builds one 32-node rig (prefix kvgb-, subnet 10.80.0.0/24), lays out the KV copy once on the storage side
(so no run pays for it), then runs the whole `kvgate run` of gates/g3-rig.yaml on the first N nodes for
N = 1, 8, 16, 32, each in a fresh Python process. Every node gets the same share of the port: the tbf rate
is reshaped to N x --share-mbit before each run, so the read phase is the same length at every N and
wall(N) / wall(1) measures what kvgate's orchestration adds per node. Needs root (namespaces).

  python3 benchmarks/g3_bench.py [--share-mbit 30] [--chunks 4] [--chunk-tokens 64] [--block "256 KiB"]
                                 [--repeat 1] [--json FILE]

Printed per N (medians over --repeat): whole-run wall and its ratio to N=1, the G3 read phase (go ->
last reader exit) and its ratio, start skew, aggregate / shaped ceiling, kvgate's own CPU seconds and
peak memory on the control host (the run's process: getrusage and /proc/self/status VmHWM, measured in
that fresh process), the CPU the rig's own processes spent (the nodes' side: on the rig it is this
machine's too), a breakdown of the run's phases from its progress lines, and the load average.
The goals of issue 17 are printed beside the figures; nothing here asserts them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SIZES = (1, 8, 16, 32)
PROGRESS_RE = re.compile(r"^\[\s*([0-9.]+)s\] (.*)$")


# ------------------------------------------------------------------------------------------ the child

def child(inventory: str, suite: str, known_hosts: str, out: str, key: str, result: str) -> int:
    """One `kvgate run` in this fresh process; its own CPU time and memory, measured around it."""
    from harness.cli.main import main

    def status_kib(field: str) -> int:
        text = Path("/proc/self/status").read_text()
        return int(re.search(rf"^{field}:\s+(\d+) kB", text, re.M).group(1))

    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    rss0 = status_kib("VmRSS")
    t0 = time.monotonic()
    rc = main(["run", "-i", inventory, "-g", suite, "--known-hosts", known_hosts, "--out", out, "--key", key])
    wall = time.monotonic() - t0
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    Path(result).write_text(json.dumps({
        "rc": rc, "run_wall_s": wall,
        "cpu_s": (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime),
        "cpu_user_s": ru1.ru_utime - ru0.ru_utime, "cpu_sys_s": ru1.ru_stime - ru0.ru_stime,
        "rss_before_run_kib": rss0, "peak_rss_kib": status_kib("VmHWM"),
        "voluntary_switches": ru1.ru_nvcsw - ru0.ru_nvcsw}))
    return 0


# ------------------------------------------------------------------------------------------ the parent

def phases(progress: list[tuple[float, str]]) -> dict[str, float]:
    """Seconds of each phase of the run, from its progress lines."""
    def at(pattern: str) -> float | None:
        return next((t for t, m in progress if re.search(pattern, m)), None)

    marks = {"connect": at(r"^connecting to "), "facts": at(r"^snapshot of "), "gate": at(r"^G3 "),
             "release": at(r"^G3: released at "), "verdict": at(r"^G3: (PASS|FAIL|ERROR|INVALID|STOP)"),
             "sign": at(r"^signing the bundle")}
    out = {}
    for name, a, b in (("connect_s", "connect", "facts"), ("facts_s", "facts", "gate"),
                       ("gate_until_go_s", "gate", "release"), ("read_and_collect_s", "release", "verdict"),
                       ("until_signing_s", "verdict", "sign")):
        if marks[a] is not None and marks[b] is not None:
            out[name] = marks[b] - marks[a]
    for t, m in progress:
        for name, pat in (("clock_s", r"clock offsets of [\d/]+ nodes in ([0-9.]+) s"),
                          ("drop_caches_s", r"page cache dropped on [\d/]+ nodes in ([0-9.]+) s"),
                          ("arm_s", r"[\d/]+ armed in ([0-9.]+) s")):
            mm = re.search(pat, m)
            if mm:
                out[name] = float(mm.group(1))
    return out


def inventory_for(rig_inventory: Path, n: int, rate_mbit: int, path: Path) -> None:
    """The rig's inventory cut to n1..nN plus the storage node, its port declared at ``rate_mbit``."""
    inv = yaml.safe_load(rig_inventory.read_text())
    keep = {f"n{i}" for i in range(1, n + 1)} | {"storage"}
    inv["nodes"] = [node for node in inv["nodes"] if node["name"] in keep]
    for node in inv["nodes"]:
        if node["name"] == "storage":
            node["nics"] = [{"name": "st0", "line_rate_gbit_s": rate_mbit / 1000.0}]
    path.write_text(yaml.safe_dump(inv, sort_keys=False))


def suite_for(chunks: int, chunk_tokens: int, block: str, path: Path) -> dict:
    data = yaml.safe_load((REPO / "gates" / "g3-rig.yaml").read_text())
    params = data["gates"][0]["params"]
    params.update(chunks=chunks, chunk_tokens=chunk_tokens, block=block)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return params


def lay_out_copy(spec, params: dict) -> None:
    """The KV copy, written once on the storage side as G3 would lay it out (its manifest matches, so no
    measured run creates it through the shaped port)."""
    from harness.node import program_path
    from harness.workloads.g3_shared_read import G3Params, manifest_for

    p = G3Params.model_validate(params)
    pool = spec.pool_dir / p.pool_subdir
    subprocess.run([sys.executable, str(program_path("g3_reader.py")), "create", "--pool-dir", str(pool),
                    "--manifest-json", json.dumps(manifest_for(p), separators=(",", ":")),
                    "--block-bytes", str(p.block_bytes)], check=True, capture_output=True)


def rig_processes(spec) -> dict[int, float]:
    """PID -> CPU seconds (its own and its reaped children's) of every process in the rig's namespaces."""
    from harness.rigs.netns import namespace_pids

    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for ns in spec.all_namespaces():
        for pid in namespace_pids(ns):
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            out[pid] = sum(int(x) for x in fields[11:15]) / tick  # utime stime cutime cstime
    return out


def rig_cpu_s(spec, before: dict[int, float]) -> float:
    """CPU the rig's processes spent since ``before`` (node side: sshd sessions and what they ran, readers,
    sshfs, the storage sshd, the forwarder). A run's sessions count once their connection's sshd process has
    exited and been reaped by its listener, so wait until only the rig's own processes are left."""
    deadline = time.monotonic() + 20
    now = rig_processes(spec)
    while set(now) - set(before) and time.monotonic() < deadline:
        time.sleep(0.2)
        now = rig_processes(spec)
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in now.items())


def one(work: Path, spec, state, n: int, share_mbit: int, suite: Path, key: Path, rep: int) -> dict:
    from harness.rigs.netns import set_port_rate

    rate = n * share_mbit
    set_port_rate(spec, rate)
    inv = work / f"inv-{n}-{rep}.yaml"
    inventory_for(Path(state.inventory_path), n, rate, inv)
    out = work / f"out-{n}-{rep}"
    result = work / f"result-{n}-{rep}.json"
    rig_before = rig_processes(spec)
    load0 = os.getloadavg()
    t0 = time.monotonic()
    cp = subprocess.run([sys.executable, __file__, "--child", str(inv), str(suite), state.known_hosts, str(out),
                         str(key), str(result)], capture_output=True, text=True)
    process_wall = time.monotonic() - t0
    load1 = os.getloadavg()
    rig_cpu = rig_cpu_s(spec, rig_before)
    if not result.exists():
        raise SystemExit(f"the {n}-node run failed (rc {cp.returncode}):\n{cp.stderr[-3000:]}")
    r = json.loads(result.read_text())
    progress = [(float(m.group(1)), m.group(2)) for m in map(PROGRESS_RE.match, cp.stderr.splitlines()) if m]
    bundle = next(out.glob("KVG-*/verdicts.json")).parent
    verdict = json.loads((bundle / "verdicts.json").read_text())["verdicts"][0]
    launch = json.loads((bundle / "gates" / "G3" / "launch.json").read_text())
    exits = [e["t_s"] for e in launch["events"] if e["event"] == "exited"]
    r.update(nodes=n, port_rate_mbit=rate, outcome=verdict["outcome"], metrics=verdict["metrics"],
             read_wall_s=(max(exits) - launch["go_ref_s"]) if exits and launch.get("go_ref_s") else None,
             process_wall_s=process_wall, phases=phases(progress), load_before=load0, load_after=load1,
             rig_cpu_s=rig_cpu)
    return r


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        return child(*sys.argv[2:8])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--share-mbit", type=int, default=30, help="each node's share of the port (default 30)")
    ap.add_argument("--chunks", type=int, default=4, help="chunk files each node reads (default 4)")
    ap.add_argument("--chunk-tokens", type=int, default=64, help="tokens per chunk (default 64: 8 MiB)")
    # A node's bytes count when a block completes: at 3.75 MB/s a 4 MiB block takes over a second, so the
    # first samples of a lone reader are empty and its window starts late (1-node ratio ~1.2 with 4 MiB).
    ap.add_argument("--block", default="256 KiB", help="read block (default 256 KiB; the suite has 4 MiB)")
    ap.add_argument("--repeat", type=int, default=1, help="rounds over 1, 8, 16, 32 nodes; medians are printed")
    ap.add_argument("--json", default=None, help="also write every run's figures here")
    a = ap.parse_args()

    from harness.report.bundle import generate_keypair
    from harness.rigs.netns import RigSpec, rig_down, rig_up

    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="kvgate-g3-bench-") as tmp:
        work = Path(tmp)
        spec = RigSpec(prefix="kvgb-", state_dir=work / "rig", node_count=max(SIZES), subnet="10.80.0.0/24",
                       port_rate_mbit=a.share_mbit * max(SIZES))
        try:
            t0 = time.monotonic()
            state = rig_up(spec)
            print(f"rig of {spec.node_count} nodes up in {time.monotonic() - t0:.1f} s", flush=True)
            suite = work / "g3.yaml"
            lay_out_copy(spec, suite_for(a.chunks, a.chunk_tokens, a.block, suite))
            generate_keypair(work / "k")
            for rep in range(a.repeat):
                for n in SIZES:
                    r = one(work, spec, state, n, a.share_mbit, suite, work / "k.key", rep)
                    runs.append(r)
                    m = r["metrics"]
                    print(f"{n:2d} node(s) [{r['outcome']}] run {r['run_wall_s']:.1f} s, read {r['read_wall_s']:.2f} s, "
                          f"skew {1e3 * m.get('start_skew_s', float('nan')):.2f} ms, "
                          f"ratio {m.get('nic_ceiling_ratio', float('nan')):.3f}, cpu {r['cpu_s']:.1f} s, "
                          f"peak {r['peak_rss_kib'] / 1024:.0f} MiB, rig cpu {r['rig_cpu_s']:.1f} s, "
                          f"load {r['load_before'][0]:.1f}->"
                          f"{r['load_after'][0]:.1f}", flush=True)
        finally:
            rig_down(spec)
    if a.json:
        Path(a.json).write_text(json.dumps(runs, indent=1))

    def med(n: int, f) -> float:
        vals = [f(r) for r in runs if r["nodes"] == n and f(r) is not None]
        return statistics.median(vals) if vals else float("nan")

    base = {k: med(1, lambda r, k=k: r[k]) for k in ("run_wall_s", "read_wall_s", "peak_rss_kib")}
    print(f"\nmedians of {a.repeat} round(s); each node's share of the port: {a.share_mbit} Mbit/s; "
          f"{a.chunks} x {a.chunk_tokens * 131072 >> 20} MiB read per node in {a.block} blocks; "
          f"{os.cpu_count()} CPUs; load average (1 min) over the runs "
          f"{min(r['load_before'][0] for r in runs):.1f}-{max(r['load_after'][0] for r in runs):.1f}")
    print("cpu_s: kvgate's own process; rig_cpu_s: every process of the rig (the nodes' side, same machine)")
    print("nodes  run_s  run/1  read_s read/1  skew_ms  agg/ceil  cpu_s  peak_MiB  rig_cpu_s  load1")
    for n in SIZES:
        print(f"{n:5d} {med(n, lambda r: r['run_wall_s']):6.1f} {med(n, lambda r: r['run_wall_s']) / base['run_wall_s']:6.3f} "
              f"{med(n, lambda r: r['read_wall_s']):7.2f} {med(n, lambda r: r['read_wall_s']) / base['read_wall_s']:6.3f} "
              f"{1e3 * med(n, lambda r: r['metrics'].get('start_skew_s')):8.2f} "
              f"{med(n, lambda r: r['metrics'].get('nic_ceiling_ratio')):9.3f} {med(n, lambda r: r['cpu_s']):6.1f} "
              f"{med(n, lambda r: r['peak_rss_kib']) / 1024:9.1f} {med(n, lambda r: r['rig_cpu_s']):10.1f} "
              f"{med(n, lambda r: r['load_before'][0]):6.1f}")
    print("\nphases (s):")
    names = ["connect_s", "facts_s", "gate_until_go_s", "clock_s", "drop_caches_s", "arm_s", "read_and_collect_s",
             "until_signing_s"]
    print("nodes " + " ".join(f"{x[:-2]:>12s}" for x in names) + "  bundle+exit")
    for n in SIZES:
        tail = med(n, lambda r: r["run_wall_s"] - sum(r["phases"].get(k, 0.0) for k in
                                                      ("connect_s", "facts_s", "gate_until_go_s",
                                                       "read_and_collect_s", "until_signing_s")))
        print(f"{n:5d} " + " ".join(f"{med(n, lambda r, k=k: r['phases'].get(k)):12.2f}" for k in names)
              + f"  {tail:11.2f}")
    growth = (med(32, lambda r: r["peak_rss_kib"]) - base["peak_rss_kib"]) / 31 / 1024
    print("\ngoals (issue 17), measured:")
    print(f"  whole run 8/1  = {med(8, lambda r: r['run_wall_s']) / base['run_wall_s']:.3f}   (goal <= 1.15)")
    print(f"  whole run 32/1 = {med(32, lambda r: r['run_wall_s']) / base['run_wall_s']:.3f}   (goal <= 1.30)")
    print(f"  read wall 32/1 = {med(32, lambda r: r['read_wall_s']) / base['read_wall_s']:.3f}   (informational)")
    print(f"  start skew at 32 = {1e3 * med(32, lambda r: r['metrics'].get('start_skew_s')):.2f} ms   (goal <= 5)")
    print(f"  aggregate / ceiling at 32 = {med(32, lambda r: r['metrics'].get('nic_ceiling_ratio')):.3f}   "
          f"(goal >= 0.93)")
    print(f"  control-host peak memory growth, 1 -> 32 nodes = {growth:.2f} MiB per node   (goal <= 10 MB)")
    print(f"  control-host CPU, 32 nodes = {med(32, lambda r: r['cpu_s']):.1f} s "
          f"(1 node: {med(1, lambda r: r['cpu_s']):.1f} s)   (informational)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
