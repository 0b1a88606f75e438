"""Parsers of nvme-cli JSON and configfs listings, on output captured from the real guest
(Debian 6.1 kernel, nvme-cli 2.3; see scripts/capture_nvme_fixtures.py)."""

from pathlib import Path

import pytest

from harness.parsers import nvme as P

FX = Path(__file__).resolve().parents[1] / "fixtures" / "nvme"
NQN = "nqn.2024-01.io.kvgate:loopback-kv0"
HOST = "nqn.2024-01.io.kvgate:host-guest"


def fx(scenario: str, name: str) -> str:
    return (FX / scenario / f"{name}.out").read_text()


def test_list_subsys_connected_gives_live_tcp_path_on_loopback():
    subs = P.parse_list_subsys(fx("up-null_blk", "list-subsys"))
    assert len(subs) == 1
    s = subs[0]
    assert (s.nqn, s.host_nqn, s.name, s.instance) == (NQN, HOST, "nvme-subsys0", 0)
    assert s.live
    (path,) = s.paths
    assert path.transport == "tcp" and path.controller == "nvme0"
    assert path.address["traddr"] == "127.0.0.1" and path.address["trsvcid"] == "4420"


def test_list_subsys_empty_and_missing_module():
    assert P.parse_list_subsys(fx("down", "list-subsys")) == []
    assert P.parse_list_subsys("") == []  # nvme-core not loaded: nvme-cli prints nothing on stdout


def test_list_subsys_rejects_garbage():
    with pytest.raises(P.ParseError):
        P.parse_list_subsys("Failed to scan topology")


def test_list_verbose_names_namespace_and_multipath_path():
    (ns,) = P.parse_list_verbose(fx("up-null_blk", "list-namespaces"))
    assert (ns.nqn, ns.device, ns.nsid) == (NQN, "nvme0n1", 1)
    assert ns.size_bytes == 256 * 1024 * 1024 and ns.sector_size == 4096
    assert ns.paths == ("nvme0c0n1",)  # where the multipath statistics appear


def test_find_namespace_device_by_nqn():
    subs = P.parse_list_subsys(fx("up-brd", "list-subsys"))
    nss = P.parse_list_verbose(fx("up-brd", "list-namespaces"))
    assert P.find_namespace_device(subs, nss, NQN) == "/dev/nvme0n1"
    assert P.find_namespace_device(subs, nss, "nqn.2024-01.io.kvgate:other") is None
    assert P.find_namespace_device(subs, nss, NQN, nsid=2) is None


def test_find_namespace_device_not_live_is_none():
    subs = P.parse_list_subsys(fx("up-brd", "list-subsys").replace('"live"', '"connecting"'))
    nss = P.parse_list_verbose(fx("up-brd", "list-namespaces"))
    assert P.find_namespace_device(subs, nss, NQN) is None


def test_parse_address():
    assert P.parse_address("traddr=127.0.0.1,trsvcid=4420,src_addr=127.0.0.1") == {
        "traddr": "127.0.0.1", "trsvcid": "4420", "src_addr": "127.0.0.1"}


def test_configfs_up_shows_every_object_and_attribute():
    st = P.parse_nvmet_configfs(fx("up-null_blk", "nvmet-find"), fx("up-null_blk", "nvmet-attrs"))
    assert st.present
    assert st.hosts == {HOST}
    sub = st.subsystems[NQN]
    assert sub.allow_any_host is False and sub.allowed_hosts == {HOST}
    ns = sub.namespaces[1]
    assert ns.device_path == "/dev/kvgate-kv0" and ns.enabled is True and ns.buffered_io is False
    port = st.ports["4420"]
    assert (port.trtype, port.adrfam, port.traddr, port.trsvcid) == ("tcp", "ipv4", "127.0.0.1", "4420")
    assert port.subsystems == {NQN}


def test_configfs_file_backing_is_buffered():
    st = P.parse_nvmet_configfs(fx("up-file", "nvmet-find"), fx("up-file", "nvmet-attrs"))
    ns = st.subsystems[NQN].namespaces[1]
    assert ns.device_path == "/tmp/kv0.img" and ns.buffered_io is True


def test_configfs_empty_and_absent():
    st = P.parse_nvmet_configfs(fx("down", "nvmet-find"), fx("down", "nvmet-attrs"))
    assert st.present and not st.subsystems and not st.ports and not st.hosts
    assert not P.parse_nvmet_configfs(fx("fresh", "nvmet-find"), "").present


def test_grep_line_split_handles_colons_in_nqn_and_slashes_in_value():
    line = f"{P.NVMET_ROOT}/subsystems/{NQN}/namespaces/1/device_path:/dev/a:b"
    st = P.parse_nvmet_configfs("", line)
    assert st.subsystems[NQN].namespaces[1].device_path == "/dev/a:b"


def test_nullb_configfs():
    devs = P.parse_nullb_configfs(fx("up-null_blk", "nullb-attrs"))
    nb = devs["kvgate-kv0"]
    assert nb.powered and nb.memory_backed and nb.size_mib == 256 and nb.index == 0
    assert P.parse_nullb_configfs(fx("down", "nullb-attrs")) == {}
