"""Summary statistics shared by the workloads (TTFT percentiles, confidence intervals over trials) and the report
(chart markers)."""

from __future__ import annotations

import math
import random
from typing import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method) of the finite values; ``q`` in [0, 100].

    Empty input (or input without a finite value) raises ValueError: there is no percentile of nothing,
    and every caller decides itself what a missing figure means."""
    if not 0 <= q <= 100:
        raise ValueError(f"q must be within [0, 100], got {q}")
    xs = sorted(float(x) for x in values if x is not None and math.isfinite(float(x)))
    if not xs:
        raise ValueError("percentile of an empty sequence")
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def median(values: Sequence[float]) -> float:
    return percentile(values, 50.0)


def bootstrap_ci(values: Sequence[float], confidence: float = 0.95, resamples: int = 2000,
                 seed: int = 0) -> tuple[float, float, float]:
    """The median of ``values`` and a percentile-bootstrap confidence interval for it: ``(median, low, high)``.

    Resampling is seeded (same values, same interval). With one value the interval is that value: one trial
    says nothing about the spread, which a caller judging on the interval must treat as such."""
    xs = [float(x) for x in values if x is not None and math.isfinite(float(x))]
    if not xs:
        raise ValueError("confidence interval of an empty sequence")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be within (0, 1), got {confidence}")
    point = median(xs)
    if len(xs) == 1:
        return point, point, point
    rng = random.Random(f"kvgate-bootstrap:{seed}")
    meds = sorted(median([rng.choice(xs) for _ in xs]) for _ in range(resamples))
    tail = (1 - confidence) / 2 * 100
    return point, percentile(meds, tail), percentile(meds, 100 - tail)
