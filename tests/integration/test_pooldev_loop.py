"""The pool device probe on a real loop device: ext4 on it, a file read back with O_DIRECT between two probes
counts exactly those bytes on the device. The loop device and the mount made here are undone in ``finally``."""

import mmap
import os
import subprocess

import pytest

from harness.parsers.pooldev import parse_pool_blockstat, pool_blockstat_argv, read_bytes_between

pytestmark = pytest.mark.integration


def probe(path):
    r = subprocess.run(list(pool_blockstat_argv(str(path))), capture_output=True, text=True, timeout=30)
    return parse_pool_blockstat(r.stdout)


def test_direct_reads_of_a_pool_on_a_loop_device_are_counted(tmp_path):
    img, mnt = tmp_path / "pool.img", tmp_path / "mnt"
    with open(img, "wb") as f:
        f.truncate(64 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(img)], check=True, capture_output=True, timeout=120)
    mnt.mkdir()
    dev = subprocess.run(["losetup", "-f", "--show", str(img)], check=True, capture_output=True, text=True).stdout.strip()
    mounted = False
    try:
        subprocess.run(["mount", dev, str(mnt)], check=True, capture_output=True, timeout=60)
        mounted = True
        pool = mnt / "pool"
        pool.mkdir()
        data = pool / "chunk.data"
        data.write_bytes(os.urandom(8 << 20))
        os.sync()
        before = probe(pool)
        assert before.source == dev and before.maj_min == f"{os.major(os.stat(dev).st_rdev)}:{os.minor(os.stat(dev).st_rdev)}"
        # a pool directory the connector has not made yet (it makes it on its first store): the same device
        unmade = probe(pool / "kv" / "not-yet")
        assert (unmade.source, unmade.maj_min) == (before.source, before.maj_min)
        fd = os.open(data, os.O_RDONLY | os.O_DIRECT)
        try:
            buf = mmap.mmap(-1, 1 << 20)
            total = 0
            while (n := os.readv(fd, [buf])) > 0:
                total += n
        finally:
            os.close(fd)
        after = probe(pool)
        assert total == 8 << 20
        assert read_bytes_between(before, after) >= 8 << 20
    finally:
        if mounted:
            subprocess.run(["umount", str(mnt)], capture_output=True, timeout=60)
        subprocess.run(["losetup", "-d", dev], capture_output=True, timeout=60)
