"""`kvgate loopback` argument handling and its errors, without booting a guest."""

import argparse

from harness import cli_loopback


def parse(argv):
    p = argparse.ArgumentParser(prog="kvgate")
    cli_loopback.register(p.add_subparsers(dest="cmd", required=True))
    return p.parse_args(argv)


def test_up_without_a_running_guest_says_what_to_run(tmp_path, capsys):
    args = parse(["loopback", "up", "--state-dir", str(tmp_path), "--steps-dir", str(tmp_path / "steps")])
    assert args.func(args) == 1
    err = capsys.readouterr().err
    assert "kvgate loopback guest-up" in err and str(tmp_path) in err


def test_bad_inventory_names_file_line_and_field(tmp_path, capsys):
    inv = tmp_path / "inv.yaml"
    inv.write_text("nodes:\n  - name: g\n    host: 127.0.0.1\n    targets:\n"
                   "      - name: kv0\n        kind: nvmeof-loopback\n        nqn: not-an-nqn\n")
    args = parse(["loopback", "status", "-i", str(inv), "--steps-dir", str(tmp_path / "s")])
    assert args.func(args) == 2
    err = capsys.readouterr().err
    assert f"{inv}:7" in err and "nqn" in err


def test_guest_down_without_guest(tmp_path, capsys):
    args = parse(["loopback", "guest-down", "--state-dir", str(tmp_path)])
    assert args.func(args) == 0
    assert "no guest running" in capsys.readouterr().out


def test_default_inventory_has_exactly_one_loopback_target():
    from harness.config import load_inventory
    inv = load_inventory(cli_loopback.inventory_path(cli_loopback.DEFAULT_INVENTORY))
    node, target = cli_loopback.pick_target(inv, None, None)
    assert node.labels.get(cli_loopback.GUEST_LABEL) == "default"
    assert (target.kind, target.traddr, target.trsvcid) == ("nvmeof-loopback", "127.0.0.1", "4420")


def test_loopback_suite_validates_with_the_integrity_workload():
    import harness.workloads.nvme_integrity  # noqa: F401  (the lead registers it in workloads/__init__)
    from harness.config import load_config
    from harness.paths import data_path
    cfg = load_config(data_path("inventory", "loopback.yaml"), data_path("gates", "loopback.yaml"))
    assert [g.id for g in cfg.suite.gates] == ["L1", "G1"]
    assert cfg.params["L1"].target == "kv0"
