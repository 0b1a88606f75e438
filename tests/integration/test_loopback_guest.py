"""The loopback in a real qemu TCG guest running Debian's own kernel: real nvmet, nvme-tcp, fio, sshd.

One guest per module (build cached under $KVGATE_CACHE_DIR or ~/.cache/kvgate/guest; boot ~12 s);
it is stopped by PID at the end, also on failure, and no qemu with its initrd may be left running.
Needs root-free tools only on the host (qemu-system-x86, busybox-static, fio, nvme-cli, openssh-server,
kmod, cpio) and apt sources that know linux-image-amd64.
"""

import json
import os
import subprocess
from dataclasses import replace

import pytest

from harness.rigs import guest as G
from harness.rigs.loopback import Loopback, LoopbackSpec
from harness.workloads.kit.integrity import loopback_integrity

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NQN = "nqn.2024-01.io.kvgate:itest-kv0"
SPEC = LoopbackSpec(name="it0", nqn=NQN, host_nqn="nqn.2024-01.io.kvgate:host-itest",
                    host_id="0c1f4f3e-3f4b-5d6e-8a9b-0c1d2e3f4a5b", size_bytes=64 << 20,
                    link_path="/dev/kvgate/it0")


@pytest.fixture(scope="module")
def guest(qemu_guest):
    return qemu_guest


# Under a CPU hog the TCG guest answers slowly: command timeouts here are hang guards, not expectations.
T = 180


def test_guest_runs_debian_kernel_with_nvme_tcp(guest):
    tr, state, _ = guest
    r = tr.run(["uname", "-r"], timeout_s=T)
    assert r.ok and r.stdout.strip() == state.kernel_release
    assert tr.run(["modprobe", "nvmet-tcp"], timeout_s=T).ok


def test_up_twice_then_down(guest):
    tr, _, _ = guest
    lb = Loopback(tr, SPEC)
    try:
        first = lb.up(verify=loopback_integrity)
        assert first.ok, first.error
        assert first.summary["state"] == "up" and first.summary["device"].startswith("/dev/nvme"), first.summary
        assert first.integrity.ok and first.integrity.checked_bytes == 2 << 20
        second = lb.up(verify=loopback_integrity)
        assert second.ok, second.error
        assert [a.name for a in second.actions if not a.name.startswith("modprobe")] == []
        assert second.summary["device"] == first.summary["device"]
        link = tr.run(["readlink", "/dev/kvgate/it0"], timeout_s=T)
        assert link.ok, link.summary()
        assert link.stdout.strip() == first.summary["device"]
    finally:
        down = lb.down()  # whatever happened above: the next tests start from nothing
    assert down.ok, down.error
    assert down.summary["state"] == "down"
    assert lb.down().actions == []  # nothing left to remove


def test_down_after_failed_up_cleans_what_exists(guest):
    tr, _, _ = guest
    broken = replace(SPEC, backing="block", backing_path="/dev/kvgate-does-not-exist")
    lb = Loopback(tr, broken)
    try:
        res = lb.up(verify=loopback_integrity)
        assert not res.ok and "ns-enable" in res.error
        assert res.summary["state"] == "partial" and res.summary["layers"]["subsystem"]
    finally:
        down = lb.down()
    assert down.ok, down.error
    find = tr.run(["find", "/sys/kernel/config/nvmet/subsystems", "/sys/kernel/config/nvmet/hosts"], timeout_s=T)
    assert find.ok, find.summary()
    assert NQN not in find.stdout and broken.host_nqn not in find.stdout


def test_integrity_check_detects_a_backing_that_loses_writes(guest):
    tr, _, _ = guest
    # A null_blk device that is NOT memory-backed returns zeros whatever was written.
    d = "/sys/kernel/config/nullb/kvgate-lossy"
    for argv in (["modprobe", "null_blk", "nr_devices=0"], ["mkdir", "-p", d],
                 ["sh", "-c", f"echo 64 > {d}/size && echo 1 > {d}/power"]):
        assert tr.run(argv, timeout_s=T).ok
    lossy = replace(SPEC, backing="block", backing_path="/dev/kvgate-lossy", allow_destructive=True)
    lb = Loopback(tr, lossy)
    try:
        res = lb.up(verify=loopback_integrity)
        assert res.integrity is not None and not res.integrity.ok
        assert res.integrity.mismatched_bytes > 1_000_000  # pattern vs zeros: almost every byte differs
        assert not res.ok and "integrity" in res.error
    finally:
        assert lb.down().ok
        tr.run(["sh", "-c", f"echo 0 > {d}/power; rmdir {d}"], timeout_s=T)


def test_fio_reads_through_nvme_tcp(guest):
    from harness.parsers.fio import parse_fio_json
    tr, _, _ = guest
    lb = Loopback(tr, replace(SPEC, backing="brd"))
    try:
        up = lb.up(verify=False)
        assert up.ok, up.error
        dev = up.summary["device"]
        r = tr.run(["fio", "--name=g1", f"--filename={dev}", "--rw=read", "--bs=1M", "--direct=1",
                    "--ioengine=libaio", "--iodepth=16", "--size=64M", "--output-format=json"], timeout_s=600)
        assert r.ok, r.stderr
        run = parse_fio_json(r.stdout)
        assert run.groups and sum(g.read_bytes for g in run.groups) == 64 << 20
        # multipath: I/O statistics land on the per-controller path device, not on the head
        (path,) = lb.status()["multipath_paths"]
        stat = tr.run(["cat", f"/sys/block/{path}/stat"], timeout_s=T)
        assert stat.ok and int(stat.stdout.split()[2]) >= (64 << 20) // 512  # sectors read
    finally:
        assert lb.down().ok
