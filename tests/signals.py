"""Tests that send a signal set up its handling first, so the suite's result does not depend on how it was
started (under ``nohup``, as a background job of a non-interactive shell, a CI runner: SIGINT or SIGHUP may be
inherited as ignored, and kvgate honours an inherited SIG_IGN, as Python does for SIGINT).

- ``default_signals``: a ``preexec_fn`` for a child the test will signal (kvgate): SIGINT, SIGTERM and SIGHUP
  back to their defaults in the child, as a user's shell starts a foreground command.
- ``ctrl_c_raises()``: for a test that interrupts its own process (``os.kill(os.getpid(), SIGINT)``,
  ``_thread.interrupt_main()``): SIGINT raises KeyboardInterrupt while the block runs, whatever it was before.
- ``signal_raises(sig)``: for a test that sends its own process SIGINT, SIGTERM or SIGHUP: while the block runs,
  the signal raises what the kvgate CLI makes of it (KeyboardInterrupt; ``Stopped`` for SIGTERM and SIGHUP, from
  the CLI's own handlers), whatever it was before.
- ``processes_tagged(tag)``: PIDs of this user's processes whose environment holds ``tag`` (a value unique to
  the test, put in the environment of the command the test starts, so it reaches everything that command
  starts): never a match on process names machine-wide.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import Iterator

SIGNALS_SENT_IN_TESTS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def default_signals() -> None:
    for sig in SIGNALS_SENT_IN_TESTS:
        signal.signal(sig, signal.SIG_DFL)


@contextlib.contextmanager
def ctrl_c_raises() -> Iterator[None]:
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def signal_raises(sig: int) -> Iterator[None]:
    if sig == signal.SIGINT:
        with ctrl_c_raises():
            yield
        return
    from harness.cli.main import install_stop_handlers, restore_handlers

    saved = {s: signal.signal(s, signal.SIG_DFL) for s in (signal.SIGTERM, signal.SIGHUP)}
    installed = install_stop_handlers()
    try:
        yield
    finally:
        restore_handlers(installed)
        for s, h in saved.items():
            signal.signal(s, h)


def processes_tagged(tag: str) -> list[int]:
    needle = tag.encode()
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if needle in (d / "environ").read_bytes():
                pids.append(int(d.name))
        except OSError:  # gone meanwhile, or another user's
            continue
    return pids
