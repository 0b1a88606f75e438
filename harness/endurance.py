"""What serving costs the drives: one pure function from a serving gate's counted bytes to its endurance figures.

Every serving gate (g2-ttft, g2-load, g2-gain and its capacity sweep, pd-handoff, r3) reads the pool device's
``/sys/dev/block/MAJ:MIN/stat`` around what it serves; :func:`endurance` turns the bytes written over that window
into the figures a buyer prices (docs/endurance.md):

* ``write_bytes_per_mtok``: device bytes written per million prompt tokens served;
* ``write_amplification``: device bytes written per KV byte the tier stored (the file system's metadata and
  journal, the connector's own files and a partial chunk's padding all land on the drive; 1.0 is none);
* ``store_write_gb_s``: the store bandwidth, device bytes written over the window (decimal GB/s);
* for a drive the inventory declares (``pool_drive``: capacity, rated drive writes per day over its warranty),
  ``drive_writes_per_day`` at the measured rate (served without pause) and ``days_to_rating``: the days until the
  drive has taken the bytes its rating allows (capacity x DWPD x 365 x warranty years).

A figure whose inputs were not measured is None, and ``unknown`` says why: never a guess.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SECONDS_PER_DAY = 86400.0
DAYS_PER_YEAR = 365.0


@dataclass(frozen=True)
class DriveRating:
    """A drive as its datasheet rates it: ``capacity_bytes`` (decimal, as vendors state it), ``rated_dwpd`` (full
    drive writes per day) over ``warranty_years``."""

    capacity_bytes: int
    rated_dwpd: float
    warranty_years: float = 5.0
    name: str | None = None

    @property
    def rated_write_bytes(self) -> float:
        """The bytes the rating allows over the warranty (TBW x 1e12)."""
        return self.capacity_bytes * self.rated_dwpd * DAYS_PER_YEAR * self.warranty_years

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "capacity_bytes": self.capacity_bytes, "rated_dwpd": self.rated_dwpd,
                "warranty_years": self.warranty_years, "rated_write_bytes": self.rated_write_bytes}


@dataclass(frozen=True)
class Endurance:
    """One gate's (or one point's) endurance figures and the counts they come from."""

    device_write_bytes: int | None
    served_tokens: float | None
    stored_kv_bytes: float | None
    window_s: float | None
    write_bytes_per_mtok: float | None = None
    write_amplification: float | None = None
    store_write_gb_s: float | None = None
    drive_writes_per_day: float | None = None
    days_to_rating: float | None = None
    drive: DriveRating | None = None
    unknown: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return {"device_write_bytes": self.device_write_bytes, "served_tokens": self.served_tokens,
                "stored_kv_bytes": self.stored_kv_bytes, "window_s": self.window_s,
                "write_bytes_per_mtok": self.write_bytes_per_mtok, "write_amplification": self.write_amplification,
                "store_write_gb_s": self.store_write_gb_s, "drive_writes_per_day": self.drive_writes_per_day,
                "days_to_rating": self.days_to_rating,
                "drive": None if self.drive is None else self.drive.to_dict(), "unknown": list(self.unknown)}


def endurance(device_write_bytes: int | None, served_tokens: float | None, stored_kv_bytes: float | None,
              window_s: float | None, drive: DriveRating | None = None) -> Endurance:
    """Pure: the endurance figures from the pool device's bytes written over a window, the prompt tokens served in
    it, the KV bytes the tier stored in it and the window's length; ``drive`` the inventory's rating, if any."""
    unknown: list[str] = []
    wrote = device_write_bytes
    if wrote is None:
        unknown.append("no device write counters (the pool has no block device of its own, or a probe failed)")
    per_mtok = None if wrote is None or not served_tokens or served_tokens <= 0 else wrote / served_tokens * 1e6
    if wrote is not None and not (served_tokens and served_tokens > 0):
        unknown.append("no tokens served: no bytes per million tokens")
    wa = None if wrote is None or not stored_kv_bytes or stored_kv_bytes <= 0 else wrote / stored_kv_bytes
    if wrote is not None and not (stored_kv_bytes and stored_kv_bytes > 0):
        unknown.append("no stored KV bytes counted: no write amplification")
    rate = None if wrote is None or not window_s or window_s <= 0 else wrote / window_s  # bytes/s
    if wrote is not None and rate is None:
        unknown.append("no window measured: no store bandwidth")
    dwpd = days = None
    if drive is None:
        unknown.append("no drive declared (inventory pool_drive): no days to rating")
    elif rate is not None:
        dwpd = rate * SECONDS_PER_DAY / drive.capacity_bytes
        days = drive.rated_write_bytes / (rate * SECONDS_PER_DAY) if rate > 0 else float("inf")
    return Endurance(device_write_bytes=wrote, served_tokens=served_tokens, stored_kv_bytes=stored_kv_bytes,
                     window_s=window_s, write_bytes_per_mtok=per_mtok, write_amplification=wa,
                     store_write_gb_s=None if rate is None else rate / 1e9, drive_writes_per_day=dwpd,
                     days_to_rating=days, drive=drive, unknown=tuple(unknown))


def _total(xs: list[float | int | None]) -> float | None:
    return None if not xs or any(x is None for x in xs) else float(sum(xs))  # type: ignore[arg-type]


def combined(parts: list[Endurance], drive: DriveRating | None = None) -> Endurance:
    """Pure: one figure over several windows (a gate's points, trials or prompts): their sums; a count any part
    lacks is unknown for the whole (a partial sum would flatter the drive)."""
    wrote = _total([p.device_write_bytes for p in parts])
    return endurance(None if wrote is None else int(wrote), _total([p.served_tokens for p in parts]),
                     _total([p.stored_kv_bytes for p in parts]), _total([p.window_s for p in parts]), drive)
