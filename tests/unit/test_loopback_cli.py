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


def test_default_inventory_provisions_a_tcp_and_an_rdma_target_side_for_its_nvmeof_targets():
    from harness.config import load_inventory
    from harness.rigs.loopback import LoopbackSpec
    inv = load_inventory(given_or_shipped(cli_loopback.DEFAULT_INVENTORY, "inventory"))
    pairs = cli_loopback.pick_targets(inv, None, None)
    assert [(t.name, t.transport, t.traddr, t.trsvcid) for _, t in pairs] == [
        ("kv0", "tcp", "127.0.0.1", "4420"), ("kv1", "rdma", "10.0.2.15", "4421")]
    node = pairs[0][0]
    assert node.labels.get(GUEST_LABEL) == "default"
    for _, t in pairs:  # the target side only, allowing the host NQN its kind: nvmeof target connects with
        spec = LoopbackSpec.from_target(t, node.name, node)
        host = next(x for x in node.targets if x.kind == "nvmeof" and x.nqn == t.nqn)
        assert spec.connect_host is False and spec.host_nqn == host.host_nqn and host.connect == "managed"
        assert (host.transport, host.traddr, host.trsvcid) == (t.transport, t.traddr, t.trsvcid)
    assert LoopbackSpec.from_target(pairs[1][1], node.name, node).soft_roce_netdev == "eth0"
    assert cli_loopback.pick_target(inv, None, "kv1")[1].name == "kv1"


def test_loopback_suite_reads_over_tcp_and_rdma_through_managed_nvmeof_targets():
    from harness.config import load_config
    from harness.workloads import WORKLOADS
    from harness.paths import data_path
    cfg = load_config(data_path("inventory", "loopback.yaml"), data_path("gates", "loopback.yaml"), WORKLOADS)
    assert [g.id for g in cfg.suite.gates] == ["L1-tcp", "G1-tcp", "L1-rdma", "G1-rdma"]
    node = cfg.inventory.node("guest")
    for gate in cfg.suite.gates:
        t = node.target(cfg.params[gate.id].target)
        assert (t.kind, t.connect, t.transport) == ("nvmeof", "managed", gate.id.split("-")[1])
