"""Quantities with units and thresholds such as ``">= 5.0 GB/s"``.

Decimal prefixes are powers of 1000 (GB = 1e9 bytes), binary ones powers of 1024 (GiB).
Every quantity is reduced to a base value in its dimension (bytes/s, s, bytes, ratio, count, 1/s),
so comparisons between GB/s, MB/s and GiB/s are exact and a time compared with a bandwidth is an error.
"""

from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass

_SIZE = {
    "B": 1, "kB": 1e3, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12, "PB": 1e15,
    "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "TiB": 1024**4,
}
_TIME = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0}

UNITS: dict[str, tuple[str, float]] = {}
for _u, _f in _SIZE.items():
    UNITS[_u] = ("size", float(_f))
    UNITS[f"{_u}/s"] = ("bandwidth", float(_f))
for _u, _f in _TIME.items():
    UNITS[_u] = ("time", _f)
for _u, _f in {"bit/s": 1 / 8, "Kbit/s": 1e3 / 8, "Mbit/s": 1e6 / 8, "Gbit/s": 1e9 / 8, "Gb/s": 1e9 / 8}.items():
    UNITS[_u] = ("bandwidth", _f)
UNITS.update({
    "x": ("ratio", 1.0), "ratio": ("ratio", 1.0), "%": ("ratio", 0.01),
    "": ("count", 1.0), "count": ("count", 1.0),
    "IOPS": ("rate", 1.0), "/s": ("rate", 1.0), "tokens/s": ("rate", 1.0),
    "USD": ("money", 1.0), "$": ("money", 1.0),
})

DIMENSION_BASE_UNIT = {
    "size": "B", "bandwidth": "B/s", "time": "s", "ratio": "x", "count": "", "rate": "/s", "money": "USD",
}

_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_QTY_RE = re.compile(rf"^\s*({_NUM})\s*([A-Za-zµ%$/]*(?:/s)?)\s*$")
_OPS = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt}
_THR_RE = re.compile(r"^\s*(>=|<=|>|<)\s*(.+?)\s*$")


class UnitError(ValueError):
    """A quantity or threshold could not be parsed, or its unit has the wrong dimension."""


@dataclass(frozen=True)
class Quantity:
    """A number with a unit; ``base`` is the value in the dimension's base unit."""

    value: float
    unit: str
    dimension: str
    base: float

    def to(self, unit: str) -> float:
        dim, factor = unit_info(unit)
        if dim != self.dimension:
            raise UnitError(f"cannot convert {self} ({self.dimension}) to {unit} ({dim})")
        return self.base / factor

    def __str__(self) -> str:
        return f"{self.value:g} {self.unit}".strip()


def unit_info(unit: str) -> tuple[str, float]:
    """Return (dimension, factor to base) for a unit; raise UnitError for an unknown unit."""
    try:
        return UNITS[unit]
    except KeyError:
        known = ", ".join(sorted(u for u in UNITS if u))
        raise UnitError(f"unknown unit {unit!r} (expected one of {known})") from None


def parse_quantity(text: str | int | float, dimension: str | None = None) -> Quantity:
    """Parse ``"5.23 GB/s"``; when ``dimension`` is given, the unit must belong to it."""
    if isinstance(text, bool):
        raise UnitError(f"expected a quantity such as '5 GB/s', got {text!r}")
    if isinstance(text, (int, float)):
        text = str(text)
    m = _QTY_RE.match(text)
    if not m:
        raise UnitError(f"expected '<number> <unit>' such as '5.0 GB/s', got {text!r}")
    value = float(m.group(1))
    unit = m.group(2)
    dim, factor = unit_info(unit)
    if dimension is not None and dim != dimension:
        want = DIMENSION_BASE_UNIT.get(dimension, dimension)
        raise UnitError(f"{text!r} is a {dim}, expected a {dimension} (e.g. '{want}')")
    return Quantity(value=value, unit=unit, dimension=dim, base=value * factor)


@dataclass(frozen=True)
class Threshold:
    """A comparison such as ``>= 5.0 GB/s``; ``holds`` takes a value in base units."""

    op: str
    quantity: Quantity

    def holds(self, value_base: float) -> bool:
        return _OPS[self.op](value_base, self.quantity.base)

    @property
    def dimension(self) -> str:
        return self.quantity.dimension

    @property
    def higher_is_better(self) -> bool:
        return self.op in (">=", ">")

    def __str__(self) -> str:
        return f"{self.op} {self.quantity}"


def parse_threshold(text: str, dimension: str | None = None) -> Threshold:
    """Parse ``">= 5.0 GB/s"`` or ``"< 3 GB/s"``."""
    if not isinstance(text, str):
        raise UnitError(f"expected a threshold such as '>= 5.0 GB/s', got {text!r}")
    m = _THR_RE.match(text)
    if not m:
        raise UnitError(f"expected '<op> <number> <unit>' with op one of >=, >, <=, <, got {text!r}")
    return Threshold(op=m.group(1), quantity=parse_quantity(m.group(2), dimension))


def parse_size_bytes(value: str | int, multiple_of: int = 1, what: str = "size") -> int:
    """A positive size in bytes from an int or a quantity such as ``"4 GiB"``, a multiple of ``multiple_of``
    (e.g. 512 for O_DIRECT); raise UnitError (a ValueError, so pydantic validators may call this) otherwise."""
    if isinstance(value, bool):
        raise UnitError(f"expected a size such as '4 GiB', got {value!r}")
    if isinstance(value, int):
        n = value
    else:
        n = int(parse_quantity(str(value), "size").base)
    if n <= 0:
        raise UnitError(f"{what} must be positive, got {value!r} (expected e.g. '4 GiB')")
    if n % multiple_of:
        raise UnitError(f"{what} must be a multiple of {multiple_of} bytes for O_DIRECT, got {value!r}")
    return n


# ------------------------------------------------------------------------------------------ for people

_BINARY_PREFIXES = (("PiB", 1024**5), ("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024))


def format_quantity(value: object, unit: str | None = "") -> str:
    """A figure as a report shows it: readable, with its unit, the exact count kept where it matters.

    Sizes: a binary prefix and the exact bytes (``2.0 MiB (2097152 bytes)``); times: µs, ms or s
    (``940 ms``, ``11.85 s``); a ``ratio``: the number and its percentage; ``x``: a factor (``12.6 x``);
    counts: whole numbers as integers; any other unit (GB/s, tokens/s, ...): 4 significant digits in that
    unit. ``None``: an em dash; ``unit`` None (not recorded): the number alone, 6 significant digits; a
    unit kvgate does not know, or a value that is not a finite number, is shown as it is, never raised."""
    if value is None:
        return "—"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    v = float(value)
    if not math.isfinite(v):
        return str(value)
    if unit is None:
        return f"{v:.6g}"
    try:
        dim, factor = unit_info(unit)
    except UnitError:
        return f"{v:.4g} {unit}".strip()
    base = v * factor
    if dim == "size":
        return _size_text(base)
    if dim == "time":
        return _time_text(base)
    if dim == "count":
        return str(int(v)) if v.is_integer() and abs(v) < 2**63 else f"{v:.6g}"
    if dim == "ratio":
        if unit == "x":
            return f"{v:.4g} x"
        if unit == "%":
            return f"{v:.4g} %"
        return f"{v:.4g} ({100 * v:.1f} %)"
    return f"{v:.4g} {unit}"


def _size_text(n: float) -> str:
    exact = (f"{int(n)} byte" + ("" if n == 1 else "s")) if float(n).is_integer() and abs(n) < 2**63 \
        else f"{n:.6g} bytes"
    for prefix, f in _BINARY_PREFIXES:
        if abs(n) >= f:
            return f"{n / f:.1f} {prefix} ({exact})"
    return exact


def _time_text(s: float) -> str:
    a = abs(s)
    if a == 0:
        return "0 s"
    if a < 1e-3:
        return f"{s * 1e6:.4g} µs"
    if a < 1:
        return f"{s * 1e3:.4g} ms"
    if a < 600:
        return f"{s:.4g} s"
    return f"{s:.0f} s ({s / 60:.1f} min)"
