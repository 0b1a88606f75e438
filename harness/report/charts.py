"""Charts of a report as inline SVG text (matplotlib, Agg), from plain inputs.

Every function takes plain Python data (lists of numbers, dicts of series), never a bundle, so the same
function draws a chart for any workload that produces the data. Output is deterministic (fixed hash salt,
no date, text as paths), so re-rendering a bundle gives byte-identical SVG with the same matplotlib.
Artists that tests and readers look for carry an SVG id (``gid``): ``bar-<label>``, ``bar-fio-<label>``,
``pass-line``, ``stop-loss-line``, ``reference-line``, ``ecdf-recompute``, ``ecdf-readback``, ``series-<node>``,
``aggregate-line``, ``nic-ceiling-line``.
"""

from __future__ import annotations

import io
import math
import re
from typing import Any, Iterable, Mapping, Sequence

from ..stats import percentile

PASS_COLOR = "#2e7d32"
STOP_COLOR = "#c62828"
REF_COLOR = "#6d6d6d"
BAR_COLOR = "#4f81bd"
BASELINE_COLOR = "#a5a5a5"
RECOMPUTE_COLOR = "#c0504d"
READBACK_COLOR = "#4f81bd"
RC = {"svg.hashsalt": "kvgate-report", "svg.fonttype": "path", "font.size": 9}


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return matplotlib, plt


def _gid(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", str(text))


def _finite(xs: Iterable[float]) -> list[float]:
    return [float(x) for x in xs if x is not None and math.isfinite(float(x))]


def svg_text(fig) -> str:
    """A matplotlib figure as SVG text without the XML prolog or a date, for inlining into HTML."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None}, bbox_inches="tight")
    text = buf.getvalue()
    return text[text.index("<svg"):]


def stream_bars_svg(streams: Sequence[tuple[str, float]], *, unit: str = "GB/s", pass_value: float | None = None,
                    stop_value: float | None = None, reference_value: float | None = None,
                    title: str = "Read bandwidth per GPU / stream",
                    baseline: Sequence[float | None] | None = None, baseline_name: str = "fio",
                    bar_name: str = "connector") -> str:
    """One bar per GPU or read stream (label, value in ``unit``), with the pass and stop-loss lines and the
    reference figure where given (all in ``unit``). With ``baseline`` (one value per stream, e.g. fio's figure
    for the same stream) each stream gets two bars side by side: the baseline (``bar-<name>-<label>``) and the
    measured one (``bar-<label>``)."""
    mpl, plt = _plt()
    with mpl.rc_context(RC):
        n = max(len(streams), 1)
        paired = baseline is not None and any(b is not None for b in baseline)
        fig, ax = plt.subplots(figsize=(min(3.5 + (0.8 if paired else 0.55) * n, 11.0), 3.6))
        xs = list(range(len(streams)))
        width, shift = (0.38, 0.2) if paired else (0.7, 0.0)
        for i, (x, (label, val)) in enumerate(zip(xs, streams)):
            base = baseline[i] if paired and i < len(baseline) else None
            if base is not None:
                bb = ax.bar([x - shift], [base], color=BASELINE_COLOR, width=width,
                            label=baseline_name if i == 0 else None)
                bb.patches[0].set_gid(f"bar-{_gid(baseline_name)}-{_gid(label)}")
                ax.annotate(f"{base:.3g}", (x - shift, base), ha="center", va="bottom", fontsize=7,
                            xytext=(0, 2), textcoords="offset points")
            bar = ax.bar([x + shift], [val], color=BAR_COLOR, width=width,
                         label=bar_name if paired and i == 0 else None)
            bar.patches[0].set_gid(f"bar-{_gid(label)}")
            ax.annotate(f"{val:.3g}", (x + shift, val), ha="center", va="bottom", fontsize=7,
                        xytext=(0, 2), textcoords="offset points")
        ax.set_xticks(xs, [str(s[0]) for s in streams], rotation=45 if n > 8 else 0,
                      ha="right" if n > 8 else "center")
        # A reference far above what was measured would flatten the bars: then it is named, not drawn.
        near = _finite([v for _, v in streams] + list(baseline or []) + [pass_value, stop_value])
        ref_off_scale = (reference_value is not None and near and reference_value > 2.5 * max(near))
        for value, gid, color, style, name in (
            (pass_value, "pass-line", PASS_COLOR, "-", "pass"),
            (stop_value, "stop-loss-line", STOP_COLOR, "--", "stop-loss"),
            (None if ref_off_scale else reference_value, "reference-line", REF_COLOR, ":", "reference"),
        ):
            if value is not None:
                line = ax.axhline(value, color=color, linestyle=style, linewidth=1.2,
                                  label=f"{name} {value:.3g} {unit}")
                line.set_gid(gid)
        tops = _finite([v for _, v in streams] + list(baseline or []) + [pass_value, stop_value] +
                       ([] if ref_off_scale else [reference_value]))
        ax.set_ylim(0, (max(tops) if tops else 1.0) * 1.15 or 1.0)
        ax.set_ylabel(f"read ({unit})")
        ax.set_title(title)
        if ref_off_scale:
            ax.text(1.02, 0.02, f"reference {reference_value:.3g} {unit}\n(off scale)", transform=ax.transAxes,
                    fontsize=7, color=REF_COLOR, va="bottom", gid="reference-note")
        if paired or any(v is not None for v in (pass_value, stop_value)) or (
                reference_value is not None and not ref_off_scale):
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, framealpha=0.9)
        fig.tight_layout()
        svg = svg_text(fig)
        plt.close(fig)
    return svg


def ecdf(values: Sequence[float]) -> tuple[list[float], list[float]]:
    """Empirical CDF: sorted values and the fraction of values at or below each."""
    xs = sorted(_finite(values))
    n = len(xs)
    return xs, [(i + 1) / n for i in range(n)]


def ttft_distribution_svg(recompute_s: Sequence[float], readback_s: Sequence[float], *,
                          reference_p50_s: float | None = None,
                          title: str = "TTFT: re-compute vs read-back") -> str:
    """Empirical CDFs of the time to first token with the KV re-computed and with it read back, p50 marked."""
    mpl, plt = _plt()
    with mpl.rc_context(RC):
        fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 3.6), gridspec_kw={"width_ratios": [3, 2]})
        groups = [("re-compute", "ecdf-recompute", RECOMPUTE_COLOR, recompute_s),
                  ("read-back", "ecdf-readback", READBACK_COLOR, readback_s)]
        for name, gid, color, vals in groups:
            xs, ys = ecdf(vals)
            if not xs:
                continue
            p50 = percentile(xs, 50)
            (line,) = ax.step(xs, ys, where="post", color=color, label=f"{name} (n={len(xs)}, p50 {p50:.3g} s)")
            line.set_gid(gid)
            ax.axvline(p50, color=color, linestyle=":", linewidth=0.8)
        if reference_p50_s is not None:
            ax.axvline(reference_p50_s, color=REF_COLOR, linestyle="--", linewidth=1.0,
                       label=f"reference p50 {reference_p50_s:.3g} s").set_gid("reference-line")
        allv = _finite(list(recompute_s) + list(readback_s))
        if allv and min(allv) > 0 and max(allv) / min(allv) > 20:
            ax.set_xscale("log")
        ax.set_xlabel("time to first token (s)")
        ax.set_ylabel("fraction of requests")
        ax.set_ylim(0, 1.02)
        ax.set_title(title)
        ax.legend(loc="lower right", fontsize=7)
        data = [_finite(v) for _, _, _, v in groups]
        labels = [g[0] for g in groups]
        keep = [(d, lab) for d, lab in zip(data, labels) if d]
        if keep:
            bp = bx.boxplot([d for d, _ in keep], whis=(5, 95), showfliers=True)
            bx.set_xticks(range(1, len(keep) + 1), [lab for _, lab in keep])
            for box, (_, lab) in zip(bp["boxes"], keep):
                box.set_gid(f"box-{_gid(lab)}")
        bx.set_ylabel("TTFT (s), whiskers p5-p95")
        bx.set_title("spread")
        fig.tight_layout()
        svg = svg_text(fig)
        plt.close(fig)
    return svg


def aggregate_series(series: Mapping[str, Sequence[Sequence[float]]]) -> list[tuple[float, float]]:
    """Sum of per-node rates over the union of sample times.

    Each node's rate holds from one sample to the next (sample-and-hold); before a node's first sample and
    after its last it contributes nothing. Returns [(t_s, sum_gb_s)], sorted by time.
    """
    nodes = {n: sorted((float(t), float(v)) for t, v in pts) for n, pts in series.items() if pts}
    # One sweep over every sample in time order, so 32 nodes of a long run cost N x P, not N x (N x P) x P.
    samples = sorted((t, v, n) for n, pts in nodes.items() for t, v in pts)
    ends = sorted((pts[-1][0], n) for n, pts in nodes.items())  # a node drops out after its last sample
    current: dict[str, float] = {}
    out: list[tuple[float, float]] = []
    i = j = 0
    while i < len(samples):
        t = samples[i][0]
        while j < len(ends) and ends[j][0] < t:
            current.pop(ends[j][1], None)
            j += 1
        while i < len(samples) and samples[i][0] == t:
            _, v, n = samples[i]
            current[n] = v  # equal times in one node: the last in sorted order holds
            i += 1
        total = 0.0
        for n in nodes:  # the series' order, as a plain running sum: the same float as ever
            if n in current:
                total += current[n]
        out.append((t, total))
    return out


#: the most nodes :func:`node_series_svg`'s legend names one by one
LEGEND_NODES = 32


def node_series_svg(series: Mapping[str, Sequence[Sequence[float]]], *, nic_line_rate_gb_s: float | None = None,
                    pass_value: float | None = None, unit: str = "GB/s",
                    title: str = "Read rate per node over time",
                    marks: Sequence[Sequence[Any]] = ()) -> str:
    """Per-node read rate over time (t_s, rate), their aggregate, the NIC ceiling and the pass line; ``marks``:
    (t_s, label) events drawn as vertical lines (a fault and its inverse). The legend names each node up to
    :data:`LEGEND_NODES` nodes; above, one entry says how many lines there are (a legend of a thousand names is
    taller than the chart, and laying it out was most of a 1,024-node bundle's rendering); every node's line
    keeps its ``series-<node>`` id either way."""
    mpl, plt = _plt()
    with mpl.rc_context(RC):
        fig, ax = plt.subplots(figsize=(10, 4))
        cmap = plt.get_cmap("tab10")
        named = len(series) <= LEGEND_NODES
        drawn = 0
        for i, node in enumerate(sorted(series)):
            pts = sorted((float(t), float(v)) for t, v in series[node])
            if not pts:
                continue
            (line,) = ax.step([p[0] for p in pts], [p[1] for p in pts], where="post", linewidth=0.9,
                              color=cmap(i % 10), label=node if named else None)
            line.set_gid(f"series-{_gid(node)}")
            drawn += 1
        if not named and drawn:
            ax.plot([], [], color=cmap(0), linewidth=0.9, label=f"{drawn} nodes, one line each")
        agg = aggregate_series(series)
        tops = [v for _, v in agg]
        if agg:
            (line,) = ax.step([p[0] for p in agg], [p[1] for p in agg], where="post", color="black",
                              linewidth=1.8, label="aggregate")
            line.set_gid("aggregate-line")
        for i, (t, label) in enumerate(marks):
            ax.axvline(float(t), color=STOP_COLOR if i % 2 == 0 else PASS_COLOR, linestyle=":", linewidth=1.2,
                       label=str(label)).set_gid(f"mark-{i}")
        if nic_line_rate_gb_s is not None:
            ax.axhline(nic_line_rate_gb_s, color=STOP_COLOR, linestyle="--", linewidth=1.2,
                       label=f"NIC line rate {nic_line_rate_gb_s:.3g} {unit}").set_gid("nic-ceiling-line")
            tops.append(nic_line_rate_gb_s)
        if pass_value is not None:
            ax.axhline(pass_value, color=PASS_COLOR, linestyle="-", linewidth=1.0,
                       label=f"pass {pass_value:.3g} {unit}").set_gid("pass-line")
            tops.append(pass_value)
        ax.set_ylim(0, (max(tops) if tops else 1.0) * 1.12 or 1.0)
        ax.set_xlabel("time since start (s)")
        ax.set_ylabel(f"read ({unit})")
        ax.set_title(title)
        ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=7)
        fig.tight_layout()
        svg = svg_text(fig)
        plt.close(fig)
    return svg


def compare_svg(rows: Sequence[tuple[str, float | None]], *, label_a: str, label_b: str,
                title: str = "Change from A to B") -> str:
    """Horizontal bars of the relative change (percent) of each shared metric from run A to run B."""
    mpl, plt = _plt()
    with mpl.rc_context(RC):
        rows = [(n, p) for n, p in rows if p is not None and math.isfinite(p)]
        fig, ax = plt.subplots(figsize=(9, 0.35 * max(len(rows), 2) + 1.4))
        ys = list(range(len(rows)))[::-1]
        for y, (name, pct) in zip(ys, rows):
            bar = ax.barh([y], [pct], color=PASS_COLOR if pct >= 0 else STOP_COLOR)
            bar.patches[0].set_gid(f"delta-{_gid(name)}")
            ax.annotate(f"{pct:+.1f}%", (pct, y), va="center", ha="left" if pct >= 0 else "right",
                        xytext=(3 if pct >= 0 else -3, 0), textcoords="offset points", fontsize=7)
        ax.set_yticks(ys, [n for n, _ in rows])
        ax.axvline(0, color="black", linewidth=0.8)
        ax.set_xlabel(f"change from {label_a} to {label_b} (%)")
        ax.set_title(title)
        fig.tight_layout()
        svg = svg_text(fig)
        plt.close(fig)
    return svg
