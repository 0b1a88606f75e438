"""Trend charts of the evidence library: per suite and gate, the gate's measured metric over time (SVG).

Deterministic like harness.report.charts (fixed hash salt per chart, no date, text as paths), so a
published library re-renders byte for byte. SVG ids: ``trend-point-<report ID>`` on every point,
``pass-line`` / ``stop-loss-line`` for the latest run's thresholds.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from typing import Any

from .charts import PASS_COLOR, STOP_COLOR, _gid, _plt, svg_text
from .predicate import finite
from .render import threshold_in

OUTCOME_COLORS = {"PASS": PASS_COLOR, "INFO": PASS_COLOR, "FAIL": "#ef6c00", "STOP": STOP_COLOR,
                  "ERROR": "#6a1b9a", "INVALID": "#ad1457", "SKIPPED": "#757575"}


def _when(utc: str) -> datetime:
    return datetime.strptime(utc, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)


def trend_points(entries: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """(suite, gate) -> [{report_id, created_utc, actual, unit, outcome, metric, pass, stop_loss}], oldest first;
    verified acceptance bundles with a measured value only."""
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for e in entries:
        if e.get("kind") != "acceptance" or e["status"] != "verified" or not e.get("created_utc"):
            continue
        for g in e.get("gates", []):
            if finite(g.get("actual")):  # a checked predicate (harness.report.predicate); NaN cannot be drawn
                out.setdefault((e["suite"]["name"] or "", g["gate_id"]), []).append(
                    g | {"report_id": e["report_id"], "created_utc": e["created_utc"]})
    for pts in out.values():
        pts.sort(key=lambda p: (p["created_utc"], p["report_id"]))
    return dict(sorted(out.items()))


def trend_svg(suite: str, gate_id: str, points: list[dict[str, Any]]) -> str:
    """One gate's metric over time: points coloured by outcome, joined in time order, with the latest run's
    pass and stop-loss thresholds."""
    latest = points[-1]
    unit = latest.get("unit") or ""
    pts = [p for p in points if (p.get("unit") or "") == unit]
    mpl, plt = _plt()
    rc = {"svg.hashsalt": f"kvgate-library-{suite}-{gate_id}", "svg.fonttype": "path", "font.size": 9}
    with mpl.rc_context(rc):
        fig, ax = plt.subplots(figsize=(7.5, 3.2))
        xs = [_when(p["created_utc"]) for p in pts]
        ys = [float(p["actual"]) for p in pts]
        ax.plot(xs, ys, color="#9e9e9e", linewidth=0.9, zorder=1)
        labelled: set[str] = set()
        for x, y, p in zip(xs, ys, pts):
            o = p.get("outcome") or "?"
            (m,) = ax.plot([x], [y], "o", color=OUTCOME_COLORS.get(o, "#424242"), markersize=6, zorder=3,
                           label=o if o not in labelled else None)
            m.set_gid(f"trend-point-{_gid(p['report_id'])}")
            labelled.add(o)
        tops = list(ys)
        for thr, gid, color, style, name in ((latest.get("pass"), "pass-line", PASS_COLOR, "-", "pass"),
                                             (latest.get("stop_loss"), "stop-loss-line", STOP_COLOR, "--",
                                              "stop-loss")):
            v = threshold_in(thr, unit) if thr and unit else None
            if v is not None:
                ax.axhline(v, color=color, linestyle=style, linewidth=1.0, label=f"{name} {thr}").set_gid(gid)
                tops.append(v)
        if len(set(xs)) == 1:  # one date: a week around it, not matplotlib's default of years
            ax.set_xlim(xs[0] - timedelta(days=3), xs[0] + timedelta(days=3))
        lo = min(0.0, min(ys))
        ax.set_ylim(lo, (max(tops) if tops else 1.0) * 1.15 or 1.0)
        ax.set_ylabel(f"{latest.get('metric')} ({unit})" if unit else str(latest.get("metric")))
        runs = f"{len(pts)} run" + ("s" if len(pts) != 1 else "")
        ax.set_title(f"{suite} {gate_id}: {latest.get('metric')} over time ({runs})")
        fig.autofmt_xdate()
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7)
        fig.tight_layout()
        svg = svg_text(fig)
        plt.close(fig)
    return svg


def trend_charts(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """[{suite, gate_id, metric, id, n, svg}] for every (suite, gate) with measured values."""
    out = []
    for (suite, gate), pts in trend_points(entries).items():
        out.append({"suite": suite, "gate_id": gate, "metric": pts[-1].get("metric"), "n": len(pts),
                    "id": "trend-" + re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{suite}-{gate}"),
                    "svg": trend_svg(suite, gate, pts)})
    return out
