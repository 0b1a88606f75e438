"""`kvgate plan` lists every command a run sends: the node facts from the runner's own list, then each gate's
steps; a whole run through a scripted node sends exactly the planned commands."""

import shlex
from pathlib import Path

import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from harness.cli.main import main
from harness.config import load_config
from harness.execute.facts import FACTS, facts_argv
from harness.suite.plan import facts_plan, gate_plan
from harness.suite.runner import run_suite
from harness.transport.doubles import Reply, ScriptedTransport
from harness.workloads import WORKLOADS

ROOT = Path(__file__).resolve().parents[2]


def test_plan_prints_every_node_fact_command_and_the_gate_commands(capsys):
    assert main(["plan", "-i", str(ROOT / "inventory" / "localhost.yaml"), "-g", str(ROOT / "gates" / "local.yaml")]) == 0
    out = capsys.readouterr().out
    for fact in FACTS:  # what the one facts command runs, fact by fact, then that command exactly
        assert f"{fact.description}: {shlex.join(fact.argv)}" in out, fact.key
    assert f"$ {shlex.join(facts_argv(FACTS))}" in out
    assert "nvidia-smi" in out and "nvme list-subsys -o json" in out  # the provenance commands too
    assert "$ fio --output-format=json /var/tmp/kvgate-work/kvgate-G1-localhost.fio" in out


def test_a_run_sends_exactly_the_planned_commands(tmp_path):
    inv = yaml.safe_load((ROOT / "inventory" / "localhost.yaml").read_text())
    inv["nodes"][0]["work_dir"] = "/w"
    (tmp_path / "inv.yaml").write_text(yaml.safe_dump(inv))
    cfg = load_config(tmp_path / "inv.yaml", ROOT / "gates" / "local.yaml", WORKLOADS)
    fio_json = (ROOT / "tests" / "fixtures" / "fio" / "io_uring_2groups_2jobs_grouped.json").read_text()

    def handler(call):
        if call.argv[:2] == ("fio", "--output-format=json"):
            return Reply(stdout=fio_json)
        if call.argv[:2] == ("sh", "-c") and call.argv[3:4] == ("kvgate-path-probe",):
            return Reply(stdout="missing\nforeign\n-\n")
        return Reply(rc=127, stderr="not installed") if call.argv[0] in ("nvidia-smi", "nvme") else Reply()

    node = ScriptedTransport(handler, name="localhost")
    out = run_suite(cfg, tmp_path / "out", Ed25519PrivateKey.generate(), transports={"localhost": node},
                    progress=lambda m: None)
    assert out.bundle is not None
    planned = [s.argv for s in facts_plan(cfg.inventory.nodes) + gate_plan(cfg, cfg.suite.gates[0]) if s.argv]
    assert node.commands == planned
