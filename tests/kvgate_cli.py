"""kvgate as a user runs it, for end-to-end tests: ``python -m harness`` of this checkout, from its root, output
captured; ``home`` sets KVGATE_HOME (keys, caches) to a private directory, ``env`` adds variables."""

from __future__ import annotations

import os
import subprocess
import sys
import time
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
    return r, bundle_dir(r, out)


def bundle_dir(r: subprocess.CompletedProcess, out: Path) -> Path:
    """The bundle directory a ``kvgate run`` into ``out`` wrote, from the report ID it printed (the test fails,
    quoting the run's output, when it printed none)."""
    report_id = next((l.split(": ")[1] for l in r.stdout.splitlines() if l.startswith("report ID: ")), None)
    assert report_id is not None, r.stdout[-3000:] + r.stderr[-3000:]
    return out / report_id


def _in_namespace(ns: str) -> list[str]:
    """The processes (pid and command) whose mount namespace is ``ns`` (``mnt:[INODE]``)."""
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if os.readlink(proc / "ns" / "mnt") == ns:
                    cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    out.append(f"{proc.name} {cmd[:200]}")
            except OSError:
                pass  # gone meanwhile, or a kernel thread
    return out


def readme_run(suite: str, inventory: str, tmp_path: Path, *, timeout: float = 1500, before=None,
               home: Path | None = None) -> tuple[subprocess.CompletedProcess, Path, Path]:
    """``kvgate run -i inventory/INVENTORY -g gates/SUITE --out OUT`` exactly as the README's table gives it: the
    shipped files, unchanged, from the checkout's root, signed with the development key (KVGATE_HOME private to
    the test; ``home``, default ``tmp_path/home``, holds it as ``dev-signing.pub``). The one difference from a
    user's machine: the run sees a private ``/var/tmp`` (a mount namespace of its own with ``tmp_path/var-tmp``
    bound there), so the inventories' ``work_dir: /var/tmp/kvgate-work`` is the test's and nothing outside
    ``tmp_path`` is touched. ``before(work_dir)`` runs first (a model to preseed). Once kvgate has exited, every
    process the run started (everything in that mount namespace: engines, evictors, fio) must be gone within 60 s.
    Returns the run, its bundle directory and that work directory (as this host sees it)."""
    var_tmp = tmp_path / "var-tmp"
    work = var_tmp / "kvgate-work"
    work.mkdir(parents=True, exist_ok=True)
    if before is not None:
        before(work)
    out, ns_file = tmp_path / "runs", tmp_path / "mnt-ns"
    e = dict(os.environ, KVGATE_HOME=str(home or tmp_path / "home"))
    argv = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
            'readlink /proc/$$/ns/mnt > "$1" && mount --bind "$0" /var/tmp && shift && exec "$@"', str(var_tmp),
            str(ns_file), sys.executable, "-m", "harness", "run", "-i", f"inventory/{inventory}", "-g",
            f"gates/{suite}", "--out", str(out)]
    r = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=e, timeout=timeout)
    ns = ns_file.read_text().strip()
    assert ns.startswith("mnt:[") and ns != os.readlink("/proc/self/ns/mnt"), (ns, r.stderr[-2000:])
    deadline = time.monotonic() + 60
    while _in_namespace(ns) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _in_namespace(ns), f"left running by the run: {_in_namespace(ns)}"
    return r, bundle_dir(r, out), work
