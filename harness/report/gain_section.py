"""The charts of a tier-gain gate (``g2-gain``): the two arms' TTFT distributions overlaid, one empirical CDF per
arm over every request of every trial, read from each arm's requests files (``gates/ID/tier/``,
``gates/ID/no_tier/``), the SLO as a vertical line; for a capacity sweep (``capacity:``) the capacity curve: per
working set the reusable tokens by the level that served them, stacked (engine memory, RAM level, tier,
recomputed), the knee and the point where the tier ran out marked, goodput on a second axis. SVG ids:
``level-<level>-<bar index>`` (a level's bar at a working set), ``goodput-line``, ``knee-line``, ``tier-full-line``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..workloads.g2_gain import ARMS, GainEvidence
from ..workloads.kit.load import hits_by_level
from ..workloads.kit.capacity import LEVEL_NAMES, LEVELS, CapacityEvidence
from . import load_charts as lc
from .charts import RC, STOP_COLOR, _plt, svg_text
from .load_section import _finite, load_evidence, read_requests

ARM_NAMES = {"tier": "with the tier", "no_tier": "without the tier"}
LEVEL_COLORS = {"memory": "#4f81bd", "ram": "#9bbb59", "tier": "#8e44ad", "recomputed": "#c0504d"}


def gain_evidence(verdict: dict[str, Any], workload: str | None) -> GainEvidence | None:
    """A g2-gain gate's evidence as its model (``workload``: the gate's, as the bundle's config/gates.yaml names
    it), or None for another workload's gate or evidence not readable as g2-gain's."""
    ev = verdict.get("evidence")
    if workload != "g2-gain" or not isinstance(ev, dict):
        return None
    try:
        return GainEvidence.model_validate(ev)
    except ValidationError:
        return None


def arm_ttfts(ev: GainEvidence, gate_dir: Path | None) -> dict[str, list[float]]:
    """Each arm's successful requests' TTFT (s), all points and trials, from its requests files."""
    out: dict[str, list[float]] = {}
    for arm in ARMS:
        arm_ev = ev.arms.get(arm)
        if arm_ev is None or gate_dir is None:
            continue
        values: list[float] = []
        for pt in arm_ev.points:
            for r in read_requests(gate_dir / arm, pt) or []:
                if r.record.ok and (x := _finite(r.record.ttft_s)) is not None:
                    values.append(x)
        out[arm] = values
    return out


def gain_charts(verdict: dict[str, Any], gate_dir: Path | None, workload: str | None) -> dict[str, tuple[str, str]]:
    """kind -> (caption, svg): the arms' TTFT CDFs overlaid, and a capacity sweep's curve (nothing for a gate that
    is not a gain gate)."""
    ev = gain_evidence(verdict, workload)
    if ev is None:
        return {}
    gid = str(verdict.get("gate_id", ""))
    out = {}
    if ev.capacity is not None and ev.capacity.curve:
        out["capacity-curve"] = (
            "The capacity curve: per working set (a multiple of engine memory), the reusable prompt tokens by the "
            "level that served them, levels stacked (engine memory, RAM level, tier, recomputed; medians over "
            "trials), the knee where engine memory stops holding and where the tier's own capacity ran out marked, "
            "goodput on the right axis", capacity_svg(ev.capacity, title=f"{gid}: capacity curve"))
    ttfts = arm_ttfts(ev, gate_dir)
    if not any(ttfts.values()):
        return out
    svg = lc.ttft_cdf_svg([(ARM_NAMES[a], v) for a, v in ttfts.items()], slo_s=ev.ttft_slo_s,
                          title=f"{gid}: TTFT with the tier and without")
    caption = ("Time to first token of the two arms, the same load with the tier and without (successful requests of "
               "all trials; empirical CDF), the SLO as a vertical line") if ev.capacity is None else (
        "Time to first token over the sweep's points with the tier (successful requests of all points and trials; "
        "empirical CDF), the SLO as a vertical line")
    return {**out, "gain-cdf": (caption, svg)}


def capacity_svg(cap: CapacityEvidence, *, title: str = "capacity curve") -> str:
    """Pure: the capacity curve as SVG: one bar per working set (in sweep order, labelled with its multiple of
    engine memory), its levels' hit rates stacked, the knee and the tier's end as vertical lines between bars,
    goodput (requests/s) on a second axis."""
    mpl, plt = _plt()
    with mpl.rc_context(RC):
        fig, ax = plt.subplots(figsize=(8, 4))
        try:
            xs = list(range(len(cap.curve)))
            bottom = [0.0] * len(xs)
            for level in LEVELS:
                key = "recomputed_rate" if level == "recomputed" else f"{level}_hit_rate"
                vals = [c.figures.get(key) or 0.0 for c in cap.curve]
                bars = ax.bar(xs, vals, bottom=bottom, width=0.7, color=LEVEL_COLORS[level], label=LEVEL_NAMES[level])
                for bar in bars:
                    bar.set_gid(f"level-{level}-{bar.get_x() + bar.get_width() / 2:g}")
                bottom = [b + v for b, v in zip(bottom, vals)]
            ax.set_xticks(xs, [f"{c.working_set_x:g}x\n{c.sessions} session{'s' if c.sessions != 1 else ''}"
                               for c in cap.curve])
            ax.set_xlabel("working set (x engine memory; sessions)")
            ax.set_ylabel("share of the reusable prompt tokens")
            ax.set_ylim(0, 1.05)

            def at(x: float | None) -> float | None:
                """The bar position of a working set (the knee and the tier's end are sweep points)."""
                return next((i - 0.5 for i, c in zip(xs, cap.curve) if x is not None and c.working_set_x == x), None)

            if (k := at(cap.knee_x)) is not None:
                ax.axvline(k, color=lc.KNEE_COLOR, linestyle="-.", linewidth=1.2,
                           label=f"knee {cap.knee_x:g}x").set_gid("knee-line")
            if (f := at(cap.tier_exhausted_x)) is not None:
                ax.axvline(f, color=STOP_COLOR, linestyle="--", linewidth=1.2,
                           label=f"tier full {cap.tier_exhausted_x:g}x").set_gid("tier-full-line")
            if cap.require_up_to_x is not None and cap.require_levels:
                low = "-" if cap.capacity_hit_rate is None else f"{cap.capacity_hit_rate:.2f}"
                title += (f"\nrequired: {' + '.join(cap.require_levels)} from past engine memory up to "
                          f"{cap.require_up_to_x:g}x (lowest {low})")
            good = [c.figures.get("goodput_rps") for c in cap.curve]
            if any(g is not None for g in good):
                ax2 = ax.twinx()
                (line,) = ax2.plot([x for x, g in zip(xs, good) if g is not None], [g for g in good if g is not None],
                                   color="#333333", marker="o", linewidth=1.0, label="goodput (requests/s)")
                line.set_gid("goodput-line")
                ax2.set_ylabel("goodput (requests/s)")
                ax2.set_ylim(bottom=0)
                h1, l1 = ax.get_legend_handles_labels()
                h2, l2 = ax2.get_legend_handles_labels()
                ax.legend(h1 + h2, l1 + l2, loc="upper left", bbox_to_anchor=(1.12, 1.0), fontsize=7)
            else:
                ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7)
            ax.set_title(title, fontsize=9)
            fig.tight_layout()
            return svg_text(fig)
        finally:
            plt.close(fig)


def hits_line(verdict: dict[str, Any], workload: str | None) -> str | None:
    """Where a serving gate's tier hits came from (harness.workloads.kit.load.hits_by_level): a load gate's points,
    or a gain gate's tier arm; None for any other gate."""
    gain = gain_evidence(verdict, workload)
    if gain is not None:
        tier = gain.arms.get("tier") if gain.arms else None
        return hits_by_level(tier.points, tier.pool) if tier is not None else None
    load = load_evidence(verdict, workload)
    return hits_by_level(load.points, load.pool) if load is not None else None
