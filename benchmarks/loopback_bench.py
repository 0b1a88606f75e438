#!/usr/bin/env python3
"""Loopback benchmark: the README main command from nothing to verdict, and direct vs NVMe/TCP vs NVMe/RDMA.

    python3 benchmarks/loopback_bench.py [--cold] [--out DIR] [--size-mib N] [--skip-main]

1. The README main command (`bash scripts/run-loopback-suite.sh`) as a user runs it, timed from start to the
   verdict line and to its end (guest stopped). --cold gives it an empty build cache (KVGATE_CACHE_DIR), so the
   kernel package is downloaded and the initramfs built again. Goal (issue 12): <= 180 s on 2 cores, cold.
2. In one fresh guest boot, side by side, the same fio job (1 MiB sequential read, libaio, QD16, O_DIRECT) on:
   the backing null_blk device directly; its namespace over NVMe/TCP (127.0.0.1:4420); its namespace over
   NVMe/RDMA (soft-RoCE on the guest's virtio NIC, 10.0.2.15:4421), each connected with kvgate's own
   connect: managed code and disconnected after. Prints MB/s and the ratios.

Every figure here is qemu-TCG-bound (the host's CPUs emulate the guest's): the ratios say what each layer costs
under emulation, not what a real RNIC or array does.
"""

from __future__ import annotations

import argparse
import os
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


def side_by_side(out: Path, size_mib: int) -> dict:
    """direct / NVMe/TCP / NVMe/RDMA in one boot (the build is cached by now)."""
    node = load_inventory(ROOT / "inventory" / "loopback.yaml").node("guest")
    image = G.build_guest()
    state = G.start_guest(image, out / "guest")
    tr = SSHTransport(state.host, state.ssh_port, state.user, state.identity_file,
                      known_hosts_path=state.known_hosts_path, name="guest")
    lbs = [Loopback(tr, LoopbackSpec.from_target(t, node.name, node)) for t in node.targets
           if t.kind == "nvmeof-loopback"]
    figures: dict = {}
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
        figures["direct_mb_s"] = fio_mb_s(tr, f"/dev/{lbs[0].spec.nullb_name}", size_mib)
        for name in ("kv-tcp", "kv-rdma"):
            spec = NvmeofSpec.from_target(node.target(name))
            host = NvmeofHost(lambda n, argv, t: tr.run(list(argv), timeout_s=t), spec, node="guest")
            t0 = time.monotonic()
            rec = host.connect()
            if not rec.ok:
                raise SystemExit(f"connect {name}: {rec.error}")
            figures[f"{spec.transport}_connect_s"] = time.monotonic() - t0
            try:
                figures[f"{spec.transport}_mb_s"] = fio_mb_s(tr, rec.resolution["device"], size_mib)
                if spec.transport == "rdma":
                    figures["rdma_device"] = rec.resolution["rdma"][0]
            finally:
                host.disconnect(rec)
    finally:
        for lb in reversed(lbs):
            lb.down()
        tr.close()
        G.stop_guest(out / "guest")
    return figures


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cold", action="store_true", help="the main command gets an empty build cache")
    ap.add_argument("--out", type=Path, default=Path(tempfile.mkdtemp(prefix="kvgate-loopback-bench-")))
    ap.add_argument("--size-mib", type=int, default=128, help="bytes each fio read covers")
    ap.add_argument("--skip-main", action="store_true", help="only the side-by-side fio figures")
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
    f = side_by_side(args.out, args.size_mib)
    d, t, r = f["direct_mb_s"], f["tcp_mb_s"], f["rdma_mb_s"]
    print(f"fio 1 MiB sequential read, libaio QD16, O_DIRECT, {args.size_mib} MiB, one boot (qemu TCG):")
    print(f"  backing null_blk direct  {d:8.1f} MB/s")
    print(f"  NVMe/TCP  127.0.0.1:4420  {t:8.1f} MB/s  ({t / d:.3f} x direct; connect {f['tcp_connect_s']:.1f} s)")
    print(f"  NVMe/RDMA 10.0.2.15:4421  {r:8.1f} MB/s  ({r / d:.3f} x direct, {r / t:.3f} x TCP; connect "
          f"{f['rdma_connect_s']:.1f} s; {f['rdma_device']['device']} on {f['rdma_device']['netdev']})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
