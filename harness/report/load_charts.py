"""Charts of a serving-load gate (SVG): TTFT against load with percentile bands, request throughput and goodput
against load, the TTFT distribution of every load point, the knee marked against the TTFT SLO.

Pure functions of plain data, like harness.report.charts (whose SVG helpers they use: same fixed hash salt, no
date, text as paths, so a bundle re-renders byte for byte). A figure over trials is a :data:`Band`: the median
across trials and the low and high ends of its spread (the confidence interval, or the trials' range); a band of
one trial is that trial's value three times. SVG ids: ``ttft-<pct>`` (the median line) and ``band-<pct>`` (its
spread) per percentile, ``throughput-line`` / ``band-throughput``, ``goodput-line`` / ``band-goodput``,
``offered-line`` (an open loop's offered rate), ``cdf-<point label>`` per load point, ``slo-line``,
``knee-line`` (at the knee's load) and ``knee-marker`` (where it meets the SLO line), ``knee-none`` (a note when no load met the SLO).
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

from .charts import PASS_COLOR, REF_COLOR, STOP_COLOR, RC, _finite, _gid, _plt, ecdf, svg_text

#: (median over trials, low end, high end) of one figure at one load point
Band = tuple[float, float, float]

PCT_COLORS = {"p50": "#4f81bd", "p90": "#ef6c00", "p95": "#8e44ad", "p99": "#c0504d"}
THROUGHPUT_COLOR = "#4f81bd"
GOODPUT_COLOR = PASS_COLOR
KNEE_COLOR = "#333333"


def _usable(band: Band | None) -> bool:
    return band is not None and all(x is not None and math.isfinite(float(x)) for x in band)


def _series(loads: Sequence[float], bands: Sequence[Band | None]) -> tuple[list[float], list[float], list[float],
                                                                          list[float]]:
    """(loads, medians, lows, highs) of the points that have a finite band, in load order."""
    pts = sorted((float(x), b) for x, b in zip(loads, bands) if _usable(b) and math.isfinite(float(x)))
    return ([x for x, _ in pts], [float(b[0]) for _, b in pts], [float(min(b)) for _, b in pts],
            [float(max(b)) for _, b in pts])


def _load_axis(ax, loads: Sequence[float], label: str) -> None:
    xs = _finite(loads)
    if xs and min(xs) > 0 and max(xs) / min(xs) >= 10:
        # a ladder (1, 2, 4, ... 64) spreads evenly on a log axis; its own loads are the ticks
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(set(xs)), [f"{x:g}" for x in sorted(set(xs))])
        ax.minorticks_off()
    ax.set_xlabel(label)


def _knee(ax, knee: float | None, slo_s: float | None, unit: str) -> None:
    """The knee as a vertical line at its load, a marker where it meets the SLO line (where there is one); a note
    when there is an SLO and no load met it."""
    if knee is not None and math.isfinite(knee):
        ax.axvline(knee, color=KNEE_COLOR, linestyle="-.", linewidth=1.1,
                   label=f"knee {knee:g} {unit}").set_gid("knee-line")
        if slo_s is not None:
            (m,) = ax.plot([knee], [slo_s], marker="D", markersize=6, color=KNEE_COLOR, linestyle="none")
            m.set_gid("knee-marker")
    elif slo_s is not None:
        ax.text(0.02, 0.97, "no load point met the SLO (no knee)", transform=ax.transAxes, fontsize=8,
                color=STOP_COLOR, va="top", gid="knee-none")


def _finish(fig, ax, plt, title: str) -> str:
    """Title, legend beside the axes, the SVG text; the figure is closed whatever happens."""
    try:
        ax.set_title(title)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7)
        fig.tight_layout()
        return svg_text(fig)
    finally:
        plt.close(fig)


def _ladder_svg(loads: Sequence[float], series: Sequence[tuple[str, str, str, str, Sequence[Band | None]]], *,
                ylabel: str, title: str, load_label: str, load_unit: str, knee: float | None,
                slo: tuple[float, str] | None = None, offered: bool = False) -> str:
    """Figures against load: per series ``(line gid, band gid, legend label, color, bands)`` a median line and its
    band; the SLO line ``(seconds, the figure judged on it)``; the offered rate as a diagonal; the knee."""
    mpl, plt = _plt()
    with mpl.rc_context(RC):
        fig, ax = plt.subplots(figsize=(8, 4))
        tops: list[float] = []
        for line_gid, band_gid, name, color, bands in series:
            xs, med, lo, hi = _series(loads, bands)
            if not xs:
                continue
            ax.fill_between(xs, lo, hi, color=color, alpha=0.18, linewidth=0).set_gid(band_gid)
            (line,) = ax.plot(xs, med, marker="o", markersize=3.5, color=color, linewidth=1.4, label=name)
            line.set_gid(line_gid)
            tops += hi
        if slo is not None:
            ax.axhline(slo[0], color=STOP_COLOR, linestyle="--", linewidth=1.2,
                       label=f"SLO {slo[1]} ≤ {slo[0]:.3g} s").set_gid("slo-line")
            tops.append(slo[0])
        xs = sorted(set(_finite(loads)))
        if offered and xs:
            (line,) = ax.plot(xs, xs, color=REF_COLOR, linestyle=":", linewidth=1.0, label="offered rate")
            line.set_gid("offered-line")
            tops += xs
        _knee(ax, knee, slo[0] if slo is not None else None, load_unit)
        ax.set_ylim(0, (max(tops) if tops else 1.0) * 1.12 or 1.0)
        _load_axis(ax, loads, load_label)
        ax.set_ylabel(ylabel)
        return _finish(fig, ax, plt, title)


def ttft_vs_load_svg(loads: Sequence[float], percentiles: Mapping[str, Sequence[Band | None]], *,
                     slo_s: float | None = None, slo_name: str = "p95", knee: float | None = None,
                     load_label: str = "request rate (req/s)", load_unit: str = "req/s",
                     title: str = "TTFT against load") -> str:
    """TTFT percentiles (``{"p50": [band per load], "p90": ..., "p99": ...}``, seconds) against the load
    (``loads``: a rate or a concurrency per point), each a median line over trials with its spread as a band;
    the SLO line (``slo_s``, the figure named ``slo_name`` is judged on it) and the knee at its load."""
    series = [(f"ttft-{_gid(name)}", f"band-{_gid(name)}", f"TTFT {name}", PCT_COLORS.get(name, REF_COLOR), bands)
              for name, bands in percentiles.items()]
    return _ladder_svg(loads, series, ylabel="time to first token (s)", title=title, load_label=load_label,
                       load_unit=load_unit, knee=knee, slo=(slo_s, slo_name) if slo_s is not None else None)


def throughput_vs_load_svg(loads: Sequence[float], throughput_rps: Sequence[Band | None],
                           goodput_rps: Sequence[Band | None], *, knee: float | None = None,
                           offered: bool = False, load_label: str = "request rate (req/s)",
                           load_unit: str = "req/s", title: str = "Throughput and goodput against load") -> str:
    """Completed requests per second and goodput (requests within the SLOs per second) against the load, each a
    median line with its spread; with ``offered`` (an open loop, whose load is a rate) the offered rate as the
    diagonal a server that keeps up follows; the knee at its load."""
    series = [("throughput-line", "band-throughput", "throughput (req/s)", THROUGHPUT_COLOR, throughput_rps),
              ("goodput-line", "band-goodput", "goodput (req/s)", GOODPUT_COLOR, goodput_rps)]
    return _ladder_svg(loads, series, ylabel="requests per second", title=title, load_label=load_label,
                       load_unit=load_unit, knee=knee, offered=offered)


def ttft_cdf_svg(points: Sequence[tuple[str, Sequence[float]]], *, slo_s: float | None = None,
                 title: str = "TTFT distribution per load point") -> str:
    """One empirical CDF of the successful requests' TTFT (s) per load point (``(label, ttfts)``, all trials
    together), lightest at the lowest load, and the SLO line."""
    mpl, plt = _plt()
    with mpl.rc_context(RC):
        fig, ax = plt.subplots(figsize=(8, 4))
        cmap = plt.get_cmap("viridis")
        n = max(len(points) - 1, 1)
        allv: list[float] = []
        for i, (label, values) in enumerate(points):
            xs, ys = ecdf(values)
            if not xs:
                continue
            (line,) = ax.step(xs, ys, where="post", color=cmap(0.85 - 0.85 * i / n), linewidth=1.2,
                              label=f"{label} (n={len(xs)})")
            line.set_gid(f"cdf-{_gid(label)}")
            allv += xs
        if slo_s is not None:
            ax.axvline(slo_s, color=STOP_COLOR, linestyle="--", linewidth=1.2,
                       label=f"SLO {slo_s:.3g} s").set_gid("slo-line")
            allv.append(slo_s)
        if allv and min(allv) > 0 and max(allv) / min(allv) > 20:
            ax.set_xscale("log")
        ax.set_xlabel("time to first token (s)")
        ax.set_ylabel("fraction of requests")
        ax.set_ylim(0, 1.02)
        return _finish(fig, ax, plt, title)
