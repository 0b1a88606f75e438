"""Provenance parsers on captured real output (see tests/fixtures/provenance/README.md for each source)."""

import json

import pytest

from harness.execute.facts import collect_node_facts
from harness.parsers.facts import (ProvenanceParseError, parse_nics, parse_nvidia_smi_csv, parse_nvme_list,
                                   parse_nvme_list_subsys, parse_versions)
from harness.transport.doubles import Call, Reply, ScriptedTransport

from facts_double import answer_facts, is_facts_call


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


def answering(answers):
    """A node that answers by program name from a table; any other program is not installed. The facts
    come as one command, answered fact by fact (tests/facts_double.py)."""
    def per_fact(argv) -> Reply:
        out = answers.get(argv[0])
        if out is None:
            return Reply(error="[Errno 2] No such file or directory")
        rc, stdout, stderr = out
        return Reply(rc=rc, stdout=stdout, stderr=stderr)

    def handler(call: Call) -> Reply:
        return answer_facts(call, per_fact) if is_facts_call(call) else per_fact(call.argv)
    return ScriptedTransport(handler, name="n1")


def test_collect_records_absent_tools_and_failures(fixtures, tmp_path):
    from harness.transport.steps import StepLog

    tr = answering({
        "nvme": (1, "", "Failed to scan topology: No such file or directory\n"),
        "sh": (0, read(fixtures, "nics_debian12_vm.txt"), ""),
        "python3": (0, "not json", ""),
    })
    facts = collect_node_facts(tr, StepLog(tmp_path))
    assert len(tr.commands) == 1  # one command for every fact
    prov, snap = facts["provenance"], facts["snapshot"]
    assert prov["absent"] == ["nvidia-smi"]
    assert prov["nvme_controllers"] == [] and prov["nvme_subsystems"] == []
    assert "Failed to scan topology" in prov["notes"]["nvme_list"]
    assert snap["nics"][0]["name"] == "eth0"  # /sys/class/net is read once, into the snapshot
    assert "unparseable" in prov["errors"]["versions"]
    # a tool the snapshot needs that is missing is an error there, not an absence
    assert "exit 127" in snap["errors"]["uname"] and "uname: not found" in snap["errors"]["uname"]
    # the whole command is a step, and so is every fact cut from it: its own argv, stdout, stderr and rc
    from harness.execute.facts import FACTS
    dirs = sorted((tmp_path / "steps").iterdir())
    assert len(dirs) == 1 + len(FACTS) and dirs[0].name.endswith("-n1-facts")
    nvme = next(d for d in dirs if d.name.endswith("-provenance-nvme_list"))
    argv = json.loads((nvme / "argv.json").read_text())
    assert argv["argv"] == ["nvme", "list", "-o", "json"] and argv["part_of"] == dirs[0].name
    assert (nvme / "rc").read_text() == "1\n" and "Failed to scan" in (nvme / "stderr").read_text()
    assert json.loads((nvme / "status.json").read_text())["status"] == "failed"


def test_engine_versions_are_read_by_the_nodes_engine_interpreter():
    from harness.execute.facts import FACTS, node_facts
    assert node_facts(None) == FACTS
    facts = {f.key: f for f in node_facts("/opt/engine/bin/python")}
    assert facts["versions"].argv[0] == "/opt/engine/bin/python"
    assert facts["versions"].argv[1:] == next(f for f in FACTS if f.key == "versions").argv[1:]
    assert {k: f.argv for k, f in facts.items() if k != "versions"} == {f.key: f.argv for f in FACTS if f.key != "versions"}
