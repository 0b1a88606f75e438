"""`kvgate rig up|down|status|kill-node|link-down|link-up`: the N-node test rig (network namespaces, sshds,
one shaped storage port). A RigError exits 3 like every infrastructure error (harness.cli.exits)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..rigs.netns import RigSpec, kill_node, rig_down, rig_status, rig_up, set_node_link
from .exits import EXIT_NO, EXIT_OK

DEFAULT_STATE_ROOT = Path("/var/tmp/kvgate-rig")


def _spec(args: argparse.Namespace) -> RigSpec:
    state_dir = Path(args.state_dir) if args.state_dir else DEFAULT_STATE_ROOT / args.prefix.rstrip("-")
    kwargs = {"prefix": args.prefix, "state_dir": state_dir}
    for name in ("node_count", "subnet", "port_rate_mbit", "engine_python", "shell_rc"):
        value = getattr(args, name, None)
        if value is not None:
            kwargs[name] = value
    return RigSpec(**kwargs)


def _which(args: argparse.Namespace, node_count: int, recorded: bool, spec: RigSpec) -> str:
    """Which rig a command acted on, in words: the one `up` recorded, or the flags' when there is no record."""
    text = (f"{spec.prefix} rig of {node_count} nodes as `rig up` recorded it ({spec.state_dir}/rig.json)" if recorded
            else f"{spec.prefix} rig of {node_count} nodes (no record of `rig up` in {spec.state_dir}: as given, and "
                 "every further node namespace of the prefix)")
    if recorded and args.node_count is not None and args.node_count != node_count:
        text += f"; --nodes {args.node_count} ignored"
    return text


def _handler(args: argparse.Namespace) -> int:
    # `down`, `status`, `kill-node` and the link commands act on the rig `up` recorded in the state dir (its node
    # count), whatever flags they are given; without a record, on the names the prefix and node count give.
    spec = _spec(args)
    if args.rig_cmd == "up":
        state = rig_up(spec)
        print(f"rig up: {spec.node_count} nodes, storage port shaped to {spec.port_rate_mbit} Mbit/s")
        print(f"inventory: {state.inventory_path}")
        print(f"ssh config: {state.ssh_config}   (e.g. ssh -F {state.ssh_config} n1)")
        print(f"pool on every node: {state.pool_mount}")
    elif args.rig_cmd == "down":
        res = rig_down(spec, remove_state=args.purge)
        print(f"rig down: {_which(args, res['node_count'], res['recorded'], spec)}: killed {len(res['killed_pids'])} "
              f"processes, deleted {len(res['deleted_namespaces'])} namespaces; left: no namespace, no process"
              + (f"; its state dir {res['state_dir_kept']} (keys, pool; --purge deletes it)"
                 if res["state_dir_kept"] else ""))
    elif args.rig_cmd == "status":
        st = rig_status(spec)
        if args.json:
            print(json.dumps(st, indent=2))
        else:
            print(f"rig {_which(args, st['node_count'], st['recorded'], spec)}")
            for ns, info in st["namespaces"].items():
                what = "absent" if info is None else f"{len(info['pids'])} processes"
                print(f"{ns:12s} {what}")
            if "ssh_reachable" in st:
                bad = [w for w, ok in st["ssh_reachable"].items() if not ok]
                print("ssh: all reachable" if not bad else f"ssh: unreachable: {', '.join(bad)}")
            print(f"up: {st['up']}")
        return EXIT_OK if st["up"] else EXIT_NO
    elif args.rig_cmd == "kill-node":
        pids = kill_node(spec, args.node)
        print(f"killed {len(pids)} processes of {args.node}")
    else:  # link-down, link-up
        set_node_link(spec, args.node, up=args.rig_cmd == "link-up")
        print(f"{args.node}: link {args.rig_cmd[5:]}")
    return EXIT_OK


def register(subparsers) -> None:
    """Add `rig` with up/down/status/kill-node/link-down/link-up to the kvgate CLI."""
    p = subparsers.add_parser("rig", help="N-node test rig on this machine (namespaces, sshds, shaped port)")
    sub = p.add_subparsers(dest="rig_cmd", required=True)
    for name, help_ in (("up", "build the rig and write its inventory"),
                        ("down", "tear the rig down (idempotent)"),
                        ("status", "show namespaces, processes, ssh reachability"),
                        ("kill-node", "fault injection: kill every process of one node"),
                        ("link-down", "fault injection: take one node's link down (its processes live on)"),
                        ("link-up", "bring one node's link back up")):
        sp = sub.add_parser(name, help=help_)
        sp.add_argument("--prefix", default="kvg-", help="namespace name prefix (default kvg-)")
        sp.add_argument("--state-dir", default=None,
                        help=f"keys, configs, pool, inventory (default {DEFAULT_STATE_ROOT}/<prefix>)")
        sp.add_argument("--nodes", dest="node_count", type=int, default=None, help="node count (default 8)")
        if name == "up":
            sp.add_argument("--subnet", default=None, help="private /24 used inside the namespaces (default 10.77.0.0/24)")
            sp.add_argument("--port-rate-mbit", type=int, default=None, help="storage port tbf rate (default 1000)")
            sp.add_argument("--engine-python", default=None,
                            help="the nodes' engine interpreter, written into the inventory (default: this kvgate's)")
            sp.add_argument("--shell-rc", choices=("empty", "host"), default=None,
                            help="the ~/.bashrc a node's login shell reads before every command: empty, as on a "
                                 "fresh node (default), or this machine's root's")
        if name == "down":
            sp.add_argument("--purge", action="store_true", help="also delete the state dir (keys, pool)")
        if name == "status":
            sp.add_argument("--json", action="store_true")
        if name in ("kill-node", "link-down", "link-up"):
            sp.add_argument("node", help="node name, e.g. n3")
    p.set_defaults(func=_handler)
