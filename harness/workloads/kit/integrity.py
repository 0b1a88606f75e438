"""Data integrity through a block device: a known pattern written on one path and read back on another,
compared byte by byte here. The ``nvme-integrity`` workload checks an array's namespace with it
(:func:`roundtrip_integrity`: through the fabric and back) and a loopback target against its backing store
(:func:`loopback_integrity`); ``kvgate loopback up`` verifies a fresh loopback with the same check
(``Loopback.up(verify=loopback_integrity)``).

Every write asks the write guard (harness.writeguard) first; the commands are plain ``dd`` with O_DIRECT on the
node (:func:`dd_argv`, planned by :func:`integrity_commands`), and only the regions compared travel over the
transport.
"""

from __future__ import annotations

import hashlib
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...rigs.loopback import (INTEGRITY_CHUNK, INTEGRITY_LEN_BYTES, Loopback, LoopbackState, Runner, backing_device,
                             nvme_device)
from ...writeguard import WriteDecision, check_write


def pattern_bytes(seed: str, length: int) -> bytes:
    """Deterministic, incompressible test data: SHA-256 in counter mode over ``seed``."""
    out = bytearray()
    counter = 0
    while len(out) < length:
        out += hashlib.sha256(f"{seed}:{counter}".encode()).digest()
        counter += 1
    return bytes(out[:length])


def count_mismatched_bytes(a: bytes, b: bytes) -> int:
    """Bytes that differ, counting a length difference as mismatched."""
    n = min(len(a), len(b))
    diff = sum(1 for i in range(n) if a[i] != b[i]) if a[:n] != b[:n] else 0
    return diff + abs(len(a) - len(b))


@dataclass(frozen=True)
class IntegrityCheck:
    """One read-back: data written (or read) on one path, read on the other, compared byte by byte."""

    direction: str  # "backing->nvme", "nvme->backing" or "compare" (read-only)
    offset_bytes: int
    length_bytes: int
    mismatched_bytes: int
    expected_sha256: str
    actual_sha256: str
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.mismatched_bytes == 0


@dataclass(frozen=True)
class IntegrityResult:
    checks: tuple[IntegrityCheck, ...]
    device: str
    backing_device: str
    write_guard: WriteDecision | None = None  # the guard's decision on the backing, when a write was wanted
    device_write_guard: WriteDecision | None = None  # and on the namespace (the same storage, another path)

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    @property
    def mismatched_bytes(self) -> int:
        return sum(c.mismatched_bytes for c in self.checks)

    @property
    def checked_bytes(self) -> int:
        return sum(c.length_bytes for c in self.checks if c.error is None)

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "device": self.device, "backing_device": self.backing_device,
                "mismatched_bytes": self.mismatched_bytes, "checked_bytes": self.checked_bytes,
                "checks": [dict(c.__dict__, ok=c.ok) for c in self.checks],
                "write_guard": self.write_guard.as_dict() if self.write_guard else None,
                "device_write_guard": self.device_write_guard.as_dict() if self.device_write_guard else None}


def dd_argv(src: str, dst: str, offset: int, count: int, iflag_direct: bool = False, oflag_direct: bool = False,
            read: bool = True) -> tuple[str, ...]:
    """One dd of ``count`` integrity chunks at ``offset`` bytes: a read skips to it in ``src``, a write seeks
    to it in ``dst`` (synced, never truncating)."""
    skip_seek = f"skip={offset // INTEGRITY_CHUNK}" if read else f"seek={offset // INTEGRITY_CHUNK}"
    argv = ["dd", f"if={src}", f"of={dst}", f"bs={INTEGRITY_CHUNK}", f"count={count}", skip_seek]
    if iflag_direct:
        argv.append("iflag=direct")
    if oflag_direct:
        argv.append("oflag=direct")
    if not read:
        argv.append("conv=fsync,notrunc")
    return tuple(argv)


def integrity_tmp(label: str) -> str:
    """The node-side file prefix of one integrity check's pattern and read-backs."""
    return f"/tmp/kvgate-integrity-{label}"


def integrity_cleanup_argv(label: str) -> tuple[str, ...]:
    tmp = integrity_tmp(label)
    return ("rm", "-f", f"{tmp}.pattern", f"{tmp}.readback", f"{tmp}.backing")


def integrity_commands(label: str, backing: str, device: str, length_bytes: int, direct_backing: bool,
                       writable: bool) -> list[tuple[str, tuple[str, ...]]]:
    """Pure: the dd commands of :meth:`Loopback.check_integrity`, in order, as (what, argv): with ``writable``,
    a pattern written on ``backing`` and read through ``device``, then one written through ``device`` and read
    on ``backing``; otherwise both only read at the same offset and compared."""
    tmp, count = integrity_tmp(label), length_bytes // INTEGRITY_CHUNK
    if not writable:
        return [("read the backing", dd_argv(backing, f"{tmp}.backing", length_bytes, count, True)),
                ("read the same region through the namespace",
                 dd_argv(device, f"{tmp}.readback", length_bytes, count, True))]
    out = []
    for direction, wdev, rdev, wdirect, rdirect, offset in (
            ("backing->nvme", backing, device, direct_backing, True, length_bytes),
            ("nvme->backing", device, backing, True, direct_backing, 2 * length_bytes)):
        out.append((f"{direction}: write the pattern", dd_argv(f"{tmp}.pattern", wdev, offset, count,
                                                               oflag_direct=wdirect, read=False)))
        out.append((f"{direction}: read it back", dd_argv(rdev, f"{tmp}.readback", offset, count, rdirect)))
    return out


class PatternIO:
    """Known patterns through a node's block devices: dd with O_DIRECT on the node, compared here. Data
    travels over the transport only for the regions compared."""

    def __init__(self, transport: Any, run: Runner):
        self.transport, self.run = transport, run

    def _dd(self, name, src, dst, offset, count, iflag_direct=False, oflag_direct=False, read=True):
        return self.run(name, dd_argv(src, dst, offset, count, iflag_direct, oflag_direct, read), 120)

    def write_read(self, direction, data, wdev, rdev, wdirect, rdirect, offset, count, tmp, local,
                   allowed_by: WriteDecision | None):
        """Write ``data`` on ``wdev`` and read it back on ``rdev``; only with the write guard's decision allowing
        exactly ``wdev`` (``allowed_by``): without one nothing is written and the check fails."""
        expected = hashlib.sha256(data).hexdigest()
        if allowed_by is None or not allowed_by.allowed or allowed_by.path != wdev:
            why = allowed_by.refusal() if allowed_by is not None and not allowed_by.allowed else \
                f"no write guard decision allows writing to {wdev}"
            return IntegrityCheck(direction, offset, len(data), len(data), expected, "",
                                  error=f"{why}; nothing was written")
        (local / "pattern").write_bytes(data)
        try:
            self.transport.put(str(local / "pattern"), f"{tmp}.pattern")
        except Exception as exc:  # noqa: BLE001 - a failed transfer is a failed check, kept as data
            return IntegrityCheck(direction, offset, len(data), len(data), expected, "", error=f"put: {exc}")
        w = self._dd(f"integrity-write-{direction.replace('>', '')}", f"{tmp}.pattern", wdev, offset, count,
                     oflag_direct=wdirect, read=False)
        if not w.ok:
            return IntegrityCheck(direction, offset, len(data), len(data), expected, "",
                                  error=f"write on {wdev} failed: {(w.stderr or w.error or '').strip()[-300:]}")
        return self.read_compare(direction, data, rdev, rdirect, offset, count, tmp, local)

    def read_compare(self, direction, data, rdev, rdirect, offset, count, tmp, local):
        expected = hashlib.sha256(data).hexdigest()
        r = self._dd(f"integrity-read-{direction.replace('>', '')}", rdev, f"{tmp}.readback", offset, count,
                     iflag_direct=rdirect)
        if not r.ok:
            return IntegrityCheck(direction, offset, len(data), len(data), expected, "",
                                  error=f"read on {rdev} failed: {(r.stderr or r.error or '').strip()[-300:]}")
        try:
            self.transport.get(f"{tmp}.readback", str(local / "readback"))
        except Exception as exc:  # noqa: BLE001
            return IntegrityCheck(direction, offset, len(data), len(data), expected, "", error=f"get: {exc}")
        got = (local / "readback").read_bytes()
        return IntegrityCheck(direction, offset, len(data), count_mismatched_bytes(data, got), expected,
                              hashlib.sha256(got).hexdigest())

    def compare_read(self, bdev, dev, length_bytes, count, tmp, local):
        offset = length_bytes
        r = self._dd("integrity-read-backing", bdev, f"{tmp}.backing", offset, count, iflag_direct=True)
        if not r.ok:
            return IntegrityCheck("compare", offset, length_bytes, length_bytes, "", "",
                                  error=f"read on {bdev} failed: {(r.stderr or r.error or '').strip()[-300:]}")
        try:
            self.transport.get(f"{tmp}.backing", str(local / "backing"))
        except Exception as exc:  # noqa: BLE001
            return IntegrityCheck("compare", offset, length_bytes, length_bytes, "", "", error=f"get: {exc}")
        return self.read_compare("compare", (local / "backing").read_bytes(), dev, True, offset, count, tmp, local)


def roundtrip_commands(label: str, device: str, length_bytes: int) -> list[tuple[str, tuple[str, ...]]]:
    """Pure: the dd commands of :func:`roundtrip_integrity`, in order, as (what, argv)."""
    tmp, count = integrity_tmp(label), length_bytes // INTEGRITY_CHUNK
    return [("write the pattern through the namespace", dd_argv(f"{tmp}.pattern", device, length_bytes, count,
                                                                 oflag_direct=True, read=False)),
            ("read it back through the namespace", dd_argv(device, f"{tmp}.readback", length_bytes, count, True))]


def roundtrip_integrity(transport: Any, run: Runner, device: str, length_bytes: int = INTEGRITY_LEN_BYTES,
                        seed: str = "kvgate", label: str = "nvme", decision: WriteDecision | None = None
                        ) -> IntegrityResult:
    """A pattern written through ``device`` with O_DIRECT and read back through it with O_DIRECT (where no
    backing store can be read, e.g. an array's namespace): the data crosses the fabric both ways. The caller
    asked the write guard first (``decision``)."""
    count = length_bytes // INTEGRITY_CHUNK
    tmp = integrity_tmp(label)
    io = PatternIO(transport, run)
    with tempfile.TemporaryDirectory(prefix="kvgate-integrity-") as local_s:
        data = pattern_bytes(f"{seed}:{device}:roundtrip", length_bytes)
        check = io.write_read("nvme->nvme", data, device, device, True, True, length_bytes, count, tmp, Path(local_s),
                              decision)
        run("integrity-cleanup", integrity_cleanup_argv(label), 30)
    return IntegrityResult((check,), device, "", decision)


def loopback_integrity(lb: Loopback, st: LoopbackState | None = None, length_bytes: int = INTEGRITY_LEN_BYTES,
                       seed: str = "kvgate", device: str | None = None,
                       device_decision: WriteDecision | None = None) -> IntegrityResult:
    """Read a known pattern back through NVMe-oF and compare with the backing store.

    ``device``: the namespace device to go through instead of this loopback's own connection (the one a
    ``kind: nvmeof`` target of the node found by NQN), with the write guard's decision on it
    (``device_decision``).

    Every write asks the write guard (harness.writeguard) first, whatever made the device: the backing
    (a null_blk or brd device kvgate made and recorded, a backing file kvgate created, a block device or
    a brd RAM disk kvgate did not load marked allow_destructive) and then the namespace that reaches the
    same storage (``same_storage_as``: refused when it is mounted or read-only). Allowed on both: a
    pattern written on the backing and read through /dev/nvmeXnY, then one written through /dev/nvmeXnY
    and read on the backing. A device that holds a filesystem, a partition table or a signature, or is
    mounted (a namespace carrying kv-read's ext4, say), a device kvgate did not make and is not offered
    (allow_destructive), a file kvgate did not create are only read on both paths and compared. A
    block device marked allow_destructive that the guard refuses is not touched: the check fails with
    the guard's reason. Data travels over the transport only for the 1 MiB regions compared here.
    """
    st = st or lb.probe()
    spec = lb.spec
    dev = device or nvme_device(spec, st)
    bdev = backing_device(spec, st)
    if dev is None or bdev is None:
        return IntegrityResult((IntegrityCheck("backing->nvme", 0, 0, 0, "", "",
                                               error="loopback not up (no device)"),), dev or "", bdev or "")
    chunk = INTEGRITY_CHUNK
    count = length_bytes // chunk
    decision, ns_decision = _write_decisions(lb, st, dev, bdev, device_decision)
    writable = bool(decision and decision.allowed and ns_decision and ns_decision.allowed)
    refused = next((x for x in (decision, ns_decision) if x is not None and not x.allowed), None)
    if refused is not None:
        lb.progress(refused.refusal())
        if spec.backing == "block":
            return IntegrityResult((IntegrityCheck("backing->nvme", 0, 0, 0, "", "",
                                                   error=refused.refusal()),), dev, bdev, decision, ns_decision)
    direct_backing = spec.backing != "file"  # nvmet file backing uses the page cache (buffered_io=1)
    tmp = integrity_tmp(spec.name)
    checks: list[IntegrityCheck] = []
    io = PatternIO(lb.transport, lb.run)
    with tempfile.TemporaryDirectory(prefix="kvgate-integrity-") as local_s:
        local = Path(local_s)
        if writable:
            plan = (("backing->nvme", bdev, dev, direct_backing, True, length_bytes, decision),
                    ("nvme->backing", dev, bdev, True, direct_backing, 2 * length_bytes, ns_decision))
            for direction, wdev, rdev, wdirect, rdirect, offset, allowed_by in plan:
                data = pattern_bytes(f"{seed}:{spec.nqn}:{direction}", length_bytes)
                checks.append(io.write_read(direction, data, wdev, rdev, wdirect, rdirect, offset, count,
                                            tmp, local, allowed_by))
        else:
            checks.append(io.compare_read(bdev, dev, length_bytes, count, tmp, local))
        lb.run("integrity-cleanup", integrity_cleanup_argv(spec.name), 30)
    return IntegrityResult(tuple(checks), dev, bdev, decision, ns_decision)


def _write_decisions(lb: Loopback, st: LoopbackState, dev: str, bdev: str, device_decision: WriteDecision | None
                     ) -> tuple[WriteDecision | None, WriteDecision | None]:
    """The write guard's decisions for :func:`loopback_integrity`: on the backing, where it is offered (a file,
    a RAM device kvgate made and recorded, or allow_destructive), then, where that is allowed, on the namespace
    reaching the same storage (``device_decision`` when the caller has one); None where not asked."""
    decision = ns_decision = None
    node = getattr(lb.transport, "name", "")
    spec = lb.spec
    # a RAM device kvgate did not make (or no longer has on record) is the node's: like a block device
    made = {"null_blk": f"nullb:{spec.nullb_name}", "brd": "brd"}.get(spec.backing)
    offered = spec.allow_destructive or (made is not None and made in st.record.created) or spec.backing == "file"
    if offered:
        decision = check_write(lb.run, bdev, expect="file" if spec.backing == "file" else "block",
                               purpose=f"integrity pattern on the backing of loopback target {spec.name}",
                               node=node, allow_destructive=spec.allow_destructive, serial=spec.serial)
        if decision.allowed:
            ns_decision = device_decision or check_write(
                lb.run, dev, expect="block", node=node, same_storage_as=decision,
                purpose=f"integrity pattern through the namespace of loopback target {spec.name}")
    return decision, ns_decision
