"""The load section of a report, for a serving-load gate (``g2-load``): its charts, the token accounting table,
every request of every point in one CSV, and each point × trial as an llm-d Benchmark Report.

Read from the gate's evidence through the workload's own model (harness.workloads.kit.load.G2LoadEvidence: the
points × trials with their figures and accounting, the points over trials with median and confidence interval,
the knee) and from its raw ``requests-<point>-t<trial>.jsonl`` files, so ``kvgate report`` draws the same from
a verified bundle. Evidence of another shape is no load gate: :func:`load_section` returns None.

What it gives (harness.report.render puts it in place):
  charts  ``load-ttft`` (TTFT p50 / p90 / the knee percentile / p99 against load: median over trials, the
          95 % interval for the median as a band, the SLO line, the knee), ``load-throughput`` (request throughput
          and goodput against load), ``load-cdf`` (the TTFT distribution of every point, all trials)
  tables  ``requests`` (every request: point, trial, due, sent, lag, TTFT, end-to-end, tokens, ok, error),
          ``accounting`` (per point × trial: where the prompt tokens' KV came from, the pool device's bytes) and
          ``figures`` (the gate's metrics in one long table: per point and figure the median over trials, its
          interval and trial count; the knee and the highest goodput)
  files   ``llmd/<gate>-<point>-t<trial>.json``: llm-d Benchmark Report v0.2.1 of that point and trial
          (harness.report.llmd), its ``run.uid`` the report ID, the gate, the point and the trial
  view    what the templates print (reports/_load.*.j2): the load, the SLO, the knee and the highest goodput
          over trials, a row per point, a row per point × trial of the accounting
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import BaseModel, ConfigDict, ValidationError

from ..engines.client import RequestRecord
from ..engines.load import LoadRecord
from ..safeio import InputFileError
from ..workloads.kit.load import G2LoadEvidence, MetricInterval, PointTrial, hits_by_level, multi_turn_text
from . import load_charts as lc
from .jsonl import jsonl_objects
from .llmd import EngineInfo, LoadInfo, benchmark_report

_PLAIN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")

# load kind -> (axis label, unit after a load figure)
AXES = {"closed": ("concurrency (users)", "users"), "open": ("request rate (req/s)", "req/s"),
        "trace": ("trace replay", "")}

REQUEST_COLUMNS = ["point", "load", "trial", "request_id", "due_s", "sent_s", "lag_s", "ttft_s", "e2e_s",
                   "prompt_tokens", "output_tokens", "ok", "error"]
ACCOUNTING_COLUMNS = ["point", "load", "trial", "prompt_tokens", "prompt_tokens_source", "memory_hit_tokens",
                      "memory_hit_share", "tier_hit_tokens", "tier_hit_share", "recomputed_tokens", "recomputed_share",
                      "kv_bytes_per_token", "tier_hit_kv_bytes", "device_read_bytes", "read_fraction",
                      "device_write_bytes", "window_s", "store_write_gb_s", "invalid_reason"]


class RequestLine(BaseModel):
    """One line of a ``requests-<point>-t<trial>.jsonl``: harness.engines.load.LoadRecord as the workload wrote
    it (``to_dict``). Read strictly: a line of another shape is an InputFileError naming the file, line and field."""

    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)

    due_s: float
    sent_s: float
    request_id: str
    prompt_tokens: int | None = None
    queue_s: float = 0.0
    ttft_s: float | None = None
    itl_s: list[float] = []
    latency_s: float | None = None
    e2e_s: float | None = None
    output_chunks: int = 0
    output_text: str = ""
    http_status: int | None = None
    error: str | None = None
    started_unix_s: float | None = None

    def load_record(self) -> LoadRecord:
        return LoadRecord(self.due_s, self.sent_s, RequestRecord(
            self.request_id, self.prompt_tokens, self.queue_s, self.ttft_s, tuple(self.itl_s), self.latency_s,
            self.e2e_s, self.output_chunks, self.output_text, self.http_status, self.error, self.started_unix_s))


def load_evidence(verdict: dict[str, Any], workload: str | None) -> G2LoadEvidence | None:
    """A g2-load gate's evidence as its model (``workload``: the gate's, as the bundle's config/gates.yaml names
    it), or None for another workload's gate or evidence not readable as g2-load's (a bundle of another kvgate
    draws no load section, it does not fail)."""
    ev = verdict.get("evidence")
    if workload != "g2-load" or not isinstance(ev, dict):
        return None
    try:
        return G2LoadEvidence.model_validate(ev)
    except ValidationError:
        return None


def read_requests(gate_dir: Path | None, pt: PointTrial) -> list[LoadRecord] | None:
    """The requests of one point × trial from its file in the gate's directory; None when there is no such
    file (or its name is not a plain file name: it would lie outside the gate's directory)."""
    if gate_dir is None or not _PLAIN.match(pt.requests_file):
        return None
    rel = f"gates/{gate_dir.name}/{pt.requests_file}"
    lines = jsonl_objects(gate_dir / pt.requests_file, rel)
    if lines is None:
        return None
    out = []
    for n, obj in enumerate(lines, 1):
        try:
            out.append(RequestLine.model_validate(obj).load_record())
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(x) for x in err["loc"]) or "record"
            raise InputFileError(rel, n, f"{where}: {err['msg']}") from None
    return out


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def request_rows(pt: PointTrial, records: list[LoadRecord]) -> list[dict[str, Any]]:
    """The ``<gate>-requests.csv`` rows of one point × trial: when each request was due and sent (s from the
    point's start), the client's lag, what it measured, its tokens, and whether it succeeded."""
    return [{"point": pt.label, "load": pt.load, "trial": pt.trial, "request_id": r.record.request_id,
             "due_s": r.due_s, "sent_s": r.sent_s, "lag_s": r.lag_s, "ttft_s": r.record.ttft_s,
             "e2e_s": r.record.e2e_s, "prompt_tokens": r.record.prompt_tokens,
             "output_tokens": r.record.output_chunks, "ok": r.record.ok, "error": r.record.error} for r in records]


def accounting_rows(ev: G2LoadEvidence) -> list[dict[str, Any]]:
    """One row per point × trial, by load then trial: the point, and its token accounting where it has one."""
    rows = []
    for pt in sorted(ev.points, key=lambda p: (p.load, p.label, p.trial)):
        acc = pt.accounting.model_dump() if pt.accounting is not None else {}
        rows.append({"point": pt.label, "load": pt.load, "trial": pt.trial,
                     **{c: acc.get(c) for c in ACCOUNTING_COLUMNS[3:-1]},
                     "invalid_reason": pt.invalid_reason or pt.error})
    return rows


FIGURE_COLUMNS = ["point", "load", "figure", "median", "ci_low", "ci_high", "trials"]


def figure_rows(ev: G2LoadEvidence) -> list[dict[str, Any]]:
    """Every figure over trials, the gate's metrics in one long table: per point each figure's median, its exact
    95 % interval for the median (empty where too few trials give none) and trial count, then the ladder's knee and highest goodput (no point)."""
    rows = [{"point": s.label, "load": s.load, "figure": name, **iv.model_dump()}
            for s in ev.summary for name, iv in sorted(s.figures.items())]
    knee = {"closed": "knee_concurrency", "open": "knee_rate_rps"}.get(ev.load_kind or "")
    for name, iv in ((knee, ev.knee), ("max_goodput_rps", ev.max_goodput)):
        if name and iv is not None:
            rows.append({"point": None, "load": None, "figure": name, **iv.model_dump()})
    return rows


def _band(iv: MetricInterval | None) -> lc.Band | None:
    if iv is None:
        return None
    if not iv.has_interval:  # too few trials for an interval: the median alone, no band
        return (iv.median, iv.median, iv.median)
    return (iv.median, iv.ci_low, iv.ci_high)


def _pcts(ev: G2LoadEvidence) -> list[str]:
    names = ["p50", "p90", "p99"]
    if ev.knee_percentile and f"p{ev.knee_percentile}" not in names:
        names.append(f"p{ev.knee_percentile}")
    return sorted(names, key=lambda n: int(n[1:]))


def knee_load(ev: G2LoadEvidence) -> float | None:
    """The knee over trials (its median), or None where no load met the SLO (the workload counts such a trial's
    knee as 0) or there is no ladder."""
    if ev.knee is None or not ev.knee.median > 0:
        return None
    return ev.knee.median


def charts(ev: G2LoadEvidence, ttfts: dict[str, list[float]], gid: str) -> dict[str, tuple[str, str]]:
    """kind -> (caption, svg): the ladder's charts (closed and open loops) and the TTFT CDF of every point."""
    out: dict[str, tuple[str, str]] = {}
    label, unit = AXES.get(ev.load_kind or "", ("load", ""))
    loads = [s.load for s in ev.summary]
    if ev.load_kind in ("closed", "open") and ev.summary:
        pcts = {p: [_band(s.figures.get(f"ttft_{p}_s")) for s in ev.summary] for p in _pcts(ev)}
        slo = f"p{ev.knee_percentile}" if ev.knee_percentile else "p95"
        svg = lc.ttft_vs_load_svg(loads, pcts, slo_s=ev.ttft_slo_s, slo_name=slo, knee=knee_load(ev),
                                  load_label=label, load_unit=unit, title=f"{gid}: TTFT against load")
        out["load-ttft"] = (f"TTFT percentiles against load: the median over trials, its 95 % interval as a band (none "
                            f"from fewer than 6 trials); the SLO ({slo} within {ev.ttft_slo_s:g} s) and the knee, the highest load whose "
                            f"{slo} stays within it", svg)
        svg = lc.throughput_vs_load_svg(
            loads, [_band(s.figures.get("request_rate_rps")) for s in ev.summary],
            [_band(s.figures.get("goodput_rps")) for s in ev.summary], knee=knee_load(ev),
            offered=ev.load_kind == "open", load_label=label, load_unit=unit,
            title=f"{gid}: throughput and goodput against load")
        out["load-throughput"] = ("Completed requests per second and goodput (requests within the SLOs per second) "
                                  "against load: median over trials with its 95 % interval"
                                  + ("; the dotted diagonal is the offered rate" if ev.load_kind == "open" else ""),
                                  svg)
    if any(ttfts.values()):
        names = {s.label: f"{s.label} ({load_text(s.load, ev.load_kind)})" for s in ev.summary}
        svg = lc.ttft_cdf_svg([(names.get(k, k), v) for k, v in ttfts.items()], slo_s=ev.ttft_slo_s,
                              title=f"{gid}: TTFT distribution per load point")
        out["load-cdf"] = ("Distribution of the time to first token at every load point (successful requests of "
                           "all trials; empirical CDF), the SLO as a vertical line", svg)
    return out


def _interval_view(iv: MetricInterval | None) -> dict[str, Any] | None:
    return None if iv is None else iv.model_dump()


def load_text(load: float, kind: str | None) -> str:
    """A load for people: ``1 user``, ``4 users``, ``2.5 req/s`` (a trace: its mean rate)."""
    if kind == "closed":
        return f"{load:g} user" + ("" if load == 1 else "s")
    return f"{load:.4g} req/s" + (" (mean)" if kind == "trace" else "")


def view(ev: G2LoadEvidence, llmd_paths: list[str]) -> dict[str, Any]:
    """What the templates print: the load, the bounds, the knee and the highest goodput over trials, a row per
    point (figures over trials) and per point × trial (accounting)."""
    label, unit = AXES.get(ev.load_kind or "", ("load", ""))
    kind = {"closed": "closed loop: a concurrency ladder",
            "open": f"open loop: a request-rate ladder, gamma arrivals (burstiness {ev.burstiness or 1.0:g}; "
                    "1 is Poisson), sent on schedule",
            "trace": "trace replay" + (f" of {multi_turn_text(ev.trace.multi_turn)}" if ev.trace and ev.trace.multi_turn
                                       else f" of {ev.trace.path} ({ev.trace.format}, {ev.trace.requests} requests "
                                       f"over {ev.trace.duration_s:g} s, " + (
                                           f"in order by {ev.trace.users} user(s)" if ev.trace.users
                                           else f"timestamps x {ev.trace.time_scale:g}") + ")"
                                       if ev.trace else "")
                     + (f"; the trace's own bound, an unbounded prefix cache, hits {ev.trace.unbounded_hit_rate * 100:.1f} % "
                        "of its prompt tokens (beside the tier's share below)"
                        if ev.trace and ev.trace.unbounded_hit_rate is not None else "")}.get(ev.load_kind or "",
                                                                                              str(ev.load_kind))
    points = []
    for s in ev.summary:
        f = s.figures
        figs = [p.figures for p in ev.points if p.label == s.label and p.figures is not None]
        sent, failed = sum(x.requests for x in figs), sum(x.failed for x in figs)
        points.append({"label": s.label, "load": s.load, "load_text": load_text(s.load, ev.load_kind),
                       "invalid_trials": s.invalid_trials,
                       # over its trials: requests sent / served / failed (a failed one is an infinite TTFT)
                       "requests_text": f"{sent} / {sent - failed} / {failed}",
                       **{k: _interval_view(f.get(k)) for k in (
                           "ttft_p50_s", "ttft_p90_s", "ttft_p95_s", "ttft_p99_s", "tpot_p50_s", "e2e_p99_s",
                           "request_rate_rps", "goodput_rps", "client_lag_p99_s")}})
    return {
        "kind": ev.load_kind, "kind_text": kind, "load_label": label, "unit": unit, "trials": ev.trials,
        "ttft_slo_s": ev.ttft_slo_s, "tpot_slo_s": ev.tpot_slo_s, "knee_percentile": ev.knee_percentile,
        "knee": _interval_view(ev.knee), "knee_per_trial": list(ev.knee_per_trial),
        "knee_text": load_text(ev.knee.median, ev.load_kind) if ev.knee is not None else None,
        "max_goodput": _interval_view(ev.max_goodput), "max_client_lag_p99_s": ev.max_client_lag_p99_s,
        "min_read_fraction": ev.min_read_fraction, "points": points, "accounting": accounting_rows(ev),
        "llmd": llmd_paths, "repeat_spoiled": ev.repeat_spoiled or 0, "client_priority": ev.client_priority,
        "spoiled": [{"label": pt.label, "trial": pt.trial, "attempt": pt.attempt, "requests_file": pt.requests_file,
                     "client_lag_p99_s": pt.figures.client_lag_p99_s if pt.figures is not None else None,
                     "breaches": pt.cold.breaches if pt.cold is not None else 0}
                    for pt in ev.spoiled],
    }


@dataclass
class LoadSection:
    """A load gate's part of the report (module docstring); ``reports`` holds, per point × trial with requests,
    what its llm-d Benchmark Report is made of, written by :meth:`files` once the report ID is known."""

    view: dict[str, Any]
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    charts: dict[str, tuple[str, str]] = field(default_factory=dict)
    reports: dict[str, tuple[PointTrial, list[LoadRecord], int]] = field(default_factory=dict)  # name -> (pt, records, stage)
    engine: EngineInfo | None = None
    title: str = ""
    gate_id: str = ""

    def gate_view(self) -> dict[str, Any]:
        """What the gate's entry in the report's view gets: the load section, and no list of metrics: a load gate
        has hundreds (``FIGURE@POINT`` with its interval), which its figures table holds and the load section
        sums up. (``metric_rows``: the name a metric list may go by in the view; empty where it is absent.)"""
        return {"load": self.view, "metrics": {}, "metric_rows": []}

    def files(self, report_id: str) -> dict[str, bytes]:
        """``llmd/<name>.json`` -> the JSON of that point × trial's Benchmark Report, its uid naming the report
        ID, the gate, the point and the trial (so the report ID binds it like every rendered file)."""
        out = {}
        for name, (pt, records, stage) in self.reports.items():
            load = LoadInfo(rate_rps=pt.load if pt.load_kind == "rate_rps" else None,
                            concurrency=int(pt.load) if pt.load_kind == "concurrency" else None, stage=stage,
                            description=f"{pt.label}, trial {pt.trial}: {self.view['kind_text']}")
            started = pt.started_unix_s if pt.started_unix_s is not None else min(
                (r.record.started_unix_s for r in records if r.record.started_unix_s is not None), default=0.0)
            doc = benchmark_report(f"{report_id}/{self.gate_id}/{pt.label}/trial-{pt.trial}", records, started,
                                   self.engine or EngineInfo("unknown", "unknown", "unknown"), load,
                                   description=self.title or None)
            out[f"llmd/{name}.json"] = (json.dumps(doc, indent=1, sort_keys=True, allow_nan=False) + "\n").encode()
        return out


def load_section(verdict: dict[str, Any], gate_dir: Path | None, gate_part: str,
                 workload: str | None) -> LoadSection | None:
    """The load section of one gate (None for a gate that is not a load gate). ``gate_part`` is the gate ID as a
    file name (harness.report.render.file_part); ``gate_dir`` its directory in the bundle, None when its ID is
    not a plain name (then no raw file is read: the section holds what the evidence says)."""
    ev = load_evidence(verdict, workload)
    if ev is None:
        return None
    gid = str(verdict.get("gate_id", ""))
    rows: list[dict[str, Any]] = []
    ttfts: dict[str, list[float]] = {}
    reports: dict[str, tuple[PointTrial, list[LoadRecord], int]] = {}
    stages = {s.label: i for i, s in enumerate(ev.summary)}
    for i, pt in enumerate(ev.points):
        records = read_requests(gate_dir, pt)
        ttfts.setdefault(pt.label, [])
        if not records:
            continue
        rows += request_rows(pt, records)
        ttfts[pt.label] += [x for r in records if r.record.ok and (x := _finite(r.record.ttft_s)) is not None]
        name = f"{gate_part}-{pt.label}-t{pt.trial}" if _PLAIN.match(pt.label) else f"{gate_part}-point{i}"
        if name in reports:  # two entries for one point and trial (not a kvgate run's): both kept
            name = f"{name}-{i}"
        reports[name] = (pt, records, stages.get(pt.label, 0))
    tables: dict[str, pd.DataFrame] = {}
    if rows:
        tables["requests"] = pd.DataFrame(rows, columns=REQUEST_COLUMNS)
    if ev.points:
        tables["accounting"] = pd.DataFrame(accounting_rows(ev), columns=ACCOUNTING_COLUMNS)
    if ev.summary:
        tables["figures"] = pd.DataFrame(figure_rows(ev), columns=FIGURE_COLUMNS)
    engine = EngineInfo(tool=ev.engine or ev.engine_profile or "unknown", tool_version=ev.engine_version or "unknown",
                        model="unrecorded", accelerator="unrecorded",
                        args={k: v for k, v in (("engine_profile", ev.engine_profile),
                                                ("attached", ev.attached)) if v is not None})
    return LoadSection(view=view(ev, [f"llmd/{n}.json" for n in reports]), tables=tables,
                       charts=charts(ev, ttfts, gid), reports=reports, engine=engine,
                       title=str(verdict.get("title") or ""), gate_id=gid)
