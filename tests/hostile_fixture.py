"""Bundles as a hostile signer makes them: the fixed report run (tests/fixtures/reports/) changed, then signed
by kvgate's own writer (``write_bundle``, no render hook: a signer chooses what it signs), and a way to run
kvgate's command line in-process and see what a user sees."""

from __future__ import annotations

import contextlib
import io
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from harness.cli.main import main
from harness.report.bundle import BundleInfo, load_private_key, write_bundle
from harness.report.render import render_bundle_reports
from report_fixture import fixed_run, g1_only


def sign_run(tmp: Path, key_path: Path, *, run_edit: Callable[[Path], None] | None = None,
             pred_edit: Callable[[dict], None] | None = None, g1: bool = True, name: str = "b",
             created_utc: str = "2026-01-02T00:00:00Z", make_tar: bool = False, render: bool = False) -> BundleInfo:
    """The fixed run (only its G1 gate, which this kvgate re-evaluates, when ``g1``), edited, signed; with
    ``render``, with the reports rendered into it as a run writes them."""
    work = Path(tmp) / name
    work.mkdir(parents=True)
    run, pred = fixed_run(work)
    if g1:
        pred = g1_only(run, pred)
    if run_edit:
        run_edit(run)
    if pred_edit:
        pred_edit(pred)
    return write_bundle(run, work / "out", load_private_key(key_path), pred, make_tar=make_tar,
                        clock=lambda: time.strptime(created_utc, "%Y-%m-%dT%H:%M:%SZ"),
                        render=(lambda rid, d: render_bundle_reports(rid, d, pred)) if render else None)


@dataclass
class Ran:
    rc: int
    out: str
    err: str
    raised: BaseException | None = None


def kvgate_inproc(*args) -> Ran:
    """``kvgate ARGS`` through harness.cli.main in this process, stdout and stderr captured; an exception that
    escapes main (the traceback a user would see) is returned as ``raised``."""
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main([str(a) for a in args])
    except SystemExit as exc:  # argparse
        return Ran(exc.code if isinstance(exc.code, int) else 2, out.getvalue(), err.getvalue())
    except BaseException as exc:  # noqa: BLE001 - what would be a traceback
        return Ran(-1, out.getvalue(), err.getvalue(), exc)
    return Ran(rc, out.getvalue(), err.getvalue())
