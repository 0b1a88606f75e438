"""Tables, charts and reports of ``kvgate cost``, written into a staging directory that becomes a signed bundle.

Layout of the staging directory (every file ends up a signed subject of the output bundle):
  params/params.yaml         the params file exactly as given
  params/<model>.json        the model config.json exactly as given
  measured_inputs.json       every measured input: value, report ID, gate, metric, outcome
  tables/inputs.csv          every input: value, kind (param/default/measured/model), source
  tables/results.csv         every output at the operating point
  tables/tornado.csv         one-at-a-time sensitivity of the judged metric
  tables/net_vs_hit_rate.csv net saving per month over hit rate x revisit rate
  tables/break_even.csv      break-even hit rate over storage price x GPU price
  charts/tornado.svg, charts/break_even.svg
  report.md, report.html     rendered after the report ID is known (they print it); HTML inlines the SVGs
Tables are a pure function of the params and the measured inputs: same inputs, byte-identical CSVs.
"""

from __future__ import annotations

import html
import json
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..report.charts import svg_text
from ..report.render import to_csv_bytes
from . import model as cost
from .params import Resolved

UNITS: dict[str, str] = {
    "kv_bytes_per_token": "B",
    "context_tokens": "tokens",
    "gpus_per_instance": "GPUs",
    "prefill_tokens_per_s_per_gpu": "tokens/s/GPU",
    "per_gpu_read_gb_s": "GB/s/GPU",
    "readback_fixed_s": "s",
    "readback_ttft_s": "s",
    "recompute_ttft_s": "s",
    "decode_tokens_per_session": "tokens",
    "decode_tokens_per_s_per_gpu": "tokens/s/GPU",
    "gpu_usd_per_hour": "USD/GPU-hour",
    "storage_usd_per_tb_month": "USD/TB-month",
    "sessions_per_day": "sessions/day",
    "revisit_rate": "ratio",
    "hit_rate": "ratio",
    "retention_days": "days",
    "capacity_overhead_ratio": "ratio",
    "kv_bytes_per_session": "B",
    "recompute_s": "s",
    "recompute_gpu_s": "GPU-s",
    "recompute_usd": "USD",
    "readback_s": "s",
    "readback_gpu_s": "GPU-s",
    "readback_usd": "USD",
    "readback_speedup": "x",
    "saved_gpu_s_per_hit": "GPU-s",
    "saved_usd_per_hit": "USD",
    "capacity_bytes": "B",
    "capacity_tb": "TB",
    "storage_usd_per_month": "USD/month",
    "revisits_per_month": "revisits/month",
    "hits_per_month": "hits/month",
    "gpu_hours_saved_per_month": "GPU-hours/month",
    "gpu_usd_saved_per_month": "USD/month",
    "net_usd_per_month": "USD/month",
    "break_even_hit_rate": "ratio",
    "throughput_gain": "ratio",
}

PARAMS_NAME = "params/params.yaml"
TORNADO_ROWS = 12


def _fmt(x: float) -> str:
    if x is None or (isinstance(x, float) and np.isnan(x)):
        return "n/a"
    if np.isinf(x):
        return "never" if x > 0 else "-inf"
    if x != 0 and (abs(x) >= 1e6 or abs(x) < 1e-3):
        return f"{x:.4g}"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.4g}"


def _source(r: Resolved, name: str) -> str:
    v = r.inputs[name]
    return f"{PARAMS_NAME}:{v.line}" if v.kind == "param" else v.source


def build_tables(r: Resolved) -> dict[str, pd.DataFrame]:
    """Every table of the report (pure; vectorized sweeps)."""
    base = r.base
    inputs = pd.DataFrame(
        [
            {"input": n, "value": v.value, "unit": UNITS.get(n, ""), "kind": v.kind, "source": _source(r, n),
             "used": n not in cost.MEASURED_ONLY or r.timing == "measured"}
            for n, v in r.inputs.items()
        ],
        columns=["input", "value", "unit", "kind", "source", "used"],
    )
    point = cost.evaluate(base, r.timing)
    results = pd.DataFrame(
        [{"output": n, "value": float(point[n]), "unit": UNITS.get(n, "")} for n in cost.OUTPUTS],
        columns=["output", "value", "unit"],
    )
    tornado = cost.tornado(base, r.sensitivity_ranges, r.params.sensitivity.metric, r.timing)
    revisit = base["revisit_rate"]
    revisits = sorted({round(min(1.0, revisit * f), 6) for f in (0.5, 1.0, 1.5)} - {0.0})
    net_vs_hit = cost.net_vs_hit_rate(base, np.linspace(0.0, 1.0, 101), revisits, r.timing)
    storage = base["storage_usd_per_tb_month"]
    s_grid = np.linspace(0.0, max(storage, 1.0) * 4.0, 81)
    gpu = base["gpu_usd_per_hour"]
    break_even = cost.break_even_curve(base, s_grid, [gpu / 2.0, gpu, gpu * 2.0], r.timing)
    return {
        "inputs": inputs,
        "results": results,
        "tornado": tornado,
        "net_vs_hit_rate": net_vs_hit,
        "break_even": break_even,
    }


# --------------------------------------------------------------------------- charts


def render_charts(r: Resolved, tables: dict[str, pd.DataFrame]) -> dict[str, str]:
    """Tornado and break-even charts as SVG text (deterministic: fixed hash salt, no date)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    metric = r.params.sensitivity.metric
    with matplotlib.rc_context({"svg.hashsalt": "kvgate-cost", "svg.fonttype": "path", "font.size": 9}):
        t = tables["tornado"]
        t = t[t.swing > 0].head(TORNADO_ROWS).iloc[::-1]
        fig, ax = plt.subplots(figsize=(8, 0.45 * max(len(t), 2) + 1.2))
        base_m = float(tables["tornado"].metric_at_base.iloc[0]) if len(tables["tornado"]) else 0.0
        y = np.arange(len(t))
        lo = t.metric_at_low.to_numpy() - base_m
        hi = t.metric_at_high.to_numpy() - base_m
        ax.barh(y, lo, left=base_m, color="#c0504d", label="input at low")
        ax.barh(y, hi, left=base_m, color="#4f81bd", label="input at high")
        ax.set_yticks(y, [f"{n} [{_fmt(a)} .. {_fmt(b)}]" for n, a, b in zip(t.input, t.low_value, t.high_value)])
        ax.axvline(base_m, color="black", linewidth=0.8)
        ax.set_xlabel(f"{metric} ({UNITS.get(metric, '')}); base {_fmt(base_m)}")
        ax.set_title(f"Sensitivity of {metric}")
        ax.legend(loc="lower right", fontsize=8)
        tornado_svg = svg_text(fig)
        plt.close(fig)

        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
        nv = tables["net_vs_hit_rate"]
        for rv, grp in nv.groupby("revisit_rate", sort=True):
            a1.plot(grp.hit_rate, grp.net_usd_per_month, label=f"revisit rate {rv:g}")
        a1.axhline(0.0, color="black", linewidth=0.8)
        a1.axvline(r.base["hit_rate"], color="grey", linestyle=":", linewidth=0.8)
        a1.set_xlabel("hit rate")
        a1.set_ylabel("net saving (USD/month)")
        a1.set_title("Net saving vs hit rate (break-even at 0)")
        a1.legend(fontsize=8)
        be = tables["break_even"]
        for g, grp in be.groupby("gpu_usd_per_hour", sort=True):
            a2.plot(grp.storage_usd_per_tb_month, np.minimum(grp.break_even_hit_rate, 1.5),
                    label=f"GPU ${g:g}/h")
        a2.axhline(1.0, color="black", linewidth=0.8)
        a2.axvline(r.base["storage_usd_per_tb_month"], color="grey", linestyle=":", linewidth=0.8)
        a2.set_ylim(0, 1.5)
        a2.set_xlabel("storage price (USD/TB-month)")
        a2.set_ylabel("break-even hit rate (above 1: never pays)")
        a2.set_title("Break-even hit rate")
        a2.legend(fontsize=8)
        fig.tight_layout()
        break_even_svg = svg_text(fig)
        plt.close(fig)
    return {"tornado.svg": tornado_svg, "break_even.svg": break_even_svg}


# --------------------------------------------------------------------------- staging


def write_staging(r: Resolved, staging: Path) -> dict[str, pd.DataFrame]:
    """Write params, tables, charts and measured inputs into ``staging`` (created; must not hold other files)."""
    (staging / "params").mkdir(parents=True, exist_ok=True)
    (staging / "tables").mkdir(exist_ok=True)
    (staging / "charts").mkdir(exist_ok=True)
    shutil.copyfile(r.params_path, staging / PARAMS_NAME)
    shutil.copyfile(r.model_config_path, staging / "params" / r.model_config_path.name)
    measured = [asdict(m) for m in r.measured]
    (staging / "measured_inputs.json").write_text(json.dumps(measured, indent=1, sort_keys=True) + "\n")
    tables = build_tables(r)
    for name, frame in tables.items():
        (staging / "tables" / f"{name}.csv").write_bytes(to_csv_bytes(frame, "%.10g"))
    for name, svg in render_charts(r, tables).items():
        (staging / "charts" / name).write_text(svg)
    return tables


def predicate(r: Resolved) -> dict[str, Any]:
    """The signed predicate: what this bundle is and which verified reports it rests on."""
    return {
        "kind": "kvgate-cost/v1",
        "input_report_ids": r.input_report_ids,
        "measured_inputs": [asdict(m) for m in r.measured],
        "model": r.arch.name,
        "kv_bytes_per_token": r.arch.kv_bytes_per_token,
        "timing": r.timing,
        "params_file": PARAMS_NAME,
    }


# --------------------------------------------------------------------------- Markdown / HTML


KEY_RESULTS = (
    "kv_bytes_per_session", "recompute_s", "readback_s", "readback_speedup", "recompute_usd", "readback_usd",
    "saved_usd_per_hit", "capacity_tb", "storage_usd_per_month", "gpu_hours_saved_per_month",
    "gpu_usd_saved_per_month", "net_usd_per_month", "break_even_hit_rate", "throughput_gain",
)


def _blocks(r: Resolved, tables: dict[str, pd.DataFrame], report_id: str) -> list[tuple[str, Any]]:
    res = dict(zip(tables["results"].output, tables["results"].value))
    blocks: list[tuple[str, Any]] = [
        ("h1", f"KV tier costing model: {r.arch.name}"),
        ("p", f"Report ID: {report_id}"),
        ("p", "Measured inputs from verified bundles: "
         + (", ".join(r.input_report_ids) if r.input_report_ids else
            "none (every number below is a parameter, a documented default or a vendor reference)")),
        ("p", f"KV bytes per token: {r.arch.formula()}."),
        ("p", "Per-session times: " + (
            "measured TTFTs (timing: measured)." if r.timing == "measured" else
            "re-compute = context tokens / (prefill tokens/s/GPU x GPUs); read-back = KV bytes / "
            "(per-GPU read GB/s x GPUs) + fixed overhead; the GPUs wait during read-back (timing: model).")),
        ("h2", "Key results"),
        ("table", (["output", "value", "unit"],
                   [[n, _fmt(res[n]), UNITS.get(n, "")] for n in KEY_RESULTS])),
    ]
    be = res["break_even_hit_rate"]
    verdict = ("never pays: a hit does not save GPU time" if np.isinf(be) else
               f"pays when more than {be:.1%} of revisits hit" if be <= 1 else
               f"does not pay at any hit rate (break-even {be:.2f} > 1)")
    blocks.append(("p", f"At these inputs the tier {verdict}; net saving {_fmt(res['net_usd_per_month'])} USD/month."))
    if r.timing == "model" and "readback_ttft_s" in r.inputs and "recompute_ttft_s" in r.inputs:
        blocks.append(("p", (
            f"Cross-check: the model gives read-back {_fmt(res['readback_s'])} s and re-compute "
            f"{_fmt(res['recompute_s'])} s per session; measured TTFT p50: read-back "
            f"{_fmt(r.inputs['readback_ttft_s'].value)} s ({r.inputs['readback_ttft_s'].source}), re-compute "
            f"{_fmt(r.inputs['recompute_ttft_s'].value)} s ({r.inputs['recompute_ttft_s'].source}).")))
    if (g := r.measured_gain) is not None:
        blocks.append(("p", (
            f"Cross-check: the model gives a throughput gain of {res['throughput_gain']:+.1%} at these inputs; "
            f"measured on the same load with the tier and without: {g.value:+.1%} ({g.report_id} {g.gate_id} "
            f"{g.metric}, {g.outcome}; docs/g2.md, \"The tier's worth\").")))
    inputs = tables["inputs"]
    blocks += [
        ("h2", "Inputs and their sources"),
        ("table", (["input", "value", "unit", "kind", "source"],
                   [[row.input, _fmt(row.value), row.unit, row.kind + ("" if row.used else " (not used)"),
                     row.source] for row in inputs.itertuples()])),
        ("h2", f"Sensitivity of {r.params.sensitivity.metric}"),
        ("svg", "tornado.svg"),
        ("table", (["input", "low", "high", "metric at low", "metric at high", "swing"],
                   [[row.input, _fmt(row.low_value), _fmt(row.high_value), _fmt(row.metric_at_low),
                     _fmt(row.metric_at_high), _fmt(row.swing)] for row in tables["tornado"].itertuples()])),
        ("h2", "Break-even"),
        ("svg", "break_even.svg"),
        ("p", "Tables (CSV): tables/inputs.csv, tables/results.csv, tables/tornado.csv, "
              "tables/net_vs_hit_rate.csv, tables/break_even.csv. Parameters as given: params/."),
        ("p", f"Model assumptions: a month is {cost.DAYS_PER_MONTH:g} days; every session's KV is kept for "
              "retention_days; prefill time is linear in context tokens; read-back does not overlap compute."),
    ]
    return blocks


def render_markdown(r: Resolved, tables: dict[str, pd.DataFrame], report_id: str) -> str:
    out: list[str] = []
    for kind, body in _blocks(r, tables, report_id):
        if kind == "h1":
            out.append(f"# {body}\n")
        elif kind == "h2":
            out.append(f"## {body}\n")
        elif kind == "p":
            out.append(f"{body}\n")
        elif kind == "svg":
            out.append(f"![{body}](charts/{body})\n")
        elif kind == "table":
            head, rows = body
            esc = lambda s: str(s).replace("|", "\\|")  # noqa: E731
            out.append("| " + " | ".join(head) + " |")
            out.append("|" + "---|" * len(head))
            out.extend("| " + " | ".join(esc(c) for c in row) + " |" for row in rows)
            out.append("")
    return "\n".join(out)


def render_html(r: Resolved, tables: dict[str, pd.DataFrame], report_id: str, charts: dict[str, str]) -> str:
    """A self-contained HTML page: no external files, the SVG charts inlined."""
    e = html.escape
    parts = [
        "<!DOCTYPE html>", "<html lang=\"en\"><head><meta charset=\"utf-8\">",
        f"<title>{e(report_id)} kvgate cost</title>",
        "<style>body{font-family:sans-serif;max-width:70em;margin:2em auto;padding:0 1em}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:2px 6px;"
        "text-align:left}td:nth-child(2){text-align:right}svg{max-width:100%;height:auto}</style>",
        "</head><body>",
    ]
    for kind, body in _blocks(r, tables, report_id):
        if kind in ("h1", "h2", "p"):
            parts.append(f"<{kind}>{e(body)}</{kind}>")
        elif kind == "svg":
            parts.append(f"<figure>{charts[body]}</figure>")
        elif kind == "table":
            head, rows = body
            parts.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>")
            parts.extend("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in row) + "</tr>" for row in rows)
            parts.append("</table>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def renderer(r: Resolved, tables: dict[str, pd.DataFrame]):
    """The ``render`` callback for :func:`harness.report.bundle.write_bundle`: reports that print the report ID."""

    def render(report_id: str, bundle_dir: Path) -> list[str]:
        charts = {n: (bundle_dir / "charts" / n).read_text() for n in ("tornado.svg", "break_even.svg")}
        (bundle_dir / "report.md").write_text(render_markdown(r, tables, report_id))
        (bundle_dir / "report.html").write_text(render_html(r, tables, report_id, charts))
        return ["report.md", "report.html"]

    return render
