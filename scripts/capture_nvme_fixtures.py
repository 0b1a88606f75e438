#!/usr/bin/env python3
"""Capture the loopback's probe outputs from a REAL guest as test fixtures.

Usage: python3 scripts/capture_nvme_fixtures.py STATE_DIR OUT_DIR
STATE_DIR holds the guest.json written by `kvgate loopback guest-up`. Writes, per scenario,
OUT_DIR/<scenario>/<probe-name>.out and .rc (what parse_state consumes), for the states:
down (modules loaded, nothing configured), up-null_blk, up-brd, up-file.
"""

import sys
from pathlib import Path

from harness.rigs.guest import GuestState
from harness.rigs.loopback import Loopback, LoopbackSpec, probe_commands
from harness.transport import SSHTransport


def snap(lb: Loopback, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, argv in probe_commands(lb.spec).items():
        res = lb.transport.run(list(argv), timeout_s=60)
        (out / f"{name}.out").write_text(res.stdout)
        (out / f"{name}.rc").write_text(f"{res.rc}\n")


def main() -> int:
    state = GuestState.from_file(Path(sys.argv[1]) / "guest.json")
    out = Path(sys.argv[2])
    tr = SSHTransport(state.host, state.ssh_port, state.user, state.identity_file,
                      known_hosts_path=state.known_hosts_path)
    try:
        for backing in ("null_blk", "brd", "file"):
            spec = LoopbackSpec(name="kv0", nqn="nqn.2024-01.io.kvgate:loopback-kv0",
                                host_nqn="nqn.2024-01.io.kvgate:host-guest",
                                host_id="6b0a4d9e-1d2c-4c1e-9a57-4b0d0c6f2f11", backing=backing,
                                backing_path="/tmp/kv0.img", link_path="/dev/kvgate/kv0")
            lb = Loopback(tr, spec)
            lb.down()
            if backing == "null_blk":
                snap(lb, out / "down")
            res = lb.up(verify=False)
            if not res.ok:
                print(f"up {backing} failed: {res.error}", file=sys.stderr)
                return 1
            snap(lb, out / f"up-{backing}")
            lb.down()
    finally:
        tr.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
