"""Provenance parsers on captured real output (see tests/fixtures/provenance/README.md for each source)."""

import json

import pytest

from harness.provenance import (ProvenanceParseError, collect_provenance, parse_nics, parse_nvidia_smi_csv,
                                parse_nvme_list, parse_nvme_list_subsys, parse_versions)
from harness.transport import CommandResult


def read(fixtures, name):
    return (fixtures / "provenance" / name).read_text()


def test_nvme_list_verbose_nvmeof_loopback(fixtures):
    ctrls = parse_nvme_list(read(fixtures, "nvme_list_v_loopback_nvme-cli-2.3.json"))
    assert len(ctrls) == 1
    c = ctrls[0]
    assert (c["device"], c["model"], c["serial"], c["firmware"]) == ("nvme0", "Linux", "7db8abd994c0caebaf60", "6.1.0-57")
    assert c["transport"] == "tcp" and c["address"].startswith("traddr=127.0.0.1,trsvcid=4420")
    assert c["subsystem_nqn"] == "nqn.2024-01.io.kvgate:loopback-kv0"
    # the namespace hangs off the subsystem (native multipath), not the controller
    assert c["namespaces"] == [{"name": "nvme0n1", "nsid": 1, "size_bytes": 268435456}]
    assert c["size_bytes"] == 268435456


def test_nvme_list_flat_shapes(fixtures):
    ps = parse_nvme_list(read(fixtures, "nvme_list_flat_tcp_handwritten.json"))
    assert [(c["device"], c["model"], c["serial"], c["firmware"], c["size_bytes"]) for c in ps] == [
        ("/dev/nvme0n1", "example-array", "EXAMPLE0001", "1.0.0.0", 10737418240),
        ("/dev/nvme0n2", "example-array", "EXAMPLE0001", "1.0.0.0", 10737418240)]
    assert ps[1]["namespaces"][0]["nsid"] == 102
    old = parse_nvme_list(read(fixtures, "nvme_list_flat_pcie_old_handwritten.json"))
    assert old[0]["model"] == "EXAMPLE NVME SSD 1.92TB" and old[0]["firmware"] == "FW000001"
    assert old[0]["namespaces"][0]["nsid"] is None  # older nvme-cli prints no NameSpace


def test_nvme_list_no_device_is_empty(fixtures):
    assert parse_nvme_list(read(fixtures, "nvme_list_no_devices_nvme-cli-2.3.stdout")) == []


def test_nvme_list_rejects_other_json():
    with pytest.raises(ProvenanceParseError, match="Devices"):
        parse_nvme_list('{"devices": []}')
    with pytest.raises(ProvenanceParseError, match="not JSON"):
        parse_nvme_list("Failed to scan topology")


def test_list_subsys_both_sources(fixtures):
    lb = parse_nvme_list_subsys(read(fixtures, "nvme_list_subsys_loopback_nvme-cli-2.3.json"))
    assert lb == [{"name": "nvme-subsys0", "nqn": "nqn.2024-01.io.kvgate:loopback-kv0",
                   "host_nqn": "nqn.2024-01.io.kvgate:host-guest",
                   "paths": [{"controller": "nvme0", "transport": "tcp",
                              "address": "traddr=127.0.0.1,trsvcid=4420,src_addr=127.0.0.1", "state": "live"}]}]
    ps = parse_nvme_list_subsys(read(fixtures, "nvme_list_subsys_two_paths_handwritten.json"))
    assert ps[0]["nqn"] == "nqn.2024-01.com.example:array01:kvpool"
    assert [(p["controller"], p["state"]) for p in ps[0]["paths"]] == [("nvme3", "live"), ("nvme2", "live")]
    # nvme-cli 1.x wraps the subsystems in one object
    one = parse_nvme_list_subsys(json.dumps({"Subsystems": [{"Name": "nvme-subsys1", "NQN": "nqn.x", "Paths": []}]}))
    assert one[0]["nqn"] == "nqn.x" and one[0]["paths"] == []
    with pytest.raises(ProvenanceParseError, match="no NQN"):
        parse_nvme_list_subsys('[{"Subsystems": [{"Name": "nvme-subsys0"}]}]')


def test_nvidia_smi_by_header(fixtures):
    gpus = parse_nvidia_smi_csv(read(fixtures, "nvidia_smi_4gpu_driver_drift_handwritten.csv"))
    assert [g["index"] for g in gpus] == [0, 1, 2, 3]
    assert {g["name"] for g in gpus} == {"NVIDIA H100 80GB HBM3"}
    assert [g["driver_version"] for g in gpus].count("550.54.15") == 1
    assert gpus[2]["pci_bus_id"] == "00000000:3A:00.0" and gpus[2]["memory_total_mib"] is None
    one = parse_nvidia_smi_csv(read(fixtures, "nvidia_smi_units_handwritten.csv"))
    assert one == [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "driver_version": "570.86.10",
                    "memory_total_mib": 81559, "pci_bus_id": None}]
    with pytest.raises(ProvenanceParseError, match="fields"):
        parse_nvidia_smi_csv("index, name\n0, A, extra\n")


def test_nics_and_versions(fixtures):
    nics = {n["name"]: n for n in parse_nics(read(fixtures, "nics_debian12_vm.txt"))}
    assert nics["eth0"] == {"name": "eth0", "speed_mbit_s": None, "mtu": 1400, "operstate": "up", "driver": "virtio_net"}
    assert nics["lo"]["mtu"] == 65536 and nics["lo"]["driver"] is None
    assert parse_nics("ens1f0 100000 9000 up mlx5_core\n")[0]["speed_mbit_s"] == 100000
    v = parse_versions(read(fixtures, "versions_debian12_vm.json"))
    assert v["vllm"] is None and v["lmcache"] and v["python"].startswith("3.")


class ScriptedTransport:
    """A transport that answers from a table (the seam the step log takes); unknown commands are 'not found'."""

    name = "n1"

    def __init__(self, answers):
        self.answers = answers

    def run(self, argv, timeout_s=None, env=None, stdin=None):
        out = self.answers.get(argv[0])
        if out is None:
            return CommandResult(tuple(argv), None, "", "", 0.0, False, "could not start: [Errno 2] No such file")
        rc, stdout, stderr = out
        return CommandResult(tuple(argv), rc, stdout, stderr, 0.0, False, None)


def test_collect_records_absent_tools_and_failures(fixtures, tmp_path):
    from harness.steps import StepLog

    tr = ScriptedTransport({
        "nvme": (1, "", "Failed to scan topology: No such file or directory\n"),
        "sh": (0, read(fixtures, "nics_debian12_vm.txt"), ""),
        "python3": (0, "not json", ""),
    })
    prov = collect_provenance(tr, StepLog(tmp_path))
    assert prov["absent"] == ["nvidia-smi"]
    assert prov["nvme_controllers"] == [] and prov["nvme_subsystems"] == []
    assert "Failed to scan topology" in prov["notes"]["nvme_list"]
    assert prov["nics"][0]["name"] == "eth0"
    assert "unparseable" in prov["errors"]["versions"]
    # every command left its step directory on disk
    assert len(list((tmp_path / "steps").iterdir())) == 5


def test_engine_versions_are_read_by_the_nodes_engine_interpreter():
    from harness.provenance import PROVENANCE_COMMANDS, provenance_commands
    assert provenance_commands(None) == PROVENANCE_COMMANDS
    cmds = provenance_commands("/opt/engine/bin/python")
    assert cmds["versions"][0] == "/opt/engine/bin/python"
    assert cmds["versions"][1:] == PROVENANCE_COMMANDS["versions"][1:]
    assert {k: v for k, v in cmds.items() if k != "versions"} == {
        k: v for k, v in PROVENANCE_COMMANDS.items() if k != "versions"}
