"""The charts of a tier-gain gate (``g2-gain``): the two arms' TTFT distributions overlaid, one empirical CDF per
arm over every request of every trial, read from each arm's requests files (``gates/ID/tier/``,
``gates/ID/no_tier/``), the SLO as a vertical line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..workloads.g2_gain import ARMS, GainEvidence
from . import load_charts as lc
from .load_section import _finite, read_requests

ARM_NAMES = {"tier": "with the tier", "no_tier": "without the tier"}


def gain_evidence(verdict: dict[str, Any]) -> GainEvidence | None:
    """A gate's evidence as g2-gain's model, or None when it is not a gain gate's (or not readable as one)."""
    ev = verdict.get("evidence")
    if not isinstance(ev, dict) or "arms" not in ev or "pairs" not in ev:
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


def gain_charts(verdict: dict[str, Any], gate_dir: Path | None) -> dict[str, tuple[str, str]]:
    """kind -> (caption, svg): the arms' TTFT CDFs overlaid (nothing for a gate that is not a gain gate)."""
    ev = gain_evidence(verdict)
    if ev is None:
        return {}
    ttfts = arm_ttfts(ev, gate_dir)
    if not any(ttfts.values()):
        return {}
    gid = str(verdict.get("gate_id", ""))
    svg = lc.ttft_cdf_svg([(ARM_NAMES[a], v) for a, v in ttfts.items()], slo_s=ev.ttft_slo_s,
                          title=f"{gid}: TTFT with the tier and without")
    return {"gain-cdf": ("Time to first token of the two arms, the same load with the tier and without (successful "
                         "requests of all trials; empirical CDF), the SLO as a vertical line", svg)}
