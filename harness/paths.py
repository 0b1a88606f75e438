"""Where kvgate's own data lives: the repository's gates/, inventory/, workloads/, reports/ folders."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def data_path(*parts: str) -> Path:
    return ROOT.joinpath(*parts)


def state_dir() -> Path:
    """Per-user state (development signing key, caches): $KVGATE_HOME or ~/.local/share/kvgate."""
    d = Path(os.environ.get("KVGATE_HOME") or Path.home() / ".local" / "share" / "kvgate")
    d.mkdir(parents=True, exist_ok=True)
    return d


def git_commit() -> str | None:
    head = ROOT / ".git" / "HEAD"
    try:
        ref = head.read_text().strip()
        if ref.startswith("ref: "):
            p = ROOT / ".git" / ref[5:]
            if p.exists():
                return p.read_text().strip()
            packed = ROOT / ".git" / "packed-refs"
            for line in packed.read_text().splitlines() if packed.exists() else []:
                if line.endswith(ref[5:]):
                    return line.split()[0]
            return None
        return ref
    except OSError:
        return None
