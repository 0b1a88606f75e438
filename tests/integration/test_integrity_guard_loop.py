"""The loopback's integrity writes ask the write guard on both paths to the storage, on real loop devices.

This kernel has no nvmet: a second loop device over the same backing file stands in for the /dev/nvmeXnY
that reaches the same storage (as in test_write_guard_loop.py). The backing is offered for writing
(``allow_destructive`` with its serial), yet the stand-in namespace is mounted, as kv2's namespace is with
kv-read's ext4 after ``loopback up``: the guard refuses on the namespace and not a byte is written on either
path. Unmounted, both writes go through. Every mount and loop device made here is undone in ``finally``."""

import subprocess

import pytest

from harness.workloads.kit.integrity import loopback_integrity
from harness.rigs.loopback import Loopback
from test_write_guard_loop import _spec, _stand_in_state, attach, ext4_image, node_runner  # noqa: F401

pytestmark = pytest.mark.integration


@pytest.fixture
def mount_at(tmp_path):
    """mount_at(device) -> the mount point; unmounted at the end, whatever happened."""
    mounted: list[str] = []

    def _mount(dev: str) -> str:
        point = tmp_path / f"mnt{len(mounted)}"
        point.mkdir()
        r = subprocess.run(["mount", "-t", "ext4", dev, str(point)], capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            pytest.skip(f"cannot mount here: {r.stderr.strip()}")
        mounted.append(str(point))
        return str(point)

    try:
        yield _mount
    finally:
        for point in reversed(mounted):
            subprocess.run(["umount", point], capture_output=True, timeout=60)


def test_the_namespace_path_is_refused_while_mounted_and_nothing_is_written(tmp_path, attach, mount_at):  # noqa: F811
    image = ext4_image(tmp_path / "kv.img")
    backing, stand_in = attach(image), attach(image)
    point = mount_at(stand_in)
    tr, steps, run = node_runner(tmp_path)
    res = loopback_integrity(Loopback(tr, _spec(backing, f"loop:{image.resolve()}"), run=run),
                             _stand_in_state(stand_in))
    assert not [p for p in steps.root.iterdir() if "integrity-write" in p.name]  # no write on either path
    (check,) = res.checks
    assert not res.ok and f"refusing to write to {stand_in}" in check.error
    assert res.write_guard.allowed, res.write_guard.reason  # the backing: offered, its serial matches
    assert res.device_write_guard is not None and not res.device_write_guard.allowed
    assert f"{stand_in} is mounted at {point}" in res.device_write_guard.reason


def test_unmounted_both_paths_are_allowed_and_written(tmp_path, attach):  # noqa: F811
    image = ext4_image(tmp_path / "kv.img")
    backing, stand_in = attach(image), attach(image)
    tr, steps, run = node_runner(tmp_path)
    res = loopback_integrity(Loopback(tr, _spec(backing, f"loop:{image.resolve()}"), run=run),
                             _stand_in_state(stand_in))
    assert res.write_guard.allowed and res.device_write_guard.allowed, res.as_dict()
    assert "reaches the storage of" in res.device_write_guard.reason
    assert res.ok and res.checked_bytes == 2 << 20 and res.mismatched_bytes == 0, res.as_dict()
