"""Pure functions for multi-node shared reads (G3): the common window, aggregate, fairness, start skew,
the port's line rate, and parsers for the raw per-node series (kvgate's reader and fio bandwidth logs).
Clock offsets are estimated in harness.execute.clock.

Nothing here does I/O except reading text handed in; a bundle can be re-evaluated offline from its raw files.

Conventions: times are seconds (float, Unix epoch) in some clock; a node's clock offset is
`node_clock - reference_clock`, so a node time `t` is `t - offset` on the reference clock.
Bandwidth is decimal: GB/s = 1e9 bytes/s.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

GB = 1e9


class SeriesParseError(ValueError):
    """A raw series file could not be parsed; the message names the file and line."""


@dataclass(frozen=True)
class Interval:
    """`nbytes` were read during (start_s, end_s]; rate assumed uniform inside the interval."""

    start_s: float
    end_s: float
    nbytes: float

    def shifted(self, delta_s: float) -> "Interval":
        return Interval(self.start_s + delta_s, self.end_s + delta_s, self.nbytes)


@dataclass(frozen=True)
class NodeSeries:
    """One node's read series in its own clock, plus what the node reported about itself."""

    node: str
    intervals: tuple[Interval, ...]
    clock_offset_s: float = 0.0
    started_at_s: float | None = None  # node clock: when the first read was issued
    completed: bool = False  # the reader read everything it was asked to
    total_bytes: float | None = None  # reader's own total (may exceed the sum of intervals if truncated)

    def aligned(self) -> tuple[Interval, ...]:
        """Intervals on the reference clock."""
        return tuple(iv.shifted(-self.clock_offset_s) for iv in self.intervals)

    @property
    def aligned_start_s(self) -> float | None:
        if self.started_at_s is not None:
            return self.started_at_s - self.clock_offset_s
        return self.intervals[0].start_s - self.clock_offset_s if self.intervals else None


def bytes_in_window(intervals: Iterable[Interval], start_s: float, end_s: float) -> float:
    """Bytes read inside [start_s, end_s], prorating intervals that straddle an edge."""
    total = 0.0
    for iv in intervals:
        lo, hi = max(iv.start_s, start_s), min(iv.end_s, end_s)
        if hi <= lo:
            continue
        span = iv.end_s - iv.start_s
        total += iv.nbytes if span <= 0 else iv.nbytes * (hi - lo) / span
    return total


def active_span(intervals: Sequence[Interval]) -> tuple[float, float] | None:
    """(first start, last end) of the intervals that carried bytes."""
    busy = [iv for iv in intervals if iv.nbytes > 0]
    if not busy:
        return None
    return min(iv.start_s for iv in busy), max(iv.end_s for iv in busy)


def longest_idle_s(intervals: Sequence[Interval], start_s: float, end_s: float) -> float:
    """The longest stretch of [start_s, end_s] that no byte-carrying interval covers: from the window's start to
    the first busy interval, between busy intervals, and from the last to the window's end (the whole window
    when none carried bytes). G3's isolation writer must leave no such stretch longer than its bound."""
    busy = sorted((max(iv.start_s, start_s), min(iv.end_s, end_s)) for iv in intervals
                  if iv.nbytes > 0 and min(iv.end_s, end_s) > max(iv.start_s, start_s))
    idle, at = 0.0, start_s
    for lo, hi in busy:
        idle = max(idle, lo - at)
        at = max(at, hi)
    return max(idle, end_s - at)


def common_window(aligned: Mapping[str, Sequence[Interval]]) -> tuple[float, float] | None:
    """The span in which every node was reading: latest first-start to earliest last-end.

    A gap inside a node's series (no bytes for a while) stays inside the window and counts as zero:
    the node was supposed to be reading and was not. None when the spans do not overlap.
    """
    spans = [active_span(ivs) for ivs in aligned.values()]
    if not spans or any(s is None for s in spans):
        return None
    start = max(s[0] for s in spans)
    end = min(s[1] for s in spans)
    return (start, end) if end > start else None


@dataclass(frozen=True)
class Aggregate:
    """Aggregate over the common window of the included nodes."""

    aggregate_read_gb_s: float | None
    window_start_s: float | None
    window_end_s: float | None
    window_s: float
    per_node_read_gb_s: dict[str, float]  # each node's rate inside the common window
    fairness_min_max: float | None
    nodes: tuple[str, ...]
    reason: str | None = None  # why there is no aggregate

    def as_dict(self) -> dict:
        return {
            "aggregate_read_gb_s": self.aggregate_read_gb_s,
            "window_start_s": self.window_start_s,
            "window_end_s": self.window_end_s,
            "window_s": self.window_s,
            "per_node_read_gb_s": self.per_node_read_gb_s,
            "fairness_min_max": self.fairness_min_max,
            "nodes": list(self.nodes),
            "reason": self.reason,
        }


def fairness_min_max(rates: Mapping[str, float]) -> float | None:
    """Slowest node / fastest node (1.0 = perfectly fair); None without rates, 0.0 if the fastest read nothing."""
    if not rates:
        return None
    hi = max(rates.values())
    if hi <= 0:
        return 0.0
    return min(rates.values()) / hi


def aggregate(series: Mapping[str, NodeSeries], min_window_s: float = 0.0) -> Aggregate:
    """Aggregate read rate of the given nodes over the window in which all of them were reading.

    Sum of the bytes each node read inside the common window, divided by the window length; not the
    sum of per-node averages (which would credit a late starter's or early finisher's solo time).
    """
    names = tuple(sorted(series))
    aligned = {n: series[n].aligned() for n in names}
    if not names:
        return Aggregate(None, None, None, 0.0, {}, None, names, "no nodes")
    win = common_window(aligned)
    if win is None:
        silent = [n for n in names if active_span(aligned[n]) is None]
        why = (f"no data from {', '.join(silent)}" if silent
               else "the nodes' read spans do not overlap: there is no window in which all were reading")
        return Aggregate(None, None, None, 0.0, {}, None, names, why)
    start, end = win
    length = end - start
    per_node = {n: bytes_in_window(aligned[n], start, end) / length / GB for n in names}
    total = sum(per_node.values())
    reason = None
    if length < min_window_s:
        reason = f"common window {length:.3f} s is shorter than the minimum {min_window_s:.3f} s"
    return Aggregate(
        aggregate_read_gb_s=None if reason else total,
        window_start_s=start,
        window_end_s=end,
        window_s=length,
        per_node_read_gb_s=per_node,
        fairness_min_max=fairness_min_max(per_node),
        nodes=names,
        reason=reason,
    )


def rate_series(series: Mapping[str, NodeSeries], t0_s: float | None = None) -> dict[str, list[tuple[float, float]]]:
    """Every node's read rate over time on the reference clock: ``node -> [(t_s, read_gb_s)]``, one point per
    sample interval at its start (the rate holds until the next point), ``t_s`` counted from ``t0_s`` (default:
    the earliest aligned interval start of all nodes). Empty intervals keep their point (a stall shows as 0)."""
    aligned = {n: s.aligned() for n, s in series.items()}
    starts = [ivs[0].start_s for ivs in aligned.values() if ivs]
    if t0_s is None:
        t0_s = min(starts) if starts else 0.0
    out: dict[str, list[tuple[float, float]]] = {}
    for node in sorted(aligned):
        out[node] = [(iv.start_s - t0_s, (iv.nbytes / (iv.end_s - iv.start_s) / GB) if iv.end_s > iv.start_s else 0.0)
                     for iv in aligned[node]]
    return out


def start_skew_s(series: Mapping[str, NodeSeries]) -> float | None:
    """Spread of the aligned first-read times (max - min); None with fewer than one known start."""
    starts = [s.aligned_start_s for s in series.values() if s.aligned_start_s is not None]
    if not starts:
        return None
    return max(starts) - min(starts)


@dataclass(frozen=True)
class TimeFrame:
    """When a self-reported run can have happened, by clocks kvgate trusts: not before ``not_before_s`` (the
    render, or the job's submission), not after ``not_after_s`` (the collect, or the job's end), each reader's
    read no longer than ``max_duration_s`` (the job's time limit); ``slack_s`` allows for the clocks assumed."""

    not_before_s: float
    not_after_s: float
    max_duration_s: float
    slack_s: float = 60.0


def _utc(t: float) -> str:
    try:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
    except (OverflowError, OSError, ValueError):
        return repr(t)


def self_report_problems(series: Mapping[str, NodeSeries], copy_bytes: int, frame: TimeFrame | None,
                         extra_times: Mapping[str, float] | None = None) -> list[str]:
    """Pure: what is impossible in readers' self-reported series (a results volume, a job directory): a time
    outside ``frame`` (before the render or submission, or in the future), an interval ending before it starts
    or going back in time, a read longer than the job allows, more bytes than the copy holds, a reader that
    says it completed with another total than the copy's, or samples that do not add up to its total.
    ``extra_times`` are other self-reported instants (``go.json``'s start, a task's start) held to the frame."""
    out: list[str] = []
    lo = hi = None
    if frame is not None:
        lo, hi = frame.not_before_s - frame.slack_s, frame.not_after_s + frame.slack_s
    for what, t in sorted((extra_times or {}).items()):
        if lo is not None and t < lo:
            out.append(f"{what} {_utc(t)} is before the run could start ({_utc(frame.not_before_s)})")
        elif lo is not None and t > hi:
            out.append(f"{what} {_utc(t)} is after the run was collected ({_utc(frame.not_after_s)}): a time in the "
                       "future")
    for name in sorted(series):
        s = series[name]
        ivs = s.aligned()
        start = s.aligned_start_s
        back = next((i for i, iv in enumerate(ivs) if iv.end_s < iv.start_s
                     or (i and iv.start_s < ivs[i - 1].end_s - 1e-6)), None)
        if back is not None:
            out.append(f"{name}: sample {back + 1} ends before it starts or goes back in time")
        times = [t for t in ([start] if start is not None else []) + [x for iv in ivs for x in (iv.start_s, iv.end_s)]]
        if times and lo is not None:
            first, last = min(times), max(times)
            if first < lo:
                out.append(f"{name}: reports reading at {_utc(first)}, before the run could start "
                           f"({_utc(frame.not_before_s)})")
            if last > hi:
                out.append(f"{name}: reports reading at {_utc(last)}, after the run was collected "
                           f"({_utc(frame.not_after_s)}): a time in the future")
            if last - first > frame.max_duration_s + frame.slack_s:
                out.append(f"{name}: read for {last - first:.0f} s, longer than the job allows "
                           f"({frame.max_duration_s:.0f} s)")
        summed = sum(iv.nbytes for iv in s.intervals)
        total = s.total_bytes if s.total_bytes is not None else summed
        if copy_bytes > 0 and max(total, summed) > copy_bytes:
            out.append(f"{name}: reports {max(total, summed):.0f} bytes read, more than the copy holds "
                       f"({copy_bytes} bytes)")
        elif copy_bytes > 0 and s.completed and total != copy_bytes:
            out.append(f"{name}: says it completed but reports {total:.0f} bytes, not the copy's {copy_bytes}")
        if s.completed and summed != total:
            out.append(f"{name}: its samples add up to {summed:.0f} bytes, its end record says {total:.0f}")
    return out


def nodes_completed(series: Mapping[str, NodeSeries]) -> int:
    """How many nodes read everything they were asked to."""
    return sum(1 for s in series.values() if s.completed)


def nic_ceiling_ratio(aggregate_read_gb_s: float, line_rate_gbit_s: float) -> float:
    """Aggregate payload rate / the port's line rate (both converted to bytes/s)."""
    if line_rate_gbit_s <= 0:
        raise ValueError("line rate must be > 0")
    return aggregate_read_gb_s * GB / (line_rate_gbit_s * 1e9 / 8.0)


@dataclass(frozen=True)
class PortRate:
    """The port's ceiling and where each figure came from. ``measured_gbit_s`` is what the port's node reports of
    the port: the lower of the link speed the kernel gives in sysfs and a root tc tbf's rate (a shaper below the
    link is the port's ceiling: the test rig's port is a veth, nominally 10000 Mb/s, shaped with tbf). None when
    nothing was read (no session to the port's node: the declared rate stands alone). ``effective_gbit_s`` is
    min(declared, measured); ``mismatch`` says when the two differ beyond the stated tolerance (G3 is then
    INVALID: the port is not the one the inventory describes)."""

    declared_gbit_s: float
    sysfs_speed_gbit_s: float | None
    tbf_rate_gbit_s: float | None
    effective_gbit_s: float
    notes: tuple[str, ...] = field(default_factory=tuple)
    measured_gbit_s: float | None = None
    mismatch: str | None = None
    tolerance: float = 0.02

    @property
    def measured_by(self) -> str | None:
        """Which reading set the measured rate: ``tc tbf`` (a shaper), ``sysfs`` (the link speed) or None."""
        if self.measured_gbit_s is None:
            return None
        return "tc tbf" if self.tbf_rate_gbit_s is not None and self.measured_gbit_s == self.tbf_rate_gbit_s \
            else "sysfs"


DEFAULT_PORT_RATE_TOLERANCE = 0.02


def port_rate(declared_gbit_s: float, sysfs_gbit_s: float | None, tbf_gbit_s: float | None,
              tolerance: float = DEFAULT_PORT_RATE_TOLERANCE, notes: Sequence[str] = ()) -> PortRate:
    """Pure: the port's ceiling from the declared rate and the measured figures (sysfs link speed, root tbf
    rate; either may be None): measured = the lower of the two, effective = min(declared, measured), and a
    mismatch when declared and measured differ by more than ``tolerance`` (relative to the larger)."""
    notes = list(notes)
    known = [x for x in (sysfs_gbit_s, tbf_gbit_s) if x is not None and x > 0]
    measured = min(known) if known else None
    mismatch = None
    if measured is not None and not math.isclose(measured, declared_gbit_s, rel_tol=tolerance):
        mismatch = (f"declared {declared_gbit_s:g} Gbit/s but the port shows {measured:g} Gbit/s"
                    f" (sysfs {sysfs_gbit_s}, tbf {tbf_gbit_s}; tolerance {tolerance:g})")
        notes.append(mismatch)
    effective = min(declared_gbit_s, measured) if measured is not None else declared_gbit_s
    return PortRate(declared_gbit_s, sysfs_gbit_s, tbf_gbit_s, effective, tuple(notes), measured, mismatch,
                    tolerance)


def cross_check_port_rate(declared_gbit_s: float, sysfs_speed_text: str | None,
                          tc_qdisc_json: str | None, tolerance: float = DEFAULT_PORT_RATE_TOLERANCE) -> PortRate:
    """Cross-check the inventory's declared line rate with /sys/class/net/IF/speed (Mb/s) and any tc tbf
    (:func:`port_rate`: judged against min(declared, measured), a mismatch beyond ``tolerance`` named)."""
    notes = []
    sysfs = None
    if sysfs_speed_text is not None:
        try:
            mbit = int(sysfs_speed_text.strip())
            if mbit > 0:
                sysfs = mbit / 1000.0
            else:
                notes.append(f"sysfs speed reports {mbit} (unknown)")
        except ValueError:
            notes.append(f"sysfs speed unreadable: {sysfs_speed_text.strip()[:60]!r}")
    tbf = parse_tc_tbf_rate_gbit_s(tc_qdisc_json) if tc_qdisc_json else None
    return port_rate(declared_gbit_s, sysfs, tbf, tolerance, notes)


def parse_tc_tbf_rate_gbit_s(tc_qdisc_json: str) -> float | None:
    """Rate of the root tbf qdisc from `tc -j qdisc show dev IF` (bytes/s in JSON) in Gbit/s."""
    try:
        data = json.loads(tc_qdisc_json)
    except json.JSONDecodeError:
        return None
    for q in data if isinstance(data, list) else []:
        if q.get("kind") == "tbf" and q.get("root", False):
            rate = (q.get("options") or {}).get("rate")
            if isinstance(rate, (int, float)) and rate > 0:
                return rate * 8 / 1e9
    return None


# ----------------------------------------------------------------------------------------------
# parsers
# ----------------------------------------------------------------------------------------------

def parse_fio_bw_log(text: str, log_avg_msec: int, epoch_base_ms: float = 0.0,
                     source: str = "<fio bw log>") -> tuple[Interval, ...]:
    """Parse a fio `--write_bw_log` file written with `--log_avg_msec`.

    Each line is `time_ms, value, direction, block_size, offset[, priority]`; `value` is the average
    bandwidth in KiB/s over the `log_avg_msec` window ending at `time_ms`. With `--log_unix_epoch=1`
    times are Unix epoch ms (pass epoch_base_ms=0); otherwise they are ms since the job started (pass the
    job's start in epoch ms). fio does not log the last partial window, so the sum of the intervals is a
    little below the job's io_bytes.
    """
    if log_avg_msec <= 0:
        raise ValueError("parse_fio_bw_log needs the log_avg_msec the log was written with")
    out: list[Interval] = []
    prev_end = None
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 5:
            raise SeriesParseError(f"{source}:{lineno}: expected 5 or 6 comma-separated fields, got {len(parts)}")
        try:
            t_ms = float(parts[0])
            kib_s = float(parts[1])
            direction = int(parts[2])
        except ValueError:
            raise SeriesParseError(f"{source}:{lineno}: time/value/direction not numeric: {line.strip()[:80]!r}") from None
        if direction != 0:  # 0 read, 1 write, 2 trim
            continue
        end_s = (epoch_base_ms + t_ms) / 1000.0
        start_s = end_s - log_avg_msec / 1000.0
        if prev_end is not None:
            if end_s < prev_end:
                raise SeriesParseError(f"{source}:{lineno}: time goes backwards ({t_ms} ms)")
            start_s = max(start_s, prev_end)
        out.append(Interval(start_s, end_s, kib_s * 1024.0 * (end_s - start_s)))
        prev_end = end_s
    return tuple(out)


READER_SCHEMA = "kvgate-g3-reader/1"


@dataclass(frozen=True)
class ReaderOutput:
    """What kvgate's G3 reader printed (JSON lines): header, samples, and the end record if it got there."""

    header: dict
    series: NodeSeries
    end: dict | None
    errors: tuple[str, ...]
    truncated: bool  # the stream stopped without an end record (node died or was killed)
    armed: dict = field(default_factory=dict)  # the first armed record (O_DIRECT used or why not), else empty
    start: dict = field(default_factory=dict)  # the first start record (when reading began, its priority)


def parse_reader_output(text: str, node: str, clock_offset_s: float = 0.0,
                        source: str = "<reader output>") -> ReaderOutput:
    """Parse the reader's JSON-lines stream. Survives a stream cut mid-line (node killed): keeps what came."""
    header: dict = {}
    end: dict | None = None
    intervals: list[Interval] = []
    errors: list[str] = []
    started = None
    firsts: dict[str, dict] = {}
    lines = text.splitlines()
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            if lineno == len(lines):
                errors.append(f"{source}:{lineno}: last line cut off (stream ended mid-record)")
                continue
            raise SeriesParseError(f"{source}:{lineno}: not JSON: {line[:80]!r}") from None
        kind = rec.get("type")
        if isinstance(kind, str):
            firsts.setdefault(kind, rec)
        if kind == "header":
            if rec.get("schema") != READER_SCHEMA:
                raise SeriesParseError(f"{source}:{lineno}: schema {rec.get('schema')!r}, expected {READER_SCHEMA!r}")
            header = rec
        elif kind == "start":
            started = float(rec["t_s"])
        elif kind == "sample":
            try:
                intervals.append(Interval(float(rec["t0_s"]), float(rec["t1_s"]), float(rec["bytes"])))
            except (KeyError, TypeError, ValueError):
                raise SeriesParseError(f"{source}:{lineno}: sample needs t0_s, t1_s, bytes") from None
        elif kind == "error":
            errors.append(str(rec.get("message", "")))
        elif kind == "end":
            end = rec
    completed = bool(end and end.get("completed"))
    series = NodeSeries(
        node=node,
        intervals=tuple(intervals),
        clock_offset_s=clock_offset_s,
        started_at_s=started,
        completed=completed,
        total_bytes=float(end["bytes"]) if end and "bytes" in end else sum(iv.nbytes for iv in intervals),
    )
    return ReaderOutput(header=header, series=series, end=end, errors=tuple(errors), truncated=end is None,
                        armed=firsts.get("armed", {}), start=firsts.get("start", {}))
