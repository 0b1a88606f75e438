"""Provisioning order, idempotency and teardown, planned from real probe outputs."""

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.rigs import loopback as L
from harness.workloads.kit import integrity as I

FX = Path(__file__).resolve().parents[1] / "fixtures" / "nvme"
NQN = "nqn.2024-01.io.kvgate:loopback-kv0"
SPEC = L.LoopbackSpec(name="kv0", nqn=NQN, host_nqn="nqn.2024-01.io.kvgate:host-guest",
                      host_id="6b0a4d9e-1d2c-4c1e-9a57-4b0d0c6f2f11", link_path="/dev/kvgate/kv0")


def outputs(scenario: str) -> dict:
    d = FX / scenario
    return {p.stem: (int((d / f"{p.stem}.rc").read_text()), p.read_text()) for p in d.glob("*.out")}


def state(scenario: str, drop: tuple[str, ...] = ()) -> L.LoopbackState:
    outs = outputs(scenario)
    for name in drop:
        outs.pop(name, None)
    return L.parse_state(outs)


def names(actions):
    return [a.name for a in actions]


def kvgates(st: L.LoopbackState, spec: L.LoopbackSpec = SPEC) -> L.LoopbackState:
    """The state as kvgate's own ``up`` left it: every object of the spec that is there is in its record."""
    created = {}
    for rid, there in L.record_ids(spec).items():
        if there(st):
            detail = ""
            if rid.startswith("link:"):
                detail = st.link_target or ""
            elif rid.startswith("mount:"):
                detail = L.mounted_filesystem(spec, st)[0]
            created[rid] = detail
    return replace(st, record=L.LoopbackRecord("boot-1", created))


def test_fresh_node_plans_modules_then_backing():
    acts = L.plan_backing(SPEC, state("fresh"))
    assert names(acts) == ["modprobe-nvmet", "modprobe-nvmet-tcp", "modprobe-nvme-tcp", "modprobe-null_blk",
                           "nullb-mkdir", "nullb-size", "nullb-memory_backed", "nullb-blocksize", "nullb-power"]
    size = next(a for a in acts if a.name == "nullb-size")
    assert size.argv[-2:] == ("256", "/sys/kernel/config/nullb/kvgate-kv0/size")


def test_target_order_on_empty_configfs():
    st = state("down")
    st.nullb = state("up-null_blk").nullb  # backing made, nothing else
    st.block_devices = {"kvgate-kv0"}
    acts = L.plan_target(SPEC, st)
    order = names(acts)
    assert order == ["host-mkdir", "subsys-mkdir", "subsys-allow_any_host", "subsys-allow-host", "ns-mkdir",
                     "ns-device_path", "ns-enable", "port-mkdir", "port-trtype", "port-adrfam", "port-traddr",
                     "port-trsvcid", "port-link", "nvme-connect"]
    dp = acts[order.index("ns-device_path")]
    assert dp.argv[4:] == ("/dev/kvgate-kv0", f"/sys/kernel/config/nvmet/subsystems/{NQN}/namespaces/1/device_path")
    connect = acts[-1].argv
    assert connect[:9] == ("nvme", "connect", "-t", "tcp", "-a", "127.0.0.1", "-s", "4420", "-n")
    assert "--hostnqn" in connect and SPEC.host_nqn in connect


def test_up_twice_plans_nothing_new():
    st = state("up-null_blk")
    assert [a for a in L.plan_backing(SPEC, st) if not a.name.startswith("modprobe")] == []
    assert L.plan_target(SPEC, st) == []
    assert L.plan_link(SPEC, st) == []
    assert L.summarize(SPEC, st)["state"] == "up"


def test_down_reverses_up():
    acts = L.plan_down(SPEC, kvgates(state("up-null_blk")))
    assert names(acts) == ["link-remove", "nvme-disconnect", "port4420-unlink", "port-rmdir", "ns1-disable",
                           "ns1-rmdir", "subsys-disallow-host", "subsys-rmdir", "host-rmdir", "nullb-power-off",
                           "nullb-rmdir"]


def test_down_when_down_does_nothing():
    assert L.plan_down(SPEC, state("down")) == []
    assert L.plan_down(SPEC, state("fresh")) == []
    assert L.summarize(SPEC, state("fresh"))["state"] == "down"


def test_down_after_half_done_up_removes_only_what_exists():
    # up stopped before the port and the connect: configfs has host/subsystem/namespace only
    st = state("up-null_blk", drop=("list-subsys", "list-namespaces", "link"))
    st.nvmet.ports.clear()
    assert L.summarize(SPEC, st)["state"] == "partial"
    assert names(L.plan_down(SPEC, kvgates(st))) == ["ns1-disable", "ns1-rmdir", "subsys-disallow-host", "subsys-rmdir",
                                            "host-rmdir", "nullb-power-off", "nullb-rmdir"]


def test_half_done_up_resumes_where_it_stopped():
    st = state("up-null_blk", drop=("list-subsys", "list-namespaces", "link"))
    st.nvmet.ports.clear()
    assert names(L.plan_target(SPEC, st)) == ["port-mkdir", "port-trtype", "port-adrfam", "port-traddr",
                                              "port-trsvcid", "port-link", "nvme-connect"]


def test_namespace_serving_other_device_is_an_error():
    st = state("up-null_blk")
    st.nvmet.subsystems[NQN].namespaces[1].device_path = "/dev/sda"
    with pytest.raises(L.LoopbackError, match="already serves /dev/sda"):
        L.plan_target(SPEC, st)


def test_port_used_by_another_subsystem_with_other_address_is_an_error():
    st = state("up-null_blk")
    port = st.nvmet.ports["4420"]
    port.subsystems.add("nqn.2024-01.io.example:other")
    port.traddr = "127.0.0.2"
    with pytest.raises(L.LoopbackError, match="choose another trsvcid"):
        L.plan_target(SPEC, st)


def test_shared_port_is_kept_on_down():
    st = state("up-null_blk")
    st.nvmet.ports["4420"].subsystems.add("nqn.2024-01.io.example:other")
    assert "port-rmdir" not in names(L.plan_down(SPEC, kvgates(st)))


def test_brd_and_file_backings():
    brd = replace(SPEC, backing="brd")
    st = state("up-brd")
    assert L.backing_device(brd, st) == "/dev/ram0" and L.plan_target(brd, st) == []
    assert names(L.plan_down(brd, kvgates(st, brd)))[-1] == "rmmod-brd"
    f = replace(SPEC, backing="file", backing_path="/tmp/kv0.img")
    st = state("up-file")
    assert L.backing_device(f, st) == "/tmp/kv0.img" and st.file_created_by_kvgate
    assert names(L.plan_down(f, kvgates(st, f)))[-1] == "file-remove"
    fresh = L.plan_backing(f, state("fresh"))
    assert names(fresh)[-3:] == ["file-mkdir", "file-create", "file-mark-created"]


def test_brd_loaded_too_small_is_an_error():
    st = state("up-brd")
    st.nvmet.subsystems.clear()
    big = replace(SPEC, backing="brd", size_bytes=1 << 30)
    with pytest.raises(L.LoopbackError, match="rmmod brd"):
        L.plan_target(big, st)


def test_missing_backing_is_an_error():
    with pytest.raises(L.LoopbackError, match="not present"):
        L.plan_target(SPEC, state("down"))


def test_attribute_write_passes_value_as_argument_not_shell_text():
    a = L.write_attr("x", "/sys/p", "$(reboot)")
    assert a.argv[:3] == ("sh", "-c", 'printf "%s" "$1" > "$2"') and a.argv[4:] == ("$(reboot)", "/sys/p")


def test_spec_from_inventory_target():
    t = SimpleNamespace(name="kv0", kind="nvmeof-loopback", nqn=NQN, traddr=None, trsvcid=None, transport=None,
                        backing="brd", backing_path=None, size_bytes=64 << 20, path="/dev/kvgate/kv0",
                        allow_destructive=False)
    spec = L.LoopbackSpec.from_target(t, "guest")
    assert (spec.traddr, spec.trsvcid, spec.port_id, spec.backing) == ("127.0.0.1", "4420", "4420", "brd")
    assert spec.host_nqn == "nqn.2024-01.io.kvgate:host-guest"
    assert spec.host_id == L.LoopbackSpec.from_target(t, "guest").host_id  # stable across runs
    with pytest.raises(L.LoopbackError, match="expected nvmeof-loopback"):
        L.LoopbackSpec.from_target(SimpleNamespace(name="x", kind="block"), "guest")
    with pytest.raises(L.LoopbackError, match="whole number of MiB"):
        replace(SPEC, size_bytes=(64 << 20) + 1)
    with pytest.raises(L.LoopbackError, match="needs backing_path"):
        replace(SPEC, backing="block")


def test_pattern_and_mismatch_count():
    a = I.pattern_bytes("s", 100_000)
    assert len(a) == 100_000 and a == I.pattern_bytes("s", 100_000) and a != I.pattern_bytes("t", 100_000)
    assert I.count_mismatched_bytes(a, a) == 0
    b = bytearray(a)
    b[10] ^= 1
    b[99_999] ^= 0xFF
    assert I.count_mismatched_bytes(a, bytes(b)) == 2
    assert I.count_mismatched_bytes(a, a[:-5]) == 5


# ----------------------------------------------------------------------------- over RDMA (soft-RoCE)

RDMA = replace(SPEC, name="kv1", nqn="nqn.2024-01.io.kvgate:loopback-kv1", transport="rdma", traddr="10.0.2.15",
               trsvcid="4421", soft_roce_netdev="eth0", link_path=None, connect_host=False)
NVMEOF = Path(__file__).resolve().parents[1] / "fixtures" / "nvmeof"


def with_links(st: L.LoopbackState, scenario: str | None) -> L.LoopbackState:
    """The loopback state plus the RDMA links a guest capture shows (tests/fixtures/nvmeof/)."""
    st.rdma_links = L.parse_rdma_links((NVMEOF / scenario / "rdma-links.out").read_text()) if scenario else []
    return st


def test_rdma_adds_soft_roce_on_the_nic_then_an_rdma_port_and_leaves_the_connect_to_the_nvmeof_target():
    st = with_links(state("fresh"), None)
    acts = L.plan_backing(RDMA, st)
    assert names(acts)[:4] == ["modprobe-rdma_rxe", "modprobe-nvmet", "modprobe-nvmet-rdma", "modprobe-nvme-rdma"]
    add = next(a for a in acts if a.name == "rdma-link-add")
    assert add.argv == ("rdma", "link", "add", "kvgate-eth0", "type", "rxe", "netdev", "eth0")
    assert "rdma-links" in L.probe_commands(RDMA)
    st = with_links(state("down"), "none")
    assert "rdma-link-add" not in names(L.plan_backing(RDMA, st))  # the device on eth0 is there already
    st.nullb = {"kvgate-kv1": L.P.NullbDevice("kvgate-kv1", {"power": "1"})}
    st.block_devices = {"kvgate-kv1"}
    acts = L.plan_target(RDMA, st)
    assert "nvme-connect" not in names(acts)
    trtype = next(a for a in acts if a.name == "port-trtype")
    assert trtype.argv[4:] == ("rdma", "/sys/kernel/config/nvmet/ports/4421/addr_trtype")
    # a loopback that connects its own host does so over rdma
    connect = L.plan_target(replace(RDMA, connect_host=True), st)[-1].argv
    assert connect[:9] == ("nvme", "connect", "-t", "rdma", "-a", "10.0.2.15", "-s", "4421", "-n")


def test_rdma_status_layers_and_the_rdma_device():
    st = with_links(state("down"), "none")
    s = L.summarize(RDMA, st)
    assert s["layers"]["rdma_link"] is True and "connected" not in s["layers"] and "device" not in s["layers"]
    assert s["rdma_device"] == "kvgate-eth0 port 1 on eth0 (ACTIVE)"
    assert "kind: nvmeof target" in s["host_side"]


def test_rdma_down_deletes_only_kvgates_soft_roce_device_and_only_when_no_rdma_port_needs_it():
    st = kvgates(with_links(state("down"), "none"), RDMA)
    assert names(L.plan_down(RDMA, st))[-1] == "rdma-link-delete"
    st.nvmet.ports["4422"] = L.P.PortState("4422", trtype="rdma", traddr="10.0.2.15", trsvcid="4422",
                                            subsystems={"nqn.2024-01.io.kvgate:other"})
    assert "rdma-link-delete" not in names(L.plan_down(RDMA, st))
    st = with_links(state("down"), "none")
    st.rdma_links = [replace(link, device="rxe0") for link in st.rdma_links]  # the node's own device
    assert "rdma-link-delete" not in names(L.plan_down(RDMA, st))
    s = L.summarize(RDMA, st)
    assert "rdma_link" not in s["owned_layers"]


def test_rdma_spec_needs_a_nic_other_than_lo():
    with pytest.raises(L.LoopbackError, match="soft_roce_netdev"):
        replace(RDMA, soft_roce_netdev=None)
    with pytest.raises(L.LoopbackError, match="other than lo"):
        replace(RDMA, soft_roce_netdev="lo")
    with pytest.raises(L.LoopbackError, match="tcp or rdma"):
        replace(RDMA, transport="fc")


# ---- a filesystem kvgate makes on the namespace (kv-read's pool on the loopback)

FS_SPEC = replace(SPEC, filesystem="ext4", mount_path="/mnt/kvgate-kv")


def with_mount(st: L.LoopbackState, source: str, point: str = "/mnt/kvgate-kv", fstype: str = "ext4"):
    return replace(st, mounts={**st.mounts, point: (source, fstype)})


def test_mounts_parse_with_octal_escapes_and_the_last_mount_on_a_point_wins():
    m = L.parse_mounts("/dev/vda / ext4 rw 0 0\n/dev/nvme0n1 /mnt/my\\040pool ext4 rw 0 0\n"
                       "tmpfs /mnt/my\\040pool tmpfs rw 0 0\n")
    assert m["/"] == ("/dev/vda", "ext4") and m["/mnt/my pool"] == ("tmpfs", "tmpfs")


def test_down_unmounts_the_filesystem_before_it_disconnects():
    st = kvgates(with_mount(state("up-null_blk"), "/dev/nvme0n1"), FS_SPEC)
    acts = L.plan_down(FS_SPEC, st)
    assert names(acts)[:3] == ["umount", "link-remove", "nvme-disconnect"]
    assert acts[0].argv == ("umount", "/mnt/kvgate-kv")
    assert "umount" not in names(L.plan_down(FS_SPEC, state("up-null_blk")))  # nothing mounted: nothing to undo
    fs = L.summarize(FS_SPEC, st)["filesystem"]
    assert fs == {"type": "ext4", "mount_path": "/mnt/kvgate-kv", "mounted": {"source": "/dev/nvme0n1", "type": "ext4"}}


def test_filesystem_needs_the_loopback_to_connect_its_host_side():
    with pytest.raises(L.LoopbackError, match="go together"):
        replace(SPEC, filesystem="ext4")
    with pytest.raises(L.LoopbackError, match="target side only"):
        replace(FS_SPEC, connect_host=False)


class Node:
    """A scripted node for the filesystem step: argv prefix -> (rc, stdout); records what ran."""

    def __init__(self, answers: dict[tuple[str, ...], tuple[int, str]]):
        self.answers, self.ran = answers, []

    def run(self, name, argv, timeout_s):
        from harness.transport.base import CommandResult
        self.ran.append(tuple(argv))
        rc, out = next((v for k, v in self.answers.items() if tuple(argv[:len(k)]) == k), (0, ""))
        return CommandResult(tuple(argv), rc, out, "", 0.01)


def _fs(node: Node, st: L.LoopbackState, verify=None):
    lb = L.Loopback(SimpleNamespace(name="guest"), FS_SPEC, run=node.run)
    records = []
    integrity, error, decision = lb._filesystem(st, records, verify)
    return error, records, decision


def test_a_blank_namespace_passes_the_write_guard_then_gets_ext4_and_is_mounted():
    lsblk = ('{"blockdevices": [{"name": "nvme0n1", "kname": "nvme0n1", "path": "/dev/nvme0n1", "type": "disk", '
             '"size": 268435456, "ro": false, "mountpoint": null, "fstype": null, "pttype": null, "serial": "abc"}]}')
    node = Node({("blkid",): (2, ""), ("sh", "-c"): (0, "block\nforeign\n268435456\n"), ("lsblk",): (0, lsblk)})
    error, records, decision = _fs(node, state("up-null_blk"))
    assert error is None, error
    assert decision.allowed and decision.path == "/dev/nvme0n1"  # asked before anything was written
    assert [r.name for r in records] == ["mkfs", "state-write", "mount-dir", "mount", "state-write"]
    records = [r for r in records if r.name != "state-write"]
    assert records[0].argv[0] == "/usr/sbin/mke2fs" and records[0].argv[-1] == "/dev/nvme0n1"
    fs_uuid = records[0].argv[records[0].argv.index("-U") + 1]
    saved = json.loads(node.ran[-1][-1])  # what kvgate made is recorded on the node: its filesystem, its mount
    assert saved["created"] == {f"filesystem:{NQN}:1": fs_uuid, "mount:/mnt/kvgate-kv": "/dev/nvme0n1"}
    assert "-t" in records[0].argv and "ext4" in records[0].argv
    assert records[2].argv == ("mount", "-t", "ext4", "/dev/nvme0n1", "/mnt/kvgate-kv")


def test_a_namespace_holding_another_filesystem_is_not_formatted_over():
    node = Node({("blkid",): (0, "TYPE=xfs\nUUID=1\n")})
    error, records, _ = _fs(node, state("up-null_blk"))
    assert "holds a xfs filesystem" in error and records == []
    assert not any(a[0].endswith("mke2fs") or a[0] == "mount" for a in node.ran)


def test_ext4_from_an_earlier_up_is_mounted_as_it_is_and_a_mounted_one_is_left_alone():
    node = Node({("blkid",): (0, "TYPE=ext4\nUUID=0b5e-kvgate\n")})
    st = replace(state("up-null_blk"), record=L.LoopbackRecord("boot-1", {f"filesystem:{NQN}:1": "0b5e-kvgate"}))
    error, records, _ = _fs(node, st, verify=I.loopback_integrity)  # no integrity patterns over the filesystem
    assert error is None and [r.name for r in records] == ["mount-dir", "mount", "state-write"]
    assert not any("dd" in a[0] for a in node.ran)
    # an ext4 kvgate did not make (no record of it, or another UUID) is neither mounted nor written
    for record in (L.LoopbackRecord("boot-1", {}), L.LoopbackRecord("boot-1", {f"filesystem:{NQN}:1": "other"})):
        node = Node({("blkid",): (0, "TYPE=ext4\nUUID=0b5e-kvgate\n")})
        error, records, _ = _fs(node, replace(state("up-null_blk"), record=record), verify=I.loopback_integrity)
        assert "that kvgate did not make: not mounted" in error and records == []
        assert [a[0] for a in node.ran] == ["blkid"]
    node = Node({})
    error, records, _ = _fs(node, with_mount(state("up-null_blk"), "/dev/nvme0n1"))
    assert error is None and records == [] and node.ran == []
    error, _, _ = _fs(Node({}), with_mount(state("up-null_blk"), "/dev/vdb"))
    assert "holds /dev/vdb" in error
