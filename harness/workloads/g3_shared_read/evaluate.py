"""G3 judged: the aggregate over the window all readers read, the isolation loss, the validity checks (the
physics, the self-reports), each reader's stream parsed, and the same again from a bundle's raw streams."""

from __future__ import annotations

from typing import Any

from ...errors import WorkloadError
from ...execute.fanout import FailurePolicy, GroupResult, NodeOutcome
from ...parsers.g3series import (GB, NodeSeries, PortRate, TimeFrame, active_span, aggregate, bytes_in_window,
                                 longest_idle_s, nic_ceiling_ratio, nodes_completed, parse_reader_output, rate_series,
                                 self_report_problems, start_skew_s)
from ..kit.base import ValidityCheck, WorkloadResult
from .params import (G3Aggregate, G3Bounds, G3Evidence, G3Isolation, G3NodeRecord, G3Params, G3Process, G3WriterRecord,
                     WITH_WRITER)


def evaluate_g3(ev: G3Evidence, series: dict[str, NodeSeries], port: PortRate, policy: FailurePolicy,
                min_window_s: float, offset_uncertainty_s: float, go_ref_s: float | None,
                with_writer: dict[str, NodeSeries] | None = None, writer: NodeSeries | None = None,
                max_idle_s: float = 2.0, bounds: G3Bounds = G3Bounds()) -> WorkloadResult:
    """Pure: G3's metrics and validity from every reader's parsed series and the evidence gathered so far
    (``ev.nodes``, ``ev.failed_nodes``, ``ev.page_cache_dropped``); fills in the aggregate, the start skew
    and the per-node rate series the report draws. With ``ev.isolation`` (a writer): also the readers' second
    read (``with_writer``) and the writer's series, judged by :func:`evaluate_isolation`. Physics (``bounds``):
    INVALID when the port's declared and measured rates differ beyond their tolerance, when the aggregate
    exceeds the port's ceiling (min(declared, measured)) by more than ``line_rate_tolerance``, when a
    self-reported run (k8s, slurm) holds an impossible time or byte count, and, with a writer, when the writer
    wrote less than ``min_write_share`` of the port's ceiling."""
    res = _evaluate_alone(ev, series, port, policy, min_window_s, offset_uncertainty_s, go_ref_s, bounds)
    if ev.isolation is None:
        return res
    metrics, checks, error, invalid = evaluate_isolation(ev, series, with_writer or {}, writer, policy,
                                                         min_window_s, max_idle_s, bounds.min_write_share)
    ev.validity = [*ev.validity, *checks]
    return WorkloadResult({**res.metrics, **metrics}, ev, error=res.error or error,
                          invalid_reason=None if res.error or error else res.invalid_reason or invalid)


def _readers_loss(a: Any, w: Any, both: list[str]) -> tuple[float | None, dict[str, float] | None, str | None]:
    """Pure: (the readers' loss with the writer against alone, per node, or why there is none) from the two
    aggregates over the same readers."""
    if a.aggregate_read_gb_s is None or w.aggregate_read_gb_s is None:
        return None, None, (f"no {'alone' if a.aggregate_read_gb_s is None else 'with-writer'} aggregate: "
                            f"{(a if a.aggregate_read_gb_s is None else w).reason}")
    if a.aggregate_read_gb_s <= 0:
        return None, None, "the readers read nothing alone"
    per_node = {n: 1.0 - w.per_node_read_gb_s[n] / a.per_node_read_gb_s[n] for n in both if a.per_node_read_gb_s.get(n)}
    return 1.0 - w.aggregate_read_gb_s / a.aggregate_read_gb_s, per_node, None


def _writer_in_window(rec: G3WriterRecord, writer: NodeSeries | None, w: Any, max_idle_s: float
                      ) -> tuple[G3WriterRecord, bool | None]:
    """Pure: the writer's record with what it wrote inside the readers' with-writer window ``w`` (bytes, rate,
    longest idle stretch), and whether it wrote through it (None: nothing to check against)."""
    if writer is None or w.window_start_s is None or w.window_end_s is None:
        return rec, None
    ivs = writer.aligned()
    span = active_span(ivs)
    wb = bytes_in_window(ivs, w.window_start_s, w.window_end_s)
    idle = longest_idle_s(ivs, w.window_start_s, w.window_end_s)
    active = span[1] - span[0] if span else 0.0
    rec = rec.model_copy(update=dict(
        active_s=active, write_gb_s=(writer.total_bytes or 0.0) / active / GB if active > 0 else None,
        window_bytes=wb, window_write_gb_s=wb / w.window_s / GB if w.window_s > 0 else None, longest_idle_s=idle))
    return rec, wb > 0 and idle <= max_idle_s


def evaluate_isolation(ev: G3Evidence, alone: dict[str, NodeSeries], with_writer: dict[str, NodeSeries],
                       writer: NodeSeries | None, policy: FailurePolicy, min_window_s: float, max_idle_s: float,
                       min_write_share: float = 0.05
                       ) -> tuple[dict[str, float], list[ValidityCheck], str | None, str | None]:
    """Pure: the isolation run's metrics, validity, error and invalid reason. The readers' loss compares the two
    reads over the readers that completed both (each read's own common window); the writer must have written
    inside the with-writer window with no idle stretch over ``max_idle_s`` and at least ``min_write_share`` of
    the port's ceiling (``ev.nic_line_rate_gb_s``), else the comparison is INVALID."""
    iso = ev.isolation
    failed = {**ev.failed_nodes, **iso.failed_nodes}
    both = [n for n in ev.readers if n not in failed and n in alone and n in with_writer]
    a = aggregate({n: alone[n] for n in both}, min_window_s=min_window_s)
    w = aggregate({n: with_writer[n] for n in both}, min_window_s=min_window_s)
    metrics: dict[str, float] = {"nodes_completed_with_writer": float(nodes_completed(with_writer))}
    if w.aggregate_read_gb_s is not None:
        metrics["aggregate_read_gb_s_with_writer"] = w.aggregate_read_gb_s
    loss, per_node, reason = _readers_loss(a, w, both)
    if loss is not None:
        metrics["readers_loss"] = loss
    rec, wrote = _writer_in_window(iso.writer_record or G3WriterRecord(node=iso.writer, error="not started"),
                                   writer, w, max_idle_s)
    if wrote is not None and rec.window_write_gb_s is not None:  # measured in this window
        metrics["writer_write_gb_s"] = rec.window_write_gb_s
    series = dict(with_writer)
    if writer is not None:
        series[f"{iso.writer} (writer)"] = writer
    ev.isolation = iso.model_copy(update=dict(
        alone=G3Aggregate.model_validate(a.as_dict()), with_writer=G3Aggregate.model_validate(w.as_dict()),
        readers_loss=loss, per_node_loss=per_node or {}, compared=both, reason=reason, writer_record=rec,
        series=rate_series(series, iso.launch.go_ref_s if iso.launch else None)))
    group = GroupResult({n: NodeOutcome(n, n not in failed, None, failed.get(n)) for n in ev.readers})
    error = policy.verdict_error(group)
    drops = iso.page_cache_dropped
    not_cold = [n for n in with_writer if n not in failed and not (iso.nodes.get(n) and iso.nodes[n].direct_used)
                and not (n in drops and drops[n].dropped)]
    why, wrote_check = _writer_check(iso.writer, rec, wrote, w.window_s, max_idle_s, min_write_share,
                                     ev.nic_line_rate_gb_s)
    checks = [
        wrote_check,
        ValidityCheck(name="comparison", ok=loss is not None,
                      claim="the same readers read alone and with the writer, each in a common window",
                      how=reason or (f"{', '.join(both)}: {a.aggregate_read_gb_s:.4f} GB/s alone over {a.window_s:.2f} s,"
                                     f" {w.aggregate_read_gb_s:.4f} GB/s with the writer over {w.window_s:.2f} s"),
                      figure="readers' loss", value=loss, unit="ratio"),
        ValidityCheck(name="cold (with writer)", ok=bool(with_writer) and not not_cold,
                      claim="every reader's second read came from the shared copy, not its page cache",
                      how=("not cold on " + ", ".join(not_cold)) if not_cold else
                      "O_DIRECT or the page cache dropped again on every reader")]
    reported_error, invalid = _isolation_verdict(error, why, loss, reason, not_cold)
    return metrics, checks, reported_error, invalid


def _writer_check(writer: str, rec: G3WriterRecord, wrote: bool | None, window_s: float, max_idle_s: float,
                  min_write_share: float, nic_line_rate_gb_s: float | None) -> tuple[str | None, ValidityCheck]:
    """Pure: why the writer does not make the isolation run a comparison (failed, wrote nothing checkable, not
    through the readers' window, or below ``min_write_share`` of the port's line rate), None when it does, and
    the validity check saying so."""
    min_gb_s = min_write_share * nic_line_rate_gb_s if nic_line_rate_gb_s else None
    slow = (wrote and min_gb_s is not None and (rec.window_write_gb_s or 0.0) < min_gb_s)
    if rec.error:
        why = f"the writer {writer} failed: {rec.error}"
    elif wrote is None:
        why = f"the writer {writer} wrote nothing the readers' window can be checked against"
    elif not wrote:
        why = (f"the writer {writer} did not write through the readers' window: {rec.window_bytes:.0f} bytes in "
               f"its {window_s:.2f} s, longest idle stretch {rec.longest_idle_s:.2f} s (bound {max_idle_s:g} s)")
    elif slow:
        why = (f"the writer {writer} wrote {rec.window_write_gb_s:.6f} GB/s in the readers' window, below its "
               f"stated minimum {min_gb_s:.6f} GB/s (min_write_share {min_write_share:g} of the port's "
               f"{nic_line_rate_gb_s:.6g} GB/s): not a writer contending for the port, its loss is not judged")
    else:
        why = None
    return why, ValidityCheck(
        name="writer wrote", ok=why is None,
        claim=f"the writer {writer} wrote through the same port for the whole with-writer window",
        how=why or (f"{rec.window_bytes / 1e6:.1f} MB written in the readers' {window_s:.2f} s window "
                    f"({rec.window_write_gb_s:.3f} GB/s"
                    + (f", at least {min_gb_s:.4f} GB/s stated" if min_gb_s is not None else "")
                    + f"), longest idle stretch {rec.longest_idle_s:.2f} s (bound {max_idle_s:g} s)"),
        figure="longest writer idle", value=rec.longest_idle_s, unit="s")


def _isolation_verdict(error: str | None, why: str | None, loss: float | None, reason: str | None,
                       not_cold: list[str]) -> tuple[str | None, str | None]:
    """Pure: the isolation run's (error, invalid reason), first that applies: the readers' failure beyond the
    policy, the writer's reason, no loss to report, a reader not cold."""
    if error:
        return f"with the writer: {error}", None
    if why:
        return None, why
    if loss is None:
        return None, f"no readers' loss: {reason}"
    if not_cold:
        return None, f"not cold with the writer: {', '.join(not_cold)}"
    return None, None


def _evaluate_alone(ev: G3Evidence, series: dict[str, NodeSeries], port: PortRate, policy: FailurePolicy,
                    min_window_s: float, offset_uncertainty_s: float, go_ref_s: float | None,
                    bounds: G3Bounds = G3Bounds()) -> WorkloadResult:
    failed = ev.failed_nodes
    ok_series = {n: s for n, s in series.items() if n not in failed}
    agg = aggregate(ok_series, min_window_s=min_window_s)
    ev.aggregate = G3Aggregate.model_validate(agg.as_dict())
    ev.series = rate_series(series, go_ref_s)
    ev.nic_line_rate_gb_s = port.effective_gbit_s / 8.0
    metrics: dict[str, float] = {"nodes_completed": float(nodes_completed(series))}
    skew = start_skew_s({n: s for n, s in series.items() if s.started_at_s is not None})
    if skew is not None:
        metrics["start_skew_s"] = skew
        ev.start_skew_ms = skew * 1e3
        # Aligned starts are exact only if the applied offsets are: the true skew can be larger by up to
        # twice the largest offset uncertainty (zero where all nodes share one clock, as in the rig).
        ev.start_skew_uncertainty_ms = 2e3 * offset_uncertainty_s
        ev.start_times_node_clock_s = {n: s.started_at_s for n, s in series.items()}
    ratio = None
    if agg.aggregate_read_gb_s is not None:
        metrics["aggregate_read_gb_s"] = agg.aggregate_read_gb_s
        ratio = metrics["nic_ceiling_ratio"] = nic_ceiling_ratio(agg.aggregate_read_gb_s, port.effective_gbit_s)
    if agg.fairness_min_max is not None:
        metrics["fairness_min_max"] = agg.fairness_min_max
    group = GroupResult({n: NodeOutcome(n, n not in failed, None, failed.get(n)) for n in ev.readers})
    err = policy.verdict_error(group)
    drops = ev.page_cache_dropped
    not_cold = [n for n in ok_series if not _direct(ev, n) and not (n in drops and drops[n].dropped)]
    over = (f"the aggregate {agg.aggregate_read_gb_s:.4f} GB/s is {ratio:.3f} x the port's ceiling "
            f"{port.effective_gbit_s:g} Gbit/s ({port.effective_gbit_s / 8:.4f} GB/s), beyond the "
            f"{bounds.line_rate_tolerance:g} allowed for counter timing: more than the port can carry (a page "
            "cache, another path, or readers that over-count)") \
        if ratio is not None and ratio > 1.0 + bounds.line_rate_tolerance else None
    impossible = _self_report_problems(ev, series) if ev.launcher in SELF_REPORTED else []
    ev.validity = [*g3_validity(ev, list(ok_series), not_cold, err), *_physics_checks(ev, port, ratio, over, bounds),
                   *_self_report_checks(ev, impossible)]
    if err:
        return WorkloadResult(metrics, ev, error=err)
    if agg.aggregate_read_gb_s is None:
        return WorkloadResult(metrics, ev, invalid_reason=f"no aggregate: {agg.reason}")
    if port.mismatch:
        return WorkloadResult(metrics, ev, invalid_reason=f"port rate: {port.mismatch}")
    if over:
        return WorkloadResult(metrics, ev, invalid_reason=over)
    if impossible:
        return WorkloadResult(metrics, ev, invalid_reason=(
            f"self-reported figures that cannot be: {'; '.join(impossible[:4])}"
            + (f" (and {len(impossible) - 4} more)" if len(impossible) > 4 else "")))
    if not_cold:
        return WorkloadResult(metrics, ev, invalid_reason=(
            f"not cold: no O_DIRECT and the page cache was not dropped on {', '.join(not_cold)}"))
    return WorkloadResult(metrics, ev)


# Launchers whose readers' figures reach kvgate only as files the nodes wrote (a results volume, a job
# directory), not over a session kvgate held and timed.
SELF_REPORTED = ("k8s", "slurm")


def _self_report_problems(ev: G3Evidence, series: dict[str, NodeSeries]) -> list[str]:
    """Pure: the impossible in a self-reported run (harness.parsers.g3series.self_report_problems), its
    go time and its tasks' start times held to the run's frame too."""
    frame = TimeFrame(**ev.time_frame) if ev.time_frame else None
    extra: dict[str, float] = {}
    if ev.launch is not None and isinstance(ev.launch.go_ref_s, (int, float)):
        extra["the common start (go)"] = float(ev.launch.go_ref_s)
    job = ev.k8s_job or ev.slurm_job or {}
    spec = job.get("spec_sha256")  # the job spec kvgate wrote (slurm); each task records the one it read
    wrong = []
    for node, task in sorted((job.get("tasks") or {}).items()):
        t = task.get("started_at_s") if isinstance(task, dict) else None
        if isinstance(t, (int, float)) and not isinstance(t, bool):
            extra[f"{node}'s task start"] = float(t)
        if spec and isinstance(task, dict) and task.get("spec_sha256") != spec:
            wrong.append(f"{node}'s task ran a spec with sha256 {str(task.get('spec_sha256'))[:16]}, not the one "
                         f"kvgate wrote ({spec[:16]})")
    return wrong + self_report_problems(series, ev.copy_bytes, frame, extra)


def _physics_checks(ev: G3Evidence, port: PortRate, ratio: float | None, over: str | None,
                    bounds: G3Bounds) -> list[ValidityCheck]:
    """Pure: the port's rate (declared against measured) and the aggregate against the port's ceiling."""
    if port.measured_gbit_s is None:
        how = f"declared {port.declared_gbit_s:g} Gbit/s; not measured (nothing read from the port's node)"
    else:
        how = (port.mismatch or f"declared {port.declared_gbit_s:g} Gbit/s, measured {port.measured_gbit_s:g} Gbit/s "
               f"({port.measured_by}; within {port.tolerance:g})")
        how += f"; judged against {port.effective_gbit_s:g} Gbit/s"
    return [
        ValidityCheck(name="port rate", ok=port.mismatch is None,
                      claim="the port is the one the inventory declares: its declared rate and the rate its node "
                            "reports agree", how=how, figure="port ceiling", value=port.effective_gbit_s,
                      unit="Gbit/s"),
        ValidityCheck(name="within line rate", ok=over is None,
                      claim="the aggregate is no more than the port can carry",
                      how=over or ("no aggregate" if ratio is None else
                                   f"{ratio:.3f} x the port's ceiling (at most 1 + {bounds.line_rate_tolerance:g})"),
                      figure="nic ceiling ratio", value=ratio, unit="ratio")]


def _self_report_checks(ev: G3Evidence, impossible: list[str]) -> list[ValidityCheck]:
    if ev.launcher not in SELF_REPORTED:
        return []
    frame = ev.time_frame
    return [ValidityCheck(
        name="self-reported figures", ok=not impossible,
        claim="the readers' own times and byte counts are possible: inside the run's frame, no longer than the "
              "job allows, no more bytes than the copy holds",
        how="; ".join(impossible) or (f"times within the frame ({frame['max_duration_s']:.0f} s at most) and bytes "
                                      f"within the copy's {ev.copy_bytes}" if frame else
                                      f"bytes within the copy's {ev.copy_bytes}; no time frame recorded"))]


def _direct(ev: G3Evidence, node: str) -> bool:
    rec = ev.nodes.get(node)
    return bool(rec is not None and rec.direct_used)


def g3_validity(ev: G3Evidence, included: list[str], not_cold: list[str], policy_error: str | None
                ) -> list[ValidityCheck]:
    """Pure: what G3's aggregate rests on, by :func:`evaluate_g3`'s rules: the readers the failure policy
    requires completed, a common window in which all of them read, and every included reader read cold
    (O_DIRECT, or its page cache dropped)."""
    agg = ev.aggregate
    done = sorted(n for n in ev.readers if n not in ev.failed_nodes)
    ways = []
    for n in sorted(included):
        d = ev.page_cache_dropped.get(n)
        ways.append(f"{n}: " + ("O_DIRECT" if _direct(ev, n) else "page cache dropped" if d is not None and d.dropped
                                else "NEITHER O_DIRECT NOR a dropped page cache"))
    return [
        ValidityCheck(name="nodes", ok=policy_error is None,
                      claim="the readers the failure policy requires read the whole copy",
                      how=policy_error or f"{len(done)} of {len(ev.readers)} reader(s) completed"
                      + (f" (failed: {', '.join(sorted(ev.failed_nodes))})" if ev.failed_nodes else ""),
                      figure="readers completed", value=float(len(done)), unit="count"),
        ValidityCheck(name="common window", ok=agg is not None and agg.aggregate_read_gb_s is not None,
                      claim="every included reader was reading during the window the aggregate is taken over",
                      how=(f"the time-aligned per-node series of {', '.join(agg.nodes) or 'no node'}"
                           + (f": {agg.reason}" if agg.reason else "")) if agg is not None else "no aggregate",
                      figure="common window", value=agg.window_s if agg is not None else None, unit="s"),
        ValidityCheck(name="cold", ok=bool(included) and not not_cold,
                      claim="every reader read the shared copy, not its page cache",
                      how="; ".join(ways) or "no reader's series")]


# The errors a node's own output makes (parse_stream), as against the run's (rc, silence, never started).
STREAM_ERRORS = ("reader output unparseable", "reader did not complete", "writer output unparseable",
                 "writer did not end on its stop file")


def parse_stream(name: str, text: str, offset_s: float, info: dict[str, Any], source: str, kind: str = "reader"
                 ) -> tuple[NodeSeries | None, dict[str, Any]]:
    """Pure: one reader's (or the writer's) raw JSON-lines stream parsed into its series (None if unparseable)
    and its record: ``info`` (the run's record of the process: rc, error, ...) with what the stream says (O_DIRECT,
    bytes, completion, samples, errors) and the node's error: the run's, else an unparseable or incomplete
    stream. The run and ``kvgate report``'s re-derivation (:func:`reevaluate_g3`) both use it."""
    info = dict(info)
    error = info.get("error")
    series = None
    try:
        out = parse_reader_output(text, name, offset_s, source=source)
        info.update(direct_used=out.armed.get("direct_used"), direct_error=out.armed.get("direct_error"),
                    completed=out.series.completed, truncated=out.truncated, samples=len(out.series.intervals))
        if kind == "writer":
            info.update(bytes_written=out.series.total_bytes, writer_errors=list(out.errors))
        else:
            info.update(start_priority=out.start.get("start_priority"), bytes_read=out.series.total_bytes,
                        reader_errors=list(out.errors))
        series = out.series
    except Exception as exc:  # noqa: BLE001 - unparseable output is that node's failure
        info["parse_error"] = str(exc)
        error = error or f"{kind} output unparseable: {exc}"
    if error is None and not info.get("completed"):
        errs = info.get(f"{kind}_errors")
        error = ("writer did not end on its stop file: " if kind == "writer" else "reader did not complete: ") \
            + "; ".join(errs or ["no end record"])
    info["error"] = error
    return series, info


PROCESS_KEYS = ("node", "rc", "error", "stopped", "armed_at_s", "go_node_s", "go_written_at_s", "pid", "pgid")


def _run_record(rec: G3Process | None) -> dict[str, Any]:
    """What the run itself recorded of a node's process (not what its stream said): the re-derivation's input."""
    info = {k: getattr(rec, k, None) for k in PROCESS_KEYS} if rec is not None else {}
    if isinstance(info.get("error"), str) and info["error"].startswith(STREAM_ERRORS):
        info["error"] = None  # made from the stream: made again from it
    return info


def _rederive_streams(names: list[str], recs: dict[str, G3NodeRecord], raw: dict[str, str | None], stem: str,
                      offsets: dict[str, float], gate: str
                      ) -> tuple[dict[str, NodeSeries], dict[str, G3NodeRecord], dict[str, str]]:
    """Pure: every reader's stream ``nodes/<node>/<stem>.jsonl`` parsed again, as the run's ``_gather`` did. A node
    the run saw fail without output (never started, unreachable) has none; any other node's missing or empty
    file is an error of the re-derivation (WorkloadError), never a figure taken from result.json."""
    series: dict[str, NodeSeries] = {}
    node_ev: dict[str, G3NodeRecord] = {}
    failed: dict[str, str] = {}
    for name in names:
        info = _run_record(recs.get(name))
        rel = f"nodes/{name}/{stem}.jsonl"
        text = raw.get(rel)
        if text is None or (not text.strip() and info.get("error") is None):
            if info.get("error") is None:
                raise WorkloadError(f"gates/{gate}/{rel} is {'missing' if text is None else 'empty'}: the run says "
                                    f"{name} read, and its raw stream is not there to re-derive it from")
            failed[name] = info["error"]
            node_ev[name] = G3NodeRecord.model_validate(info)
            continue
        one, info = parse_stream(name, text, offsets.get(name, 0.0), info, rel)
        if one is not None:
            series[name] = one
        if info["error"]:
            failed[name] = info["error"]
        node_ev[name] = G3NodeRecord.model_validate(info)
    return series, node_ev, failed


def reevaluate_g3(signed: dict[str, Any], raw: dict[str, str | None], p: G3Params, port: PortRate,
                  gate: str = "G3") -> WorkloadResult:
    """Pure: G3 re-derived from a bundle's raw streams (``raw``: path under the gate directory -> text, None when
    the file is missing) and the bounds of its own config/gates.yaml (``p``), with what only the run can know
    taken from the signed evidence (the launch, clock offsets, cache drops, each process's exit and error, the
    self-reported run's time frame). The same evaluator as the run (:func:`evaluate_g3`); a missing or empty raw
    stream raises WorkloadError."""
    ev = G3Evidence.model_validate(signed)
    policy = FailurePolicy(p.max_failed_share, p.on_node_failure)
    offsets = {n: float(o.get("applied_s") or 0.0) for n, o in ev.clock_offsets.items() if isinstance(o, dict)}
    fresh = G3Evidence(readers=ev.readers, port=p.port, copy_bytes=p.copy_bytes, chunks=p.chunks,
                       chunk_bytes=p.chunk_bytes, streams_per_node=p.streams, block_bytes=p.block_bytes,
                       policy=vars(policy), pool=ev.pool, phase_failures=ev.phase_failures,
                       clock_offsets=ev.clock_offsets, clock_alignment=ev.clock_alignment,
                       clock_offset_errors=ev.clock_offset_errors, page_cache_dropped=ev.page_cache_dropped,
                       launch=ev.launch, launcher=ev.launcher, slurm_job=ev.slurm_job, k8s_job=ev.k8s_job,
                       time_frame=ev.time_frame, port_rate=vars(port) | {"notes": list(port.notes)})
    series, fresh.nodes, fresh.failed_nodes = _rederive_streams(ev.readers, ev.nodes, raw, "reader", offsets, gate)
    with_writer = writer = None
    if ev.isolation is not None:
        iso = ev.isolation
        with_writer, nodes, failed = _rederive_streams(list(iso.nodes), iso.nodes, raw, "reader" + WITH_WRITER,
                                                       offsets, gate)
        winfo = _run_record(iso.writer_record) | {"dir": iso.writer_record.dir if iso.writer_record else None}
        text = raw.get(f"nodes/{iso.writer}/writer.jsonl")
        if (text is None or not text.strip()) and winfo.get("error") is None:
            raise WorkloadError(f"gates/{gate}/nodes/{iso.writer}/writer.jsonl is "
                                f"{'missing' if text is None else 'empty'}: the run says the writer {iso.writer} "
                                "wrote, and its raw stream is not there to re-derive it from")
        if text is not None:
            writer, winfo = parse_stream(iso.writer, text, offsets.get(iso.writer, 0.0), winfo,
                                         f"nodes/{iso.writer}/writer.jsonl", "writer")
        fresh.isolation = G3Isolation(writer=iso.writer, nodes=nodes, failed_nodes=failed,
                                      page_cache_dropped=iso.page_cache_dropped, launch=iso.launch,
                                      writer_record=G3WriterRecord.model_validate(winfo))
    uncertainty = max((float(o.get("uncertainty_s") or 0.0) for o in ev.clock_offsets.values()
                       if isinstance(o, dict)), default=0.0)
    return evaluate_g3(fresh, series, port, policy, p.min_window_s, uncertainty,
                       ev.launch.go_ref_s if ev.launch else None, with_writer, writer,
                       p.writer.max_idle_s if p.writer else 2.0, G3Bounds.of(p))


