"""The write rule for block devices, on captured lsblk and blkid output of loop devices."""

from harness.parsers.blockdev import find_device, parse_blkid_export, parse_lsblk, write_allowed


def test_lsblk_tree(fixtures):
    devs = parse_lsblk((fixtures / "lsblk" / "vm_vda_loop.json").read_text())
    vda = find_device(devs, "/dev/vda")
    assert vda.size_bytes == 274877906944 and vda.mountpoint == "/"
    assert write_allowed(vda, {}, True, "x")[0] is False  # mounted, serial cannot match


def test_blkid_signatures_block_writes(fixtures):
    devs = parse_lsblk((fixtures / "lsblk" / "loop_ext4_gpt_blank.json").read_text())
    loop0 = find_device(devs, "/dev/loop0")
    ext4 = parse_blkid_export((fixtures / "lsblk" / "blkid_ext4.txt").read_text())
    dos = parse_blkid_export((fixtures / "lsblk" / "blkid_dos_pt.txt").read_text())
    blank = parse_blkid_export((fixtures / "lsblk" / "blkid_blank.txt").read_text())
    assert ext4["TYPE"] == "ext4" and dos["PTTYPE"] == "dos" and blank == {}
    ok, why = write_allowed(loop0, ext4, False, None)
    assert not ok and "filesystem ext4" in why
    ok, why = write_allowed(loop0, dos, False, None)
    assert not ok and "partition table dos" in why
    assert write_allowed(loop0, blank, False, None)[0]


def test_destructive_needs_matching_serial():
    from harness.parsers.blockdev import BlockDevice
    dev = BlockDevice("nvme0n1", "/dev/nvme0n1", "disk", 10, False, "xfs", None, "S123", None, None)
    assert not write_allowed(dev, {}, True, "OTHER")[0]
    assert not write_allowed(dev, {}, False, "S123")[0]
    assert write_allowed(dev, {}, True, "S123")[0]
