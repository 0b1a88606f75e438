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
