"""The reports inside a bundle: Markdown and self-contained HTML, CSV tables, SVG charts, JUnit XML.

Everything here is a pure function of the bundle's evidence files (``gates/``, ``nodes/``, ``config/``) and
the signed predicate (suite, verdicts, run times, kvgate version, signing key), so ``kvgate report`` can
re-render a verified bundle offline and get the same bytes. Rendered files (listed in the predicate's
``rendered_files``; signed subjects like every file, bound by the report ID with the ID itself replaced by a
placeholder: harness.report.bundle):

  report.md, report.html     the report people read (both print the report ID; the HTML inlines its charts)
  junit.xml                  the verdicts as JUnit test cases (prints the report ID as a property)
  REPORT_ID                  the ID, one line
  tables/verdicts.csv        one row per gate
  tables/<gate>-<key>.csv    every per-stream / per-request / per-job / per-second series of a gate
  charts/<gate>-<kind>.svg   per-GPU bars, TTFT distributions, per-node time series; a g2-faults gate's timeline
                             (harness.report.faults_section, from its evidence's requests and faults)
  llmd/<gate>-<point>-t<trial>.json   a load gate's points as llm-d Benchmark Reports (harness.report.load_section,
                             which also gives a load gate's charts, tables and the view of reports/_load.*.j2)
  (a gate ID or key that is not a plain name is written through :func:`file_part`; every path is checked to
  stay inside the output directory: :func:`confined`)

Evidence keys the charts and tables read (a workload that records them gets them drawn):
  streams: [{node, label, gpu, read_gb_s, ...}]                    -> <gate>-streams.svg/.csv
  ttft_recompute_s: [float], ttft_readback_s: [float]              -> <gate>-ttft.svg, <gate>-ttft.csv
    (else read from the raw gates/<gate>/requests-{recompute,readback}.jsonl of g2-ttft, -> <gate>-requests.csv)
  series: {node: [[t_s, read_gb_s], ...]}, nic_line_rate_gb_s      -> <gate>-series.svg/.csv
  any other list of flat records (e.g. requests: [{...}])          -> <gate>-<key>.csv
  validity: [{name, ok, claim, how, figure, value, unit}]          -> evidence-validity column and list
    (harness.workloads.kit.base.ValidityCheck, filled by each workload's evaluator; nothing else is read for it)
Raw fio JSON under gates/<gate>/<node>/fio.json becomes <gate>-jobs.csv (one row per fio job).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import jinja2
import pandas as pd
from pydantic import ValidationError

from ..config.yamlload import load_yaml
from ..errors import BundleError, ConfigError
from ..parsers.rdma import rdma_devices
from ..paths import data_path
from ..safeio import MAX_JSON_BYTES, InputFileError, decode_utf8, load_json, parse_json, read_bytes
from ..units import UnitError, format_quantity, parse_quantity, parse_threshold
from ..workloads.kit.base import ChartInputs, ValidityCheck
from . import charts as rc
from .jsonl import jsonl_objects
from .junit import verdicts_to_junit
from .faults_section import faults_charts
from .gain_section import gain_charts, hits_line
from .load_section import load_section
from .predicate import check_predicate, finite

TABLES_DIR = "tables"
CHARTS_DIR = "charts"
PER_STREAM_PREFIXES = ("per_gpu_", "per_stream_", "connector_read_gb_s")


_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def file_part(name: Any) -> str:
    """A name read from a bundle (a gate ID, an evidence key) as one part of a file name: letters, digits,
    ``_ . -`` only, never starting with a dot; a name that had to change gets a short digest of itself, so two
    names never share a file. Gate IDs and keys kvgate writes are unchanged."""
    text = str(name)
    safe = _UNSAFE.sub("_", text).lstrip(".")
    if safe == text:
        return text
    return f"{safe[:48] or '_'}-{hashlib.sha256(text.encode(errors='replace')).hexdigest()[:8]}"


def gate_dir_of(bundle_dir: Path, gate_id: Any) -> Path | None:
    """``gates/<gate_id>`` of a bundle, or None when the gate ID is not a plain name (``../x`` would read
    files outside the bundle, which no signature covers)."""
    return Path(bundle_dir) / "gates" / gate_id if isinstance(gate_id, str) and file_part(gate_id) == gate_id \
        else None


def gate_workloads(bundle_dir: Path) -> dict[str, str]:
    """Each gate's workload by its ID, as the bundle's own ``config/gates.yaml`` names it (read with the hardened
    YAML loader): the report draws a gate's own sections by this name, never by guessing from its evidence's keys.
    A bundle whose config cannot be read draws none of them (it does not fail)."""
    try:
        data, _ = load_yaml(Path(bundle_dir) / "config" / "gates.yaml")
    except (ConfigError, OSError):
        return {}
    gates = data.get("gates") if isinstance(data, dict) else None
    return {g["id"]: g["workload"] for g in gates if isinstance(g, dict) and isinstance(g.get("id"), str)
            and isinstance(g.get("workload"), str)} if isinstance(gates, list) else {}


def confined(out_dir: Path, rel: str) -> Path:
    """``out_dir / rel`` with its directories made, refused (BundleError) unless it stays inside ``out_dir``
    once every link is resolved: an output path built from bundle content never escapes the output."""
    root = Path(out_dir).resolve()
    p = Path(out_dir) / rel
    if Path(rel).is_absolute() or ".." in Path(rel).parts:
        raise BundleError(f"{rel}: would be written outside {out_dir}")
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.is_symlink() or not p.parent.resolve().is_relative_to(root) or p.name in ("", ".", ".."):
        raise BundleError(f"{out_dir}/{rel}: would be written outside {out_dir} (a link in the output directory?)")
    return p


def metric_rows(verdict: dict[str, Any]) -> list[dict[str, Any]]:
    """Every metric of a gate as the report shows it: [{name, value (readable, with its unit)}], sorted by name.
    Units come from the verdict's ``metric_units`` (the workload's METRICS table, recorded at run time) and,
    for the gate's metric, its ``unit``; a metric whose unit the bundle does not record shows its number only."""
    metrics = verdict.get("metrics")
    units = verdict.get("metric_units")
    units = units if isinstance(units, dict) else {}
    out = []
    for name in sorted(metrics) if isinstance(metrics, dict) else []:
        unit = units.get(name)
        if not isinstance(unit, str):
            unit = verdict.get("unit") if name == verdict.get("metric") and isinstance(verdict.get("unit"), str) \
                else None
        out.append({"name": name, "value": format_quantity(metrics[name], unit)})
    return out


def threshold_in(threshold: str | None, unit: str) -> float | None:
    """The number of a threshold string (``">= 100 MB/s"``) expressed in ``unit``; None if not convertible."""
    if not threshold:
        return None
    try:
        return parse_threshold(threshold).quantity.to(unit)
    except (UnitError, ValueError):
        return None


def quantity_in(text: str | None, unit: str) -> float | None:
    if not text:
        return None
    try:
        return parse_quantity(text).to(unit)
    except (UnitError, ValueError):
        return None


# --------------------------------------------------------------------------- evidence validity


def validity(verdict: dict[str, Any]) -> list[dict[str, Any]]:
    """What makes a gate's measurement valid, as its evaluator said: the evidence's ``validity`` list
    (harness.workloads.kit.base.ValidityCheck), each as {name, proven: bool|None|"not checked", detail} for the
    templates (``"not checked"``: a proof the gate turned off, shown NOT CHECKED).

    Nothing else is read: evidence without the list (a bundle of an older kvgate) gives [] ("not recorded").
    Evidence is signed data of any shape (harness.report.predicate checks only that it is an object): an item
    that is not a ValidityCheck reads as "unknown", never as a crash."""
    ev = verdict.get("evidence")
    items = ev.get("validity") if isinstance(ev, dict) else None
    if not isinstance(items, list):
        return []
    out: list[dict[str, Any]] = []
    for item in items:
        try:
            c = ValidityCheck.model_validate(item)
        except ValidationError:
            name = item.get("name") if isinstance(item, dict) else None
            out.append({"name": name if isinstance(name, str) else "?", "proven": None,
                        "detail": "a validity record kvgate cannot read"})
            continue
        figure = c.figure_text()
        # a proof the gate turned off: "not checked", never shown as proven
        out.append({"name": c.name, "proven": c.ok if c.checked else "not checked",
                    "detail": f"{c.claim}. Checked: {c.how}" + (f"; {figure}" if figure else "")})
    return out


def validity_text(items: list[dict[str, Any]]) -> str:
    if not items:
        return "not recorded"
    marks = {True: "proven", False: "NOT proven", None: "unknown", "not checked": "NOT CHECKED"}
    return "; ".join(f"{i['name']} {marks.get(i['proven'], 'unknown')}" for i in items)


# --------------------------------------------------------------------------- tables


def fio_job_rows(text: str, node: str) -> list[dict[str, Any]]:
    """One row per job of ``fio --output-format=json`` (pure; the grouped view is harness.parsers.fio)."""
    start = text.find("{")
    if start < 0:
        return []
    try:
        d = json.loads(text[start:])
    except (ValueError, RecursionError):
        return []
    jobs = d.get("jobs") if isinstance(d, dict) else None
    rows = []
    for j in jobs if isinstance(jobs, list) else []:
        try:
            rd = j.get("read") or {}
            pct = (rd.get("clat_ns") or {}).get("percentile") or {}
            rows.append({
                "node": node, "jobname": j.get("jobname"), "groupid": j.get("groupid"), "error": j.get("error", 0),
                "read_gb_s": float(rd.get("bw_bytes", 0)) / 1e9, "read_bytes": int(rd.get("io_bytes", 0)),
                "read_iops": float(rd.get("iops", 0.0)), "runtime_ms": int(rd.get("runtime", 0)),
                "clat_p50_us": pct["50.000000"] / 1e3 if "50.000000" in pct else None,
                "clat_p99_us": pct["99.000000"] / 1e3 if "99.000000" in pct else None,
            })
        except (AttributeError, TypeError, ValueError):
            continue  # not fio's shape: the table shows the jobs that have it
    return rows


REQUEST_FILES = {"recompute": "requests-recompute.jsonl", "readback": "requests-readback.jsonl"}


def request_records(gate_dir: Path | None) -> dict[str, list[dict[str, Any]]]:
    """Per-request records of a TTFT gate (``requests-<phase>.jsonl``, one JSON object per line), by phase.

    A file past the JSON size cap, or not a regular file, draws no chart (it does not hang the report). Every
    line of a file read is a JSON object parsed strictly (harness.safeio: nesting limit, no duplicate keys);
    anything else is an InputFileError naming the file and the line (exit 2), not a chart drawn from part
    of the data."""
    out: dict[str, list[dict[str, Any]]] = {}
    if gate_dir is None:
        return out
    for phase, name in REQUEST_FILES.items():
        recs = jsonl_objects(gate_dir / name, f"gates/{gate_dir.name}/{name}")
        if recs is not None:
            out[phase] = recs
    return out


def chart_inputs(verdict: dict[str, Any]) -> ChartInputs:
    """The fields of a gate's evidence the report draws, read through the model the workloads write them with
    (harness.workloads.kit.base.ChartInputs). Evidence of another shape (a bundle of another kvgate) draws nothing."""
    ev = verdict.get("evidence")
    try:
        ci = ChartInputs.model_validate(ev if isinstance(ev, dict) else {})
    except ValidationError:
        return ChartInputs()
    numbers = [s.read_gb_s for s in ci.streams] + [s.fio_read_gb_s for s in ci.streams if s.fio_read_gb_s is not None]
    numbers += [x for pts in ci.series.values() for pt in pts for x in pt] + (ci.ttft_recompute_s or [])
    numbers += (ci.ttft_readback_s or []) + ([ci.nic_line_rate_gb_s] if ci.nic_line_rate_gb_s is not None else [])
    return ci if all(math.isfinite(x) for x in numbers) else ChartInputs()  # NaN or infinity cannot be drawn


def ttft_lists(verdict: dict[str, Any], gate_dir: Path | None) -> tuple[list[float] | None, list[float] | None]:
    """TTFTs (s) of the successful requests: evidence ``ttft_recompute_s`` / ``ttft_readback_s``, else the raw
    ``requests-<phase>.jsonl`` records."""
    ci = chart_inputs(verdict)
    rc, rb = ci.ttft_recompute_s, ci.ttft_readback_s
    if rc is not None or rb is not None:
        return rc, rb
    recs = request_records(gate_dir)
    if not recs:
        return None, None
    pick = lambda rs: [float(r["ttft_s"]) for r in rs if r.get("error") is None and finite(r.get("ttft_s"))]  # noqa: E731
    return (pick(recs["recompute"]) if "recompute" in recs else None,
            pick(recs["readback"]) if "readback" in recs else None)


def _flat_records(v: Any) -> bool:
    return (isinstance(v, list) and bool(v) and all(isinstance(r, dict) for r in v)
            and all(not isinstance(x, (dict, list)) for r in v for x in r.values()))


def _ordered_frame(rows: list[dict[str, Any]], first: tuple[str, ...] = ()) -> pd.DataFrame:
    cols: list[str] = [c for c in first if any(c in r for r in rows)]
    for c in sorted({k for r in rows for k in r}):
        if c not in cols:
            cols.append(c)
    return pd.DataFrame(rows, columns=cols)


def to_csv_bytes(frame: pd.DataFrame, float_format: str = "%.9g") -> bytes:
    """A table as CSV with a fixed float format and ``\\n`` line ends, so equal numbers give equal bytes."""
    return frame.to_csv(index=False, lineterminator="\n", float_format=float_format).encode()


def gate_tables(verdict: dict[str, Any], gate_dir: Path | None) -> dict[str, pd.DataFrame]:
    """Every series of one gate as a table: name -> DataFrame (names become ``<gate>-<name>.csv``)."""
    ev = verdict.get("evidence") or {}
    out: dict[str, pd.DataFrame] = {}
    for key in sorted(ev):
        if key != "validity" and _flat_records(ev[key]):  # validity is the report's own list, not a series
            out[key] = _ordered_frame(ev[key], ("node", "label", "gpu", "request", "mode"))
    recs = request_records(gate_dir)
    if recs:
        rows = [{"phase": phase, **{k: (json.dumps(v) if isinstance(v, (list, dict)) else v)
                                    for k, v in r.items() if k != "output_text"}}
                for phase, rs in recs.items() for r in rs]
        out["requests"] = _ordered_frame(rows, ("phase", "request_id", "ttft_s", "latency_s", "error"))
    rc, rb = ttft_lists(verdict, gate_dir)
    if isinstance(rc, list) or isinstance(rb, list):
        rows = [{"mode": "recompute", "request": i, "ttft_s": v} for i, v in enumerate(rc or [])]
        rows += [{"mode": "readback", "request": i, "ttft_s": v} for i, v in enumerate(rb or [])]
        out["ttft"] = pd.DataFrame(rows, columns=["mode", "request", "ttft_s"])
    series = chart_inputs(verdict).series
    if series:
        rows = [{"node": n, "t_s": t, "read_gb_s": v} for n in sorted(series) for t, v in series[n]]
        out["series"] = pd.DataFrame(rows, columns=["node", "t_s", "read_gb_s"])
    if gate_dir is not None and gate_dir.is_dir():
        jobs = []
        for fio in sorted(gate_dir.glob("*/fio.json")):
            try:
                text = read_bytes(fio, max_bytes=MAX_JSON_BYTES, what="fio output",
                                  follow_symlinks=False).decode(errors="replace")
            except InputFileError:
                continue  # re-evaluation reports it; the report shows what is readable
            jobs += fio_job_rows(text, fio.parent.name)
        if jobs:
            out["jobs"] = _ordered_frame(jobs, ("node", "jobname", "groupid"))
    return out


def verdicts_frame(verdicts: list[dict[str, Any]]) -> pd.DataFrame:
    rows = [{"gate": v["gate_id"], "title": v["title"], "metric": v["metric"], "pass": v["pass_threshold"],
             "stop_loss": v.get("stop_loss_threshold"), "actual": v.get("actual"), "unit": v.get("unit"),
             "outcome": v["outcome"], "reference": (v.get("reference") or {}).get("value"),
             "validity": validity_text(validity(v)), "reason": v.get("reason")} for v in verdicts]
    return pd.DataFrame(rows, columns=["gate", "title", "metric", "pass", "stop_loss", "actual", "unit", "outcome",
                                       "reference", "validity", "reason"])


# --------------------------------------------------------------------------- charts


def gate_charts(verdict: dict[str, Any], gate_dir: Path | None = None) -> dict[str, tuple[str, str]]:
    """kind -> (caption, svg) for the charts a gate's evidence supports."""
    ci = chart_inputs(verdict)
    metric, unit = verdict.get("metric", ""), verdict.get("unit") or ""
    gid = verdict["gate_id"]
    out: dict[str, tuple[str, str]] = {}
    if ci.streams:
        multi = len({s.node for s in ci.streams}) > 1
        bars = [((f"{s.node}/" if multi else "") + s.label, s.read_gb_s) for s in ci.streams]
        per_stream = metric.startswith(PER_STREAM_PREFIXES)
        ref = quantity_in((verdict.get("reference") or {}).get("value"), "GB/s")
        fio = [s.fio_read_gb_s for s in ci.streams]
        paired = any(f is not None for f in fio)
        svg = rc.stream_bars_svg(
            bars, unit="GB/s",
            pass_value=threshold_in(verdict.get("pass_threshold"), "GB/s") if per_stream else None,
            stop_value=threshold_in(verdict.get("stop_loss_threshold"), "GB/s") if per_stream else None,
            reference_value=ref if per_stream else None, baseline=fio if paired else None,
            title=f"{gid}: read bandwidth per GPU / stream" + (": fio vs connector" if paired else ""))
        caption = ("fio (grey) and the KV connector (blue) reading the same bytes, " if paired else "") + \
            "Read bandwidth of each GPU / read stream" + (
            " with the pass and stop-loss thresholds and the reference figure" if per_stream else
            f" (the thresholds apply to {metric}, not to single streams)")
        out["streams"] = (caption, svg)
    rcmp, rbk = ttft_lists(verdict, gate_dir)
    if (isinstance(rcmp, list) and rcmp) or (isinstance(rbk, list) and rbk):
        ref_s = quantity_in((verdict.get("reference") or {}).get("value"), "s")
        svg = rc.ttft_distribution_svg(rcmp or [], rbk or [], reference_p50_s=ref_s,
                                       title=f"{gid}: TTFT re-compute vs read-back")
        out["ttft"] = ("Distribution of time to first token, KV re-computed vs read back from the tier "
                       "(empirical CDF with p50 marked; spread p5-p95)", svg)
    if any(ci.series.values()):
        pass_v = threshold_in(verdict.get("pass_threshold"), "GB/s") if unit.endswith("/s") else None
        svg = rc.node_series_svg(ci.series, nic_line_rate_gb_s=ci.nic_line_rate_gb_s,
                                 pass_value=pass_v, title=f"{gid}: read rate per node over time",
                                 marks=ci.series_marks)
        out["series"] = ("Read rate of every node over time, their aggregate and the NIC line rate", svg)
    return out


# --------------------------------------------------------------------------- provenance


def _read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from the bundle, or None when the file is absent or unusable (hardened reader)."""
    try:
        d = load_json(path)
    except InputFileError:
        return None
    return d if isinstance(d, dict) else None


def node_provenance(bundle_dir: Path) -> list[dict[str, Any]]:
    """Per node: the snapshot (kernel, CPU, memory, NICs, fio) merged with provenance.json (GPUs, NVMe, versions)."""
    out = []
    nodes_dir = bundle_dir / "nodes"
    if not nodes_dir.is_dir():
        return out
    for d in sorted(p for p in nodes_dir.iterdir() if p.is_dir()):
        snap = _read_json(d / "snapshot.json") or {}
        prov = _read_json(d / "provenance.json") or {}
        # node files are signed data of any shape: each field is taken only with the type the templates use
        versions = {k: v for k, v in _dict(prov.get("versions")).items() if isinstance(v, (str, type(None)))}
        if isinstance(snap.get("fio_version"), str) and snap["fio_version"] and not versions.get("fio"):
            versions["fio"] = snap["fio_version"]
        text = lambda k: snap.get(k) if isinstance(snap.get(k), (str, int, float)) else None  # noqa: E731
        mem = snap.get("mem_total_bytes")
        out.append({
            "name": d.name, "kernel": text("kernel"), "os": text("os"), "cpu_model": text("cpu_model"),
            "logical_cpus": text("logical_cpus"), "mem_total_bytes": mem if finite(mem) else None,
            "nics": _dicts(prov.get("nics")) or _dicts(snap.get("nics")), "gpus": _dicts(prov.get("gpus")),
            "nvme_controllers": _dicts(prov.get("nvme_controllers")),
            "nvme_subsystems": _dicts(prov.get("nvme_subsystems")), "versions": versions,
            "nvme_fabric_controllers": _dicts(snap.get("nvme_fabric_controllers")),
            "rdma_devices": rdma_devices(_dicts(snap.get("rdma_links")), _dicts(snap.get("rdma_devices"))),
            "nvmeof_managed": _read_json_list(d / "nvmeof-managed.json"),
            "errors": {**_dict(snap.get("errors")), **_dict(prov.get("errors"))},
            "collected": bool(prov),
        })
    return out


def _read_json_list(path: Path) -> list[dict[str, Any]]:
    try:
        d = load_json(path)
    except InputFileError:
        return []
    return [x for x in d if isinstance(x, dict)] if isinstance(d, list) else []


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [x for x in value if isinstance(x, dict)] if isinstance(value, list) else []


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def nvmeof_rows(verdict: dict[str, Any]) -> list[dict[str, Any]]:
    """Per node of a gate that read through a ``kind: nvmeof`` target: the namespace, its transport, every path
    (address, state, ANA, queues) and the RDMA device and NIC under an NVMe/RDMA connection."""
    nodes = (verdict.get("evidence") or {}).get("nodes")
    out = []
    for node, rec in sorted(nodes.items()) if isinstance(nodes, dict) else []:
        nv = rec.get("nvmeof") if isinstance(rec, dict) else None
        if not isinstance(nv, dict):
            continue
        paths = "; ".join(
            f"{p.get('controller')} {p.get('address')} {p.get('state')}"
            + (f", ANA {p['ana_state']}" if p.get("ana_state") else "")
            + (f", {p['queue_count']} queues" if p.get("queue_count") else "") for p in _dicts(nv.get("paths")))
        rdma = ", ".join(f"{r['device']} port {r.get('port')} on {r.get('netdev') or '?'}"
                         for r in _dicts(nv.get("rdma")) if r.get("device"))
        out.append({"node": node, "target": nv.get("target"), "nqn": nv.get("nqn"), "device": nv.get("device"),
                    "transport": nv.get("transport"), "multipath": nv.get("multipath"), "paths": paths or None,
                    "rdma": rdma or None,
                    "managed": isinstance(nv.get("managed"), dict) and bool(nv["managed"].get("connected_by_kvgate"))})
    return out


def _num(x: Any, fmt: str, unit: str = "") -> str:
    return "—" if not isinstance(x, (int, float)) or isinstance(x, bool) else (
        "never" if x == float("inf") else f"{x:{fmt}}{unit}")


def endurance_rows(verdicts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per gate whose evidence priced its writes (``evidence.endurance``, harness.endurance): what serving cost the
    pool's drive, as the report's table shows it (``text``) and as tables/endurance.csv keeps it (the numbers)."""
    out = []
    for v in verdicts:
        e = (v.get("evidence") or {}).get("endurance") if isinstance(v.get("evidence"), dict) else None
        if not isinstance(e, dict):
            continue
        drive, smart = _dict(e.get("drive")), _dict(e.get("smart"))
        smart_text = "—" if not smart else (
            f"{smart.get('data_units_written')} units ({_num(smart.get('written_bytes'), ',.0f', ' B')}); "
            + ("agrees with the block counters" if smart.get("reconciled") else smart.get("note") or "")
            if smart.get("exposed") else str(smart.get("note") or "not exposed"))
        out.append({
            "gate": v.get("gate_id"), "workload": v.get("workload"),
            "device_write_bytes": e.get("device_write_bytes"), "served_tokens": e.get("served_tokens"),
            "stored_kv_bytes": e.get("stored_kv_bytes"), "window_s": e.get("window_s"),
            "write_bytes_per_mtok": e.get("write_bytes_per_mtok"), "write_amplification": e.get("write_amplification"),
            "store_write_gb_s": e.get("store_write_gb_s"), "drive_capacity_bytes": drive.get("capacity_bytes"),
            "drive_rated_dwpd": drive.get("rated_dwpd"), "drive_writes_per_day": e.get("drive_writes_per_day"),
            "days_to_rating": e.get("days_to_rating"), "smart_data_units_written": smart.get("data_units_written"),
            "smart_reconciled": smart.get("reconciled"),
            "text": {"written": _num(e.get("device_write_bytes"), ",.0f", " B"),
                     "per_mtok": _num(None if e.get("write_bytes_per_mtok") is None
                                      else e["write_bytes_per_mtok"] / 1e9, ".3f", " GB"),
                     "wa": _num(e.get("write_amplification"), ".2f", " x"),
                     "gb_s": _num(e.get("store_write_gb_s"), ".4f", " GB/s"),
                     "drive": "—" if not drive else f"{drive.get('capacity_bytes', 0) / 1e12:g} TB, "
                                                    f"{drive.get('rated_dwpd'):g} DWPD",
                     "dwpd": _num(e.get("drive_writes_per_day"), ".3g"),
                     "days": _num(e.get("days_to_rating"), ",.0f"), "smart": smart_text,
                     "unknown": "; ".join(str(u) for u in e.get("unknown") or [])}})
    return out


SELF_REPORTED_BY = {"k8s": "self-reported by the pods",
                    "slurm": "self-reported by the Slurm tasks (their job directory's files)"}


def provenance_notes(verdicts: list[dict[str, Any]]) -> list[str]:
    """Pure: per gate, what of its evidence kvgate did not measure itself, from the signed evidence: figures the
    nodes wrote as files (``launcher`` k8s or slurm), a port rate only declared (``port_rate`` with nothing
    measured), clocks assumed in sync (``clock_alignment: assume_synced``). The report's first lines say it."""
    out = []
    for v in verdicts:
        ev = v.get("evidence") if isinstance(v, dict) else None
        if not isinstance(ev, dict):
            continue
        parts = []
        if ev.get("launcher") in SELF_REPORTED_BY:
            parts.append(SELF_REPORTED_BY[ev["launcher"]])
        pr = ev.get("port_rate")
        if isinstance(pr, dict) and all(pr.get(k) is None for k in ("measured_gbit_s", "sysfs_speed_gbit_s",
                                                                     "tbf_rate_gbit_s")):
            parts.append("port rate declared")
        if ev.get("clock_alignment") == "assume_synced":
            parts.append("clocks assumed")
        if parts:
            out.append(f"{v.get('gate_id')} evidence: {'; '.join(parts)}")
    return out


def config_files(bundle_dir: Path) -> list[dict[str, Any]]:
    out = []
    for name in ("gates.yaml", "inventory.yaml"):
        p = bundle_dir / "config" / name
        if p.is_file():
            data = p.read_bytes()
            out.append({"path": f"config/{name}", "sha256": hashlib.sha256(data).hexdigest(),
                        "text": data.decode(errors="replace")})
    return out


# --------------------------------------------------------------------------- the view


@dataclass
class Rendered:
    """Everything a report consists of, before it is written."""

    view: dict[str, Any]
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)  # relative path -> frame
    charts: dict[str, str] = field(default_factory=dict)  # relative path -> svg
    files: dict[str, bytes] = field(default_factory=dict)  # relative path -> bytes (llm-d reports)
    # makers of the files that print the report ID (llm-d reports), for :meth:`for_id`
    id_files: list[Callable[[str], dict[str, bytes]]] = field(default_factory=list)

    def for_id(self, report_id: str) -> "Rendered":
        """The same report for another report ID: the view's ID and the files that print it are redone; the
        tables and charts (drawn from the bundle's files, which hold no ID) are shared, not drawn again."""
        files: dict[str, bytes] = {}
        for make in self.id_files:
            files.update(make(report_id))
        return dataclasses.replace(self, view={**self.view, "report_id": report_id}, files=files)


def build(report_id: str, bundle_dir: Path, predicate: dict[str, Any]) -> Rendered:
    """Collect the view (for the templates), the tables and the charts of one bundle (pure: reads only)."""
    bundle_dir = Path(bundle_dir)
    check_predicate(predicate, "the predicate to render")  # readers check it first, naming the bundle
    verdicts = [dict(v) for v in predicate.get("verdicts") or []]
    tables: dict[str, pd.DataFrame] = {f"{TABLES_DIR}/verdicts.csv": verdicts_frame(verdicts)}
    charts: dict[str, str] = {}
    files: dict[str, bytes] = {}
    id_files: list[Callable[[str], dict[str, bytes]]] = []
    gates = []
    workloads = gate_workloads(bundle_dir)
    for v in verdicts:
        gid = v["gate_id"]
        gate_dir = gate_dir_of(bundle_dir, gid)
        workload = workloads.get(gid)
        result = (_read_json(gate_dir / "result.json") if gate_dir else None) or {}
        g_tables = []
        load = load_section(v, gate_dir, file_part(gid), workload)  # None unless a g2-load gate
        for key, frame in {**gate_tables(v, gate_dir), **(load.tables if load else {})}.items():
            rel = f"{TABLES_DIR}/{file_part(gid)}-{file_part(key)}.csv"
            tables[rel] = frame
            g_tables.append({"path": rel, "rows": len(frame), "key": key})
        g_charts = []
        own = {**(load.charts if load else {}), **gain_charts(v, gate_dir, workload),
               **faults_charts(v, workload, gate_dir)}  # the gate's workload's own charts, found by its name
        for kind, (caption, svg) in {**gate_charts(v, gate_dir), **own}.items():
            rel = f"{CHARTS_DIR}/{file_part(gid)}-{kind}.svg"
            charts[rel] = svg
            g_charts.append({"path": rel, "kind": kind, "caption": caption, "id": f"chart-{gid}-{kind}"})
        if load:
            id_files.append(load.files)
            files.update(load.files(report_id))
        started, finished = result.get("started_unix_s"), result.get("finished_unix_s")
        ref = v.get("reference") or {}
        gates.append({
            **v, "validity": validity(v), "validity_text": validity_text(validity(v)),
            "reference_text": " ".join(x for x in (ref.get("value"), f"({ref['note']})" if ref.get("note") else None)
                                       if x) or "—",
            "reference_source": ref.get("source"), "tables": g_tables, "charts": g_charts, "hits_line": hits_line(v, workload),
            "nvmeof": nvmeof_rows(v), "metric_rows": metric_rows(v),
            "duration_s": (finished - started) if isinstance(started, (int, float)) and
            isinstance(finished, (int, float)) else None,
            "streams": [s.model_dump() for s in chart_inputs(v).streams], **(load.gate_view() if load else {}),
        })
    wear = endurance_rows(verdicts)
    if wear:
        tables[f"{TABLES_DIR}/endurance.csv"] = pd.DataFrame([{k: r[k] for k in r if k != "text"} for r in wear])
    view = {
        "endurance": wear,
        "report_id": report_id, "suite": predicate.get("suite") or {}, "overall": predicate.get("overall"),
        "run": predicate.get("run") or {}, "kvgate": predicate.get("kvgate") or {},
        "signing_key": predicate.get("signing_key") or {}, "gates": gates,
        "nodes": node_provenance(bundle_dir), "config_files": config_files(bundle_dir),
        "notice": predicate.get("rerender_notice"),
        "provenance": provenance_notes(verdicts),
        # render-only (kvgate report): every signature of the envelope as checked now (harness.report.cosign)
        "signers": (predicate.get("rerender_signers") or {}).get("signatures"),
        "signers_checked_with": (predicate.get("rerender_signers") or {}).get("checked_with"),
    }
    return Rendered(view, tables, charts, files, id_files)


class MdText(str):
    """Markdown that the template made itself (already escaped): :func:`md_escape` leaves it as is."""


# What opens a code span, ends a table cell, starts raw HTML or an autolink (``<`` before a tag or scheme
# character; ``< 0.2 GB/s`` stays as is), or makes a link or image (``[``, ``]``), and the escape itself.
_MD_INLINE = re.compile(r"([\\`|\[\]]|<(?=[A-Za-z/!?]))")
_MD_LINE_START = re.compile(r"^(\s*)([#>=+*-]|\d+[.)](?=\s|$))")


def md_escape(value: Any) -> Any:
    """Text quoted into Markdown, inert: one line (CR/LF as spaces), and a backslash before every character
    that could open a code span, end a table cell, start raw HTML or an autolink, or make a link
    (`` ` | < [ ] \\ ``). Ordinary text (figures, thresholds, names) comes out unchanged, so a re-render of
    an honest bundle stays byte-identical. Numbers and :class:`MdText` pass as they are."""
    if isinstance(value, (MdText, int, float)) or value is None:
        return value
    text = str(value)
    if "\n" in text or "\r" in text:
        text = " ".join(text.splitlines())
    return MdText(_MD_INLINE.sub(r"\\\1", text))


def md_line(value: Any) -> Any:
    """:func:`md_escape` for text that starts a line: a heading, quote, list or rule marker at its start is
    escaped too."""
    text = md_escape(value)
    if not isinstance(text, str):
        return text
    def esc(m: re.Match) -> str:  # "1." -> "1\\.", "#" -> "\\#"
        mark = m.group(2)
        return m.group(1) + (mark[:-1] + "\\" + mark[-1] if mark[0].isdigit() else "\\" + mark)
    return MdText(_MD_LINE_START.sub(esc, text))


def _md_finalize(value: Any) -> Any:
    """Every ``{{ … }}`` of a Markdown template goes through :func:`md_escape` (as autoescape does for HTML)."""
    if isinstance(value, jinja2.Undefined):
        return value
    return md_escape(value)


def _env(autoescape: bool) -> jinja2.Environment:
    # HTML: jinja's autoescape (on for report.html.j2; tests/unit/test_report_render.py checks it stays on).
    # Markdown: every interpolation escaped by _md_finalize.
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(data_path("reports"))),
                             undefined=jinja2.ChainableUndefined, keep_trailing_newline=True,
                             autoescape=autoescape, trim_blocks=True, lstrip_blocks=True,
                             **({} if autoescape else {"finalize": _md_finalize}))
    env.globals.update(fmt=format_quantity)
    env.filters["mdcell"] = lambda s: MdText("—") if s is None else md_escape(s)
    env.filters["mdline"] = md_line
    return env


def render_markdown_view(r: Rendered) -> str:
    return _env(False).get_template("report.md.j2").render(**r.view)


def render_html_view(r: Rendered) -> str:
    charts = {k: jinja2.utils.markupsafe.Markup(v) for k, v in r.charts.items()}
    return _env(True).get_template("report.html.j2").render(charts=charts, **r.view)


def render_markdown(report_id: str, predicate: dict[str, Any], bundle_dir: Path | None = None) -> str:
    """report.md of a predicate (and the bundle's evidence files where given)."""
    return render_markdown_view(build(report_id, bundle_dir or Path("/nonexistent"), predicate))


def write_reports(report_id: str, bundle_dir: Path, predicate: dict[str, Any], out_dir: Path | None = None) -> list[str]:
    """Render every report file of ``bundle_dir`` into ``out_dir`` (default: the bundle itself);
    return the written paths relative to ``out_dir``, sorted."""
    return write_rendered(build(report_id, Path(bundle_dir), predicate), predicate, Path(out_dir or bundle_dir))


def write_rendered(r: Rendered, predicate: dict[str, Any], out_dir: Path,
                   static: dict[str, bytes] | None = None) -> list[str]:
    """Write the report files of ``r`` (its view's report ID) into ``out_dir``; the written paths, sorted.
    ``static``, when given, caches the tables' and charts' bytes (the same for every report ID)."""
    report_id = r.view["report_id"]
    files: dict[str, bytes] = {
        "report.md": render_markdown_view(r).encode(),
        "report.html": render_html_view(r).encode(),
        "REPORT_ID": (report_id + "\n").encode(),
        "junit.xml": verdicts_to_junit(report_id, predicate.get("suite") or {}, predicate.get("verdicts", []),
                                       predicate.get("overall"),
                                       {g["gate_id"]: g["duration_s"] for g in r.view["gates"]}).encode(),
    }
    if static is None:
        static = {}
    if not static:
        static.update((rel, to_csv_bytes(frame)) for rel, frame in r.tables.items())
        static.update((rel, svg.encode()) for rel, svg in r.charts.items())
    files.update(static)
    files.update(r.files)
    for rel, data in files.items():
        confined(out_dir, rel).write_bytes(data)
    return sorted(files)


def render_bundle_reports(report_id: str, staging: Path, predicate: dict[str, Any]) -> list[str]:
    """The render hook of :func:`harness.report.bundle.write_bundle`: write every report file into the staging bundle."""
    return write_reports(report_id, Path(staging), predicate)


def bundle_renderer(predicate: dict[str, Any]) -> Callable[[str, Path], list[str]]:
    """A render hook for one :func:`harness.report.bundle.write_bundle`, which calls it twice on the same staging
    bundle (the ID placeholder, then the derived ID): the report is built from the bundle's files once (reading
    every node's files, drawing the charts: seconds at a thousand nodes) and written for each ID, the same
    bytes :func:`render_bundle_reports` writes. The evidence files do not change between the calls (the
    rendered files, which do, are not read by :func:`build`)."""
    built: dict[Path, tuple[Rendered, dict[str, bytes]]] = {}

    def render(report_id: str, staging: Path) -> list[str]:
        staging = Path(staging)
        if staging not in built:
            built[staging] = (build(report_id, staging, predicate), {})
        r, static = built[staging]
        return write_rendered(r.for_id(report_id), predicate, staging, static)
    return render


def render_predicate(signed_predicate: dict[str, Any]) -> dict[str, Any]:
    """The predicate a run renders its reports from: the signed one without what write_bundle adds."""
    return {k: v for k, v in signed_predicate.items() if k not in ("report_id", "rendered_files", "created_utc")}


def signed_render_differences(report_id: str, bundle_dir: Path, signed_predicate: dict[str, Any],
                              out_dir: Path) -> tuple[list[str], list[str]]:
    """Render a verified bundle into ``out_dir`` from its files and signed predicate, as its run did; return
    (the files written, the signed files that are not byte for byte those: a signed file at a rendered path
    that differs, or one listed in ``rendered_files`` that kvgate does not render), both sorted. A render the
    bundle does not hold is no difference: nothing signed shows it. A signed render that differs does
    not follow from the evidence: it is never shown as the bundle's report."""
    mine = write_reports(report_id, bundle_dir, render_predicate(signed_predicate), out_dir)
    differ = {f for f in mine if (Path(bundle_dir) / f).is_file()
              and (Path(bundle_dir) / f).read_bytes() != (Path(out_dir) / f).read_bytes()}
    listed = signed_predicate.get("rendered_files")
    differ |= set(listed) - set(mine) if isinstance(listed, list) else set()
    return mine, sorted(differ)
