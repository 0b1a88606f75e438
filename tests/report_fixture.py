"""The fixed report bundle (tests/fixtures/reports/): its run directory and predicate, copied for a test."""

import copy
import json
import shutil
from pathlib import Path

FIXED = Path(__file__).parent / "fixtures" / "reports"
FIXED_ID = "KVG-20260101-0123abcd"


def fixed_run(tmp_path: Path) -> tuple[Path, dict]:
    """A private copy of the fixed run directory and its predicate."""
    run = tmp_path / "run"
    shutil.copytree(FIXED / "fixed_run", run)
    return run, copy.deepcopy(json.loads((FIXED / "predicate.json").read_text()))


def add_gate(run: Path, gate_id: str, workload: str) -> None:
    """Name a gate added to the fixed run in its config/gates.yaml, as a run's bundle names every gate it ran: the
    report draws a gate's own sections by that name."""
    import yaml

    gates = yaml.safe_load((run / "config" / "gates.yaml").read_text())
    gates["gates"].append({"id": gate_id, "title": gate_id, "workload": workload, "metric": "m", "pass": ">= 0"})
    (run / "config" / "gates.yaml").write_text(yaml.safe_dump(gates, sort_keys=False))


def g1_only(run: Path, predicate: dict) -> dict:
    """Restrict the fixed run to its G1 gate (fio-read, which this kvgate can re-evaluate)."""
    import yaml

    gates = yaml.safe_load((run / "config" / "gates.yaml").read_text())
    gates["gates"] = [g for g in gates["gates"] if g["id"] == "G1"]
    (run / "config" / "gates.yaml").write_text(yaml.safe_dump(gates, sort_keys=False))
    for g in ("G2", "G3"):
        shutil.rmtree(run / "gates" / g)
    predicate["verdicts"] = [v for v in predicate["verdicts"] if v["gate_id"] == "G1"]
    return predicate


def sign_run(run: Path, predicate: dict, out: Path, key: Path, at: str) -> Path:
    """A run directory signed into ``out`` as ``kvgate run`` signs it, with the signing time ``at`` (UTC,
    ``YYYY-MM-DDTHH:MM:SSZ``) fixed; the bundle's directory."""
    import time
    from harness.report.bundle import load_private_key, write_bundle
    return write_bundle(run, out, load_private_key(key), predicate, make_tar=False,
                        clock=lambda: time.strptime(at, "%Y-%m-%dT%H:%M:%SZ")).path
