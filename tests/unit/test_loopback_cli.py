"""`kvgate loopback` argument handling and its errors, without booting a guest, through kvgate's one
exit-code map (harness.cli.exits): an infrastructure error exits 3 here as in `run`, a configuration error 2."""

from harness.cli import loopback as cli_loopback
from harness.cli.exits import EXIT_INFRA, EXIT_INPUT, EXIT_OK
from harness.cli.main import main
from harness.paths import given_or_shipped
from harness.rigs.guest import GUEST_LABEL


def test_up_without_a_running_guest_says_what_to_run(tmp_path, capsys):
    assert main(["loopback", "up", "--state-dir", str(tmp_path), "--steps-dir", str(tmp_path / "steps")]) == EXIT_INFRA
    err = capsys.readouterr().err
    assert "kvgate loopback guest-up" in err and str(tmp_path) in err


def test_bad_inventory_names_file_line_and_field(tmp_path, capsys):
    inv = tmp_path / "inv.yaml"
    inv.write_text("nodes:\n  - name: g\n    host: 127.0.0.1\n    targets:\n"
                   "      - name: kv0\n        kind: nvmeof-loopback\n        nqn: not-an-nqn\n")
    assert main(["loopback", "status", "-i", str(inv), "--steps-dir", str(tmp_path / "s")]) == EXIT_INPUT
    err = capsys.readouterr().err
    assert f"{inv}:7" in err and "nqn" in err


def test_guest_down_without_guest(tmp_path, capsys):
    assert main(["loopback", "guest-down", "--state-dir", str(tmp_path)]) == EXIT_OK
    assert "no guest running" in capsys.readouterr().out


def test_default_inventory_has_exactly_one_loopback_target():
    from harness.config import load_inventory
    inv = load_inventory(given_or_shipped(cli_loopback.DEFAULT_INVENTORY, "inventory"))
    node, target = cli_loopback.pick_target(inv, None, None)
    assert node.labels.get(GUEST_LABEL) == "default"
    assert (target.kind, target.traddr, target.trsvcid) == ("nvmeof-loopback", "127.0.0.1", "4420")


def test_loopback_suite_validates_with_the_integrity_workload():
    import harness.workloads.nvme_integrity  # noqa: F401  (the lead registers it in workloads/__init__)
    from harness.config import load_config
    from harness.workloads import WORKLOADS
    from harness.paths import data_path
    cfg = load_config(data_path("inventory", "loopback.yaml"), data_path("gates", "loopback.yaml"), WORKLOADS)
    assert [g.id for g in cfg.suite.gates] == ["L1", "G1"]
    assert cfg.params["L1"].target == "kv0"
