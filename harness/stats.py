"""Summary statistics shared by the workloads (TTFT percentiles) and the report (chart markers)."""

from __future__ import annotations

import math
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
