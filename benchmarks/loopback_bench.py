#!/usr/bin/env python3
"""Loopback benchmark: time from nothing to verdict, and the NVMe/TCP path's cost.

    python3 benchmarks/loopback_bench.py [--cold] [--out DIR]

Phases timed: guest build (cached unless --cold, which uses an empty cache dir and so downloads
the kernel package again), boot to sshd, `loopback up` (with integrity check), the loopback suite
(L1 + G1, signed bundle, verified), `loopback down`, guest stop. Then fio reads the same backing
device directly and through /dev/nvmeXnY inside the guest (same job) and prints the ratio.
Goal (issue 3): nothing -> verdict <= 180 s on a 2-core host. Figures are qemu-TCG-bound.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.rigs import guest as G  # noqa: E402
from harness.report.bundle import generate_keypair, load_private_key, verify_bundle  # noqa: E402
from harness.cli.loopback import pick_target  # noqa: E402
from harness.rigs.guest import open_guest_transports  # noqa: E402
from harness.config import load_config  # noqa: E402
from harness.workloads import WORKLOADS  # noqa: E402
from harness.parsers.fio import parse_fio_json  # noqa: E402
from harness.rigs.loopback import Loopback, LoopbackSpec  # noqa: E402
from harness.paths import data_path  # noqa: E402
from harness.suite.runner import run_suite  # noqa: E402
import harness.workloads.nvme_integrity  # noqa: E402,F401


def fio_bw_mb_s(tr, path: str, size_mib: int) -> float:
    r = tr.run(["fio", "--name=bench", f"--filename={path}", "--rw=read", "--bs=1M", "--direct=1",
                "--ioengine=libaio", "--iodepth=16", f"--size={size_mib}M", "--loops=2", "--output-format=json"],
               timeout_s=300)
    if not r.ok:
        raise SystemExit(f"fio on {path} failed rc={r.rc} error={r.error}: {r.stderr} {r.stdout[-600:]}")
    g = parse_fio_json(r.stdout).groups[0]
    return g.read_bw_bytes_s / 1e6


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cold", action="store_true", help="empty build cache: include the kernel download")
    ap.add_argument("--out", type=Path, default=Path(tempfile.mkdtemp(prefix="kvgate-loopback-bench-")))
    args = ap.parse_args()
    if args.cold:
        os.environ["KVGATE_CACHE_DIR"] = str(args.out / "cache")
    state_dir = args.out / "guest"
    t = {}
    t0 = time.monotonic()
    image = G.build_guest()
    t["build_s"] = time.monotonic() - t0
    t1 = time.monotonic()
    state = G.start_guest(image, state_dir)
    t["boot_to_ssh_s"] = time.monotonic() - t1
    try:
        cfg = load_config(data_path("inventory", "loopback.yaml"), data_path("gates", "loopback.yaml"), WORKLOADS)
        trs = open_guest_transports(cfg.inventory, state_dir)
        node, target = pick_target(cfg.inventory, None, None)
        tr = trs[node.name]
        spec = LoopbackSpec.from_target(target, node.name)
        lb = Loopback(tr, spec)
        t2 = time.monotonic()
        up = lb.up()
        t["up_s"] = time.monotonic() - t2
        if not up.ok:
            raise SystemExit(f"loopback up failed: {up.error}")
        generate_keypair(str(args.out / "key"))
        t3 = time.monotonic()
        outcome = run_suite(cfg, args.out / "runs", load_private_key(str(args.out / "key.key")), transports=trs,
                            progress=lambda m: None)
        ok = verify_bundle(outcome.bundle.tar_path or outcome.bundle.path, str(args.out / "key.pub")).ok
        t["suite_s"] = time.monotonic() - t3
        t["nothing_to_verdict_s"] = time.monotonic() - t0
        size_mib = 256
        tr = open_guest_transports(cfg.inventory, state_dir)[node.name]  # run_suite closed the others
        lb = Loopback(tr, spec)
        direct = fio_bw_mb_s(tr, up.summary["backing_device"], size_mib)
        via_tcp = fio_bw_mb_s(tr, up.summary["device"], size_mib)
        t4 = time.monotonic()
        down = lb.down()
        t["down_s"] = time.monotonic() - t4
    finally:
        t5 = time.monotonic()
        G.stop_guest(state_dir)
        t["stop_s"] = time.monotonic() - t5
    print(f"kernel {image.kernel_package}, cache {'cold' if args.cold else 'warm'}")
    for k, v in t.items():
        print(f"{k:24} {v:8.1f}")
    print(f"verdicts: " + ", ".join(f"{v.gate_id}={v.outcome.value}" + (f" ({v.actual:.4g} {v.unit})" if v.actual is not None else "")
                                    for v in outcome.verdicts) + f"; overall {outcome.overall.value}; bundle verifies: {ok}")
    print(f"nothing->verdict {t['nothing_to_verdict_s']:.1f} s vs goal 180 s: ratio {t['nothing_to_verdict_s'] / 180:.2f}")
    print(f"fio 1M seq read QD16: backing {spec.backing} direct {direct:.1f} MB/s, through NVMe/TCP {via_tcp:.1f} MB/s, "
          f"ratio nvme/direct {via_tcp / direct:.3f}")
    print(f"down ok: {down.ok}")
    return 0 if outcome.overall.value == "PASS" and ok and down.ok else 1


if __name__ == "__main__":
    sys.exit(main())
