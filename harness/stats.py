"""Summary statistics shared by the workloads (TTFT percentiles, confidence intervals over trials), the verdict and
the report (chart markers).

A figure measured over trials travels as an :class:`Interval`: its median and an exact distribution-free
confidence interval for the median from binomial order statistics (:func:`median_interval`), or, where the trials
are too few for one, the median alone and the statement that there is no interval."""

from __future__ import annotations

import math
from typing import Sequence

from pydantic import BaseModel, ConfigDict

CONFIDENCE = 0.95
ORDER_STATISTICS = "binomial order statistics"


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


def percentile_with_failures(values: Sequence[float], failed: int, q: float) -> float | None:
    """The ``q`` percentile (as :func:`percentile`) of ``values`` with ``failed`` more values that are infinite: a
    failed request's TTFT, which never came. None when the percentile falls on (or between a value and) a failed
    one, so it has no finite value; None too when there is nothing at all."""
    xs = sorted(float(x) for x in values if x is not None and math.isfinite(float(x)))
    n = len(xs) + max(0, failed)
    if n == 0:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"q must be within [0, 100], got {q}")
    pos = (n - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    if hi >= len(xs):
        return None
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def median(values: Sequence[float]) -> float:
    return percentile(values, 50.0)


class Interval(BaseModel):
    """A figure over trials, typed: its median (``median``), the confidence interval for the median (``ci_low``,
    ``ci_high``; None: too few trials for an interval at ``confidence``), the trials that gave a figure
    (``trials``), the trials the gate asked for (``asked``; a trial that gave none is a failed trial), how the
    interval was made (``method``; None in a bundle of an older kvgate: a percentile bootstrap) and the coverage
    that method guarantees (``coverage``: at least ``confidence``).

    The field names are those an older kvgate wrote into the evidence (``median``, ``ci_low``, ``ci_high``,
    ``trials``), so bundles signed before still read."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    median: float
    ci_low: float | None = None
    ci_high: float | None = None
    trials: int
    asked: int | None = None
    method: str | None = None
    coverage: float | None = None

    @property
    def has_interval(self) -> bool:
        return self.ci_low is not None and self.ci_high is not None

    @property
    def failed_trials(self) -> int:
        """Trials asked for that gave no figure (0 when the gate's count is not recorded)."""
        return max(0, (self.asked or self.trials) - self.trials)

    def text(self, unit: str = "") -> str:
        """The figure in words: ``median 1.26 s (95 % CI 1.1-1.4, 6 trials)`` or ``median 1.26 s (3 trials, no
        interval)`` / ``(1 trial, no interval)``."""
        u = f" {unit}" if unit else ""
        n = f"{self.trials} trial{'s' if self.trials != 1 else ''}"
        if not self.has_interval:
            return f"median {self.median:.4g}{u} ({n}, no interval)"
        how = "" if self.method == ORDER_STATISTICS else ", percentile bootstrap"
        return f"median {self.median:.4g}{u} (95 % CI {self.ci_low:.4g}-{self.ci_high:.4g}, {n}{how})"


def binomial_cdf(k: int, n: int, p: float = 0.5) -> float:
    """P(X <= k) for X ~ Binomial(n, p); 0 for k < 0."""
    if k < 0:
        return 0.0
    return sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(0, min(k, n) + 1))


def order_statistic_rank(n: int, confidence: float = CONFIDENCE) -> int | None:
    """The rank k (1-based) of the widest-coverage-sufficient interval ``[x(k), x(n+1-k)]`` for the median of
    ``n`` values: the largest k whose coverage ``1 - 2 P(B <= k - 1)``, B ~ Binomial(n, 1/2), is at least
    ``confidence`` (exact for any continuous distribution, no assumption of shape). None when even ``[min, max]``
    covers less (n <= 5 at 95 %): too few trials for an interval."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be within (0, 1), got {confidence}")
    best = None
    for k in range(1, n // 2 + 1):
        if 1 - 2 * binomial_cdf(k - 1, n) >= confidence:
            best = k
        else:
            break
    return best


def min_trials_for_interval(confidence: float = CONFIDENCE) -> int:
    """The fewest trials that give an order-statistics interval at ``confidence`` (6 at 95 %)."""
    n = 1
    while order_statistic_rank(n, confidence) is None:
        n += 1
    return n


def median_interval(values: Sequence[float], asked: int | None = None,
                    confidence: float = CONFIDENCE) -> Interval:
    """The median of ``values`` (one per trial that gave a figure) and its exact distribution-free confidence
    interval from binomial order statistics (:func:`order_statistic_rank`); with too few values the median alone
    (``ci_low``/``ci_high`` None: "N trials, no interval"). ``asked``: the trials the gate asked for."""
    xs = sorted(float(x) for x in values if x is not None and math.isfinite(float(x)))
    if not xs:
        raise ValueError("a median of no trials")
    n = len(xs)
    k = order_statistic_rank(n, confidence)
    if k is None:
        return Interval(median=median(xs), trials=n, asked=asked, method=ORDER_STATISTICS)
    return Interval(median=median(xs), ci_low=xs[k - 1], ci_high=xs[n - k], trials=n, asked=asked,
                    method=ORDER_STATISTICS, coverage=1 - 2 * binomial_cdf(k - 1, n))
