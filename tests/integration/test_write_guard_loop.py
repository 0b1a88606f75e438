"""The write guard on real loop devices: one holding ext4, one holding a DOS partition table.

Refused before any write (message naming the device and what it holds, the device's sha256 unchanged),
also with allow_destructive and a wrong serial; allowed with allow_destructive and the matching serial,
which for a loop device is ``loop:<backing file>`` (loop devices have no hardware serial; see
harness/writeguard.py). The loopback's integrity writes are driven for real: this kernel has no nvmet, so a
second loop device over the same backing file stands in for the /dev/nvmeXnY that reaches the same
storage. The fio fill path is driven through run_suite. Every loop device made here is detached in
``finally``, whatever happened.
"""

import hashlib
import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
import yaml

from harness.workloads.kit.integrity import loopback_integrity
from harness.rigs.loopback import Loopback, LoopbackSpec, LoopbackState
from harness.parsers.nvme import NvmeNamespace, NvmePath, NvmeSubsystem
from harness.transport.steps import StepLog
from harness.transport import LocalTransport
from harness.writeguard import check_write

pytestmark = pytest.mark.integration

SIZE = 64 << 20
NQN = "nqn.2024-01.io.kvgate:wguard-it"


def sha256(dev: str) -> str:
    h = hashlib.sha256()
    with open(dev, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def ext4_image(path: Path) -> Path:
    with open(path, "wb") as f:
        f.truncate(SIZE)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(path)], check=True, capture_output=True, timeout=120)
    return path


def dos_image(path: Path) -> Path:
    """A DOS partition table (MBR) with one Linux partition from sector 2048 to the end, byte by byte."""
    mbr = bytearray(512)
    mbr[440:444] = struct.pack("<I", 0x6B766761)  # disk identifier
    mbr[446:462] = struct.pack("<B3sB3sII", 0x00, b"\xfe\xff\xff", 0x83, b"\xfe\xff\xff", 2048, SIZE // 512 - 2048)
    mbr[510:512] = b"\x55\xaa"
    with open(path, "wb") as f:
        f.truncate(SIZE)
        f.write(mbr)
    return path


@pytest.fixture
def attach():
    """attach(image) -> /dev/loopN; every device attached is detached at the end, whatever happened."""
    if os.geteuid() != 0:
        pytest.skip("loop devices need root")
    if shutil.which("losetup") is None:
        pytest.fail("losetup missing (util-linux)")
    attached: list[str] = []

    def _attach(image: Path) -> str:
        r = subprocess.run(["losetup", "--find", "--show", str(image)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, f"losetup: {r.stderr}"
        attached.append(r.stdout.strip())
        return attached[-1]

    try:
        yield _attach
    finally:
        for dev in attached:
            subprocess.run(["losetup", "--detach", dev], capture_output=True, timeout=60)


def node_runner(tmp_path):
    tr = LocalTransport("node")
    steps = StepLog(tmp_path / "run")
    return tr, steps, (lambda name, argv, timeout_s: steps.run(tr, name, argv, timeout_s=timeout_s))


HOLDS = {"ext4": (ext4_image, "filesystem ext4"), "dos": (dos_image, "partition table dos")}


@pytest.mark.parametrize("kind", sorted(HOLDS))
def test_guard_refuses_a_device_holding_data_and_allows_it_only_with_its_serial(tmp_path, attach, kind):
    make, holds = HOLDS[kind]
    image = make(tmp_path / f"{kind}.img")
    dev = attach(image)
    before = sha256(dev)
    _, steps, run = node_runner(tmp_path)
    d = check_write(run, dev, expect="block", purpose="test")
    assert not d.allowed and dev in d.reason and holds in d.reason, d.reason
    wrong = check_write(run, dev, expect="block", purpose="test", allow_destructive=True,
                        serial=f"loop:{tmp_path}/another.img")
    assert not wrong.allowed and "does not name this device" in wrong.reason, wrong.reason
    assert wrong.device_serial == f"loop:{image.resolve()}"
    ok = check_write(run, dev, expect="block", purpose="test", allow_destructive=True,
                     serial=f"loop:{image.resolve()}")
    assert ok.allowed and holds in ok.reason, ok.reason
    assert sha256(dev) == before  # the guard itself only reads
    names = sorted(p.name.split("-", 2)[2] for p in steps.root.iterdir())
    assert {"guard-lsblk", "guard-blkid", "guard-stat", "guard-identity"} <= set(names)


def _stand_in_state(nvme_stand_in: str) -> LoopbackState:
    """What probe() would see with the target connected, the namespace being ``nvme_stand_in``."""
    sub = NvmeSubsystem("nvme-subsys90", NQN, "nqn.2024-01.io.kvgate:host-it",
                        (NvmePath("nvme90", "tcp", {"traddr": "127.0.0.1"}, "live"),))
    ns = NvmeNamespace("nvme-subsys90", NQN, nvme_stand_in.removeprefix("/dev/"), 1, SIZE, 512, ("nvme90",), ())
    return LoopbackState(subsystems=[sub], namespaces=[ns])


def _spec(backing: str, serial: str) -> LoopbackSpec:
    return LoopbackSpec(name="wg-it", nqn=NQN, host_nqn="nqn.2024-01.io.kvgate:host-it",
                        host_id="1d3e1f5a-0b6c-4c0e-9a57-4b0d0c6f2f11", backing="block", backing_path=backing,
                        size_bytes=SIZE, allow_destructive=True, serial=serial)


@pytest.mark.parametrize("kind", sorted(HOLDS))
def test_loopback_integrity_writes_only_after_the_guard_allows(tmp_path, attach, kind):
    make, holds = HOLDS[kind]
    image = make(tmp_path / f"{kind}.img")
    backing, stand_in = attach(image), attach(image)
    tr, steps, run = node_runner(tmp_path)
    before = sha256(backing)

    refused = loopback_integrity(Loopback(tr, _spec(backing, "loop:/var/tmp/not-this.img"), run=run),
        _stand_in_state(stand_in))
    assert not refused.ok and refused.write_guard is not None and not refused.write_guard.allowed
    (check,) = refused.checks
    assert backing in check.error and holds in check.error and "does not name this device" in check.error
    assert sha256(backing) == before
    assert not [p for p in steps.root.iterdir() if "integrity-write" in p.name]  # refused before any write

    allowed = loopback_integrity(Loopback(tr, _spec(backing, f"loop:{image.resolve()}"), run=run),
        _stand_in_state(stand_in))
    assert allowed.write_guard.allowed, allowed.write_guard.reason
    assert allowed.ok and allowed.checked_bytes == 2 << 20 and allowed.mismatched_bytes == 0, allowed.as_dict()
    assert sha256(backing) != before  # the pattern was written through both paths
    assert json.dumps(allowed.as_dict())  # the decision travels with the integrity evidence


def test_fio_fill_never_writes_what_kvgate_did_not_create(tmp_path, attach):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from harness.config import load_config
    from harness.workloads import WORKLOADS
    from harness.suite.runner import run_suite

    foreign = tmp_path / "theirs.bin"
    foreign.write_bytes(b"their data\n" * 100)  # smaller than the target size: fio-read would fill it
    dev = attach(ext4_image(tmp_path / "ext4.img"))
    dev_before, file_before = sha256(dev), sha256(str(foreign))
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump({"nodes": [{
        "name": "n1", "transport": "local", "work_dir": str(tmp_path / "work"), "read_streams": 1,
        "targets": [{"name": "theirs", "kind": "file", "path": str(foreign), "size": "16 MiB"},
                    {"name": "dev", "kind": "file", "path": dev, "size": "16 MiB"}]}]}))
    gate = {"workload": "fio-read", "metric": "per_gpu_read_gb_s", "pass": ">= 0.001 MB/s",
            "params": {"runtime_s": 1, "ramp_s": 0, "drop_caches": False}}
    gates = tmp_path / "gates.yaml"
    gates.write_text(yaml.safe_dump({"suite": {"name": "guard", "version": 1}, "gates": [
        dict(gate, id="F1", title="foreign file", params=dict(gate["params"], target="theirs")),
        dict(gate, id="F2", title="device as a file", params=dict(gate["params"], target="dev"))]}))
    res = run_suite(load_config(inv, gates, WORKLOADS), tmp_path / "out", Ed25519PrivateKey.generate(),
                    progress=lambda m: None, make_tar=False)
    f1, f2 = res.verdicts
    assert f1.outcome.value == "ERROR" and f"refusing to write to {foreign}" in f1.reason
    assert "not created by kvgate" in f1.reason
    assert f2.outcome.value == "ERROR" and f"refusing to write to {dev}" in f2.reason and "block device" in f2.reason
    assert sha256(str(foreign)) == file_before and sha256(dev) == dev_before
    decision = json.loads((res.bundle.path / "gates" / "F1" / "n1" / "write-guard.json").read_text())
    assert decision["allowed"] is False and decision["purpose"] == "fio fill"
    assert not [p for p in (res.bundle.path / "steps").iterdir() if p.name.endswith("fill-target")]
