"""The captured fio-faults run (tests/fixtures/faults/): gate F1-path-down of gates/loopback-faults.yaml as one run in
the loopback guest left it (path kvmp-a down for 4 s mid-read, every block verified; PASS), its raw files and its
predicate, copied for a test; and what each test changes in it before it is signed again."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

FAULTS = Path(__file__).parent / "fixtures" / "faults"
GATE = "F1-path-down"


def faults_run(tmp: Path) -> tuple[Path, dict]:
    """A private copy of the captured run directory and its predicate."""
    run = Path(tmp) / "run"
    shutil.copytree(FAULTS / "f1_run", run)
    return run, copy.deepcopy(json.loads((FAULTS / "predicate.json").read_text()))


def raw(run: Path, name: str) -> Path:
    """One of the node's raw files (fio-clat.log, fio.json, fio.log, paths.log)."""
    return run / "gates" / GATE / "guest" / name


def idle_faulted_path(run: Path) -> None:
    """Rewrite the path samples as native multipath with iopolicy numa would have them: path A (the faulted one)
    read nothing while path B carried every read, before, during and after the fault (each round's sum kept; the
    sampler prints path A's line before path B's)."""
    res = json.loads((run / "gates" / GATE / "result.json").read_text())
    dev = {p["target"]: p["device"] for p in res["evidence"]["paths"]}
    a, b = dev["kvmp-a"], dev["kvmp-b"]
    out, held = [], None
    for line in raw(run, "paths.log").read_text().splitlines():
        parts = line.split()
        if parts[:1] == [a]:
            held = parts[1:]
            out.append(" ".join([a] + ["0"] * len(held)))
        elif parts[:1] == [b] and held is not None:
            out.append(" ".join([b] + [str(int(x) + int(y)) for x, y in zip(parts[1:], held)]))
            held = None
        else:
            out.append(line)
    raw(run, "paths.log").write_text("\n".join(out) + "\n")
