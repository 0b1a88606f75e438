"""A load gate judged: token accounting, a point's validity, the figures over trials with their intervals, the knee,
the gate's validity checks, and the same again from a bundle's raw files."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from ....engines import EngineProfile
from ....engines.client import RequestRecord
from ....engines.load import LoadPoint, LoadRecord, knee, load_point
from ....parsers.poolloop import EvictWindow, cold_window_issue, evict_window
from ....endurance import DriveRating, combined, endurance
from ....stats import Interval, median_interval
from ..base import ValidityCheck, WorkloadResult, drive_rating
from .evidence import FIGURES, G2LoadEvidence, PointSummary, PointTrial, TokenAccounting, TraceInfo
from .requests import load_fields
from .spec import G2LoadParams


# --------------------------------------------------------------------------------------- pure evaluation


@dataclass(frozen=True)
class Counters:
    """The engine counter names g2-load's accounting reads (empty: not exposed)."""

    prompt_tokens: list[str]
    memory_hit_tokens: list[str]
    tier_hit_tokens: list[str]
    extra: tuple[str, ...] = ()   # more counters recorded per point (their deltas: PointTrial.extra_counters)
    ram_hit_tokens: tuple[str, ...] = ()  # of the tier's hits, those its RAM level served (per-level counters)

    @property
    def any(self) -> bool:
        return bool(self.prompt_tokens or self.memory_hit_tokens or self.tier_hit_tokens)


def accounting_counters(prof: EngineProfile) -> Counters:
    """Pure: what the profile declares: ``hit_metrics`` (tier hits; prompt tokens and engine-memory hits where
    it names them), else its per-level counters (``capabilities.level_counters``)."""
    hm = prof.hit_metrics
    level = prof.capabilities.level_counters
    prompt = list(hm.prompt_tokens) if hm and hm.prompt_tokens else [level + "prompt_tokens_total"] if level else []
    memory = (list(hm.memory_hit_tokens) if hm and hm.memory_hit_tokens
              else [level + "gpu_hit_tokens_total"] if level else [])
    tier = list(hm.hit_tokens) if hm else [level + "external_hit_tokens_total"] if level else []
    ram = (level + "ram_hit_tokens_total",) if level else ()
    return Counters(prompt, memory, tier, ram_hit_tokens=ram)


def token_accounting(sent_prompt_tokens: int, prompt_delta: float | None, memory_delta: float | None,
                     tier_delta: float | None, kv_bytes_per_token: int | None, read_bytes: int | None,
                     write_bytes: int | None, window_s: float | None,
                     ram_delta: float | None = None) -> TokenAccounting:
    """Pure: a point's accounting from its counter deltas and device bytes. Prompt tokens are the engine's
    count, or what was sent when it has none; recomputed = prompt - memory hits - tier hits (known only when
    both hit counters are); shares of the prompt tokens."""
    prompt = prompt_delta if prompt_delta is not None else float(sent_prompt_tokens)
    recomputed = None if memory_delta is None or tier_delta is None else prompt - memory_delta - tier_delta

    def share(x: float | None) -> float | None:
        return None if x is None or prompt <= 0 else x / prompt

    tier_bytes = None if tier_delta is None or kv_bytes_per_token is None else tier_delta * kv_bytes_per_token
    fraction = None if read_bytes is None or not tier_bytes else read_bytes / tier_bytes
    store = None if write_bytes is None or not window_s else write_bytes / window_s / 1e9
    device_hits = None if ram_delta is None or tier_delta is None else max(tier_delta - ram_delta, 0.0)
    return TokenAccounting(
        ram_hit_tokens=ram_delta, device_hit_tokens=device_hits,
        device_hit_share_of_tier=None if device_hits is None or not tier_delta else device_hits / tier_delta,
        device_write_bytes_per_mtok=endurance(write_bytes, prompt, None, window_s).write_bytes_per_mtok,
        prompt_tokens=prompt, prompt_tokens_source="engine" if prompt_delta is not None else "sent",
        memory_hit_tokens=memory_delta, tier_hit_tokens=tier_delta, recomputed_tokens=recomputed,
        memory_hit_share=share(memory_delta), tier_hit_share=share(tier_delta), recomputed_share=share(recomputed),
        kv_bytes_per_token=kv_bytes_per_token, tier_hit_kv_bytes=tier_bytes, device_read_bytes=read_bytes,
        read_fraction=fraction, device_write_bytes=write_bytes, window_s=window_s, store_write_gb_s=store)


def points_endurance(points: list[PointTrial], drive: DriveRating | None) -> dict[str, Any] | None:
    """Pure: what the run's points cost the pool's drive, over every point x trial that was served (docs/endurance
    .md): the pool device's bytes written over each point's window, the prompt tokens served in it. The KV the tier
    stored is not counted per point (the pool's growth is read only where a gate waits for it), so no write
    amplification here. None when no point has its accounting."""
    accs = [pt.accounting for pt in points if pt.accounting is not None]
    if not accs:
        return None
    return combined([endurance(a.device_write_bytes, a.prompt_tokens, None, a.window_s) for a in accs],
                    drive).to_dict()


def hits_by_level(points: list[PointTrial], pool: dict[str, Any] | None) -> str | None:
    """Pure: where a serving gate's tier hits came from, over every point × trial, in one sentence (the first line
    of its report section): the device's share of the tier's hits (its read bytes over the KV they claim), the
    engine's RAM level where it counts one, and the pool's device and cold regime. None when nothing claimed a
    tier hit."""
    accs = [pt.accounting for pt in points if pt.accounting is not None and pt.accounting.tier_hit_tokens]
    if not accs:
        return None
    tier = sum(a.tier_hit_tokens or 0.0 for a in accs)
    claimed = sum(a.tier_hit_kv_bytes or 0.0 for a in accs)
    read = [a.device_read_bytes for a in accs]
    ram = [a.ram_hit_tokens for a in accs]
    where = ""
    if pool:
        loop = pool.get("loop") or {}
        regime = {"evict": "pages dropped on store and after each read", "odirect": "O_DIRECT",
                  "none": "none declared"}.get(pool.get("cold_regime") or "none", str(pool.get("cold_regime")))
        dev = f"{loop['device']}, a loop device of its own" if loop.get("device") else "the pool directory's device"
        where = f" ({dev}; cold regime: {regime})"
    if any(r is None for r in read):
        dev_part = f"the pool's device{where} could not be read for every point: the tier's hits are unproven"
    else:
        share = min(sum(read) / claimed, 1.0) if claimed else 0.0
        dev_part = (f"the pool's device{where} served {100 * share:.0f} % of the tier's hits "
                    f"({sum(read):,} B read for {claimed:,.0f} B of KV claimed)")
    ram_part = ""
    if all(r is not None for r in ram):
        ram_part = f"; the engine's RAM level {100 * sum(ram) / tier:.0f} %" if tier else ""
    return f"Where the tier's {tier:,.0f} hit tokens came from: {dev_part}{ram_part}."


def failed_issue(fig: LoadPoint, max_failed_share: float) -> str | None:
    """Pure: why a point's failed requests make it INVALID: a failed share above ``max_failed_share`` (None when
    within it)."""
    if not fig.failed or fig.failed <= max_failed_share * fig.requests:
        return None
    return (f"{fig.failed} of {fig.requests} requests failed ({fig.failed / fig.requests:.0%}; {fig.ok} served), "
            f"above the gate's max_failed_share {max_failed_share:g}: a failed request is an infinite TTFT, not a "
            "faster one")


def point_invalid(fig: LoadPoint, acc: TokenAccounting | None, max_client_lag_p99_s: float,
                  min_read_fraction: float, device_reads: bool, device_error: str | None = None,
                  max_failed_share: float = 0.0, cold: EvictWindow | None = None) -> str | None:
    """Pure: why a point's figures would not mean what they claim: failed requests above ``max_failed_share``, the
    client's lag, reads that came before the cold regime had dropped their store (``cold``: the evictor's window
    over the point), or tier hits the pool's device did not read (None when valid)."""
    failed = failed_issue(fig, max_failed_share)
    if failed:
        return failed
    if fig.client_lag_p99_s > max_client_lag_p99_s:
        return (f"client lag p99 {fig.client_lag_p99_s * 1e3:.3f} ms exceeds the {max_client_lag_p99_s * 1e3:g} ms "
                f"bound: requests left later than scheduled, so the client, not the server, set the load")
    behind = cold_window_issue(cold) if device_reads and min_read_fraction > 0 else None
    return behind or read_issue(acc, min_read_fraction, device_reads, device_error)


def read_issue(acc: TokenAccounting | None, min_read_fraction: float, device_reads: bool,
               device_error: str | None = None) -> str | None:
    """Pure: tier hits the pool's device did not read (None when reconciled, when there are none, or when the
    gate turns the proof off: ``min_read_fraction`` 0 or a profile without device reads)."""
    if acc is None or not device_reads or min_read_fraction <= 0 or not acc.tier_hit_tokens:
        return None
    if acc.device_read_bytes is None:
        why = f" ({device_error})" if device_error else ""
        return (f"bytes read from the pool's device could not be measured{why}: {acc.tier_hit_tokens:.0f} tier hit "
                f"tokens are unproven")
    if acc.read_fraction is None or acc.read_fraction < min_read_fraction:
        ram = (f"; the engine's RAM level served {acc.ram_hit_tokens:.0f} of them" if acc.ram_hit_tokens
               else "")
        return (f"read fraction {0.0 if acc.read_fraction is None else acc.read_fraction:.4f} is below "
                f"{min_read_fraction}: the pool's device read {acc.device_read_bytes} B for "
                f"{acc.tier_hit_kv_bytes or 0:.0f} B of KV the {acc.tier_hit_tokens:.0f} tier hit tokens claim{ram} "
                f"(the KV came from RAM or the page cache, not the tier's device)")
    return None


def figure_values(pt: PointTrial) -> dict[str, float]:
    """Pure: a point × trial's figures (``FIGURES``) that it has."""
    out: dict[str, float] = {}
    src: dict[str, Any] = {}
    if pt.figures is not None:
        src.update(pt.figures.to_dict())
    if pt.accounting is not None:
        src.update(pt.accounting.model_dump())
    for name in FIGURES:
        v = src.get(name)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[name] = float(v)
    return out


def interval(values: list[float], asked: int | None = None) -> Interval:
    """Pure: a figure over the trials that gave it (harness.stats.median_interval); ``asked``: the trials the gate
    asked for."""
    return median_interval(values, asked=asked)


def emit(result: WorkloadResult, name: str, iv: Interval) -> None:
    """A figure over trials onto a result: its median as the metric, the interval typed beside it."""
    result.metrics[name] = iv.median
    result.intervals[name] = iv


def evaluate_load(points: list[PointTrial], kind: Literal["closed", "open", "trace"], ttft_slo_s: float,
                  knee_percentile: int = 95, evidence: G2LoadEvidence | None = None,
                  fallback: str | None = None) -> WorkloadResult:
    """Pure: metrics and validity from every point × trial. Each point's figures over trials as median and exact
    95 % interval (``FIGURE@LABEL``, typed in ``intervals``; the trials asked for: ``evidence.trials``); per trial
    the knee (the highest load whose TTFT percentile stays within ``ttft_slo_s`` with every request served; 0 when
    even the lowest misses it) and the highest goodput, then their median and interval over trials. INVALID: the
    engine's log says the tier fell back (``fallback``), or a point is INVALID (the first one named); ERROR only
    when not one request of the run succeeded. The validity as named checks (:func:`load_validity`)."""
    ev = (evidence or G2LoadEvidence()).model_copy(deep=True)
    out = WorkloadResult(metrics={}, evidence=ev)
    ev.endurance = points_endurance(points, drive_rating(ev.pool_drive))
    order: list[str] = []
    by_label: dict[str, list[PointTrial]] = {}
    for pt in points:
        if pt.label not in by_label:
            order.append(pt.label)
        by_label.setdefault(pt.label, []).append(pt)
    trials = sorted({p.trial for p in points})
    asked = ev.trials or len(trials)
    ev.summary = []
    for label in order:
        pts = by_label[label]
        values: dict[str, list[float]] = {}
        for pt in pts:
            for name, v in figure_values(pt).items():
                values.setdefault(name, []).append(v)
        figs = {name: interval(vs, asked) for name, vs in values.items()}
        for name, iv in figs.items():
            emit(out, f"{name}@{label}", iv)
        ev.summary.append(PointSummary(label=label, load=pts[0].load, load_kind=pts[0].load_kind, figures=figs,
                                       invalid_trials=sum(1 for p in pts if p.invalid_reason)))
    key = f"ttft_p{knee_percentile}_s"
    ev.knee_figure = key
    if kind != "trace":
        ev.knee_per_trial, ev.max_goodput_per_trial = [], []
        for t in trials:
            ladder = [(p.load, p.figures) for p in points if p.trial == t and p.figures is not None]
            ev.knee_per_trial.append(knee(ladder, ttft_slo_s, key=key) if ladder else None)
            goodputs = [f.goodput_rps for _, f in ladder]
            if goodputs:
                ev.max_goodput_per_trial.append(max(goodputs))
        ev.knee = (interval([k if k is not None else 0.0 for k in ev.knee_per_trial], asked)
                   if ev.knee_per_trial else None)
        if ev.knee is not None:
            emit(out, "knee_concurrency" if kind == "closed" else "knee_rate_rps", ev.knee)
        if ev.max_goodput_per_trial:
            ev.max_goodput = interval(ev.max_goodput_per_trial, asked)
            emit(out, "max_goodput_rps", ev.max_goodput)
    eff = hit_efficiency_per_trial(points, ev.trace)
    if eff:
        emit(out, "hit_efficiency", interval(eff, asked))
    ev.points = list(points)
    spoiled = spoiled_issue(ev.spoiled, points, ev.repeat_spoiled or 0, ev.max_client_lag_p99_s or 0.001)
    ev.validity = load_validity(points, ev, fallback, spoiled)
    invalid = fallback or spoiled
    if invalid is None:
        bad = next((p for p in points if p.invalid_reason), None)
        if bad is not None:
            n = sum(1 for p in points if p.invalid_reason)
            more = f" ({n - 1} more INVALID points)" if n > 1 else ""
            invalid = f"load point {bad.label}, trial {bad.trial}: {bad.invalid_reason}{more}"
    out.invalid_reason = invalid
    ok = sum(p.figures.ok for p in points if p.figures is not None)
    if not ok:  # the engine served nothing: not a measurement of load
        errs = [p for p in points if p.error]
        out.error = f"not one request of the run succeeded; first: {errs[0].error if errs else 'no request was sent'}"
    return out


def load_validity(points: list[PointTrial], ev: G2LoadEvidence, fallback: str | None,
                  spoiled: str | None) -> list[ValidityCheck]:
    """Pure: what g2-load's figures rest on, one named check each (pd_handoff's shape): every request served
    (failed share within ``max_failed_share``), the client kept its schedule, the tier's hits read from the pool's
    device (NOT CHECKED where the gate turns it off: ``min_read_fraction`` 0, or a profile without device reads),
    no fall-back in the engine's log, the attempts set aside justified."""
    figs = [p.figures for p in points if p.figures is not None]
    sent, failed = sum(f.requests for f in figs), sum(f.failed for f in figs)
    share = ev.max_failed_share if ev.max_failed_share is not None else 0.0
    worst = max(figs, key=lambda f: f.failed / f.requests, default=None)
    over = [p for p in points if p.figures is not None and failed_issue(p.figures, share)]
    out = [ValidityCheck(
        name="requests served", ok=not over and bool(figs),
        claim=f"every point served its requests (failed share at most {share:g}; a failed request counts as an "
              "infinite TTFT)",
        how=(f"{sent} requests sent, {sent - failed} served, {failed} failed over {len(figs)} points"
             + (f"; worst point {worst.failed} of {worst.requests} failed" if worst is not None and failed else "")
             + (f"; {len(over)} points above the bound" if over else "")),
        figure="failed requests", value=float(failed), unit="count")]
    lag = max((f.client_lag_p99_s for f in figs), default=0.0)
    bound = ev.max_client_lag_p99_s or 0.001
    out.append(ValidityCheck(
        name="client kept the schedule", ok=lag <= bound,
        claim="requests left when scheduled: the server, not the client, set the load",
        how=f"worst client lag p99 {lag * 1e3:.3f} ms, bound {bound * 1e3:g} ms",
        figure="client lag p99", value=lag, unit="s"))
    out.append(read_check(points, ev))
    out.append(ValidityCheck(
        name="no fall-back", ok=fallback is None,
        claim="the engine's log shows no fall-back of the tier (recompute, connector failure)",
        how=fallback or f"the whole log scanned: {len(ev.fallback_lines)} fall-back lines"))
    if ev.spoiled or spoiled:
        out.append(ValidityCheck(
            name="attempts set aside justified", ok=spoiled is None,
            claim="every attempt set aside was spoiled (by the client, or by the cold regime falling behind) and "
                  "repeated",
            how=spoiled or f"{len(ev.spoiled)} set aside, at most {ev.repeat_spoiled or 0} allowed, each repeated"))
    return out


def read_check(points: list[PointTrial], ev: G2LoadEvidence) -> ValidityCheck:
    """Pure: the tier hits reconciled with the pool device's read bytes over the run, or NOT CHECKED where the
    gate turns the proof off (``min_read_fraction`` 0, a profile without device reads)."""
    name, claim = "tier hits read from the pool", "the KV the tier hits claim was read from the pool's device"
    accs = [p.accounting for p in points if p.accounting is not None]
    hits = sum(a.tier_hit_tokens or 0 for a in accs)
    reads = sum(a.device_read_bytes or 0 for a in accs)
    kv = sum(a.tier_hit_kv_bytes or 0 for a in accs)
    seen = f"{hits:.0f} tier hit tokens, {reads} B read from the pool's device for {kv:.0f} B of KV they claim"
    if ev.device_reads is False or not (ev.min_read_fraction or 0) > 0:
        why = ("the engine's profile proves no hit by device reads" if ev.device_reads is False
               else "the gate sets min_read_fraction 0")
        return ValidityCheck(name=name, ok=True, checked=False, claim=claim, how=f"not checked: {why} ({seen})",
                             figure="pool device read bytes", value=float(reads), unit="B")
    if accs and all(a.tier_hit_tokens is None for a in accs):
        return ValidityCheck(name=name, ok=True, checked=False, claim=claim,
                             how=(f"not checked: the engine counts no tier hits (its profile declares no tier hit "
                                  f"counter: hit_metrics), so none is claimed; the pool's device read {reads} B over "
                                  "the run"),
                             figure="pool device read bytes", value=float(reads), unit="B")
    bad = [p for p in points if read_issue(p.accounting, ev.min_read_fraction or 0.0, True, ev.pool_device_error)]
    return ValidityCheck(name=name, ok=not bad, claim=claim,
                         how=(f"{seen}; each point at least {ev.min_read_fraction:g} of its claim"
                              + (f"; {len(bad)} points short" if bad else "") if hits else
                              "no point claimed tier hits: nothing to reconcile"),
                         figure="pool device read bytes", value=float(reads), unit="B")


def hit_efficiency_per_trial(points: list[PointTrial], trace: "TraceInfo | None") -> list[float]:
    """Pure: per trial, the share of the trace's prompt tokens served from cache (engine memory and the tier)
    over the trace's ideal, an unbounded prefix cache's hit rate at the replayed block size (``kvgate trace
    stats``): a tier or connector that loses reuse the trace offers shows below 1. Empty without a trace ideal
    or without both hit counters."""
    if trace is None or not trace.unbounded_hit_rate:
        return []
    out = []
    for t in sorted({p.trial for p in points}):
        accs = [p.accounting for p in points if p.trial == t and p.accounting is not None]
        if not accs or any(a.tier_hit_tokens is None for a in accs):
            continue
        prompt = sum(a.prompt_tokens for a in accs)
        served = sum((a.memory_hit_tokens or 0.0) + (a.tier_hit_tokens or 0.0) for a in accs)
        if prompt > 0:
            out.append(served / prompt / trace.unbounded_hit_rate)
    return out


def spoiled_by_client(pt: PointTrial, max_client_lag_p99_s: float) -> bool:
    """Pure: whether an attempt's own records show that the client missed its schedule (client lag p99 over the
    bound). A slow server never is: its attempt counts."""
    return pt.figures is not None and pt.figures.client_lag_p99_s > max_client_lag_p99_s


def spoiled_by_cold_regime(pt: PointTrial) -> bool:
    """Pure: whether the evictor's log shows reads of the attempt that came before it had dropped their store: the
    device proof cannot be made of that attempt (the page cache may have served them). A tier slow to take its
    stores does this every time, so its repeats are spoiled too and the gate ends INVALID, never PASS."""
    return pt.cold is not None and pt.cold.breaches > 0


def spoiled_attempt(pt: PointTrial, max_client_lag_p99_s: float) -> bool:
    """Pure: the two reasons an attempt may be set aside and repeated: its client missed the schedule, or the cold
    regime fell behind its reads."""
    return spoiled_by_client(pt, max_client_lag_p99_s) or spoiled_by_cold_regime(pt)


def spoiled_issue(spoiled: list[PointTrial], points: list[PointTrial], repeat_spoiled: int,
                  max_client_lag_p99_s: float) -> str | None:
    """Pure: why the attempts set aside as spoiled are not all justified (None when they are): more of them than
    ``repeat_spoiled`` allows, one whose records keep the schedule (set aside without cause), or one with no
    repeat after it (attempt k of a point and trial is followed by attempt k + 1, spoiled or counted)."""
    if len(spoiled) > repeat_spoiled:
        return f"{len(spoiled)} attempts were set aside as spoiled; the gate allows {repeat_spoiled}"
    have = {(p.label, p.trial, p.attempt) for p in list(spoiled) + list(points)}
    for pt in spoiled:
        where = f"load point {pt.label}, trial {pt.trial}, attempt {pt.attempt}"
        if not spoiled_attempt(pt, max_client_lag_p99_s):
            lag = "no figures" if pt.figures is None else f"client lag p99 {pt.figures.client_lag_p99_s * 1e3:.3f} ms"
            return (f"{where} was set aside as spoiled, but its records keep the schedule ({lag}, "
                    f"bound {max_client_lag_p99_s * 1e3:g} ms) and the evictor's log shows no read before its "
                    "store was dropped: an attempt set aside without cause")
        if (pt.label, pt.trial, pt.attempt + 1) not in have:
            return f"{where} was set aside as spoiled, but no attempt {pt.attempt + 1} follows it"
    for pt in points:
        missing = [k for k in range(pt.attempt) if (pt.label, pt.trial, k) not in have]
        if missing:
            return (f"load point {pt.label}, trial {pt.trial} counts attempt {pt.attempt}, but attempt {missing[0]} "
                    "before it is not recorded")
    return None


def records_from_jsonl(text: str) -> list[LoadRecord]:
    """Pure: a point's ``requests-<point>-t<trial>.jsonl`` back into its records (as LoadRecord.to_dict wrote
    them)."""
    out = []
    fields = set(RequestRecord.__dataclass_fields__)
    for line in text.splitlines():
        if not line.strip():
            continue
        d = json.loads(line)
        rec = {k: v for k, v in d.items() if k in fields}
        rec["itl_s"] = tuple(rec.get("itl_s") or ())
        out.append(LoadRecord(float(d["due_s"]), float(d["sent_s"]), RequestRecord(**rec)))
    return out


# The bounds a re-evaluation takes from the gate's params (the bundle's config/gates.yaml), never from the evidence.
BOUND_FIELDS = ("load_kind", "ttft_slo_s", "tpot_slo_s", "knee_percentile", "knee_figure", "max_client_lag_p99_s",
                "min_read_fraction", "repeat_spoiled")


def raw_records(pt: PointTrial, requests: dict[str, str]) -> list[LoadRecord]:
    """Pure: an attempt's records from its raw requests file; ValueError when the file is missing, or empty or
    short while the attempt records figures (signed figures with no raw basis are not kept)."""
    text = requests.get(pt.requests_file)
    if text is None:
        raise ValueError(f"{pt.requests_file}: missing from the bundle")
    records = records_from_jsonl(text)
    if not records and pt.figures is not None:
        raise ValueError(f"{pt.requests_file}: empty, yet the evidence records figures for point {pt.label} trial "
                         f"{pt.trial}")
    if records and len(records) != pt.requests:
        raise ValueError(f"{pt.requests_file}: {len(records)} request records for the {pt.requests} requests point "
                         f"{pt.label} trial {pt.trial} sent")
    return records


def reevaluate_load(evidence: dict[str, Any], requests: dict[str, str], counters_text: dict[str, str],
                    counters: Counters, device_reads: bool, fallback: str | None = None,
                    params: "G2LoadParams | None" = None,
                    device: dict[str, tuple[int | None, int | None]] | None = None,
                    evict_log: str | None = None) -> WorkloadResult:
    """Pure: a bundle's g2-load result again from its raw files: every point's figures from its requests file
    (``requests``: file name -> text), its accounting from the engine counters before and after
    (``counters_text``: file name -> text; ``counters``: which of them are prompt tokens, memory and tier hits)
    with the pool device's bytes (``device``: requests file name -> (read, written) bytes, re-parsed from the run's
    steps; None: as the run recorded them), then the same evaluation as the run (:func:`evaluate_load`).
    ``params``: the gate's params, whose bounds (SLOs, knee percentile, client lag, read fraction) replace the
    ones the evidence records; ``fallback``: the engine log's fall-back, as re-scanned; ``evict_log``: the cold
    regime's log, from which each point's window (its breaches up to its mark) is read again."""
    ev = G2LoadEvidence.model_validate(evidence)
    ev.device_reads = device_reads
    if params is not None:
        fields = load_fields(params)
        ev = ev.model_copy(update={k: fields[k] for k in BOUND_FIELDS})

    def cold(pt: PointTrial) -> EvictWindow | None:
        if evict_log is None or pt.cold is None or pt.cold.error is not None:
            return pt.cold
        w = evict_window(evict_log, pt.cold.name, pt.cold.made_unix_s)
        if w is None:
            raise ValueError(f"{pt.requests_file}: the cold regime's log has no mark {pt.cold.name!r}, which the "
                             "point recorded")
        return w

    spoiled = []
    for pt in ev.spoiled:  # the attempts set aside: their figures again, so their cause is judged on the records
        records = raw_records(pt, requests)
        spoiled.append(pt.model_copy(update={"figures": load_point(records, ev.ttft_slo_s, ev.tpot_slo_s)
                                             if records else None, "cold": cold(pt)}))
    ev.spoiled = spoiled
    points = []
    for pt in ev.points:
        records = raw_records(pt, requests)
        if not records:
            if pt.requests and pt.figures is not None:  # figures recorded from records the file no longer holds
                raise ValueError(f"{pt.requests_file}: empty, but the point recorded figures of {pt.requests} "
                                 "requests")
            points.append(pt)
            continue
        fig = load_point(records, ev.ttft_slo_s, ev.tpot_slo_s)
        acc = pt.accounting
        if acc is not None:
            deltas: dict[str, float | None] = {"prompt": None, "memory": None, "tier": None, "ram": None}
            if pt.counters_file is not None:
                c = json.loads(counters_text[pt.counters_file])

                def delta(names: list[str]) -> float | None:
                    for n in names:
                        a, b = c["before"].get(n), c["after"].get(n)
                        if a is not None and b is not None:
                            return b - a
                    return None
                deltas = {"prompt": delta(counters.prompt_tokens), "memory": delta(counters.memory_hit_tokens),
                          "tier": delta(counters.tier_hit_tokens),
                          "ram": delta(list(counters.ram_hit_tokens)) if counters.ram_hit_tokens else None}
            sent = sum(r.record.prompt_tokens or 0 for r in records if r.record.ok)
            read_b, write_b = (acc.device_read_bytes, acc.device_write_bytes) if device is None \
                else device.get(pt.requests_file, (None, None))
            acc = token_accounting(sent, deltas["prompt"], deltas["memory"], deltas["tier"], acc.kv_bytes_per_token,
                                   read_b, write_b, fig.duration_s, deltas["ram"])
        w = cold(pt)
        invalid = point_invalid(fig, acc, ev.max_client_lag_p99_s or 0.001,
                                ev.min_read_fraction if ev.min_read_fraction is not None else 0.5,
                                device_reads, ev.pool_device_error, ev.max_failed_share or 0.0, w)
        points.append(pt.model_copy(update={"figures": fig, "accounting": acc, "invalid_reason": invalid,
                                            "cold": w}))
    return evaluate_load(points, ev.load_kind or "closed", ev.ttft_slo_s or 0.0, ev.knee_percentile or 95, ev,
                         fallback=fallback)


