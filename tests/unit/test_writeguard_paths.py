"""The write guard's pure decisions for what the integrity gate writes: a lost blkid answer is never read as
"blank", and a second path to judged storage (an NVMe-oF namespace over a loopback's backing) is refused while
mounted or read-only."""

from dataclasses import replace

from harness.parsers.blockdev import BlockDevice
from harness.writeguard import WriteDecision, decide_block, decide_same_storage

BLANK = BlockDevice("nvme0n1", "/dev/nvme0n1", "disk", 1 << 28, False, None, None, "abc", None, None)


def _allowed(destructive: bool = False) -> WriteDecision:
    return WriteDecision("/dev/kvgate-kv2", "integrity", "block", True, "blank", allow_destructive=destructive)


def test_blkid_exiting_0_without_naming_a_signature_is_refused():
    ok, why = decide_block(BLANK, {}, 0, False, None)
    assert not ok and "output lost" in why
    assert decide_block(BLANK, {}, 2, False, None)[0]  # 2: nothing found
    ok, why = decide_same_storage(BLANK, {}, 0, _allowed())
    assert not ok and "output lost" in why


def test_the_namespace_over_judged_storage_is_refused_mounted_read_only_or_holding_data_judged_blank():
    assert decide_same_storage(BLANK, {}, 2, _allowed())[0]
    mounted = replace(BLANK, mountpoint="/mnt/kvgate-kv")
    ok, why = decide_same_storage(mounted, {}, 2, _allowed(destructive=True))
    assert not ok and "/dev/nvme0n1 is mounted at /mnt/kvgate-kv" in why
    part = replace(BLANK, children=(replace(BLANK, name="nvme0n1p1", path="/dev/nvme0n1p1", mountpoint="/data"),))
    assert "mounted at /data" in decide_same_storage(part, {}, 2, _allowed(destructive=True))[1]
    assert "read-only" in decide_same_storage(replace(BLANK, ro=True), {}, 2, _allowed())[1]
    ok, why = decide_same_storage(BLANK, {"TYPE": "ext4"}, 0, _allowed())
    assert not ok and "holds filesystem ext4" in why  # the backing was judged blank: the answers disagree
    assert decide_same_storage(BLANK, {"TYPE": "ext4"}, 0, _allowed(destructive=True))[0]
    refused = replace(_allowed(), allowed=False, reason="holds filesystem ext4")
    ok, why = decide_same_storage(BLANK, {}, 2, refused)
    assert not ok and "which the guard refused" in why


def test_a_guard_probe_whose_output_was_cut_short_is_asked_again():
    from harness.transport.base import CommandResult
    from harness.writeguard import check_write

    lsblk = ('{"blockdevices": [{"name": "nvme0n1", "path": "/dev/nvme0n1", "type": "disk", "size": 268435456, '
             '"ro": false, "mountpoint": null, "fstype": null, "pttype": null, "serial": "abc"}]}')
    answers = {"guard-stat": ["block\nforeign\n", "block\nforeign\n268435456\n"],  # the size line lost once
               "guard-lsblk": ["", lsblk], "guard-blkid": [(0, ""), (0, "TYPE=ext4\n")]}
    asked = []

    def run(name, argv, timeout_s):
        asked.append(name)
        a = answers[name].pop(0) if len(answers[name]) > 1 else answers[name][0]
        rc, out = a if isinstance(a, tuple) else (0, a)
        return CommandResult(tuple(argv), rc, out, "", 0.01)

    d = check_write(run, "/dev/nvme0n1", expect="block", purpose="test")
    assert asked == ["guard-stat", "guard-stat", "guard-lsblk", "guard-lsblk", "guard-blkid", "guard-blkid"]
    assert not d.allowed and "holds filesystem ext4" in d.reason  # the lost blkid answer was not read as blank
