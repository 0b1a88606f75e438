"""Compare two runs: the metrics they share (same gate, same metric name), their deltas, and outcome changes.

Pure functions of two signed predicates (``verdicts`` with their ``metrics``); the CLI loads and verifies the
bundles. "Better" follows the gate's pass threshold for the judged metric (``>=``: higher is better) and the
unit in the name for the others (``_gb_s``, ``_ratio``, ``speedup``, ``iops``: higher; ``_s``, ``_ms``,
``_us``: lower); otherwise the direction is not claimed.
"""

from __future__ import annotations

import html as _html
import math
from typing import Any

import pandas as pd

from .predicate import check_predicate
from .render import md_escape as _md

HIGHER = ("_gb_s", "_gb_s_mean", "_gb_s_min", "_ratio", "speedup", "iops", "_per_s", "throughput")
LOWER = ("_s", "_ms", "_us", "_skew_s", "latency")


def direction(metric: str, verdict: dict[str, Any]) -> str | None:
    """'higher' or 'lower' is better, or None when not known."""
    if metric == verdict.get("metric"):
        thr = (verdict.get("pass_threshold") or "").strip()
        if thr.startswith(">"):
            return "higher"
        if thr.startswith("<"):
            return "lower"
    if metric.endswith(HIGHER) or any(h in metric for h in ("speedup", "iops")):
        return "higher"
    if metric.endswith(LOWER):
        return "lower"
    return None


def compare_predicates(a: dict[str, Any], b: dict[str, Any],
                       names: tuple[str, str] = ("bundle A", "bundle B")) -> pd.DataFrame:
    """One row per (gate, metric) present in both runs, in gate order of run A. Each predicate is checked
    first (harness.report.predicate; InputFileError naming ``names[i]``)."""
    check_predicate(a, names[0])
    check_predicate(b, names[1])
    va = {v["gate_id"]: v for v in a.get("verdicts") or []}
    vb = {v["gate_id"]: v for v in b.get("verdicts") or []}
    rows = []
    for gid, x in va.items():
        y = vb.get(gid)
        if y is None:
            continue
        ma, mb = dict(x.get("metrics") or {}), dict(y.get("metrics") or {})
        if x.get("actual") is not None:
            ma.setdefault(x["metric"], x["actual"])
        if y.get("actual") is not None:
            mb.setdefault(y["metric"], y["actual"])
        names = [x["metric"]] if x["metric"] in ma and x["metric"] in mb else []
        names += sorted(n for n in set(ma) & set(mb) if n != x["metric"])
        for name in names:
            fa, fb = float(ma[name]), float(mb[name])
            delta = fb - fa
            pct = (delta / abs(fa) * 100.0) if fa != 0 else (0.0 if fb == 0 else math.inf)
            d = direction(name, x)
            verdict = ("same" if delta == 0 else "better" if d and (delta > 0) == (d == "higher") else
                       "worse" if d else "changed")
            rows.append({"gate": gid, "metric": name, "judged": name == x["metric"], "a": fa, "b": fb,
                         "delta": delta, "delta_pct": pct, "better_is": d or "", "change": verdict,
                         "outcome_a": x["outcome"] if name == x["metric"] else "",
                         "outcome_b": y["outcome"] if name == x["metric"] else ""})
    return pd.DataFrame(rows, columns=["gate", "metric", "judged", "a", "b", "delta", "delta_pct", "better_is",
                                       "change", "outcome_a", "outcome_b"])


def outcome_changes(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, str, str]]:
    va = {v["gate_id"]: v["outcome"] for v in a.get("verdicts") or []}
    vb = {v["gate_id"]: v["outcome"] for v in b.get("verdicts") or []}
    return [(g, va.get(g, "—"), vb.get(g, "—")) for g in list(va) + [g for g in vb if g not in va]]


def _n(x: float) -> str:
    return f"{x:.4g}" if math.isfinite(x) else str(x)


def render_markdown(id_a: str, id_b: str, frame: pd.DataFrame, changes, notes: list[str]) -> str:
    # every text from a bundle (IDs, gate and metric names, outcomes, notes) escaped: harness.report.render.md_escape
    out = [f"# kvgate comparison {_md(id_a)} → {_md(id_b)}", ""]
    out += [f"> {_md(n)}" for n in notes] + ([""] if notes else [])
    out += ["| Gate | Outcome A | Outcome B |", "|---|---|---|"]
    out += [f"| {_md(g)} | {_md(oa)} | {_md(ob)} |" for g, oa, ob in changes] + [""]
    if frame.empty:
        out.append("The two runs share no metric.")
    else:
        out += ["| Gate | Metric | A | B | Δ | Δ % | Change |", "|---|---|---|---|---|---|---|"]
        for r in frame.itertuples():
            name = f"**{_md(r.metric)}**" if r.judged else _md(r.metric)
            out.append(f"| {_md(r.gate)} | {name} | {_n(r.a)} | {_n(r.b)} | {_n(r.delta)} | {r.delta_pct:+.2f}% | {r.change} |")
        out += ["", "![change from A to B](compare.svg)", "",
                "Bold: the metric the gate judges. Δ = B − A. Table: `compare.csv`."]
    return "\n".join(out) + "\n"


def render_html(id_a: str, id_b: str, frame: pd.DataFrame, changes, notes: list[str], svg: str | None) -> str:
    e = _html.escape
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             f"<title>kvgate comparison {e(id_a)} to {e(id_b)}</title>",
             "<style>body{font-family:system-ui,sans-serif;max-width:70em;margin:1.5em auto;padding:0 1em}"
             "table{border-collapse:collapse;margin:.8em 0}td,th{border:1px solid #ccc;padding:3px 7px}"
             "td.num{text-align:right}.better{color:#2e7d32}.worse{color:#c62828;font-weight:bold}"
             "svg{max-width:100%;height:auto}.note{background:#fff3cd;padding:.5em}</style></head><body>",
             f"<h1>kvgate comparison {e(id_a)} &rarr; {e(id_b)}</h1>"]
    parts += [f'<p class="note">{e(n)}</p>' for n in notes]
    parts.append('<table id="outcomes"><tr><th>Gate</th><th>Outcome A</th><th>Outcome B</th></tr>')
    parts += [f"<tr><td>{e(g)}</td><td>{e(oa)}</td><td>{e(ob)}</td></tr>" for g, oa, ob in changes]
    parts.append("</table>")
    if frame.empty:
        parts.append("<p>The two runs share no metric.</p>")
    else:
        parts.append('<table id="deltas"><tr><th>Gate</th><th>Metric</th><th>A</th><th>B</th><th>&Delta;</th>'
                     "<th>&Delta; %</th><th>Change</th></tr>")
        for r in frame.itertuples():
            name = f"<strong>{e(r.metric)}</strong>" if r.judged else e(r.metric)
            parts.append(f'<tr><td>{e(r.gate)}</td><td>{name}</td><td class="num">{_n(r.a)}</td>'
                         f'<td class="num">{_n(r.b)}</td><td class="num">{_n(r.delta)}</td>'
                         f'<td class="num">{r.delta_pct:+.2f}%</td><td class="{e(r.change)}">{e(r.change)}</td></tr>')
        parts.append("</table>")
        if svg:
            parts.append(f'<figure id="chart-compare">{svg}</figure>')
    parts.append("</body></html>\n")
    return "\n".join(parts)
