"""Prometheus text exposition (an engine's ``/metrics``), parsed; counter deltas between two reads."""

from __future__ import annotations

import re
from dataclasses import dataclass

_PROM_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\d+)?$')
_PROM_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float


def parse_prometheus(text: str) -> list[Sample]:
    """Samples of a Prometheus text exposition (comments skipped). Raises ValueError naming the line."""
    out = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _PROM_LINE.match(line)
        if not m:
            raise ValueError(f"metrics line {n}: not a Prometheus sample: {line[:200]!r}")
        labels = tuple(sorted((k, v.encode().decode("unicode_escape")) for k, v in _PROM_LABEL.findall(m.group(3) or "")))
        out.append(Sample(m.group(1), labels, float(m.group(4))))
    return out


def metric_total(samples: list[Sample], names: list[str]) -> float | None:
    """Sum over all label sets of the first name present (None when none is exposed)."""
    for name in names:
        vals = [s.value for s in samples if s.name == name]
        if vals:
            return sum(vals)
    return None


def counter_delta(before: list[Sample], after: list[Sample], names: list[str]) -> float | None:
    """How much a counter grew between two reads: the total of the first of ``names`` exposed, after minus
    before; None when ``names`` is empty or either read lacks the counter."""
    if not names:
        return None
    a, b = metric_total(before, names), metric_total(after, names)
    return None if a is None or b is None else b - a
