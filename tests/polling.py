"""Waiting in tests: poll for the condition with a deadline, never sleep a fixed time and hope.

The deadline is a hang guard sized for a machine under a CPU hog, not an expectation: a condition that
holds returns at once.
"""

from __future__ import annotations

import subprocess
import time
from typing import Callable, TypeVar

T = TypeVar("T")


def wait_until(probe: Callable[[], T], timeout_s: float = 60.0, what: str = "condition",
               interval_s: float = 0.05) -> T:
    """Call ``probe`` until it returns something truthy; return that, or fail naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what} (last: {value!r})")
        time.sleep(interval_s)


def pgrep(pattern: str) -> str:
    return subprocess.run(["pgrep", "-af", pattern], capture_output=True, text=True).stdout


def wait_no_process(pattern: str, timeout_s: float = 60.0) -> None:
    """Every process whose command line matches ``pattern`` is gone (killed groups take a moment)."""
    wait_until(lambda: pgrep(pattern) == "", timeout_s, f"no process matching {pattern!r}: {pgrep(pattern)!r}")
