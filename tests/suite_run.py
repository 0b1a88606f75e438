"""One gate run in-process as `kvgate run` runs it: the suite and a one-node local inventory written to the test's
directory, signed with a key of the test's own, the bundle verified."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from harness.config import load_config
from harness.report.bundle import generate_keypair, load_private_key, verify_bundle
from harness.suite.runner import RunOutcome, run_suite
from harness.workloads import WORKLOADS


def run_one_gate(tmp_path: Path, suite_name: str, gate: dict[str, Any]) -> tuple[Any, dict[str, Any], RunOutcome]:
    """(verdict, the gate's result.json, the run) of ``gate`` (id, title, workload, params, metric, pass, stop_loss)
    on node ``cpu1`` (local, its work directory under ``tmp_path``)."""
    (tmp_path / "gates.yaml").write_text(yaml.safe_dump({"suite": {"name": suite_name, "version": 1},
                                                         "gates": [gate]}, sort_keys=False))
    (tmp_path / "inv.yaml").write_text(yaml.safe_dump({"nodes": [{"name": "cpu1", "transport": "local",
                                                                  "work_dir": str(tmp_path / "work")}]}))
    config = load_config(tmp_path / "inv.yaml", tmp_path / "gates.yaml", WORKLOADS)
    key, pub = generate_keypair(tmp_path / "op")
    out = run_suite(config, tmp_path / "out", load_private_key(key), progress=lambda m: print(m, flush=True))
    result = json.loads((out.run_dir / "gates" / gate["id"] / "result.json").read_text())
    assert verify_bundle(out.bundle.path, pub).ok
    return out.verdicts[0], result, out
