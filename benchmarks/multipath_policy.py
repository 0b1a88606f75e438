#!/usr/bin/env python3
"""Which native multipath I/O policy routes reads around a slow path: gate F4 of gates/loopback-faults.yaml (one
path of two slowed by a netem delay on its port's replies, mid-read) run once per policy and round in one
guest boot, through kvgate's own runner; per gate the head's read rate while the delay was in force, the slowed
path's own rate and the other path's over the same window, the longest stall and the verdict.

    python3 benchmarks/multipath_policy.py [--kernel-package linux-image-6.12-amd64] [--rounds 2]
        [--policies numa,round-robin,queue-depth] [--delay-ms 500] [--out DIR]

Debian 12's own kernel (6.1) has the policies numa and round-robin; queue-depth came with Linux 6.11, so the
default guest here boots Debian's 6.12 kernel (bookworm-security's linux-image-6.12-amd64). The figures are qemu
TCG's: what each policy does with a slow path, not how fast a real fabric is.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402

from harness.config import load_config, load_inventory  # noqa: E402
from harness.rigs import guest as G  # noqa: E402
from harness.rigs.loopback import Loopback, LoopbackSpec  # noqa: E402
from harness.suite.runner import run_suite  # noqa: E402
from harness.transport import SSHTransport  # noqa: E402
from harness.workloads import WORKLOADS  # noqa: E402


def policy_gates(policies: list[str], rounds: int, delay_ms: float) -> dict:
    """The shipped F4 gate, once per round and policy (policies alternate their order by round)."""
    suite = yaml.safe_load((ROOT / "gates" / "loopback-faults.yaml").read_text())
    f4 = next(g for g in suite["gates"] if g["id"] == "F4-slow-path")
    gates = []
    for r in range(rounds):
        for pol in (policies if r % 2 == 0 else list(reversed(policies))):
            g = json.loads(json.dumps(f4))
            g["id"] = f"F4-{pol}-r{r}"
            g["params"]["iopolicy"] = pol
            g["params"]["faults"][0]["delay_ms"] = delay_ms
            gates.append(g)
    suite["gates"] = gates
    return suite


def row(gate_id: str, result: dict, verdict) -> dict:
    ev = result.get("evidence", {})
    (f,) = ev.get("faults") or [{}]
    window = (f.get("t_undo_s") or 0) - (f.get("t_in_force_s") or 0)
    by_path = f.get("path_read_bytes") or {}
    return {"gate": gate_id, "iopolicy": ev.get("iopolicy"), "outcome": verdict.outcome.value,
            "reason": verdict.reason, "pre_mb_s": f.get("pre_rate_mb_s"), "head_in_force_mb_s": f.get("in_force_rate_mb_s"),
            "slowed_path_in_force_mb_s": f.get("in_force_path_mb_s"), "in_force_s": round(window, 1),
            "apply_s": None if f.get("t_in_force_s") is None else round(f["t_in_force_s"] - f["t_apply_s"], 1),
            "path_a_mb": round(by_path.get("kvmp-a", 0) / 1e6, 1), "path_b_mb": round(by_path.get("kvmp-b", 0) / 1e6, 1),
            "stall_s": f.get("stall_s"), "recovery_s": f.get("recovery_s"),
            "delay_felt": next((c["ok"] for c in ev.get("validity", []) if c["name"] == "delay felt"), None)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernel-package", default="linux-image-6.12-amd64")
    ap.add_argument("--policies", default="numa,round-robin,queue-depth")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--delay-ms", type=float, default=500.0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="kvgate-mp-policy-"))
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    image = G.build_guest(progress=print, kernel_package=args.kernel_package)
    state_dir = out / "guest"
    state = G.start_guest(image, state_dir, boot_timeout_s=600, progress=print)
    tr = None
    try:
        tr = SSHTransport(state.host, state.ssh_port, state.user, state.identity_file,
                          known_hosts_path=state.known_hosts_path, name="guest", connect_timeout_s=90)
        inv = yaml.safe_load((ROOT / "inventory" / "loopback-faults.yaml").read_text())
        inv["nodes"][0]["labels"]["kvgate-guest"] = str(state_dir)
        inv_path, gates_path = out / "inventory.yaml", out / "gates.yaml"
        inv_path.write_text(yaml.safe_dump(inv, sort_keys=False))
        gates_path.write_text(yaml.safe_dump(policy_gates(args.policies.split(","), args.rounds, args.delay_ms),
                                             sort_keys=False))
        node = load_inventory(inv_path).node("guest")
        lb = Loopback(tr, LoopbackSpec.from_target(node.target("kvmp"), "guest", node))
        up = lb.up(wait_s=120)
        if not up.ok:
            print(f"loopback up failed: {up.error}")
            return 1
        try:
            cfg = load_config(inv_path, gates_path, WORKLOADS)
            outcome = run_suite(cfg, out / "runs", Ed25519PrivateKey.generate(), key_kind="development",
                                transports=G.open_guest_transports(cfg.inventory), make_tar=False, progress=print)
        finally:
            tr.run(["nvme", "disconnect", "-n", "nqn.2024-01.io.kvgate:loopback-kvmp"], timeout_s=120)
            lb.down()
        rows = [row(v.gate_id, json.loads((outcome.run_dir / "gates" / v.gate_id / "result.json").read_text()), v)
                for v in outcome.verdicts]
    finally:
        if tr is not None:
            tr.close()
        G.stop_guest(state_dir)
    (out / "rows.json").write_text(json.dumps(rows, indent=1))
    print(f"\nkernel {image.kernel_release}, {len(rows)} gates in {time.monotonic() - t0:.0f} s; run in {out}")
    cols = ["gate", "iopolicy", "outcome", "pre_mb_s", "head_in_force_mb_s", "slowed_path_in_force_mb_s",
            "in_force_s", "apply_s", "path_a_mb", "path_b_mb", "stall_s", "recovery_s", "delay_felt"]
    print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r[c]) for c in cols) + " |")
    for pol in args.policies.split(","):
        mine = [r["head_in_force_mb_s"] / r["pre_mb_s"] for r in rows if r["iopolicy"] == pol
                and r["head_in_force_mb_s"] and r["pre_mb_s"]]
        if mine:
            print(f"{pol}: head in force / before, median {statistics.median(mine):.3f} over {len(mine)} rounds "
                  f"({min(mine):.3f}-{max(mine):.3f})")
    for r in rows:
        if r["outcome"] != "PASS":
            print(f"{r['gate']}: {r['outcome']}: {r['reason']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
