"""``kvgate loopback``: the single-node NVMe-oF loopback (guest lifecycle and target provisioning).

    kvgate loopback guest-up   [--state-dir D] [--port P] [--engine-python PY] [--kernel-args ARGS]
                                                             build + boot the qemu guest, wait for SSH
    kvgate loopback guest-down [--state-dir D]                 stop it by PID
    kvgate loopback up|status|down [-i inventory/loopback.yaml] [--node N] [--target T] [--no-verify]

up, status and down act on every nvmeof-loopback target of the inventory (or the one named), in order (down
in reverse). A loopback whose NQN a ``kind: nvmeof`` target of the node names is the target side only: the
host side is that target's (``kvgate run`` connects it with ``connect: managed``).

A node whose ``labels`` hold ``kvgate-guest: <state-dir or "default">`` is the guest: its address,
port, key and known_hosts come from the guest's state file, since the forwarded port can change.

``up`` replaces nothing kvgate did not make: a target ``path`` holding a file, a directory or a link kvgate did
not record is refused before anything is done, in one line naming the inventory's FILE:LINE of ``path``.
``down`` undoes only what ``up`` recorded on the node (/run/kvgate/loopback/state.json): a brd RAM disk,
configfs items, a link or a mount that were there before are left alone (listed as such).

Exit codes (harness.cli.exits): 0 done; 2 a configuration error, or a refusal of what the inventory asks; 3 the
guest or the loopback could not be brought up or torn down (the result is printed first).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from ..config import load_inventory
from ..config.yamlload import load_yaml
from ..errors import ConfigError, ConfigIssue
from ..paths import given_or_shipped
from ..rigs.guest import (DEFAULT_KERNEL_PACKAGE, GuestError, build_guest, check_engine_python, check_kernel_package,
                          default_state_dir, guest_running, open_node_transport, start_guest, stop_guest)
from ..rigs.loopback import Loopback, LoopbackSpec
from ..workloads.kit.integrity import loopback_integrity
from ..transport.steps import StepLog
from .exits import EXIT_INFRA, EXIT_INPUT, EXIT_OK

DEFAULT_INVENTORY = "inventory/loopback.yaml"


def register(subparsers) -> None:
    p = subparsers.add_parser("loopback", help="single-node NVMe-oF loopback (kernel nvmet + nvme-tcp)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="loopback_cmd", required=True)

    g = sub.add_parser("guest-up", help="build (cached) and boot the qemu guest; wait for its sshd")
    g.add_argument("--state-dir", type=Path, default=None, help="guest state (default ~/.cache/kvgate/guest/run)")
    g.add_argument("--port", type=int, default=None, help="SSH port on 127.0.0.1 (another is picked if taken)")
    g.add_argument("--memory-mib", type=int, default=None,
                   help="guest memory (default 2048; 4096 with --engine-python: torch and LMCache in the guest)")
    g.add_argument("--engine-python", default=None, metavar="PY",
                   help="a host interpreter with torch and LMCache (e.g. .venv/bin/python): the host's tree is "
                        "shared read-only with the guest, whose kvgate-engine-python runs PY chrooted on it "
                        "(the engine_python of inventory/loopback-kv-read.yaml)")
    g.add_argument("--boot-timeout-s", type=float, default=240.0)
    g.add_argument("--kernel-args", default="", metavar="ARGS",
                   help="appended to the guest kernel's command line, e.g. nvme_core.multipath=N (per-path "
                        "/dev/nvmeXnY devices, whose read counters kv-read needs: Debian 6.1's multipath head "
                        "has none)")
    g.add_argument("--kernel-package", default=DEFAULT_KERNEL_PACKAGE, metavar="PKG",
                   help="the Debian kernel the guest boots: a linux-image-* metapackage or image (default "
                        f"{DEFAULT_KERNEL_PACKAGE}; e.g. linux-image-6.12-amd64 for the multipath iopolicy "
                        "queue-depth, Linux 6.11+)")
    g.set_defaults(func=_guest_up)

    g = sub.add_parser("guest-down", help="stop the guest by PID")
    g.add_argument("--state-dir", type=Path, default=None)
    g.set_defaults(func=_guest_down)

    for name, help_ in (("up", "provision the target and connect (idempotent)"),
                        ("status", "show what exists"),
                        ("down", "disconnect and tear down what exists, in reverse order")):
        c = sub.add_parser(name, help=help_)
        c.add_argument("-i", "--inventory", default=DEFAULT_INVENTORY)
        c.add_argument("--node", default=None, help="node name (default: every node with a loopback target)")
        c.add_argument("--target", default=None, help="target name (default: every loopback target)")
        c.add_argument("--state-dir", type=Path, default=None, help="guest state dir for kvgate-guest nodes")
        c.add_argument("--out", type=Path, default=None, help="write the result as JSON here")
        c.add_argument("--steps-dir", type=Path, default=None,
                       help="where every command's argv/stdout/stderr/rc go (default runs/loopback/<op>-<time>)")
        c.add_argument("--json", action="store_true", help="print the result as JSON")
        if name == "up":
            c.add_argument("--no-verify", action="store_true", help="skip the data-integrity read-back")
        c.set_defaults(func=_provision, loopback_op=name)


def _guest_up(args) -> int:
    state_dir = args.state_dir or default_state_dir()
    running = guest_running(state_dir)
    if running:
        print(f"guest already running: pid {running.pid}, ssh root@127.0.0.1 -p {running.ssh_port}")
        return EXIT_OK
    try:  # a wrong path is bad input (exit 2), found before anything is built or started
        engine_python = check_engine_python(os.path.abspath(args.engine_python)) if args.engine_python else None
        check_kernel_package(args.kernel_package)
    except GuestError as exc:
        print(f"kvgate loopback guest-up: {exc}", file=sys.stderr)
        return EXIT_INPUT
    t0 = time.monotonic()
    image = build_guest(progress=lambda m: print(m, file=sys.stderr), kernel_package=args.kernel_package)
    memory_mib = args.memory_mib or (4096 if args.engine_python else 2048)
    state = start_guest(image, state_dir, ssh_port=args.port, memory_mib=memory_mib,
                        boot_timeout_s=args.boot_timeout_s, progress=lambda m: print(m, file=sys.stderr),
                        engine_python=engine_python, kernel_args=args.kernel_args)
    print(f"guest up in {time.monotonic() - t0:.1f} s: kernel {state.kernel_release}, pid {state.pid}, "
          f"ssh -i {state.identity_file} -o UserKnownHostsFile={state.known_hosts_path} "
          f"-p {state.ssh_port} root@127.0.0.1; console {state.console_log}")
    return EXIT_OK


def _guest_down(args) -> int:
    stopped = stop_guest(args.state_dir or default_state_dir())
    print("guest stopped" if stopped else "no guest running")
    return EXIT_OK


def pick_targets(inventory, node_name: str | None, target_name: str | None) -> list:
    """[(node, target)] of the loopback: the nvmeof-loopback targets matching the names (every one by default)."""
    cands = [(n, t) for n in inventory.nodes for t in n.targets if t.kind == "nvmeof-loopback"
             and (node_name is None or n.name == node_name) and (target_name is None or t.name == target_name)]
    if not cands:
        what = f"node={node_name or '*'} target={target_name or '*'}"
        raise ConfigError(ConfigIssue(str(getattr(inventory, "path", "inventory")), None, "nodes[].targets[]",
                                      f"expected an nvmeof-loopback target for {what}; found none"))
    return cands


def pick_target(inventory, node_name: str | None, target_name: str | None):
    """(node, target) for the loopback: explicit names, else the only nvmeof-loopback target."""
    cands = pick_targets(inventory, node_name, target_name)
    if len(cands) != 1:
        what = f"node={node_name or '*'} target={target_name or '*'}"
        found = ", ".join(f"{n.name}/{t.name}" for n, t in cands)
        raise ConfigError(ConfigIssue(str(getattr(inventory, "path", "inventory")), None, "nodes[].targets[]",
                                      f"expected exactly one nvmeof-loopback target for {what}; found {found}"))
    return cands[0]


def path_where(inventory_path, inventory, node, target) -> str | None:
    """``FILE:LINE: nodes[i].targets[j].path`` of a target's ``path`` in the inventory, for refusals."""
    if not target.path:
        return None
    _, index = load_yaml(inventory_path)
    i = next(k for k, n in enumerate(inventory.nodes) if n is node)
    j = next(k for k, t in enumerate(node.targets) if t is target)
    issue = index.issue(("nodes", i, "targets", j, "path"), "")
    return f"{issue.file}:{issue.line}: {issue.path}" if issue.line else f"{issue.file}: {issue.path}"


def _provision(args) -> int:
    inv_path = given_or_shipped(args.inventory, "inventory")
    inv = load_inventory(inv_path)
    pairs = pick_targets(inv, args.node, args.target)
    if args.loopback_op == "down":
        pairs = pairs[::-1]  # an RDMA device shared by two targets goes with the last
    steps_dir = args.steps_dir or Path("runs") / "loopback" / f"{args.loopback_op}-{time.strftime('%Y%m%d-%H%M%S')}"
    steps = StepLog(steps_dir)
    print(f"steps: {steps.root}", file=sys.stderr)
    results, all_ok, refused = [], True, None
    opened: dict[str, object] = {}
    try:
        for node, target in pairs:
            spec = LoopbackSpec.from_target(target, node.name, node, where=path_where(inv_path, inv, node, target))
            tr = opened.get(node.name) or opened.setdefault(node.name, open_node_transport(node, args.state_dir))
            lb = Loopback(tr, spec, run=lambda name, argv, timeout_s, tr=tr: steps.run(tr, name, argv,
                                                                                     timeout_s=timeout_s),
                          progress=lambda m: print(m, file=sys.stderr))
            if args.loopback_op == "status":
                data, ok = lb.status(), True
            elif args.loopback_op == "up":
                res = lb.up(verify=None if args.no_verify else loopback_integrity)
                data, ok = res.as_dict(), res.ok
            else:
                res = lb.down()
                data, ok = res.as_dict(), res.ok
            results.append(data)
            all_ok = all_ok and ok
            if isinstance(data, dict) and data.get("refused"):
                refused = data["error"]  # bad input: one line, nothing was done for this target
                break
            if not args.json:
                print(_human(args.loopback_op, data), flush=True)
            if not ok and args.loopback_op == "up":
                break  # the result says what failed; `down` removes what exists
    finally:
        for tr in opened.values():
            tr.close()
    data = results[0] if len(results) == 1 else results
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(data, indent=2, default=str))
    if args.json:
        print(json.dumps(data, indent=2, default=str))
    if refused:
        print(f"kvgate loopback {args.loopback_op}: {refused}", file=sys.stderr)
        return EXIT_INPUT
    return EXIT_OK if all_ok else EXIT_INFRA


def _human(op: str, data: dict) -> str:
    summary = data.get("summary", data)
    lines = [f"{summary['target']} ({summary['nqn']}) at {summary['address']}: {summary['state']}"
             + (f", device {summary['device']}" if summary.get("device") else "")
             + (f", backing {summary['backing_device']}" if summary.get("backing_device") else "")
             + (f", RDMA {summary['rdma_device']}" if summary.get("rdma_device") else "")
             + ("" if summary.get("host_side", "").startswith("connected") else
                f" (target side only; host side {summary.get('host_side', '').replace('left to ', '')})")]
    fs = summary.get("filesystem")
    if fs:
        m = fs.get("mounted")
        lines.append(f"  filesystem {fs['type']} at {fs['mount_path']}: "
                     + (f"mounted ({m['source']}, {m['type']})" if m else "not mounted"))
    if data.get("left_alone"):
        lines.append("  left alone (not made by kvgate): " + ", ".join(data["left_alone"]))
    missing = [k for k, v in summary["layers"].items() if not v]
    if summary["state"] == "partial":
        lines.append("  missing: " + ", ".join(missing))
    for a in data.get("actions", []) or []:
        if not a["ok"]:
            lines.append(f"  FAILED {a['name']} (rc={a['rc']}): {a['stderr']}")
    integ = data.get("integrity")
    if integ:
        lines.append(f"  integrity: {'ok' if integ['ok'] else 'FAILED'} ({integ['checked_bytes']} bytes read back, "
                     f"{integ['mismatched_bytes']} differ)")
    if data.get("error"):
        lines.append(f"  error: {data['error']}")
    return "\n".join(lines)
