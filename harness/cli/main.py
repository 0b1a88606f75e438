"""The kvgate command line: one parser, one module per command group, one exit-code map.

Command groups: ``suite`` (validate, plan, run), ``report`` (keygen, verify, report, compare), ``evidence``
(cosign, library build|check), ``cost``, ``loopback``, ``rig``, ``trace`` (synth, stats). Every subcommand returns a status from
:mod:`harness.cli.exits` or raises; ``main`` maps what it raised with :func:`harness.cli.exits.exit_for_error`,
so a HarnessError exits 3 whichever subcommand raised it, a configuration or bundle error 2.
"""

from __future__ import annotations

import argparse
import sys

from .. import __version__
from ..errors import ConfigError
from . import cost, evidence, loopback, report, rig, suite, trace
from .exits import exit_for_error

COMMAND_GROUPS = (suite, report, evidence, cost, loopback, rig, trace)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvgate", description="Acceptance gates for KV-cache storage tiers.")
    p.add_argument("--version", action="version", version=f"kvgate {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    for group in COMMAND_GROUPS:
        group.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as exc:
        for issue in exc.issues:
            print(str(issue), file=sys.stderr)
        print(f"{len(exc.issues)} configuration error(s)", file=sys.stderr)
        return exit_for_error(exc)
    except KeyboardInterrupt as exc:
        print("interrupted", file=sys.stderr)
        return exit_for_error(exc)
    except Exception as exc:  # noqa: BLE001 - mapped when it is one of kvgate's errors, re-raised otherwise
        code = exit_for_error(exc)
        print(f"error: {exc}", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
