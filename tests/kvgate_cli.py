"""kvgate as a user runs it, for end-to-end tests: ``python -m harness`` of this checkout, from its root, output
captured; ``home`` sets KVGATE_HOME (keys, caches) to a private directory, ``env`` adds variables."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def kvgate(*args, home: Path | None = None, env: dict[str, str] | None = None,
           timeout: float = 600) -> subprocess.CompletedProcess:
    e = dict(os.environ)
    if home is not None:
        e["KVGATE_HOME"] = str(home)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "harness", *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, env=e, timeout=timeout)


def signed_run(inventory: Path, gates: Path, out: Path, key: Path, home: Path,
               timeout: float = 1500) -> tuple[subprocess.CompletedProcess, Path]:
    """``kvgate run`` into ``out`` signed with ``key``, and the bundle directory it wrote (the test fails, quoting
    the run's output, when it printed no report ID)."""
    r = kvgate("run", "-i", inventory, "-g", gates, "--out", out, "--key", key, home=home, timeout=timeout)
    report_id = next((l.split(": ")[1] for l in r.stdout.splitlines() if l.startswith("report ID: ")), None)
    assert report_id is not None, r.stdout[-3000:] + r.stderr[-3000:]
    return r, out / report_id
