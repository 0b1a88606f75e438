"""``kvgate validate``, ``plan`` and ``run``: a suite of gates on an inventory of nodes."""

from __future__ import annotations

import sys
from pathlib import Path

from ..config import Config, load_config
from ..errors import ConfigError, ConfigIssue
from ..paths import given_or_shipped
from ..redact import redact_text
from ..report.signing import resolve_signing_key
from ..rigs.guest import open_guest_transports
from ..suite.plan import plan_text
from ..suite.runner import run_suite
from ..workloads import WORKLOADS
from .exits import EXIT_FOR_OUTCOME, EXIT_INTERRUPTED, EXIT_OK, exit_for_interrupt

DEFAULT_INVENTORY = "inventory/localhost.yaml"
DEFAULT_GATES = "gates/local.yaml"


def _config_args(p, required: bool = True) -> None:
    p.add_argument("--inventory", "-i", required=required,
                   help="node inventory YAML (a path, or the name of one kvgate ships in inventory/)")
    p.add_argument("--gates", "-g", required=required,
                   help="gate suite YAML (a path, or the name of one kvgate ships in gates/)")


def load(args, check_files: bool = False) -> Config:
    """The inventory and the gate suite the command line names, validated against every workload
    (``check_files``: and every control-host file a gate names, there and parsing)."""
    return load_config(given_or_shipped(args.inventory, "inventory"), given_or_shipped(args.gates, "gates"),
                       WORKLOADS, check_files=check_files)


def cmd_validate(args) -> int:
    cfg = load(args, check_files=True)
    print(f"OK: {args.inventory}: {len(cfg.inventory.nodes)} node(s); {args.gates}: suite "
          f"{cfg.suite.suite.name} v{cfg.suite.suite.version}, {len(cfg.suite.gates)} gate(s)")
    return EXIT_OK


def cmd_plan(args) -> int:
    cfg = load(args)  # loading registers the configuration's secrets (profiles, inventory, attach URLs)
    print(redact_text(plan_text(cfg)), end="")
    return EXIT_OK


def cmd_run(args) -> int:
    if bool(args.inventory) != bool(args.gates):
        raise ConfigError(ConfigIssue("<command line>", None, "--inventory/--gates",
                                      "give both, or neither for the default suite"))
    if not args.inventory:
        args.inventory, args.gates = DEFAULT_INVENTORY, DEFAULT_GATES
        print(f"no suite given: running the default {DEFAULT_GATES} on {DEFAULT_INVENTORY}", file=sys.stderr)
    cfg = load(args, check_files=True)  # a missing trace or model config stops the run before anything starts
    signing = resolve_signing_key(args.key)
    if signing.kind == "development":
        print(f"no --key given: signing with the development key {signing.key_path} (marked as such)",
              file=sys.stderr)
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
    if outcome.interrupted:
        return exit_for_interrupt(outcome.interrupt) if outcome.interrupt is not None else EXIT_INTERRUPTED
    return EXIT_FOR_OUTCOME[outcome.overall]


def register(sub) -> None:
    """Add ``validate``, ``plan`` and ``run``."""
    s = sub.add_parser("validate", help="check an inventory and a gate suite; every error, with file:line")
    _config_args(s)
    s.set_defaults(func=cmd_validate)

    s = sub.add_parser("plan", help="print every command a run would send to each node, and the job files")
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
