"""The chart of an engine gate under faults (``g2-faults``): its timeline, drawn from the gate's evidence alone
(every request of the faulted phase and every fault, as the verdict records them; harness.workloads.g2_faults,
:func:`~harness.workloads.g2_faults.faults_timeline`).

Top panel: each request's TTFT at the time it was sent (s after the phase started), one marker per source: served
from the tier, re-computed (the engine fell back), failed (drawn at the time until its error); each fault's window
shaded from when it was made to when its inverse returned, both marked. Bottom panel, on the same time axis: the
KV tokens each request read from the tier by the engine's hit counter (a bar over the request's flight), against
what its prompt stored. The pool device's read rate is not drawn: the gate does not sample it (the pool is a
network mount on the engine's node, which has no block device of it to count, and a probe on that node would
wait on the dead mount during a fault; docs/faults.md).

SVG ids: ``ttft-tier``, ``ttft-re-compute``, ``ttft-failed`` (the markers of each source), ``fault-window-<i>``,
``fault-made-<i>`` and ``fault-undone-<i>`` (fault i's shading and its two lines), ``tier-tokens-<source>-<request
index>`` (its bar), ``stored-tokens`` (what each prompt stored)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..workloads.g2_faults import FaultsTimeline, G2FaultsEvidence, faults_timeline
from .charts import PASS_COLOR, READBACK_COLOR, RECOMPUTE_COLOR, REF_COLOR, RC, STOP_COLOR, _plt, svg_text

SOURCES = {"tier": ("served from the tier", READBACK_COLOR, "o"),
           "re-compute": ("re-computed (fell back)", RECOMPUTE_COLOR, "s"),
           "failed": ("failed (time until its error)", "black", "x")}
WINDOW_COLOR = "#f4cccc"


def faults_evidence(verdict: dict[str, Any], workload: str | None) -> G2FaultsEvidence | None:
    """A g2-faults gate's evidence as its model (``workload``: the gate's, as the bundle's config/gates.yaml names
    it), or None for another workload's gate or evidence not readable as g2-faults'."""
    ev = verdict.get("evidence")
    if workload != "g2-faults" or not isinstance(ev, dict):
        return None
    try:
        return G2FaultsEvidence.model_validate(ev)
    except ValidationError:
        return None


def faults_charts(verdict: dict[str, Any], workload: str | None, gate_dir: Path | None = None
                  ) -> dict[str, tuple[str, str]]:
    """kind -> (caption, svg): a g2-faults gate's timeline (nothing for any other gate, or one with no request
    and no fault on its time line). Reads the verdict's evidence only; ``gate_dir`` is not needed."""
    ev = faults_evidence(verdict, workload)
    if ev is None:
        return {}
    tl = faults_timeline(ev.requests, ev.faults)
    if not tl.points and not tl.windows:
        return {}
    gid = str(verdict.get("gate_id", ""))
    caption = ("Timeline of the faulted phase: each request's time to first token at the time it was sent (served "
               "from the tier, re-computed by the engine, or failed), each fault's window shaded from when it was "
               "made to when its inverse returned; below, the KV tokens each request read from the tier by the "
               "engine's hit counter against what its prompt stored. The pool device's read rate is not sampled "
               "by this gate")
    return {"timeline": (caption, timeline_svg(tl, title=f"{gid}: requests and faults over time"))}


def timeline_svg(tl: FaultsTimeline, *, title: str = "requests and faults over time") -> str:
    """Pure: the timeline as SVG (deterministic: harness.report.charts' settings)."""
    mpl, plt = _plt()
    with mpl.rc_context(RC):
        fig, (ax, bx) = plt.subplots(2, 1, figsize=(10, 5), sharex=True, gridspec_kw={"height_ratios": [3, 1.3]})
        try:
            for served, (name, color, marker) in SOURCES.items():
                pts = [p for p in tl.points if p.served == served]
                if not pts:
                    continue
                coll = ax.scatter([p.t_sent_s for p in pts], [p.wait_s for p in pts], color=color, marker=marker,
                                  s=28, zorder=3, label=f"{name} ({len(pts)})")
                coll.set_gid(f"ttft-{served}")
            for w in tl.windows:
                end = w.t_undo_s if w.t_undo_s is not None else tl.t_end_s
                for axis in (ax, bx):
                    span = axis.axvspan(w.t_apply_s, end, color=WINDOW_COLOR, alpha=0.6, zorder=0, linewidth=0)
                    if axis is ax:
                        span.set_gid(f"fault-window-{w.index}")
                ax.axvline(w.t_apply_s, color=STOP_COLOR, linestyle=":", linewidth=1.2,
                           label=f"fault {w.index} ({w.kind}) made {w.t_apply_s:g} s").set_gid(f"fault-made-{w.index}")
                if w.t_undo_s is not None:
                    ax.axvline(w.t_undo_s, color=PASS_COLOR, linestyle=":", linewidth=1.2,
                               label=f"fault {w.index} undone {w.t_undo_s:g} s" + ("" if w.undone_ok else
                                                                                     " (inverse failed)")
                               ).set_gid(f"fault-undone-{w.index}")
            waits = [p.wait_s for p in tl.points if p.wait_s > 0]
            if waits and max(waits) / min(waits) > 20:
                ax.set_yscale("log")  # a stall of seconds beside hits of tens of ms: both readable
            else:
                ax.set_ylim(bottom=0)
            ax.set_ylabel("time to first token (s)")
            ax.set_title(title)
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7)
            for served, (name, color, _) in SOURCES.items():
                pts = [p for p in tl.points if p.served == served and p.tier_tokens is not None]
                if pts:
                    bars = bx.bar([p.t_sent_s for p in pts], [p.tier_tokens for p in pts],
                                  width=[max(p.t_end_s - p.t_sent_s, 0.02) for p in pts], align="edge", color=color,
                                  alpha=0.8, label=f"tier tokens: {name}")
                    for bar, p in zip(bars, pts):
                        bar.set_gid(f"tier-tokens-{served}-{p.index}")
            if tl.points:
                stored = bx.hlines([p.expected_tier_tokens for p in tl.points], [p.t_sent_s for p in tl.points],
                                   [max(p.t_end_s, p.t_sent_s + 0.02) for p in tl.points], color=REF_COLOR,
                                   linestyle="--", linewidth=1.0, label="stored KV of its prompt")
                stored.set_gid("stored-tokens")
                bx.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7)
            bx.set_ylim(bottom=0)
            bx.set_ylabel("tier tokens\n(hit counter)")
            bx.set_xlabel("time since the faulted phase started (s)")
            bx.set_xlim(0, max(tl.t_end_s, 1e-3) * 1.03)
            fig.tight_layout()
            return svg_text(fig)
        finally:
            plt.close(fig)
