"""The write guard's parsers and decisions, on probe output captured from real loop devices and a virtio VM.

The node is scripted at the runner seam (step name -> CommandResult); the real commands on real loop
devices are exercised in tests/integration/test_write_guard_loop.py.
"""

from dataclasses import replace

import pytest

from harness.parsers.blockdev import BlockDevice, parse_lsblk
from harness.transport import CommandResult
from harness.writeguard import (check_write, decide_block, device_serial, identity_argv, parse_identity,
                                parse_path_probe, path_probe_argv)

IMG = "/tmp/wgcap/ext4.img"  # the backing file of the captured loop device
LOOP_SERIAL = "loop:" + IMG


def read(fixtures, name):
    return (fixtures / "writeguard" / name).read_text()


def test_path_probe_parses_captured_output(fixtures):
    assert parse_path_probe(read(fixtures, "path_probe_block.txt")).kind == "block"
    missing = parse_path_probe(read(fixtures, "path_probe_missing.txt"))
    assert (missing.kind, missing.created_by_kvgate, missing.size_bytes) == ("missing", False, None)
    made = parse_path_probe(read(fixtures, "path_probe_created_file.txt"))
    assert (made.kind, made.created_by_kvgate, made.size_bytes) == ("file", True, 1)
    theirs = parse_path_probe(read(fixtures, "path_probe_foreign_file.txt"))
    assert (theirs.kind, theirs.created_by_kvgate, theirs.size_bytes) == ("file", False, 4096)
    assert parse_path_probe(read(fixtures, "path_probe_directory.txt")).kind == "other"
    assert parse_path_probe("") is None and parse_path_probe("block\nmaybe\n0\n") is None


def test_probes_pass_paths_as_arguments_not_shell_text():
    argv = path_probe_argv("/x/$(reboot) a.bin")
    assert argv[:2] == ("sh", "-c") and argv[-2:] == ("/x/$(reboot) a.bin", "/x/$(reboot) a.bin.kvgate-created")
    assert identity_argv("loop0")[-1] == "loop0"


def test_serial_comes_from_lsblk_then_sysfs_then_a_loops_backing_file(fixtures):
    loop = parse_lsblk(read(fixtures, "lsblk_loop_ext4.json"))[0]
    assert loop.serial is None  # lsblk shows no serial for a loop device
    ident = parse_identity(read(fixtures, "identity_loop.txt"))
    assert ident == {"loop/backing_file": IMG}
    assert device_serial(loop, ident) == (LOOP_SERIAL, "/sys/class/block/loop0/loop/backing_file")
    # virtio: lsblk without udev shows no serial, the kernel's sysfs attribute has it
    vda = BlockDevice("vda", "/dev/vda", "disk", 1, False, None, None, None, None, None)
    assert device_serial(vda, parse_identity(read(fixtures, "identity_vda_virtio.txt"))) == \
        ("overlayblk", "/sys/class/block/vda/serial")
    nvme = BlockDevice("nvme0n1", "/dev/nvme0n1", "disk", 1, False, None, None, "S4EV", None, None)
    assert device_serial(nvme, {"device/serial": "OTHER"}) == ("S4EV", "lsblk SERIAL")
    assert parse_identity("serial=\ndevice/serial=  \n") == {}  # empty attributes are no serial


class Node:
    """Answers the guard's probes from captured outputs; records what was asked."""

    def __init__(self, fixtures, path_probe="path_probe_block.txt", blkid=("blkid_loop_ext4.txt", 0),
                 lsblk="lsblk_loop_ext4.json", identity="identity_loop.txt"):
        self.out = {"guard-stat": (read(fixtures, path_probe), 0),
                    "guard-lsblk": (read(fixtures, lsblk) if lsblk else "", 0 if lsblk else 32),
                    "guard-blkid": (read(fixtures, blkid[0]) if blkid[0] else "", blkid[1]),
                    "guard-identity": (read(fixtures, identity), 0)}
        self.asked = []

    def __call__(self, name, argv, timeout_s):
        self.asked.append(name)
        text, rc = self.out[name]
        return CommandResult(tuple(argv), rc, text, "", 0.01)


def test_loop_with_ext4_is_refused_naming_device_and_what_it_holds(fixtures):
    node = Node(fixtures)
    d = check_write(node, "/dev/loop0", expect="block", purpose="test")
    assert not d.allowed and "/dev/loop0" in d.reason and "filesystem ext4" in d.reason
    assert d.device_serial == LOOP_SERIAL and d.evidence["blkid"]["TYPE"] == "ext4"
    assert node.asked == ["guard-stat", "guard-lsblk", "guard-blkid", "guard-identity"]


def test_partition_table_is_refused(fixtures):
    d = check_write(Node(fixtures, blkid=("../lsblk/blkid_dos_pt.txt", 0)), "/dev/loop0", expect="block",
                    purpose="test")
    assert not d.allowed and "partition table dos" in d.reason


def test_allow_destructive_needs_the_matching_serial(fixtures):
    ok = check_write(Node(fixtures), "/dev/loop0", expect="block", purpose="t", allow_destructive=True,
                     serial=LOOP_SERIAL)
    assert ok.allowed and "matching serial" in ok.reason
    wrong = check_write(Node(fixtures), "/dev/loop0", expect="block", purpose="t", allow_destructive=True,
                        serial="loop:/var/tmp/other.img")
    assert not wrong.allowed and "does not name this device" in wrong.reason and LOOP_SERIAL in wrong.reason


def test_blank_device_is_writable_unless_the_target_names_another_serial(fixtures):
    blank = ("../lsblk/blkid_blank.txt", 2)  # blkid -p exits 2 when it finds no signature
    d = check_write(Node(fixtures, blkid=blank), "/dev/loop0", expect="block", purpose="t")
    assert d.allowed and "holds no partition table" in d.reason
    d = check_write(Node(fixtures, blkid=blank), "/dev/loop0", expect="block", purpose="t", serial="S123")
    assert not d.allowed and "blank" in d.reason and "does not name this device" in d.reason


def test_an_unclear_probe_refuses(fixtures):
    d = check_write(Node(fixtures, blkid=("", 8)), "/dev/loop0", expect="block", purpose="t")
    assert not d.allowed and "exit 8" in d.reason  # blkid: ambivalent probing result
    d = check_write(Node(fixtures, lsblk=None), "/dev/loop0", expect="block", purpose="t")
    assert not d.allowed and "lsblk" in d.reason


def test_mounted_is_never_written(fixtures):
    devs = parse_lsblk((fixtures / "lsblk" / "vm_vda_loop.json").read_text())
    vda = replace(next(d for d in devs if d.path == "/dev/vda"), serial="S1")
    ok, why = decide_block(vda, {}, 2, True, "S1")
    assert not ok and "mounted" in why


@pytest.mark.parametrize("probe,allowed,text", [
    ("path_probe_missing.txt", True, "kvgate creates it"),
    ("path_probe_created_file.txt", True, "created by kvgate"),
    ("path_probe_foreign_file.txt", False, "not created by kvgate"),
    ("path_probe_block.txt", False, "is a block device, not a file"),
    ("path_probe_directory.txt", False, "not a regular file"),
])
def test_files_are_written_only_when_kvgate_creates_or_created_them(fixtures, probe, allowed, text):
    node = Node(fixtures, path_probe=probe)
    d = check_write(node, "/var/tmp/t.bin", expect="file", purpose="fio fill", allow_destructive=True, serial="x")
    assert d.allowed is allowed and text in d.reason
    assert node.asked == ["guard-stat"]  # a file never gets a block-device probe
