"""The host side of NVMe-oF on output captured from the real guest (scripts/capture_nvmeof_fixtures.py: Debian 6.1
kernel, nvme-cli 2.3, iproute2 6.1, soft-RoCE rdma_rxe on the virtio NIC): the parsers, and the check that a
device is the namespace of the inventory's NQN over its transport, at its address, live."""

import re
from dataclasses import replace
from pathlib import Path

import pytest

from harness.execute import nvmeof as N
from harness.parsers import nvme as P
from harness.parsers import rdma as R

FX = Path(__file__).resolve().parents[1] / "fixtures" / "nvmeof"
KV0 = "nqn.2024-01.io.kvgate:loopback-kv0"  # the TCP loopback's subsystem
KV1 = "nqn.2024-01.io.kvgate:loopback-kv1"  # the RDMA loopback's subsystem
HOST = "nqn.2024-01.io.kvgate:host-guest"
RDMA = N.NvmeofSpec(name="kv-rdma", nqn=KV1, transport="rdma", traddr="10.0.2.15", trsvcid="4421",
                    connect="managed", host_nqn=HOST)
TCP = N.NvmeofSpec(name="kv-tcp", nqn=KV0, transport="tcp", traddr="127.0.0.1", trsvcid="4420", host_nqn=HOST)


def fx(scenario: str, name: str) -> str:
    return (FX / scenario / f"{name}.out").read_text()


def state(scenario: str) -> N.HostState:
    d = FX / scenario
    return N.parse_host_state({p.stem: (int(p.with_suffix(".rc").read_text()), p.read_text())
                               for p in d.glob("*.out") if p.stem in N.probe_commands(RDMA)})


# ------------------------------------------------------------------------------------------------ parsers


def test_rdma_link_and_the_nic_under_it():
    (link,) = R.parse_rdma_links(fx("rdma", "rdma-links"))
    assert (link.device, link.port, link.state, link.physical_state, link.netdev) == \
        ("kvgate-eth0", 1, "ACTIVE", "LINK_UP", "eth0")
    assert R.parse_rdma_links("") == [] and R.parse_rdma_links("[]") == []
    with pytest.raises(R.RdmaParseError):
        R.parse_rdma_links("rdma: command not found")


def test_ib_sysfs_port_state_link_layer_gid_types_and_nic():
    (dev,) = R.parse_ib_sysfs(fx("rdma", "rdma-sysfs"))
    assert (dev.name, dev.node_type) == ("kvgate-eth0", "CA")
    port = dev.ports[1]
    assert (port.state, port.phys_state, port.link_layer) == ("ACTIVE", "LinkUp", "Ethernet")
    assert port.gid_types == ["RoCE v2"] and port.netdevs == ["eth0"]
    # the IPv4-mapped GID of the guest's 10.0.2.15 (0a00:020f), the one RoCEv2 traffic to that address uses
    assert any(g["gid"].endswith("ffff:0a00:020f") and g["type"] == "RoCE v2" for g in port.gids.values())
    assert R.parse_ib_sysfs("") == []


def test_rdma_devices_join_links_and_sysfs():
    links = [link.__dict__ for link in R.parse_rdma_links(fx("rdma", "rdma-links"))]
    devices = [d.as_dict() for d in R.parse_ib_sysfs(fx("rdma", "rdma-sysfs"))]
    (row,) = R.rdma_devices(links, devices)
    assert row == {"device": "kvgate-eth0", "port": 1, "node_type": "CA", "state": "ACTIVE",
                   "physical_state": "LINK_UP", "link_layer": "Ethernet", "rate": "2.5 Gb/sec (1X SDR)",
                   "gid_types": ["RoCE v2"], "netdev": "eth0", "gid_netdevs": ["eth0"]}
    only_link = R.rdma_devices(links, [])
    assert only_link[0]["netdev"] == "eth0" and only_link[0]["link_layer"] is None


def test_cm_ids_tell_which_rdma_device_carries_the_host_connection():
    ids = R.parse_cm_ids(fx("rdma", "rdma-cm-ids"))
    host = R.host_connection(ids, "10.0.2.15", "4421")
    assert host and {c.comm for c in host} == {"nvme_rdma"} and {c.device for c in host} == {"kvgate-eth0"}
    assert len(host) == 3  # admin queue + 2 I/O queues: the controller's queue_count
    assert R.host_connection(ids, "10.0.2.15", "4422") == []
    assert R.split_host_port("[fe80::1]:4420") == ("fe80::1", "4420")


def test_nvme_sysfs_controllers_and_paths():
    sysfs = P.parse_nvme_sysfs(fx("multipath", "sysfs"))
    assert {a["transport"] for a in sysfs.controllers.values()} == {"rdma"}
    assert all(sysfs.queue_count(c) == 3 for c in sysfs.controllers)
    ana = {d: a.get("ana_state") for d, a in sysfs.blocks.items()}
    assert sorted(v for v in ana.values() if v) == ["non-optimized", "optimized"]
    view = P.fabric_view(sysfs)
    assert {c["subsystem_nqn"] for c in view["nvme_fabric_controllers"]} == {KV1}
    assert P.parse_nvme_sysfs("") == P.NvmeSysfs({}, {})


def test_list_verbose_native_head_and_per_path_devices():
    native = [ns for ns in P.parse_list_verbose(fx("multipath", "list-verbose")) if ns.nqn == KV1]
    (head,) = native
    assert head.controller is None and len(head.paths) == 2
    assert sorted(dict(head.path_ana).values()) == ["non-optimized", "optimized"]
    per_path = [ns for ns in P.parse_list_verbose(fx("per-path-multipath", "list-verbose")) if ns.nqn == KV1]
    assert len(per_path) == 2 and all(ns.controller and not ns.paths for ns in per_path)
    assert {ns.device for ns in per_path} == {f"{ns.controller}n1" for ns in per_path}


def test_discovery_log_and_connect_output():
    recs = P.parse_discovery_log(fx("discover-rdma", "discover"))
    assert {r.subnqn for r in recs} == {N.DISCOVERY_NQN, KV1}
    assert {(r.trtype, r.traddr, r.trsvcid) for r in recs} == {("rdma", "10.0.2.15", "4421")}
    assert P.parse_connect_device(fx("connect-rdma", "connect")) is not None
    assert re.fullmatch(r"nvme\d+", P.parse_connect_device(fx("connect-tcp", "connect")))
    assert P.parse_connect_device(fx("connect-tcp-refused", "connect")) is None
    assert P.parse_discovery_log(fx("discover-rdma-nobody-there", "discover")) == []
    with pytest.raises(P.ParseError):
        P.parse_discovery_log('{"records": [{"trtype": "tcp"}]}')


# --------------------------------------------------------------------------------------------- resolution


def test_rdma_namespace_found_checked_and_its_rdma_device_recorded():
    res = N.resolve(RDMA, state("rdma"))
    assert res.ok, res.error
    assert re.fullmatch(r"/dev/nvme\d+n1", res.device) and res.multipath == "native" and res.transport == "rdma"
    (path,) = res.paths
    assert (path.transport, path.address, path.state, path.declared, path.queue_count) == \
        ("rdma", "traddr=10.0.2.15,trsvcid=4421", "live", True, 3)
    assert path.ana_state == "optimized"
    (dev,) = res.rdma
    assert (dev["device"], dev["port"], dev["netdev"], dev["queues"]) == ("kvgate-eth0", 1, "eth0", 3)
    assert res.host_nqn == HOST and res.serial and res.size_bytes == 256 << 20  # the capture's null_blk


def test_tcp_namespace_found():
    res = N.resolve(TCP, state("tcp"))
    assert res.ok, res.error
    assert res.transport == "tcp" and res.rdma == () and res.paths[0].address.endswith("src_addr=127.0.0.1")


def test_nqn_not_on_the_node_names_it_and_lists_what_is():
    res = N.resolve(replace(RDMA, nqn="nqn.2024-01.com.example:fx100"), state("rdma"))
    assert not res.ok and res.device is None
    assert "nqn.2024-01.com.example:fx100 is not connected" in res.error and f"subsystems seen: {KV1}" in res.error
    res = N.resolve(RDMA, state("none"))
    assert "subsystems seen: none" in res.error


def test_inventory_says_rdma_but_the_live_controller_is_tcp():
    res = N.resolve(replace(TCP, transport="rdma"), state("tcp"))
    assert not res.ok and res.device is None
    assert "expected rdma traddr=127.0.0.1,trsvcid=4420; found" in res.error and " tcp " in res.error


def test_another_address_is_a_mismatch():
    res = N.resolve(replace(RDMA, traddr="192.0.2.10"), state("rdma"))
    assert not res.ok and "no controller at rdma traddr=192.0.2.10,trsvcid=4421" in res.error
    assert "traddr=10.0.2.15,trsvcid=4421 (live)" in res.error
    res = N.resolve(replace(RDMA, trsvcid="4420"), state("rdma"))
    assert not res.ok and "no controller at" in res.error


def test_a_controller_that_is_not_live_is_a_mismatch():
    st = state("rdma")  # derived from the capture: the same controller, reconnecting
    st.subsystems = [replace(s, paths=tuple(replace(p, state="connecting") for p in s.paths)) for s in st.subsystems]
    res = N.resolve(RDMA, st)
    assert not res.ok and "is connecting, expected live" in res.error


def test_host_nqn_mismatch():
    res = N.resolve(replace(RDMA, host_nqn="nqn.2024-01.com.example:other-host"), state("rdma"))
    assert not res.ok and f"connected with host NQN {HOST}" in res.error


def test_native_multipath_records_every_path_and_its_ana_state():
    st = state("multipath")
    res = N.resolve(RDMA, st)
    assert res.ok, res.error
    assert res.multipath == "native" and re.fullmatch(r"/dev/nvme\d+n1", res.device)
    by_port = {p.address.split("trsvcid=")[1]: p for p in res.paths}
    assert set(by_port) == {"4421", "4422"}
    assert by_port["4421"].declared and not by_port["4422"].declared
    assert (by_port["4421"].ana_state, by_port["4422"].ana_state) == ("optimized", "non-optimized")
    assert all(re.fullmatch(r"nvme\d+c\d+n1", p.device) for p in res.paths)
    # the second port declared instead: the same head, the other path marked as declared
    res2 = N.resolve(replace(RDMA, trsvcid="4422"), st)
    assert res2.ok and res2.device == res.device


def test_per_path_devices_without_native_multipath():
    st = state("per-path-multipath")
    res = N.resolve(RDMA, st)
    assert res.ok, res.error
    assert res.multipath == "per-path"
    declared = next(p for p in res.paths if p.declared)
    assert res.device == f"/dev/{declared.device}" and declared.device == f"{declared.controller}n1"
    res2 = N.resolve(replace(RDMA, trsvcid="4422"), st)
    assert res2.ok and res2.device != res.device  # each path has its own device: the declared one is used


@pytest.mark.parametrize("scenario", ["mixed", "per-path-mixed"])
def test_a_subsystem_reached_over_two_transports_is_refused(scenario):
    res = N.resolve(replace(RDMA, nqn=KV0), state(scenario))
    assert not res.ok and "I/O would not go over rdma only" in res.error
    assert {p.transport for p in res.paths} == {"tcp", "rdma"}  # both recorded for the run directory
    assert any(p.ana_state == "non-optimized" for p in res.paths) or scenario == "per-path-mixed"


def test_namespace_by_uuid_and_a_missing_one():
    st = state("rdma")
    res = N.resolve(RDMA, st)
    assert N.resolve(replace(RDMA, ns_uuid=res.ns_uuid.upper()), st).device == res.device
    bad = N.resolve(replace(RDMA, ns_uuid="00000000-0000-0000-0000-000000000001"), st)
    assert not bad.ok and "no namespace with uuid" in bad.error and res.ns_uuid in bad.error
    assert "no namespace device for nsid 2" in N.resolve(replace(RDMA, nsid=2), st).error


def test_missing_rdma_tool_is_a_note_not_an_error():
    d = FX / "rdma"
    outs = {p.stem: (int(p.with_suffix(".rc").read_text()), p.read_text()) for p in d.glob("*.out")}
    outs["rdma-cm-ids"] = outs["rdma-links"] = (127, "")
    res = N.resolve(RDMA, N.parse_host_state(outs))
    assert res.ok and res.rdma[0]["device"] is None and "not installed" in res.notes[0]


def test_commands():
    assert RDMA.connect_argv() == ("nvme", "connect", "-t", "rdma", "-a", "10.0.2.15", "-s", "4421", "-n", KV1,
                                   "--hostnqn", HOST, "-o", "json")
    q = replace(RDMA, nr_io_queues=8, queue_size=256, ctrl_loss_tmo_s=5, host_id="6b0a4d9e-1d2c-4c1e-9a57-4b0d0c6f2f11")
    assert q.connect_argv()[-10:] == ("--hostid", "6b0a4d9e-1d2c-4c1e-9a57-4b0d0c6f2f11", "--nr-io-queues", "8",
                                      "--queue-size", "256", "--ctrl-loss-tmo", "5", "-o", "json")
    assert replace(RDMA, discovery_trsvcid="8009").discover_argv()[:7] == \
        ("nvme", "discover", "-t", "rdma", "-a", "10.0.2.15", "-s") and "8009" in \
        replace(RDMA, discovery_trsvcid="8009").discover_argv()
    assert N.disconnect_argv("nvme3") == ("nvme", "disconnect", "-d", "nvme3")
    assert set(N.probe_commands(TCP)) == {"list-subsys", "list-verbose", "sysfs"}
