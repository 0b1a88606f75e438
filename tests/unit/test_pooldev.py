"""The pool device probe: one command and parser for every workload that proves a cold read by the pool
device's read bytes (kv-read around fio, G2 around the read-back). The device is named by MAJ:MIN, so a pool on
a device-mapper volume (whose /sys/class/block name is dm-N, not its /dev/mapper name), a partition or an NVMe
namespace is counted like a loop device or a whole disk."""

from pathlib import Path

import pytest

from harness.parsers.pooldev import parse_pool_blockstat, pool_blockstat_argv, read_bytes_between

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "pooldev"
STAT = "  1897  1  1633416  4796  203  78  34610  162  0  1948  5051  2  0  131074  0  32  92\n"


@pytest.mark.parametrize("name, maj_min, source", [
    ("loop-ext4", "7:0", "/dev/loop0"),
    ("loop-partition-ext4", "259:0", "/dev/loop0p1"),            # a partition: block extended major 259
    ("virtio-disk", "254:0", "/dev/vda"),
    ("lvm-dm-handwritten", "253:3", "/dev/mapper/vg0-kvpool"),   # LVM: sysfs calls it dm-3
    ("dm-multipath-handwritten", "253:0", "/dev/mapper/mpatha"),  # a dm-multipath head
    ("nvme-namespace-handwritten", "259:0", "/dev/nvme0n1"),
    ("nvme-partition-handwritten", "259:3", "/dev/nvme1n1p2"),
])
def test_every_kind_of_block_device_is_named_by_maj_min(name, maj_min, source):
    dev = parse_pool_blockstat((FIX / f"{name}.out").read_text())
    stat_line = (FIX / f"{name}.out").read_text().splitlines()[1].split()
    assert (dev.maj_min, dev.source) == (maj_min, source)
    assert dev.stat.read_bytes == int(stat_line[2]) * 512  # sectors read, in bytes


@pytest.mark.parametrize("line, maj_min", [
    ("kvgate-pool-device 253:3 /dev/mapper/vg0-kvpool", "253:3"),       # LVM: sysfs calls it dm-3
    ("kvgate-pool-device 253:0 /dev/mapper/mpatha", "253:0"),           # a dm-multipath head
    ("kvgate-pool-device 259:1 /dev/nvme0n1p1", "259:1"),               # a partition of an NVMe namespace
    ("kvgate-pool-device 259:0 /dev/nvme0n1", "259:0"),
    ("kvgate-pool-device 8:17 /dev/sdb1", "8:17"),
])
def test_every_kind_of_block_device_is_counted_by_its_maj_min(line, maj_min):
    dev = parse_pool_blockstat(f"{line}\n{STAT}")
    assert dev.maj_min == maj_min and dev.stat.read_bytes == 1633416 * 512


def test_a_pool_without_a_block_device_says_what_it_is_on():
    with pytest.raises(ValueError, match=r"on tmpfs \(0:23\), which has no block device"):
        parse_pool_blockstat((FIX / "tmpfs.out").read_text())
    for out in ("", "kvgate-pool-device  \n", "findmnt: can't read /proc/mounts\n"):
        with pytest.raises(ValueError, match="could not be found"):
            parse_pool_blockstat(out)
    with pytest.raises(ValueError, match="no stat line"):
        parse_pool_blockstat("kvgate-pool-device 7:0 /dev/loop0\n")


def test_read_bytes_only_between_two_readings_of_the_same_device():
    a = parse_pool_blockstat(f"kvgate-pool-device 7:0 /dev/loop0\n{STAT}")
    b = parse_pool_blockstat("kvgate-pool-device 7:0 /dev/loop0\n 1900 1 1633416 0 0 0 0 0 0 0 0\n".replace(
        "1633416", "1633516"))
    assert read_bytes_between(a, b) == 100 * 512
    other = parse_pool_blockstat(f"kvgate-pool-device 7:1 /dev/loop1\n{STAT}")
    assert read_bytes_between(a, other) is None  # the pool moved between the readings: nothing is proven
    assert read_bytes_between(None, b) is None


def test_the_probe_takes_the_pool_path_as_an_argument_never_in_the_script():
    argv = pool_blockstat_argv("/pool dir/$(reboot)")
    assert argv[:2] == ("sh", "-c") and argv[-1] == "/pool dir/$(reboot)" and "reboot" not in argv[2]


def test_a_native_multipath_heads_reads_are_the_sum_of_its_paths():
    """Debian 6.1's head (nvme1n1) counts nothing; its paths nvme1c1n1 and nvme1c2n1 count what each carried."""
    text = ("kvgate-pool-device 259:3 /dev/nvme1n1\n0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n"
            "kvgate-pool-path nvme1c1n1\n10 0 2048 5 0 0 0 0 0 5 5 0 0 0 0 0 0\n"
            "kvgate-pool-path nvme1c2n1\n30 0 6144 5 2 0 8 0 0 5 5 0 0 0 0 0 0\n")
    dev = parse_pool_blockstat(text)
    assert dev.paths == ("nvme1c1n1", "nvme1c2n1") and dev.stat.read_bytes == 4 << 20
    assert dev.stat.read_ios == 40 and dev.stat.write_sectors == 8
    before = parse_pool_blockstat(text.replace("2048", "0").replace("6144", "0"))
    assert read_bytes_between(before, dev) == 4 << 20  # a cold read through the head is proven, not INVALID


def test_the_probe_lists_a_heads_paths_and_nothing_for_other_devices(tmp_path):
    """The probe's shell part run against a sysfs-shaped tree: /sys is the real one here, so only the name rule
    is exercised on this machine (no NVMe head): a loop device prints no path line."""
    import subprocess
    argv = pool_blockstat_argv(str(tmp_path))
    out = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    assert "kvgate-pool-path" not in out.stdout
