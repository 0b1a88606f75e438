"""The kvgate command line: one parser, one module per command group, one exit-code map.

Command groups: ``suite`` (validate, plan, run), ``report`` (keygen, verify, report, compare), ``evidence``
(cosign, library build|check), ``cost``, ``loopback``, ``rig``, ``trace`` (synth, stats),
``render k8s`` and ``collect`` (Kubernetes). Every subcommand returns a status from
:mod:`harness.cli.exits` or raises; ``main`` maps what it raised with :func:`harness.cli.exits.exit_for_error`,
so a HarnessError exits 3 whichever subcommand raised it, a configuration or bundle error 2.

Signals: SIGTERM and SIGHUP (what CI systems, Slurm and Kubernetes send on cancel, and a closed terminal) get
Ctrl-C's handling: the handler raises :class:`Stopped`, a KeyboardInterrupt, so the same cleanup runs (every
remote process group stopped, engines kvgate launched stopped, NVMe-oF controllers it connected disconnected,
partial results kept, no bundle) and kvgate exits 128 + the signal's number (SIGINT 130, SIGHUP 129, SIGTERM
143). A signal the parent process set to be ignored stays ignored (``nohup`` ignores SIGHUP; a background job
of a non-interactive shell ignores SIGINT): kvgate honours what its caller asked for, as Python does for SIGINT.
This is the only place kvgate handles signals.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from .. import __version__
from ..errors import ConfigError
from . import cost, evidence, gpunode, k8s, loopback, report, rig, suite, trace
from .exits import exit_for_error

# The signals that stop kvgate as Ctrl-C does (SIGINT keeps Python's own handler, which raises KeyboardInterrupt).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Stopped(KeyboardInterrupt):
    """kvgate was sent a stop signal (SIGTERM, SIGHUP): Ctrl-C's handling, and exit 128 + ``signum``."""

    def __init__(self, signum: int):
        self.signum = int(signum)
        super().__init__(signal.Signals(signum).name)


def install_stop_handlers() -> dict[int, object]:
    """Make SIGTERM and SIGHUP raise :class:`Stopped` in the main thread, except where the parent set them to be
    ignored; returns the handlers replaced (for :func:`restore_handlers`). After the first stop signal the next
    ones are ignored, so the cleanup they started is not itself cut short (SIGKILL remains for a hard stop)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    state = {"stopping": False}

    def stop(signum, _frame):
        if state["stopping"]:
            print(f"kvgate: {signal.Signals(signum).name} received again: already stopping", file=sys.stderr,
                  flush=True)
            return
        state["stopping"] = True
        print(f"kvgate: {signal.Signals(signum).name} received: stopping", file=sys.stderr, flush=True)
        raise Stopped(signum)

    previous: dict[int, object] = {}
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) is signal.SIG_IGN:  # nohup, a caller that wants kvgate to survive this signal
            continue
        previous[sig] = signal.signal(sig, stop)
    return previous


def restore_handlers(previous: dict[int, object]) -> None:
    """Put back the handlers :func:`install_stop_handlers` replaced (kvgate run in-process, as tests do)."""
    for sig, handler in previous.items():
        signal.signal(sig, handler)


COMMAND_GROUPS = (suite, report, evidence, cost, loopback, rig, trace, k8s, gpunode)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvgate", description="Acceptance gates for KV-cache storage tiers.")
    p.add_argument("--version", action="version", version=f"kvgate {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    for group in COMMAND_GROUPS:
        group.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    previous = install_stop_handlers()
    try:
        return _run(args)
    finally:
        restore_handlers(previous)


def _run(args) -> int:
    try:
        return args.func(args)
    except ConfigError as exc:
        for issue in exc.issues:
            print(str(issue), file=sys.stderr)
        print(f"{len(exc.issues)} configuration error(s)", file=sys.stderr)
        return exit_for_error(exc)
    except KeyboardInterrupt as exc:
        print(f"interrupted ({exc})" if str(exc) else "interrupted", file=sys.stderr)
        return exit_for_error(exc)
    except Exception as exc:  # noqa: BLE001 - mapped when it is one of kvgate's errors, re-raised otherwise
        code = exit_for_error(exc)
        print(f"error: {exc}", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
