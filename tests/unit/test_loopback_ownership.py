"""kvgate's loopback replaces and undoes only what it made: ``up`` refuses a target.path holding anything but
kvgate's own link (before it does anything, naming the inventory line), records what it makes on the node, and
``down`` undoes exactly that: a brd RAM disk, configfs items, a link or a mount that were there before stay."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from harness.rigs import loopback as L
from harness.workloads.kit import integrity as I
from harness.transport.base import CommandResult

FX = Path(__file__).resolve().parents[1] / "fixtures" / "nvme"
NQN = "nqn.2024-01.io.kvgate:loopback-kv0"
SPEC = L.LoopbackSpec(name="kv0", nqn=NQN, host_nqn="nqn.2024-01.io.kvgate:host-guest",
                      host_id="6b0a4d9e-1d2c-4c1e-9a57-4b0d0c6f2f11", link_path="/dev/kvgate/kv0",
                      path_where="inv.yaml:21: nodes[0].targets[0].path")
BRD = replace(SPEC, backing="brd", link_path=None)
BOOT = "4b1d2c3e-0000-4000-8000-000000000001"


def outputs(scenario: str) -> dict:
    d = FX / scenario
    return {p.stem: (int((d / f"{p.stem}.rc").read_text()), p.read_text()) for p in d.glob("*.out")}


def state(scenario: str, created: dict[str, str] | None = None, **over) -> L.LoopbackState:
    st = L.parse_state(outputs(scenario))
    return replace(st, record=L.LoopbackRecord(BOOT, dict(created or {})), **over)


def names(actions):
    return [a.name for a in actions]


class Node:
    """A scripted node: the loopback's probes answer from a captured scenario (plus ``extra`` outputs), every
    other command succeeds and is recorded."""

    def __init__(self, scenario: str, **extra: tuple[int, str]):
        self.outs = {**outputs(scenario), **extra}
        self.ran: list[tuple[str, tuple[str, ...]]] = []

    def run(self, name, argv, timeout_s):
        if name.startswith("probe-"):
            rc, out = self.outs.get(name.removeprefix("probe-"), (1, ""))
            return CommandResult(tuple(argv), rc, out, "", 0.01)
        self.ran.append((name, tuple(argv)))
        return CommandResult(tuple(argv), 0, "", "", 0.01)


def saved_state(record: L.LoopbackRecord) -> tuple[int, str]:
    return 0, f"{BOOT}\n{record.to_json()}"


# ------------------------------------------------------------------------------- target.path (the link)

@pytest.mark.parametrize("kind, what", [("regular file", "a regular file"), ("directory", "a directory"),
                                        ("character special file", "something other than a link")])
def test_up_refuses_a_path_holding_anything_but_kvgates_link_before_doing_anything(kind, what):
    node = Node("fresh", **{"link-kind": (0, f"{kind}\n")})
    res = L.Loopback(None, SPEC, run=node.run).up(verify=False)
    assert res.refused and not res.ok
    assert res.error == (f"inv.yaml:21: nodes[0].targets[0].path: /dev/kvgate/kv0 holds {what} that kvgate did "
                         "not make; kvgate replaces only its own link (remove it, or name another path)")
    assert node.ran == []  # nothing modprobed, made, linked or recorded


def test_a_link_kvgate_did_not_make_is_refused_and_its_own_is_re_pointed():
    st = state("up-null_blk", link_target="/dev/sda", link_kind="link")
    assert "holds a link to /dev/sda that kvgate did not make" in L.link_refusal(SPEC, st)
    with pytest.raises(L.LoopbackError, match="inv.yaml:21: .*did not make"):
        L.plan_link(SPEC, st)
    # kvgate's own link (recorded, pointing where it recorded) to an older device: re-pointed
    own = state("up-null_blk", {"link:/dev/kvgate/kv0": "/dev/nvme1n1"}, link_target="/dev/nvme1n1", link_kind="link")
    assert L.link_refusal(SPEC, own) is None
    (act,) = L.plan_link(SPEC, own)
    assert act.argv == ("ln", "-sfn", "/dev/nvme0n1", "/dev/kvgate/kv0") and act.creates == "link:/dev/kvgate/kv0"
    # a link recorded as kvgate's but since pointed elsewhere by someone: not kvgate's any more
    moved = replace(own, link_target="/dev/sdb")
    assert L.link_refusal(SPEC, moved) is not None
    # nothing at the path: made with ln -s (no -f: a file that appears meanwhile is not replaced)
    free = state("up-null_blk", link_target=None, link_kind="missing")
    assert L.plan_link(SPEC, free)[-1].argv == ("ln", "-s", "/dev/nvme0n1", "/dev/kvgate/kv0")


def test_the_path_probe_reads_the_path_itself_not_what_it_points_to():
    argv = L.probe_commands(SPEC)["link-kind"]
    assert argv == ("stat", "-c", "%F", "--", "/dev/kvgate/kv0")  # no -L
    assert L.parse_link_kind((0, "symbolic link\n"), "/x") == "link"
    assert L.parse_link_kind((0, "regular empty file\n"), None) == "file"
    assert L.parse_link_kind((1, ""), None) == "missing"
    assert L.parse_link_kind(None, "/dev/nvme0n1") == "link"  # captures from before the probe existed


# ------------------------------------------------------------------------------------- down: only kvgate's

def test_down_leaves_a_brd_ram_disk_kvgate_did_not_load():
    assert "modprobe-brd" not in names(L.plan_backing(BRD, state("up-brd")))  # ram0 there: not loaded by kvgate
    assert "rmmod-brd" not in names(L.plan_down(BRD, state("up-brd", {"nvmet-subsystem:" + NQN: ""})))
    assert names(L.plan_down(BRD, state("up-brd", {"brd": ""})))[-1] == "rmmod-brd"
    # brd loaded by someone else without a ram0: kvgate does not take it for its own either
    assert "modprobe-brd" not in names(L.plan_backing(BRD, replace(state("fresh"), brd_rd_size_kib=4096)))
    fresh = L.plan_backing(BRD, state("fresh"))
    assert [a.creates for a in fresh if a.name == "modprobe-brd"] == ["brd"]


def test_down_through_the_driver_leaves_a_pre_existing_ram_disk_and_says_so():
    node = Node("up-brd", state=saved_state(L.LoopbackRecord(BOOT, {})))
    res = L.Loopback(None, BRD, run=node.run).down()
    assert node.ran == [] and res.ok  # nothing of it was kvgate's: nothing undone, nothing left behind
    assert "brd" in res.left_alone and f"nvmet-subsystem:{NQN}" in res.left_alone
    # what kvgate recorded is undone, brd last, and the record written without it
    made = {i: "" for i, there in L.record_ids(BRD).items() if there(L.parse_state(outputs("up-brd")))}
    node = Node("up-brd", state=saved_state(L.LoopbackRecord(BOOT, made)))
    L.Loopback(None, BRD, run=node.run).down()
    assert [n for n, _ in node.ran if n != "state-write"][-1] == "rmmod-brd"
    assert json.loads(node.ran[-1][1][-1])["created"] == {}


def test_down_undoes_exactly_what_up_recorded():
    # the subsystem, its namespace and the host were there before up; up added the port and its link only
    st = state("up-null_blk", {f"nvmet-port:4420": "", f"nvmet-port-link:4420:{NQN}": "",
                               "link:/dev/kvgate/kv0": "/dev/nvme0n1"})
    assert names(L.plan_down(SPEC, st)) == ["link-remove", "port4420-unlink", "port-rmdir"]
    # nothing recorded: nothing undone (not the link, the mount, the connect or the null_blk device)
    assert L.plan_down(SPEC, state("up-null_blk")) == []
    # a recorded link someone re-pointed since is theirs now
    assert L.plan_down(SPEC, state("up-null_blk", {"link:/dev/kvgate/kv0": "/dev/nvme7n1"})) == []


def test_a_record_of_another_boot_or_unreadable_names_nothing_and_gone_objects_are_pruned():
    rec = L.LoopbackRecord(BOOT, {"brd": ""})
    assert L.parse_record(f"{BOOT}\n{rec.to_json()}").created == {"brd": ""}
    assert L.parse_record(f"another-boot\n{rec.to_json()}").created == {}
    assert L.parse_record(f"{BOOT}\n{{not json").created == {}
    assert L.parse_record(f"{BOOT}\n" + json.dumps({"format": 1, "boot_id": BOOT, "created": {"a": 1}})).created == {}
    assert L.parse_record(f"{BOOT}\n").created == {}
    # recorded, but gone (removed by hand): forgotten, so a later one of the same name is not taken for kvgate's
    st = state("down", {f"nullb:{SPEC.nullb_name}": "", f"nvmet-subsystem:{NQN}": "", "other-node-object": "x"})
    assert L.pruned(SPEC, st).created == {"other-node-object": "x"}


def test_up_records_what_it_made_and_only_that():
    st = state("down")
    st.nullb = state("up-null_blk").nullb
    st.block_devices = {"kvgate-kv0"}
    creates = {a.creates for a in L.plan_target(SPEC, st) if a.creates}
    assert creates == {f"nvmet-host:{SPEC.host_nqn}", f"nvmet-subsystem:{NQN}",
                       f"nvmet-allowed-host:{NQN}:{SPEC.host_nqn}", f"nvmet-namespace:{NQN}:1", "nvmet-port:4420",
                       f"nvmet-port-link:4420:{NQN}", f"connect:{NQN}"}
    # a state write is an argument, never shell text
    act = L.state_write_action(L.LoopbackRecord(BOOT, {"link:/x'; reboot; '": "$(reboot)"}))
    assert act.argv[:2] == ("sh", "-c") and act.argv[3:5] == ("kvgate-loopback-state", L.STATE_DIR)
    assert json.loads(act.argv[5])["created"] == {"link:/x'; reboot; '": "$(reboot)"}


def test_the_pattern_writer_writes_only_the_path_a_guard_decision_allowed(tmp_path):
    from harness.writeguard import WriteDecision

    node = Node("fresh")
    io = I.PatternIO(None, node.run)
    data = I.pattern_bytes("s", 65536)
    ok = WriteDecision("/dev/other", "test", "block", True, "blank")
    no = WriteDecision("/dev/nvme0n1", "test", "block", False, "/dev/nvme0n1 is mounted at /mnt/kvgate-kv")
    for decision in (None, ok, no):  # none, one for another path, a refusal
        check = io.write_read("nvme->backing", data, "/dev/nvme0n1", "/dev/kvgate-kv0", True, True, 65536, 1,
                              "/tmp/x", tmp_path, decision)
        assert not check.ok and check.error.endswith("nothing was written")
    assert node.ran == []


def test_down_forgets_on_the_node_what_went_away_without_kvgate():
    # kvgate's null_blk device was removed by hand; its record stays until a down (or up) prunes it
    node = Node("down", state=saved_state(L.LoopbackRecord(BOOT, {f"nullb:{SPEC.nullb_name}": "", "x:y": "z"})))
    res = L.Loopback(None, SPEC, run=node.run).down()
    assert res.ok and [n for n, _ in node.ran] == ["state-write"]
    assert json.loads(node.ran[0][1][-1])["created"] == {"x:y": "z"}
    node = Node("down", state=saved_state(L.LoopbackRecord(BOOT, {"x:y": "z"})))
    assert L.Loopback(None, SPEC, run=node.run).down().actions == [] and node.ran == []


def test_a_probe_that_exits_0_with_no_output_is_asked_again_and_never_read_as_absent():
    """Seen in the qemu guest under load: readlink and stat exited 0 with their output lost on the way. Read as
    "absent", kvgate's own link was forgotten and left behind by down; now the probe is asked again, and a
    probe that keeps losing its answer stops the operation instead of planning from nothing."""
    made = {i: "" for i, there in L.record_ids(SPEC).items() if there(L.parse_state(outputs("up-null_blk")))}
    made["link:/dev/kvgate/kv0"] = "/dev/nvme0n1"

    class Lossy(Node):
        def __init__(self, losses: int):
            super().__init__("up-null_blk", state=saved_state(L.LoopbackRecord(BOOT, made)),
                             **{"link-kind": (0, "symbolic link\n")})
            self.losses = losses

        def run(self, name, argv, timeout_s):
            if name in ("probe-link", "probe-link-kind") and self.losses:
                self.losses -= 1
                return CommandResult(tuple(argv), 0, "", "", 0.01)
            return super().run(name, argv, timeout_s)

    node = Lossy(losses=2)
    acts = L.plan_down(SPEC, L.Loopback(None, SPEC, run=node.run).probe())
    assert names(acts)[0] == "link-remove"
    node = Lossy(losses=10)
    with pytest.raises(L.LoopbackError, match="probe link exited 0 with no output 3 times"):
        L.Loopback(None, SPEC, run=node.run).probe()
    assert node.ran == []


def test_the_error_of_a_failed_up_names_the_failed_action_not_the_state_write_after_it():
    class Failing(Node):
        def run(self, name, argv, timeout_s):
            if name == "ns-enable":
                self.ran.append((name, tuple(argv)))
                return CommandResult(tuple(argv), 1, "", "No such device", 0.01)
            return super().run(name, argv, timeout_s)

    node = Failing("down")
    node.outs["nullb-attrs"] = outputs("up-null_blk")["nullb-attrs"]
    node.outs["block-devices"] = (0, "kvgate-kv0\n")
    res = L.Loopback(None, SPEC, run=node.run, sleep=lambda s: None).up(verify=False)
    assert res.error == "target setup failed at ns-enable: No such device"
    assert [n for n, _ in node.ran][-1] == "state-write"  # what was made before is recorded all the same
