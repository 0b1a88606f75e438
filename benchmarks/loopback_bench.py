#!/usr/bin/env python3
"""Loopback benchmark: the README main command from nothing to verdict, and direct vs NVMe/TCP vs NVMe/RDMA.

    python3 benchmarks/loopback_bench.py [--cold] [--out DIR] [--size-mib N] [--skip-main] [--rounds N]
        [--hog-every K]

1. The README main command (`bash scripts/run-loopback-suite.sh`) as a user runs it, timed from start to the
   verdict line and to its end (guest stopped). --cold gives it an empty build cache (KVGATE_CACHE_DIR), so the
   kernel package is downloaded and the initramfs built again. Goal (issue 12): <= 180 s on 2 cores, cold.
2. In one fresh guest boot, side by side, the same fio job (1 MiB sequential read, libaio, QD16, O_DIRECT) on:
   the backing null_blk device directly; its namespace over NVMe/TCP (127.0.0.1:4420); its namespace over
   NVMe/RDMA (soft-RoCE on the guest's virtio NIC, 10.0.2.15:4421), each connected with kvgate's own
   connect: managed code and disconnected after. Prints MB/s and the ratios. With ``--rounds N`` the three reads
   repeat N times in the one boot (order rotated each round), each with the CPU seconds qemu got from the host
   per wall second meanwhile and the host's load: the spread over rounds, and whether a slow round is one where
   qemu got less of the host (``--hog-every K``: every Kth round beside a busy loop on the host, for contrast).

Every figure here is qemu-TCG-bound (the host's CPUs emulate the guest's): the ratios say what each layer costs
under emulation, not what a real RNIC or array does.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.config import load_inventory  # noqa: E402
from harness.execute.nvmeof import NvmeofHost, NvmeofSpec  # noqa: E402
from harness.parsers.fio import parse_fio_json  # noqa: E402
from harness.rigs import guest as G  # noqa: E402
from harness.rigs.loopback import Loopback, LoopbackSpec  # noqa: E402
from harness.workloads.kit.integrity import loopback_integrity  # noqa: E402
from harness.transport import SSHTransport  # noqa: E402


def main_command(out: Path, cold: bool) -> dict:
    """Run the README main command; (seconds to the verdict line, seconds in all, exit code)."""
    env = dict(os.environ, KVGATE_HOME=str(out / "home"), KVGATE=f"{sys.executable} -m harness")
    if cold:
        env["KVGATE_CACHE_DIR"] = str(out / "cold-cache")
    t0 = time.monotonic()
    p = subprocess.Popen(["bash", "scripts/run-loopback-suite.sh", str(out / "runs")], cwd=ROOT, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    verdict_s = None
    lines = []
    for line in p.stdout:
        lines.append(line)
        if line.startswith("overall:") and verdict_s is None:
            verdict_s = time.monotonic() - t0
    stderr = p.stderr.read()
    rc = p.wait()
    return {"rc": rc, "verdict_s": verdict_s, "total_s": time.monotonic() - t0, "stdout": "".join(lines),
            "stderr": stderr}


def fio_mb_s(tr, path: str, size_mib: int) -> float:
    r = tr.run(["fio", "--name=bench", f"--filename={path}", "--rw=read", "--bs=1M", "--direct=1",
                "--ioengine=libaio", "--iodepth=16", f"--size={size_mib}M", "--output-format=json"], timeout_s=900)
    if not r.ok:
        raise SystemExit(f"fio on {path} failed rc={r.rc} error={r.error}: {r.stderr} {r.stdout[-600:]}")
    return parse_fio_json(r.stdout).groups[0].read_bw_bytes_s / 1e6


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) the process ``pid`` has used so far, from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measured(tr, path: str, size_mib: int, qemu_pid: int) -> dict:
    """One fio read of ``path`` with what the host gave the guest meanwhile: qemu's CPU seconds per wall second
    (its 2 vCPU threads and its I/O thread: at most the host's 2 cores) and the host's 1-minute load."""
    c0, t0 = cpu_s(qemu_pid), time.monotonic()
    mb_s = fio_mb_s(tr, path, size_mib)
    wall = time.monotonic() - t0
    return {"mb_s": mb_s, "qemu_cpu_share": (cpu_s(qemu_pid) - c0) / wall, "load1": os.getloadavg()[0]}


def side_by_side(out: Path, size_mib: int, rounds: int = 1, hog_every: int = 0) -> dict:
    """direct / NVMe/TCP / NVMe/RDMA in one boot (the build is cached by now): both transports connected once,
    then ``rounds`` rounds of the three reads, their order rotated each round; with ``hog_every`` N, every Nth
    round runs beside a busy loop on the host. Returns per path the rounds' measurements, and the connects."""
    node = load_inventory(ROOT / "inventory" / "loopback.yaml").node("guest")
    image = G.build_guest()
    state = G.start_guest(image, out / "guest")
    tr = SSHTransport(state.host, state.ssh_port, state.user, state.identity_file,
                      known_hosts_path=state.known_hosts_path, name="guest")
    lbs = [Loopback(tr, LoopbackSpec.from_target(t, node.name, node)) for t in node.targets
           if t.kind == "nvmeof-loopback"]
    figures: dict = {"rounds": {"direct": [], "tcp": [], "rdma": []}}
    hosts = []
    try:
        for lb in lbs:
            up = lb.up(verify=loopback_integrity)
            if not up.ok:
                raise SystemExit(f"loopback up {lb.spec.name}: {up.error}")
        # the backing store is written once so every path reads real data, not null_blk's unwritten zeros
        for lb in lbs:
            dev = f"/dev/{lb.spec.nullb_name}"
            r = tr.run(["dd", "if=/dev/urandom", f"of={dev}", "bs=1M", f"count={size_mib}", "oflag=direct"],
                       timeout_s=900)
            if not r.ok:
                raise SystemExit(f"filling {dev}: {r.summary()}")
        paths = {"direct": f"/dev/{lbs[0].spec.nullb_name}"}
        for name in ("kv-tcp", "kv-rdma"):
            spec = NvmeofSpec.from_target(node.target(name))
            host = NvmeofHost(lambda n, argv, t: tr.run(list(argv), timeout_s=t), spec, node="guest")
            t0 = time.monotonic()
            rec = host.connect()
            if not rec.ok:
                raise SystemExit(f"connect {name}: {rec.error}")
            hosts.append((host, rec))
            figures[f"{spec.transport}_connect_s"] = time.monotonic() - t0
            paths[spec.transport] = rec.resolution["device"]
            if spec.transport == "rdma":
                figures["rdma_device"] = rec.resolution["rdma"][0]
        order = list(paths)
        for rnd in range(rounds):
            hogged = bool(hog_every) and rnd % hog_every == hog_every - 1
            # a busy loop in its own process (one core's worth of CPU taken from qemu), stopped by PID
            hogger = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if hogged else None
            try:
                for k in order[rnd % 3:] + order[:rnd % 3]:
                    figures["rounds"][k].append({"round": rnd, "hog": hogged,
                                                 **measured(tr, paths[k], size_mib, state.pid)})
            finally:
                if hogger:
                    hogger.kill()
                    hogger.wait()
            print(f"  round {rnd}{' (host busy loop)' if hogged else ''}: "
                  + ", ".join(f"{k} {figures['rounds'][k][-1]['mb_s']:.1f} MB/s "
                              f"(qemu {figures['rounds'][k][-1]['qemu_cpu_share']:.2f} cores)" for k in order),
                  file=sys.stderr, flush=True)
    finally:
        for host, rec in hosts:
            host.disconnect(rec)
        for lb in reversed(lbs):
            lb.down()
        tr.close()
        G.stop_guest(out / "guest")
    for k, rows in figures["rounds"].items():
        figures[f"{k}_mb_s"] = statistics.median(r["mb_s"] for r in rows if not r["hog"])
    return figures


def spread_row(name: str, rows: list[dict]) -> str:
    """min / p25 / median / p75 / max MB/s over the rounds, and the median qemu CPU share."""
    v = sorted(r["mb_s"] for r in rows)
    q = statistics.quantiles(v, n=4) if len(v) > 1 else [v[0]] * 3
    share = statistics.median(r["qemu_cpu_share"] for r in rows)
    return (f"| {name} | {len(v)} | {v[0]:.1f} | {q[0]:.1f} | {statistics.median(v):.1f} | {q[2]:.1f} | {v[-1]:.1f} "
            f"| {v[-1] / v[0]:.2f} | {share:.2f} |")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cold", action="store_true", help="the main command gets an empty build cache")
    ap.add_argument("--out", type=Path, default=Path(tempfile.mkdtemp(prefix="kvgate-loopback-bench-")))
    ap.add_argument("--size-mib", type=int, default=128, help="bytes each fio read covers")
    ap.add_argument("--skip-main", action="store_true", help="only the side-by-side fio figures")
    ap.add_argument("--rounds", type=int, default=1, help="rounds of the three reads in the one boot")
    ap.add_argument("--hog-every", type=int, default=0,
                    help="every Nth round beside a busy loop on the host (0: none)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    ok = True
    if not args.skip_main:
        m = main_command(args.out, args.cold)
        ok = m["rc"] == 0
        print(f"README main command ({'cold' if args.cold else 'warm'} build cache): exit {m['rc']}, "
              f"verdict after {m['verdict_s'] or float('nan'):.1f} s, done (guest stopped) after {m['total_s']:.1f} s; "
              f"goal <= 180 s: ratio {(m['verdict_s'] or m['total_s']) / 180:.2f}")
        print("".join(line for line in m["stdout"].splitlines(True) if " PASS " in line or " FAIL " in line
                      or line.startswith("overall")), end="")
        if not ok:
            print(m["stdout"][-2000:], m["stderr"][-3000:], sep="\n")
    f = side_by_side(args.out, args.size_mib, args.rounds, args.hog_every)
    (args.out / "rounds.json").write_text(json.dumps(f, indent=1, default=str))
    d, t, r = f["direct_mb_s"], f["tcp_mb_s"], f["rdma_mb_s"]
    print(f"fio 1 MiB sequential read, libaio QD16, O_DIRECT, {args.size_mib} MiB, one boot (qemu TCG), "
          f"{args.rounds} round(s); medians{' of the quiet rounds' if args.hog_every else ''}:")
    print(f"  backing null_blk direct  {d:8.1f} MB/s")
    print(f"  NVMe/TCP  127.0.0.1:4420  {t:8.1f} MB/s  ({t / d:.3f} x direct; connect {f['tcp_connect_s']:.1f} s)")
    print(f"  NVMe/RDMA 10.0.2.15:4421  {r:8.1f} MB/s  ({r / d:.3f} x direct, {r / t:.3f} x TCP; connect "
          f"{f['rdma_connect_s']:.1f} s; {f['rdma_device']['device']} on {f['rdma_device']['netdev']})")
    print("| path | rounds | min | p25 | median | p75 | max | max/min | qemu cores (median) |\n|---|" + "---:|" * 8)
    for k, rows in f["rounds"].items():
        for hogged in (False, True):
            mine = [x for x in rows if x["hog"] == hogged]
            if mine:
                print(spread_row(f"{k}{' (host busy loop)' if hogged else ''}", mine))
    for k, rows in f["rounds"].items():  # per path: does a slower read go with less of the host for qemu?
        quiet = [x for x in rows if not x["hog"]]
        r = lambda xs: statistics.correlation([x["qemu_cpu_share"] for x in xs], [x["mb_s"] for x in xs])  # noqa: E731
        if len(quiet) > 2:
            print(f"{k}: rate vs qemu's CPU share, Pearson r {r(quiet):.2f} over the quiet rounds"
                  + (f", {r(rows):.2f} with the busy-loop rounds" if len(rows) > len(quiet) else ""))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
