"""Provisioning order, idempotency and teardown, planned from real probe outputs."""

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.rigs import loopback as L

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
    acts = L.plan_down(SPEC, state("up-null_blk"))
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
    assert names(L.plan_down(SPEC, st)) == ["ns1-disable", "ns1-rmdir", "subsys-disallow-host", "subsys-rmdir",
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
    assert "port-rmdir" not in names(L.plan_down(SPEC, st))


def test_brd_and_file_backings():
    brd = replace(SPEC, backing="brd")
    st = state("up-brd")
    assert L.backing_device(brd, st) == "/dev/ram0" and L.plan_target(brd, st) == []
    assert names(L.plan_down(brd, st))[-1] == "rmmod-brd"
    f = replace(SPEC, backing="file", backing_path="/tmp/kv0.img")
    st = state("up-file")
    assert L.backing_device(f, st) == "/tmp/kv0.img" and st.file_created_by_kvgate
    assert names(L.plan_down(f, st))[-1] == "file-remove"
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
    a = L.pattern_bytes("s", 100_000)
    assert len(a) == 100_000 and a == L.pattern_bytes("s", 100_000) and a != L.pattern_bytes("t", 100_000)
    assert L.count_mismatched_bytes(a, a) == 0
    b = bytearray(a)
    b[10] ^= 1
    b[99_999] ^= 0xFF
    assert L.count_mismatched_bytes(a, bytes(b)) == 2
    assert L.count_mismatched_bytes(a, a[:-5]) == 5
