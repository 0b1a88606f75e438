"""Costing model for a KV-cache storage tier: pure, vectorized arithmetic.

Everything here is a pure function of numbers. Inputs are named with their units (``per_gpu_read_gb_s``,
``gpu_usd_per_hour``) and may be scalars or numpy arrays of any broadcastable shape, so one call evaluates
one operating point or a sweep of a million points with the same code (no Python loop per point).

Model (per session = one conversation/agent context of ``context_tokens`` tokens on an instance of
``gpus_per_instance`` GPUs):

* KV bytes per token (from a model's config.json, see :func:`harness.engines.kv.arch_from_config`):
  MHA/GQA ``layers x kv_heads x head_dim x 2 (K and V) x dtype_bytes``;
  MLA ``layers x (kv_lora_rank + qk_rope_head_dim) x dtype_bytes`` (one latent vector per layer).
* Re-compute: prefill of the context on all GPUs of the instance:
  ``recompute_s = context_tokens / (prefill_tokens_per_s_per_gpu x gpus_per_instance)``,
  ``recompute_gpu_s = recompute_s x gpus_per_instance``.
* Read-back: every GPU reads its shard of the KV from the tier:
  ``readback_s = kv_bytes_per_session / (per_gpu_read_gb_s x 1e9 x gpus_per_instance) + readback_fixed_s``;
  the GPUs wait meanwhile, so ``readback_gpu_s = readback_s x gpus_per_instance`` (conservative: no overlap).
* Timing "measured": the two per-session times are the measured TTFTs (G2) instead of the two formulas.
* Fleet (a month is :data:`DAYS_PER_MONTH` days): every session is parked for ``retention_days``, so
  ``capacity_bytes = sessions_per_day x retention_days x kv_bytes_per_session x (1 + capacity_overhead_ratio)``;
  ``hits_per_month = sessions_per_day x DAYS_PER_MONTH x revisit_rate x hit_rate``; each hit saves
  ``recompute_gpu_s - readback_gpu_s``; net saving = GPU money saved - storage money.
  Break-even hit rate: the hit rate at which net saving is zero (``inf`` when a hit saves nothing).
* Drive wear: each session's KV is written to the tier once, at the device's write amplification (device bytes
  written per stored KV byte, measured by a serving gate: docs/endurance.md), so
  ``device_written_bytes_per_month = sessions_per_day x DAYS_PER_MONTH x kv_bytes_per_session x
  device_write_amplification``, priced at ``drive_usd_per_tb_written`` (a drive's price over its rated writes:
  capacity x DWPD x 365 x warranty years); ``wear_usd_per_mtok`` is the same per million tokens stored. The wear is
  a cost of the tier beside its capacity: it comes off the net saving and into the break-even hit rate.
* Throughput gain of the instance: GPU work per session (context prefill + decode) on every visit without the
  tier, versus read-back instead of prefill on the revisits that hit; gain = work_without / work_with - 1.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

DAYS_PER_MONTH = 30.0
"""Days in a costing month. A fixed 30 keeps hand-checked numbers simple; 365.25/12 would add 1.5 %."""

GB = 1e9
TB = 1e12

INPUTS: tuple[str, ...] = (
    "kv_bytes_per_token",
    "context_tokens",
    "gpus_per_instance",
    "prefill_tokens_per_s_per_gpu",
    "per_gpu_read_gb_s",
    "readback_fixed_s",
    "readback_ttft_s",
    "recompute_ttft_s",
    "decode_tokens_per_session",
    "decode_tokens_per_s_per_gpu",
    "gpu_usd_per_hour",
    "storage_usd_per_tb_month",
    "sessions_per_day",
    "revisit_rate",
    "hit_rate",
    "retention_days",
    "capacity_overhead_ratio",
    "device_write_amplification",
    "drive_usd_per_tb_written",
)
"""Names of the model's numeric inputs (units in the names)."""

WEAR_DEFAULTS = {"device_write_amplification": 1.0, "drive_usd_per_tb_written": 0.0}
"""Inputs a caller may leave out: drive wear then unpriced (a device that writes only the KV, at no price)."""

MEASURED_ONLY = ("readback_ttft_s", "recompute_ttft_s")
"""Inputs used only when ``timing="measured"``."""

OUTPUTS: tuple[str, ...] = (
    "kv_bytes_per_session",
    "recompute_s",
    "recompute_gpu_s",
    "recompute_usd",
    "readback_s",
    "readback_gpu_s",
    "readback_usd",
    "readback_speedup",
    "saved_gpu_s_per_hit",
    "saved_usd_per_hit",
    "capacity_bytes",
    "capacity_tb",
    "storage_usd_per_month",
    "device_written_tb_per_month",
    "wear_usd_per_mtok",
    "wear_usd_per_month",
    "revisits_per_month",
    "hits_per_month",
    "gpu_hours_saved_per_month",
    "gpu_usd_saved_per_month",
    "net_usd_per_month",
    "break_even_hit_rate",
    "throughput_gain",
)
"""Names of the model's outputs, in table order."""

TIMINGS = ("model", "measured")


# --------------------------------------------------------------------------- the model


def _as_float(inputs: Mapping[str, Any], name: str) -> np.ndarray:
    try:
        value = inputs[name] if name in inputs or name not in WEAR_DEFAULTS else WEAR_DEFAULTS[name]
    except KeyError:
        raise KeyError(f"cost model input {name!r} missing") from None
    return np.asarray(value, dtype=np.float64)


def _session_s(x: Mapping[str, np.ndarray], timing: str, kv_session: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(recompute_s, readback_s) of one session: the measured TTFTs, or from prefill rate and read bandwidth."""
    if timing == "measured":
        return x["recompute_ttft_s"] * np.ones_like(kv_session), x["readback_ttft_s"] * np.ones_like(kv_session)
    gpus = x["gpus_per_instance"]
    recompute_s = x["context_tokens"] / (x["prefill_tokens_per_s_per_gpu"] * gpus)
    readback_s = kv_session / (x["per_gpu_read_gb_s"] * GB * gpus) + x["readback_fixed_s"]
    return recompute_s, readback_s


def _wear(x: Mapping[str, np.ndarray], kv_session: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Drive wear: (device bytes written per month, their price per month, the price per million tokens stored)."""
    wa, usd_per_tb_written = x["device_write_amplification"], x["drive_usd_per_tb_written"]
    written_bytes = x["sessions_per_day"] * DAYS_PER_MONTH * kv_session * wa
    wear_usd = written_bytes / TB * usd_per_tb_written
    wear_per_mtok = x["kv_bytes_per_token"] * 1e6 * wa / TB * usd_per_tb_written
    return written_bytes, wear_usd, wear_per_mtok


def _break_even_hit_rate(revisits: np.ndarray, saved_usd: np.ndarray, tier_usd: np.ndarray) -> np.ndarray:
    """The hit rate at which the hits' savings pay the tier's monthly cost (``inf`` where a hit saves nothing)."""
    denom = revisits * saved_usd
    return np.where(denom > 0, tier_usd / np.where(denom > 0, denom, 1.0), np.inf)


def _throughput_gain(x: Mapping[str, np.ndarray], recompute_gpu_s: np.ndarray,
                     readback_gpu_s: np.ndarray) -> np.ndarray:
    """The instance's throughput gain: GPU work per session without the tier over the work with it, less one."""
    decode_gpu_s = x["decode_tokens_per_session"] / x["decode_tokens_per_s_per_gpu"]
    visit_without = recompute_gpu_s + decode_gpu_s
    r, h = x["revisit_rate"], x["hit_rate"]
    work_without = (1.0 + r) * visit_without
    work_with = visit_without + r * (h * readback_gpu_s + (1.0 - h) * recompute_gpu_s + decode_gpu_s)
    return work_without / work_with - 1.0


def evaluate(inputs: Mapping[str, Any], timing: str = "model") -> dict[str, np.ndarray]:
    """Evaluate the costing model on scalars or broadcastable arrays; returns every name in :data:`OUTPUTS`.

    ``timing="model"`` derives the per-session times from prefill rate and read bandwidth;
    ``timing="measured"`` takes them from ``recompute_ttft_s`` / ``readback_ttft_s`` (G2 TTFTs).
    Divisions by zero give ``inf``/``nan`` per point rather than raising, so a sweep never dies on one corner.
    """
    if timing not in TIMINGS:
        raise ValueError(f"timing must be one of {TIMINGS}, got {timing!r}")
    x = {name: _as_float(inputs, name) for name in INPUTS if name not in MEASURED_ONLY or timing == "measured"}
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        gpus = x["gpus_per_instance"]
        usd_per_gpu_s = x["gpu_usd_per_hour"] / 3600.0
        kv_session = x["kv_bytes_per_token"] * x["context_tokens"]
        recompute_s, readback_s = _session_s(x, timing, kv_session)
        recompute_gpu_s = recompute_s * gpus
        readback_gpu_s = readback_s * gpus
        saved_gpu_s = recompute_gpu_s - readback_gpu_s
        saved_usd = saved_gpu_s * usd_per_gpu_s

        capacity_bytes = (
            x["sessions_per_day"] * x["retention_days"] * kv_session * (1.0 + x["capacity_overhead_ratio"])
        )
        storage_usd = capacity_bytes / TB * x["storage_usd_per_tb_month"]
        written_bytes, wear_usd, wear_per_mtok = _wear(x, kv_session)
        revisits = x["sessions_per_day"] * DAYS_PER_MONTH * x["revisit_rate"]
        hits = revisits * x["hit_rate"]
        gpu_h_saved = hits * saved_gpu_s / 3600.0
        gpu_usd_saved = gpu_h_saved * x["gpu_usd_per_hour"]
        net = gpu_usd_saved - storage_usd - wear_usd
        break_even = _break_even_hit_rate(revisits, saved_usd, storage_usd + wear_usd)
        gain = _throughput_gain(x, recompute_gpu_s, readback_gpu_s)

    out = {
        "kv_bytes_per_session": kv_session,
        "recompute_s": recompute_s,
        "recompute_gpu_s": recompute_gpu_s,
        "recompute_usd": recompute_gpu_s * usd_per_gpu_s,
        "readback_s": readback_s,
        "readback_gpu_s": readback_gpu_s,
        "readback_usd": readback_gpu_s * usd_per_gpu_s,
        "readback_speedup": recompute_s / readback_s,
        "saved_gpu_s_per_hit": saved_gpu_s,
        "saved_usd_per_hit": saved_usd,
        "capacity_bytes": capacity_bytes,
        "capacity_tb": capacity_bytes / TB,
        "storage_usd_per_month": storage_usd,
        "device_written_tb_per_month": written_bytes / TB,
        "wear_usd_per_mtok": wear_per_mtok,
        "wear_usd_per_month": wear_usd,
        "revisits_per_month": revisits,
        "hits_per_month": hits,
        "gpu_hours_saved_per_month": gpu_h_saved,
        "gpu_usd_saved_per_month": gpu_usd_saved,
        "net_usd_per_month": net,
        "break_even_hit_rate": break_even,
        "throughput_gain": gain,
    }
    shape = np.broadcast_shapes(*(v.shape for v in x.values()))
    return {k: np.broadcast_to(v, shape) for k, v in out.items()}


# --------------------------------------------------------------------------- sweeps


def sweep(
    base: Mapping[str, float], overrides: Mapping[str, np.ndarray], timing: str = "model"
) -> dict[str, np.ndarray]:
    """Evaluate with some inputs replaced by arrays (all of one length, or broadcastable); the rest from ``base``."""
    merged: dict[str, Any] = dict(base)
    merged.update({k: np.asarray(v, dtype=np.float64) for k, v in overrides.items()})
    return evaluate(merged, timing)


def tornado(
    base: Mapping[str, float],
    ranges: Mapping[str, tuple[float, float]],
    metric: str = "net_usd_per_month",
    timing: str = "model",
) -> pd.DataFrame:
    """One-at-a-time sensitivity: each input in ``ranges`` set to its low and its high value, the rest at base.

    All 2k+1 points are evaluated in one vectorized call (row 0 is the base point). Returns one row per input
    with ``low_value``, ``high_value``, ``base_value``, ``metric_at_low``, ``metric_at_high``, ``swing``
    (absolute spread), sorted by swing, largest first (ties by name, so the order is deterministic).
    """
    names = sorted(ranges)
    n = 2 * len(names) + 1
    arrays = {k: np.full(n, float(v)) for k, v in base.items()}
    for i, name in enumerate(names):
        lo, hi = ranges[name]
        arrays[name][1 + 2 * i] = lo
        arrays[name][2 + 2 * i] = hi
    values = evaluate(arrays, timing)[metric]
    rows = []
    for i, name in enumerate(names):
        lo_m, hi_m = float(values[1 + 2 * i]), float(values[2 + 2 * i])
        rows.append(
            {
                "input": name,
                "base_value": float(base[name]),
                "low_value": float(ranges[name][0]),
                "high_value": float(ranges[name][1]),
                "metric": metric,
                "metric_at_base": float(values[0]),
                "metric_at_low": lo_m,
                "metric_at_high": hi_m,
                "swing": abs(hi_m - lo_m),
            }
        )
    frame = pd.DataFrame(rows, columns=[
        "input", "base_value", "low_value", "high_value", "metric",
        "metric_at_base", "metric_at_low", "metric_at_high", "swing",
    ])
    return frame.sort_values(["swing", "input"], ascending=[False, True], kind="mergesort").reset_index(drop=True)


RATIO_INPUTS = ("revisit_rate", "hit_rate")
"""Inputs bounded to [0, 1]."""


def default_ranges(
    base: Mapping[str, float], names: Sequence[str], spread: float
) -> dict[str, tuple[float, float]]:
    """``base x (1 - spread)`` .. ``base x (1 + spread)`` for each name; rates clipped to [0, 1]."""
    out = {}
    for name in names:
        b = float(base[name])
        lo, hi = b * (1.0 - spread), b * (1.0 + spread)
        if name in RATIO_INPUTS:
            lo, hi = max(0.0, lo), min(1.0, hi)
        out[name] = (min(lo, hi), max(lo, hi))
    return out


def _grid(base: Mapping[str, float], x_name: str, xs: Sequence[float], y_name: str, ys: Sequence[float],
          outputs: Sequence[str], timing: str) -> pd.DataFrame:
    """Outputs over the grid ys x xs (long format: y, x, outputs...), evaluated in one vectorized call."""
    x = np.asarray(xs, dtype=np.float64)[None, :]
    y = np.asarray(ys, dtype=np.float64)[:, None]
    out = sweep(base, {x_name: x, y_name: y}, timing)
    xx, yy = np.broadcast_arrays(x, y)
    return pd.DataFrame({y_name: yy.ravel(), x_name: xx.ravel(), **{k: out[k].ravel() for k in outputs}})


def net_vs_hit_rate(
    base: Mapping[str, float], hit_rates: np.ndarray, revisit_rates: Sequence[float], timing: str = "model"
) -> pd.DataFrame:
    """Net saving per month over a grid of hit rate x revisit rate (long format), one vectorized call."""
    return _grid(base, "hit_rate", hit_rates, "revisit_rate", revisit_rates,
                 ("net_usd_per_month", "break_even_hit_rate"), timing)


def break_even_curve(
    base: Mapping[str, float],
    storage_usd_per_tb_month: np.ndarray,
    gpu_usd_per_hour: Sequence[float],
    timing: str = "model",
) -> pd.DataFrame:
    """Break-even hit rate over a grid of storage price x GPU price (long format), one vectorized call."""
    return _grid(base, "storage_usd_per_tb_month", storage_usd_per_tb_month, "gpu_usd_per_hour",
                 gpu_usd_per_hour, ("break_even_hit_rate",), timing)
