"""G2 on an SSH node: the engine binds the node's loopback and kvgate's client reaches it through an SSH port
forward over the same connection (real sshd on 127.0.0.1, real cpu-reference engine with LMCache)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.report.bundle import generate_keypair, load_private_key, verify_bundle
from harness.config import load_config
from harness.workloads import WORKLOADS
from harness.suite.runner import run_suite
from harness.gates.verdict import Outcome

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_g2_over_ssh_with_the_engine_on_the_nodes_loopback(tmp_path, sshd):
    # the node's interpreter runs the engine program kvgate puts there: it needs the engine's packages from any
    # directory, not kvgate (scripts/setup.sh --test installs them into the venv)
    probe = subprocess.run([sys.executable, "-c", "import torch, transformers, lmcache"], cwd="/",
                           capture_output=True, text=True)
    assert probe.returncode == 0, "the engine packages must be in this interpreter: " + probe.stderr[-300:]
    suite = yaml.safe_load((ROOT / "gates" / "g2-cpu-reference.yaml").read_text())
    suite["gates"] = [suite["gates"][0]]
    from harness.transport.local import free_port
    suite["gates"][0]["params"].update(port=free_port())
    gates = tmp_path / "gates.yaml"
    gates.write_text(yaml.safe_dump(suite, sort_keys=False))
    node = sshd.node_yaml("sshnode")
    node["work_dir"] = str(tmp_path / "work")
    node["engine_python"] = sys.executable  # the node's engine environment: the venv scripts/setup.sh made
    inv = tmp_path / "inventory.yaml"
    inv.write_text(yaml.safe_dump({"nodes": [node]}))
    key, pub = generate_keypair(tmp_path / "op")
    out = run_suite(load_config(inv, gates, WORKLOADS), tmp_path / "out", load_private_key(key),
                    known_hosts_path=str(sshd.known_hosts), progress=lambda m: print(m, flush=True))
    v = out.verdicts[0]
    result = json.loads((out.run_dir / "gates" / "G2" / "result.json").read_text())
    assert v.outcome is Outcome.PASS, (v.reason, result.get("error"))
    ev = result["evidence"]
    assert ev["client_path"].startswith("ssh-forward to sshnode:127.0.0.1:")
    assert result["metrics"]["hit_rate"] >= 0.95
    assert verify_bundle(out.bundle.path, pub).ok
