"""G3 benchmark on the rig: kvgate's cost as nodes grow, at 1, 8, 16 and 32 nodes on one shaped port.

Builds one 32-node rig (prefix kvgb-, subnet 10.80.0.0/24), lays out the KV copy once on the storage side
(so no run pays for it), then runs the whole `kvgate run` of gates/g3-rig.yaml on the first N nodes for
N = 1, 8, 16, 32, each in a fresh Python process. Every node gets the same share of the port: the tbf rate
is reshaped to N x --share-mbit before each run, so the read phase is the same length at every N and
wall(N) / wall(1) measures what kvgate's orchestration adds per node. Needs root (namespaces).

  python3 benchmarks/g3_bench.py [--share-mbit 30] [--chunks 4] [--chunk-tokens 64] [--block "256 KiB"]
                                 [--repeat 1] [--json FILE] [--sizes 1,8,16,32] [--shell-rc empty|host]

Printed per N (medians over --repeat): whole-run wall and its ratio to N=1, the G3 read phase (go ->
last reader exit) and its ratio, start skew, aggregate / shaped ceiling, kvgate's own CPU seconds and
peak memory on the control host (the run's process: getrusage and /proc/self/status VmHWM, measured in
that fresh process), the CPU the rig's own processes spent (the nodes' side: on the rig it is this
machine's too), a breakdown of the run's phases from its progress lines, and the load average.
The rig's CPU is split by who spent it (kvgate's SSH sessions on the nodes and all they ran; the data path
that emulates the array's port; the forwarder) and by when (inside the read phase or outside it), and a
modelled ratio, wall(N) less the rig's extra CPU outside the read phase over this machine's cores, is printed
apart from the measured one as what it is: an estimate.
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
import threading
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


def rig_processes(spec) -> dict[int, tuple[str, float]]:
    """PID -> (comm, CPU seconds: its own and its reaped children's) of every process in the rig's network
    namespaces, in one pass over /proc. The sum over these is continuous: a child's time moves into its
    parent's when it is reaped."""
    inodes = set()
    for ns in spec.all_namespaces():
        try:
            inodes.add(os.stat(f"/run/netns/{ns}").st_ino)
        except OSError:
            pass
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}/ns/net").st_ino not in inodes:
                continue
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        out[int(entry)] = (comm, sum(int(x) for x in fields[11:15]) / tick)  # utime stime cutime cstime
    return out


def rig_cpu_split(state, before: dict, now: dict) -> dict[str, float]:
    """The rig's CPU between two ``rig_processes`` looks, by who spent it:

    sessions_s: the nodes' sshd listeners, into which every SSH connection kvgate opens is reaped with all it
      ran (the facts, clock probes, page-cache drops, readers and their FUSE reads): kvgate's node-side work,
      which on real nodes runs on each node's own CPUs;
    data_path_s: every other process of the node and storage namespaces (sshfs, its ssh, the storage sshd's
      SFTP sessions): the rig emulating the array's port, which on real hardware is the NIC and the array;
    forwarder_s: the hub's forwarder carrying kvgate's SSH connections from 127.0.0.1 into the namespaces."""
    listeners = {pid for role, pid in state.pids.items() if role.startswith("sshd-")}
    forwarder = state.pids.get("forwarder")
    split = {"sessions_s": 0.0, "data_path_s": 0.0, "forwarder_s": 0.0}
    for pid, (_comm, cpu) in now.items():
        delta = cpu - before.get(pid, ("", 0.0))[1]
        key = "sessions_s" if pid in listeners else "forwarder_s" if pid == forwarder else "data_path_s"
        split[key] += delta
    split["total_s"] = sum(split.values())
    return split


def rig_cpu_after(spec, state, before: dict) -> dict[str, float]:
    """``rig_cpu_split`` since ``before``, once a run's sessions have been reaped by their listeners: wait
    until only the rig's own processes are left."""
    deadline = time.monotonic() + 20
    now = rig_processes(spec)
    while set(now) - set(before) and time.monotonic() < deadline:
        time.sleep(0.2)
        now = rig_processes(spec)
    return rig_cpu_split(state, before, now)


class RigCpuSampler:
    """The rig's total CPU every ``period_s`` while a run goes on (our clock), to tell how much of it fell
    inside the read phase (readers and the data path at work while the port sets the pace) and how much
    outside it, where it competes with kvgate's orchestration for this machine's cores."""

    def __init__(self, spec, period_s: float = 0.25):
        self.spec, self.period_s = spec, period_s
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.monotonic(), sum(c for _, c in rig_processes(self.spec).values())))
            self._stop.wait(self.period_s)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def cpu_between(self, t0: float, t1: float) -> float | None:
        """The rig's CPU between the samples nearest to t0 and t1."""
        if not self.samples:
            return None
        def at(t: float) -> float:
            return min(self.samples, key=lambda s: abs(s[0] - t))[1]
        return at(t1) - at(t0)


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
    lines: list[tuple[float, str]] = []  # every line of the run's stderr with the time it arrived (our clock)
    with RigCpuSampler(spec) as sampler:
        proc = subprocess.Popen([sys.executable, __file__, "--child", str(inv), str(suite), state.known_hosts,
                                 str(out), str(key), str(result)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        for line in proc.stderr:
            lines.append((time.monotonic(), line.rstrip("\n")))
        rc = proc.wait()
        process_wall = time.monotonic() - t0
    load1 = os.getloadavg()
    rig_cpu = rig_cpu_after(spec, state, rig_before)
    stderr = "\n".join(text for _, text in lines)
    if not result.exists():
        raise SystemExit(f"the {n}-node run failed (rc {rc}):\n{stderr[-3000:]}")
    t_release = next((t for t, text in lines if re.search(r"\] G3: released at ", text)), None)
    t_verdict = next((t for t, text in lines if re.search(r"\] G3: (PASS|FAIL|ERROR|INVALID|STOP)", text)), None)
    rig_in_read = (sampler.cpu_between(t_release, t_verdict) if t_release is not None and t_verdict is not None
                   else None)
    r = json.loads(result.read_text())
    progress = [(float(m.group(1)), m.group(2)) for m in map(PROGRESS_RE.match, stderr.splitlines()) if m]
    bundle = next(out.glob("KVG-*/verdicts.json")).parent
    verdict = json.loads((bundle / "verdicts.json").read_text())["verdicts"][0]
    launch = json.loads((bundle / "gates" / "G3" / "launch.json").read_text())
    exits = [e["t_s"] for e in launch["events"] if e["event"] == "exited"]
    r.update(nodes=n, port_rate_mbit=rate, outcome=verdict["outcome"], metrics=verdict["metrics"],
             read_wall_s=(max(exits) - launch["go_ref_s"]) if exits and launch.get("go_ref_s") else None,
             process_wall_s=process_wall, phases=phases(progress), load_before=load0, load_after=load1,
             rig_cpu_s=rig_cpu["total_s"], rig_cpu=rig_cpu, rig_cpu_in_read_s=rig_in_read)
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
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)),
                    help="node counts, the first the baseline (default 1,8,16,32)")
    ap.add_argument("--shell-rc", choices=("empty", "host"), default="empty",
                    help="the ~/.bashrc the rig's nodes read before every command (default empty, as on a fresh "
                         "node; host: this machine's root's, as the rig had it before)")
    a = ap.parse_args()
    sizes = tuple(int(x) for x in a.sizes.split(","))

    from harness.report.bundle import generate_keypair
    from harness.rigs.netns import RigSpec, rig_down, rig_up

    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="kvgate-g3-bench-") as tmp:
        work = Path(tmp)
        spec = RigSpec(prefix="kvgb-", state_dir=work / "rig", node_count=max(sizes), subnet="10.80.0.0/24",
                       port_rate_mbit=a.share_mbit * max(sizes), shell_rc=a.shell_rc)
        try:
            t0 = time.monotonic()
            state = rig_up(spec)
            print(f"rig of {spec.node_count} nodes up in {time.monotonic() - t0:.1f} s", flush=True)
            suite = work / "g3.yaml"
            lay_out_copy(spec, suite_for(a.chunks, a.chunk_tokens, a.block, suite))
            generate_keypair(work / "k")
            for rep in range(a.repeat):
                for n in sizes:
                    r = one(work, spec, state, n, a.share_mbit, suite, work / "k.key", rep)
                    runs.append(r)
                    m = r["metrics"]
                    print(f"{n:2d} node(s) [{r['outcome']}] run {r['run_wall_s']:.1f} s, read {r['read_wall_s']:.2f} s, "
                          f"skew {1e3 * m.get('start_skew_s', float('nan')):.2f} ms, "
                          f"ratio {m.get('nic_ceiling_ratio', float('nan')):.3f}, cpu {r['cpu_s']:.1f} s, "
                          f"peak {r['peak_rss_kib'] / 1024:.0f} MiB, rig cpu {r['rig_cpu_s']:.1f} s "
                          f"(sessions {r['rig_cpu']['sessions_s']:.1f}, data path {r['rig_cpu']['data_path_s']:.1f}, "
                          f"forwarder {r['rig_cpu']['forwarder_s']:.1f}; in the read phase "
                          f"{r['rig_cpu_in_read_s'] if r['rig_cpu_in_read_s'] is not None else float('nan'):.1f}), "
                          f"load {r['load_before'][0]:.1f}->"
                          f"{r['load_after'][0]:.1f}", flush=True)
        finally:
            rig_down(spec)
    if a.json:
        Path(a.json).write_text(json.dumps(runs, indent=1))

    def med(n: int, f) -> float:
        vals = [f(r) for r in runs if r["nodes"] == n and f(r) is not None]
        return statistics.median(vals) if vals else float("nan")

    base = {k: med(sizes[0], lambda r, k=k: r[k]) for k in ("run_wall_s", "read_wall_s", "peak_rss_kib")}
    print(f"\nmedians of {a.repeat} round(s); each node's share of the port: {a.share_mbit} Mbit/s; "
          f"{a.chunks} x {a.chunk_tokens * 131072 >> 20} MiB read per node in {a.block} blocks; "
          f"{os.cpu_count()} CPUs; nodes' ~/.bashrc: {a.shell_rc}; load average (1 min) over the runs "
          f"{min(r['load_before'][0] for r in runs):.1f}-{max(r['load_after'][0] for r in runs):.1f}")
    print("cpu_s: kvgate's own process; rig_cpu_s: every process of the rig (the nodes' side, same machine)")
    print("nodes  run_s  run/1  read_s read/1  skew_ms  agg/ceil  cpu_s  peak_MiB  rig_cpu_s  load1")
    for n in sizes:
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
    for n in sizes:
        tail = med(n, lambda r: r["run_wall_s"] - sum(r["phases"].get(k, 0.0) for k in
                                                      ("connect_s", "facts_s", "gate_until_go_s",
                                                       "read_and_collect_s", "until_signing_s")))
        print(f"{n:5d} " + " ".join(f"{med(n, lambda r, k=k: r['phases'].get(k)):12.2f}" for k in names)
              + f"  {tail:11.2f}")
    lo, mid, hi = sizes[0], (8 if 8 in sizes else sizes[len(sizes) // 2]), sizes[-1]
    growth = (med(hi, lambda r: r["peak_rss_kib"]) - base["peak_rss_kib"]) / max(1, hi - lo) / 1024
    print("\ngoals (issue 17: 8/1 <= 1.15, 32/1 <= 1.3, skew <= 5 ms and ceiling >= 0.93 at 32, <= 10 MB per node), "
          "measured:")
    print(f"  whole run {mid}/{lo}  = {med(mid, lambda r: r['run_wall_s']) / base['run_wall_s']:.3f}")
    print(f"  whole run {hi}/{lo} = {med(hi, lambda r: r['run_wall_s']) / base['run_wall_s']:.3f}")
    print(f"  read wall {hi}/{lo} = {med(hi, lambda r: r['read_wall_s']) / base['read_wall_s']:.3f}   (informational)")
    print(f"  start skew at {hi} = {1e3 * med(hi, lambda r: r['metrics'].get('start_skew_s')):.2f} ms")
    print(f"  aggregate / ceiling at {hi} = {med(hi, lambda r: r['metrics'].get('nic_ceiling_ratio')):.3f}")
    print(f"  control-host peak memory growth, {lo} -> {hi} nodes = {growth:.2f} MiB per node")
    print(f"  control-host CPU, {hi} nodes = {med(hi, lambda r: r['cpu_s']):.1f} s "
          f"({lo} node(s): {med(lo, lambda r: r['cpu_s']):.1f} s)   (informational)")

    # Who spent what, per node, and a model of the run without the rig's CPU contention (printed apart from
    # the goals: the goals are the measured walls above).
    cores = os.cpu_count() or 1

    def outside(r: dict) -> float | None:
        return None if r.get("rig_cpu_in_read_s") is None else r["rig_cpu_s"] - r["rig_cpu_in_read_s"]

    print("\nwhere the CPU went (medians; the rig's nodes are this machine's processes):")
    print("  kvgate_cpu: kvgate's own process, on the control host. node_sessions: kvgate's SSH sessions on the")
    print("  nodes and all they ran (facts, clock probes, cache drops, readers). data_path: sshfs, ssh and the")
    print("  storage sshd (the rig emulating the array's port). outside_read: the rig's CPU before the readers'")
    print("  start and after the last exit, when it competes with kvgate for the cores.")
    print(f"  +node: (figure at N - figure at {sizes[0]}) / (N - {sizes[0]}), what each added node costs.")
    print("nodes  kvgate_cpu    +node  node_sessions    +node  data_path    +node  forwarder  outside_read  "
          "modelled_run/1")
    base_out = med(sizes[0], outside)
    for n in sizes:
        sess = med(n, lambda r: r["rig_cpu"]["sessions_s"])
        data = med(n, lambda r: r["rig_cpu"]["data_path_s"])
        out_n = med(n, outside)
        modelled = med(n, lambda r: None if outside(r) is None else
                       (r["run_wall_s"] - (outside(r) - base_out) / cores) / base["run_wall_s"])
        def added(x: float, x0: float) -> float:
            return (x - x0) / (n - sizes[0]) if n != sizes[0] else float("nan")
        kv = med(n, lambda r: r["cpu_s"])
        print(f"{n:5d} {kv:11.2f} {added(kv, med(sizes[0], lambda r: r['cpu_s'])):8.3f} "
              f"{sess:14.2f} {added(sess, med(sizes[0], lambda r: r['rig_cpu']['sessions_s'])):8.3f} "
              f"{data:10.2f} {added(data, med(sizes[0], lambda r: r['rig_cpu']['data_path_s'])):8.3f} "
              f"{med(n, lambda r: r['rig_cpu']['forwarder_s']):10.2f} {out_n:13.2f} {modelled:15.3f}")
    print(f"  modelled_run/1 (an estimate, not a measurement): (wall(N) - (outside_read(N) - outside_read(1)) / "
          f"{cores} cores) / wall(1),\n  as if the rig's extra node-side work outside the read phase had run on "
          "the nodes' own CPUs; it\n  assumes that work was CPU-bound on these cores, which other sessions' "
          "load also shares.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
