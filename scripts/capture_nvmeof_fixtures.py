#!/usr/bin/env python3
"""Capture the host side of NVMe-oF (TCP and RDMA over soft-RoCE) from a REAL guest as test fixtures.

Usage: python3 scripts/capture_nvmeof_fixtures.py STATE_DIR OUT_DIR [--per-path]

STATE_DIR holds the guest.json of a running guest (`kvgate loopback guest-up`, or start_guest). Writes, per
scenario, OUT_DIR/<scenario>/<probe>.out and .rc: the probes harness.execute.nvmeof.resolve reads
(list-subsys, list-verbose, sysfs, rdma-cm-ids, rdma-links), the RDMA facts (rdma-sysfs) and, where the
scenario has them, discover/connect outputs. Scenarios:

  none                nothing connected (the RDMA device exists)
  tcp, rdma           one subsystem connected over NVMe/TCP (127.0.0.1:4420), one over NVMe/RDMA (10.0.2.15:4421)
  multipath           the RDMA subsystem on two RDMA ports, both connected, the second port's ANA group
                      non-optimized (native multipath: one nvmeXnY head over hidden nvmeXcYnZ paths)
  mixed               the TCP subsystem on its TCP port and the RDMA port, both connected, the TCP path
                      non-optimized
  discover-*, connect-*   nvme discover / connect answers: offered, refused, nobody there

With --per-path (a guest booted with nvme_core.multipath=N) only multipath and mixed are captured, as
per-path-multipath and per-path-mixed: one /dev/nvmeXnY per controller.
"""

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.execute.nvmeof import NvmeofSpec, probe_commands  # noqa: E402
from harness.parsers.rdma import IB_SYSFS_ARGV  # noqa: E402
from harness.rigs.guest import GuestState  # noqa: E402
from harness.rigs.loopback import Loopback, LoopbackSpec, write_attr  # noqa: E402
from harness.transport import SSHTransport  # noqa: E402
from harness.transport.steps import StepLog  # noqa: E402

HOST = "nqn.2024-01.io.kvgate:host-guest"
T = 120  # hang guard for the TCG guest


def save(out: Path, name: str, res) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.out").write_text(res.stdout)
    (out / f"{name}.rc").write_text(f"{res.rc}\n")
    if res.stderr.strip():
        (out / f"{name}.err").write_text(res.stderr)


def snap(tr, out: Path, spec: NvmeofSpec) -> None:
    for name, argv in probe_commands(spec).items():
        save(out, name, tr.run(list(argv), timeout_s=T))
    save(out, "rdma-sysfs", tr.run(list(IB_SYSFS_ARGV), timeout_s=T))


def must(res) -> None:
    if not res.ok:
        raise SystemExit(f"{' '.join(res.argv)}: {res.summary()}")


def main() -> int:
    state = GuestState.from_file(Path(sys.argv[1]) / "guest.json")
    out = Path(sys.argv[2])
    per_path = "--per-path" in sys.argv
    tr = SSHTransport(state.host, state.ssh_port, state.user, state.identity_file,
                      known_hosts_path=state.known_hosts_path, name="guest")
    tcp_lb = LoopbackSpec(name="kv0", nqn="nqn.2024-01.io.kvgate:loopback-kv0", host_nqn=HOST,
                          host_id="6b0a4d9e-1d2c-4c1e-9a57-4b0d0c6f2f11", connect_host=False)
    rdma_lb = LoopbackSpec(name="kv1", nqn="nqn.2024-01.io.kvgate:loopback-kv1", host_nqn=HOST,
                           host_id="6b0a4d9e-1d2c-4c1e-9a57-4b0d0c6f2f11", transport="rdma", traddr="10.0.2.15",
                           trsvcid="4421", soft_roce_netdev="eth0", connect_host=False)
    tcp = NvmeofSpec(name="kv-tcp", nqn=tcp_lb.nqn, transport="tcp", traddr="127.0.0.1", trsvcid="4420",
                     connect="managed", host_nqn=HOST)
    rdma = NvmeofSpec(name="kv-rdma", nqn=rdma_lb.nqn, transport="rdma", traddr="10.0.2.15", trsvcid="4421",
                      connect="managed", host_nqn=HOST)
    # one subsystem behind both ports: the RDMA port serves the TCP loopback's null_blk device
    mp_rdma_lb = replace(rdma_lb, name="mp1", nqn=tcp_lb.nqn, backing="block", backing_path="/dev/kvgate-kv0")
    steps = StepLog(out / "_steps")  # every provisioning command, for when a capture goes wrong (not a fixture)
    run = lambda name, argv, timeout_s: steps.run(tr, name, argv, timeout_s=timeout_s)  # noqa: E731
    lbs = [Loopback(tr, s, run=run) for s in (tcp_lb, rdma_lb)]
    try:
        for lb in lbs:
            lb.down()
            res = lb.up(verify=False)
            if not res.ok:
                raise SystemExit(f"loopback up {lb.spec.name}: {res.error}")
        if not per_path:
            snap(tr, out / "none", rdma)
            for spec, lb in ((tcp, lbs[0]), (rdma, lbs[1])):
                save(out / f"discover-{spec.transport}", "discover", tr.run(list(spec.discover_argv()), timeout_s=T))
                save(out / f"connect-{spec.transport}", "connect", tr.run(list(spec.connect_argv()), timeout_s=T))
                snap(tr, out / spec.transport, spec)
                must(tr.run(["nvme", "disconnect", "-n", spec.nqn], timeout_s=T))
            nobody = replace(rdma, traddr="10.0.2.99")
            save(out / "discover-rdma-nobody-there", "discover", tr.run(list(nobody.discover_argv()), timeout_s=T))
            refused = replace(tcp, trsvcid="4499")
            save(out / "connect-tcp-refused", "connect", tr.run(list(refused.connect_argv()), timeout_s=T))
        # multipath: kv1's subsystem on a second RDMA port too (two array ports, as it were), that path's ANA group
        # non-optimized; mixed: kv0's subsystem on the RDMA port besides its TCP one, the TCP path non-optimized
        prefix = "per-path-" if per_path else ""
        second = replace(rdma_lb, name="mp2", trsvcid="4422", backing="block", backing_path="/dev/kvgate-kv1")
        mixed = replace(rdma_lb, name="mx1", nqn=tcp_lb.nqn, backing="block", backing_path="/dev/kvgate-kv0")
        for scenario, extra, paths, ana_port in (
                ("multipath", second, (rdma, replace(rdma, trsvcid="4422")), "4422"),
                ("mixed", mixed, (tcp, replace(rdma, nqn=tcp.nqn)), "4420")):
            lb = Loopback(tr, extra, run=run)
            res = lb.up(verify=False)
            if not res.ok:
                raise SystemExit(f"{scenario} port: {res.error}")
            for spec in paths:
                must(tr.run(list(spec.connect_argv()), timeout_s=T))
            must(tr.run(list(write_attr("ana", f"/sys/kernel/config/nvmet/ports/{ana_port}/ana_groups/1/ana_state",
                                        "non-optimized").argv), timeout_s=T))
            tr.run(["sleep", "2"], timeout_s=T)  # the host reads the ANA log page after the change notice
            snap(tr, out / (prefix + scenario), paths[-1])
            must(tr.run(["nvme", "disconnect", "-n", paths[0].nqn], timeout_s=T))
            must(tr.run(list(write_attr("ana", f"/sys/kernel/config/nvmet/ports/{ana_port}/ana_groups/1/ana_state",
                                        "optimized").argv), timeout_s=T))
            lb.down()
    finally:
        for lb in reversed(lbs):
            lb.down()
        tr.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
