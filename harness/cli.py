"""The kvgate command line: validate, plan, run, keygen, verify (and the topic modules' subcommands).

Exit codes of ``run``: 0 every gate PASS, 1 some gate FAIL (or INVALID/SKIPPED), 2 configuration error,
3 infrastructure error (a gate ERROR), 4 stop-loss hit (STOP), 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import shlex
import sys
from pathlib import Path

from . import __version__
from .errors import BundleError, ConfigError, HarnessError
from .safeio import InputFileError

# Topic modules that add subcommands: each has register(subparsers).
PLUGIN_MODULES: list[str] = ["harness.cli_cost", "harness.cli_loopback", "harness.cli_rig", "harness.cli_report"]

DEFAULT_INVENTORY = "inventory/localhost.yaml"
DEFAULT_GATES = "gates/local.yaml"


def _config_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--inventory", "-i", required=required, help="node inventory YAML")
    p.add_argument("--gates", "-g", required=required, help="gate suite YAML")


def _load(args):
    from .config import load_config
    return load_config(args.inventory, args.gates)


def cmd_validate(args) -> int:
    cfg = _load(args)
    print(f"OK: {args.inventory}: {len(cfg.inventory.nodes)} node(s); {args.gates}: suite "
          f"{cfg.suite.suite.name} v{cfg.suite.suite.version}, {len(cfg.suite.gates)} gate(s)")
    return 0


def cmd_plan(args) -> int:
    from .workloads import WORKLOADS, GateContext

    cfg = _load(args)
    print(f"suite {cfg.suite.suite.name} v{cfg.suite.suite.version}: {len(cfg.suite.gates)} gate(s), nothing runs")
    print("every node: snapshot (" + ", ".join(["uname", "os-release", "cpuinfo", "meminfo", "fio --version",
                                                "lsblk", "numa", "nics"]) + ")")
    for gate in cfg.suite.gates:
        wl = WORKLOADS[gate.workload]()
        nodes = {n.name: n for n in cfg.gate_nodes(gate)}
        stop = f", stop-loss {gate.stop_loss}" if gate.stop_loss else ""
        print(f"\n{gate.id} {gate.title} [{gate.workload}] metric {gate.metric}: pass {gate.pass_}{stop}"
              + (" (informational)" if gate.informational else ""))
        ctx = GateContext(gate=gate, params=cfg.params[gate.id], nodes=nodes, transports={}, steps=None,
                          gate_dir=Path("."), work_dir=Path("."))
        for step in wl.plan(ctx):
            print(f"  [{step.node}] {step.description}")
            for path, content in step.files.items():
                print(f"    file {path}:")
                for line in content.rstrip().splitlines():
                    print(f"      {line}")
            if step.argv:
                print(f"    $ {shlex.join(step.argv)}")
        if gate.stop_loss:
            print(f"  if {gate.metric} {gate.stop_loss}: STOP, later gates SKIPPED")
    return 0


def cmd_run(args) -> int:
    from .paths import data_path
    from .runner import run_suite
    from .signing import resolve_signing_key

    if bool(args.inventory) != bool(args.gates):
        raise HarnessError("give both --inventory and --gates, or neither for the default suite")
    if not args.inventory:
        args.inventory = str(data_path(DEFAULT_INVENTORY))
        args.gates = str(data_path(DEFAULT_GATES))
        print(f"no suite given: running the default {DEFAULT_GATES} on {DEFAULT_INVENTORY}", file=sys.stderr)
    cfg = _load(args)
    signing = resolve_signing_key(args.key)
    if signing.kind == "development":
        print(f"no --key given: signing with the development key {signing.key_path} (marked as such)",
              file=sys.stderr)
    from .cli_loopback import open_guest_transports

    # nodes labelled kvgate-guest are the local qemu guest: its port, key and known_hosts come from its state
    outcome = run_suite(cfg, Path(args.out), signing.private, key_kind=signing.kind,
                        trust_new_hosts=args.trust_new_hosts,
                        known_hosts_path=args.known_hosts, transports=open_guest_transports(cfg.inventory))
    print()
    for v in outcome.verdicts:
        actual = "—" if v.actual is None else f"{v.actual:.4g} {v.unit}"
        print(f"{v.gate_id:6} {v.outcome.value:8} {v.metric} = {actual} (pass {v.pass_threshold}"
              + (f", stop-loss {v.stop_loss_threshold}" if v.stop_loss_threshold else "") + f")  {v.reason}")
    for m in outcome.messages:
        print(m, file=sys.stderr)
    print(f"overall: {outcome.overall.value}")
    if not outcome.bundle:
        print(f"run directory: {outcome.run_dir}")
    else:
        print(f"report ID: {outcome.bundle.report_id}")
        print(f"bundle: {outcome.bundle.path}" + (f" ({outcome.bundle.tar_path})" if outcome.bundle.tar_path else ""))
        if signing.pub_path is not None:
            print(f"verify with: kvgate verify {outcome.bundle.tar_path or outcome.bundle.path} "
                  f"--pubkey {signing.pub_path}")
    return outcome.exit_code


def cmd_keygen(args) -> int:
    from .bundle import generate_keypair, key_fingerprint, load_public_key

    key, pub = generate_keypair(args.out)
    print(f"wrote {key} (private, mode 0600) and {pub}; fingerprint {key_fingerprint(load_public_key(pub))}")
    return 0


def cmd_verify(args) -> int:
    from .bundle import verify_bundle

    res = verify_bundle(args.bundle, args.pubkey)
    if not res.ok:
        print(f"FAILED: {res.error}")
        return 1
    pred = res.statement["predicate"]
    # The predicate is signed, but what it holds beyond the checked shape is printed as data, never trusted
    # to have the types this kvgate writes.
    key = pred.get("signing_key")
    print(f"OK {res.report_id}: signed by {res.signer} ({key.get('kind', '?') if isinstance(key, dict) else '?'} "
          f"key), created {pred.get('created_utc')}, overall {pred.get('overall')}, "
          f"{len(res.statement['subject'])} files")
    verdicts = pred.get("verdicts")
    for v in verdicts if isinstance(verdicts, list) else []:
        if not isinstance(v, dict):
            continue
        a = v.get("actual")
        actual = ("—" if a is None else f"{a:.4g} {v.get('unit', '')}".strip()
                  if isinstance(a, (int, float)) and not isinstance(a, bool) else repr(a))
        print(f"  {v.get('gate_id')}: {v.get('outcome')} {v.get('metric')} = {actual}")
    inputs = pred.get("input_report_ids")
    for rid in inputs if args.verbose and isinstance(inputs, list) else []:
        print(f"  input report: {rid}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvgate", description="Acceptance gates for KV-cache storage tiers.")
    p.add_argument("--version", action="version", version=f"kvgate {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("validate", help="check an inventory and a gate suite; every error, with file:line")
    _config_args(s)
    s.set_defaults(func=cmd_validate)

    s = sub.add_parser("plan", help="print what would run on which node, with the exact commands")
    _config_args(s)
    s.set_defaults(func=cmd_plan)

    s = sub.add_parser("run", help="run the gates and write a signed bundle (no arguments: the default suite)")
    _config_args(s, required=False)
    s.add_argument("--out", "-o", default="runs", help="directory for the run directory and the bundle (default: runs)")
    s.add_argument("--key", help="Ed25519 private key (from kvgate keygen); default: a development key, marked as such")
    s.add_argument("--trust-new-hosts", action="store_true",
                   help="accept and record unknown SSH host keys (changed keys are always refused)")
    s.add_argument("--known-hosts", help="known_hosts file (default ~/.ssh/known_hosts)")
    s.set_defaults(func=cmd_run)

    s = sub.add_parser("keygen", help="write an Ed25519 key pair PREFIX.key (0600) and PREFIX.pub")
    s.add_argument("--out", required=True, metavar="PREFIX")
    s.set_defaults(func=cmd_keygen)

    s = sub.add_parser("verify", help="verify a bundle (directory or .tar.gz) against a public key")
    s.add_argument("bundle")
    s.add_argument("--pubkey", required=True)
    s.add_argument("--verbose", "-v", action="store_true", help="also list the input report IDs a bundle cites")
    s.set_defaults(func=cmd_verify)

    for mod in PLUGIN_MODULES:
        importlib.import_module(mod).register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as exc:
        for issue in exc.issues:
            print(str(issue), file=sys.stderr)
        print(f"{len(exc.issues)} configuration error(s)", file=sys.stderr)
        return 2
    except (BundleError, InputFileError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
