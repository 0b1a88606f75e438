"""Where kvgate's own data lives (gates/, inventory/, reports/, traces/, workloads/) and its per-user state.

The data folders stay at the top of the repository; a wheel carries a copy in ``harness/_data`` (the
build copies them, see setup.py). Running from a checkout, the repository's folders are used, so an edit
there takes effect without reinstalling; an installed kvgate reads its own copy through importlib.resources.
"""

from __future__ import annotations

import importlib.resources
import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
CHECKOUT = PACKAGE_DIR.parent
DATA_DIRS = ("gates", "inventory", "reports", "traces", "workloads")


def _is_checkout(root: Path) -> bool:
    return (root / "pyproject.toml").is_file() and all((root / d).is_dir() for d in DATA_DIRS)


def data_root() -> Path:
    """The folder that holds gates/, inventory/, reports/, traces/ and workloads/."""
    if _is_checkout(CHECKOUT):
        return CHECKOUT
    return Path(os.fspath(importlib.resources.files("harness") / "_data"))


def data_path(*parts: str) -> Path:
    """A file or folder of kvgate's data, e.g. ``data_path("gates", "local.yaml")``."""
    return data_root().joinpath(*parts)


def state_dir() -> Path:
    """Per-user state (development signing key, caches): $KVGATE_HOME or ~/.local/share/kvgate."""
    d = Path(os.environ.get("KVGATE_HOME") or Path.home() / ".local" / "share" / "kvgate")
    d.mkdir(parents=True, exist_ok=True)
    return d


def git_commit() -> str | None:
    """The commit of the checkout kvgate runs from (None for an installed kvgate or no git metadata)."""
    head = CHECKOUT / ".git" / "HEAD"
    try:
        ref = head.read_text().strip()
        if ref.startswith("ref: "):
            p = CHECKOUT / ".git" / ref[5:]
            if p.exists():
                return p.read_text().strip()
            packed = CHECKOUT / ".git" / "packed-refs"
            for line in packed.read_text().splitlines() if packed.exists() else []:
                if line.endswith(ref[5:]):
                    return line.split()[0]
            return None
        return ref
    except OSError:
        return None


def given_or_shipped(arg: str | Path, folder: str) -> Path:
    """A file named on the command line: the path as given when it exists, else kvgate's own copy of
    ``<folder>/<name>`` (so ``-g gates/g2-cpu-reference.yaml`` or ``-g g2-cpu-reference.yaml`` works from
    any directory with an installed kvgate). A missing file is returned as given (its loader reports it)."""
    p = Path(arg)
    if p.exists():
        return p
    parts = p.parts
    rel = parts[1:] if len(parts) > 1 and parts[0] == folder else parts
    if len(rel) == 1:
        shipped = data_path(folder, rel[0])
        if shipped.is_file():
            return shipped
    return p
