"""NVMe SMART data units, the drive's own count of what the host wrote, beside the block layer's: one probe
(``nvme smart-log DEV -o json``) and pure functions, so a serving gate on an NVMe namespace reports both and
whether they agree (docs/endurance.md).

A data unit is 1000 x 512 bytes; the drive (and Linux nvmet, from its backing block device's sector counters)
reports ``DIV_ROUND_UP(sectors, 1000)`` of the running total, so the units written between two readings lie within
one unit of the sectors written over 1000. Linux nvmet reports data units only for a namespace backed by a block
device (null_blk, brd, a disk): a file-backed namespace answers zeros, which is "not exposed", never a measurement
of nothing written. A device that is no NVMe namespace, or an nvme-cli that fails, is "not exposed" with its error.
Fixtures: tests/fixtures/nvme/smart-log/ (the qemu guest's nvmet loopback, Debian 6.1, nvme-cli 2.3).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

DATA_UNIT_BYTES = 512_000
_NVME_NS = re.compile(r"^/dev/(nvme\d+n\d+)(?:p\d+)?$")


def smart_device(pool_device: str | None) -> str | None:
    """Pure: the NVMe namespace to ask for the pool's device as findmnt names it (a partition asks its namespace);
    None when the device is no NVMe namespace (a loop device, device-mapper, virtio: no SMART log to read)."""
    m = _NVME_NS.match(pool_device or "")
    return None if m is None else f"/dev/{m.group(1)}"


def smart_log_argv(device: str) -> tuple[str, ...]:
    """The node command: the SMART / health log of ``device``'s controller (all namespaces) as JSON."""
    return ("nvme", "smart-log", device, "-o", "json")


@dataclass(frozen=True)
class SmartLog:
    """The counters of one SMART log reading (totals since the controller's making)."""

    data_units_read: int
    data_units_written: int
    host_read_commands: int
    host_write_commands: int


def _count(doc: dict[str, Any], key: str) -> int:
    v = doc.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, str)) or not str(v).isdigit():
        raise ValueError(f"smart-log: {key} is {v!r}, not a count")
    return int(v)


def parse_smart_log(text: str) -> SmartLog:
    """Pure: ``nvme smart-log -o json`` (nvme-cli 2.x prints the 128-bit counters as decimal strings, 1.x as
    numbers). Raises ValueError on any other shape."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"smart-log: not JSON ({exc.msg}): {text.strip()[:120]!r}") from None
    if not isinstance(doc, dict):
        raise ValueError("smart-log: not a JSON object")
    return SmartLog(*(_count(doc, k) for k in ("data_units_read", "data_units_written", "host_read_commands",
                                               "host_write_commands")))


@dataclass(frozen=True)
class SmartWrites:
    """What the drive says was written between two readings, beside the block counters: ``exposed`` False (with
    ``note`` saying why) when it could not say."""

    exposed: bool
    device: str | None
    data_units_written: int | None = None
    data_units_read: int | None = None
    block_write_bytes: int | None = None
    reconciled: bool | None = None
    note: str = ""

    @property
    def written_bytes(self) -> int | None:
        """The data units as bytes (each 512,000; the drive rounds its running total up to whole units)."""
        return None if self.data_units_written is None else self.data_units_written * DATA_UNIT_BYTES

    def to_dict(self) -> dict[str, Any]:
        return {"exposed": self.exposed, "device": self.device, "data_units_written": self.data_units_written,
                "data_units_read": self.data_units_read, "written_bytes": self.written_bytes,
                "block_write_bytes": self.block_write_bytes, "reconciled": self.reconciled, "note": self.note}


def smart_writes(device: str | None, before: SmartLog | None, after: SmartLog | None,
                 block_write_bytes: int | None, error: str | None = None) -> SmartWrites:
    """Pure: the data units written between ``before`` and ``after``, reconciled with the block layer's bytes
    written over the same window: they agree when the sectors written over 1000 lie within one data unit of the
    units the drive counted. ``error``: why a reading is missing (the probe's failure)."""
    if before is None or after is None:
        why = error or ("the pool's device is no NVMe namespace" if device is None else "no SMART log was read")
        return SmartWrites(False, device, block_write_bytes=block_write_bytes, note=f"not exposed: {why}")
    if after.data_units_written == 0 and after.data_units_read == 0 and (block_write_bytes or 0) > 0:
        return SmartWrites(False, device, block_write_bytes=block_write_bytes,
                           note="not exposed: the device reports no data units at all while the block layer counted "
                                "writes (Linux nvmet counts them only for a namespace backed by a block device, not a "
                                "file)")
    units = after.data_units_written - before.data_units_written
    read = after.data_units_read - before.data_units_read
    if units < 0:
        return SmartWrites(False, device, block_write_bytes=block_write_bytes,
                           note="not exposed: the data units written went down (another controller, or a reset)")
    ok = None
    note = "the drive's data units only (no block counters to reconcile with)"
    if block_write_bytes is not None:
        ok = abs(units * 1000 - block_write_bytes / 512) < 1000
        note = ("the drive's data units agree with the block counters (within one data unit)" if ok else
                f"the drive counted {units} data units ({units * DATA_UNIT_BYTES} B), the block layer "
                f"{block_write_bytes} B: writes the host did not make through this device (another host or "
                "namespace on the controller), or a device that counts otherwise")
    return SmartWrites(True, device, units, read, block_write_bytes, ok, note)
