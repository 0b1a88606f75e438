"""Pure G3 functions: alignment with clock offsets, the common window, aggregate, fairness, parsers."""

import json
from pathlib import Path

import pytest

from harness.execute.clock import estimate_clock_offset
from harness.parsers.g3series import (
    Interval, NodeSeries, SeriesParseError, aggregate, bytes_in_window, common_window, cross_check_port_rate,
    fairness_min_max, nic_ceiling_ratio, nodes_completed, parse_fio_bw_log, parse_reader_output,
    parse_tc_tbf_rate_gbit_s, rate_series, start_skew_s,
)

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "fio_bwlog"


def steady(node, start, end, rate_bytes_s, step=1.0, offset=0.0, completed=True):
    """A series at a constant rate in the node's own clock (node clock = ref clock + offset)."""
    ivs, t = [], start
    while t < end - 1e-9:
        t1 = min(t + step, end)
        ivs.append(Interval(t + offset, t1 + offset, rate_bytes_s * (t1 - t)))
        t = t1
    return NodeSeries(node, tuple(ivs), clock_offset_s=offset, started_at_s=start + offset, completed=completed)


def test_offsets_are_removed_before_the_window_is_taken():
    # Same real reading span [100, 110] on the reference clock; node clocks off by +5 s and -3 s.
    a = steady("a", 100, 110, 1e9, offset=5.0)
    b = steady("b", 100, 110, 1e9, offset=-3.0)
    agg = aggregate({"a": a, "b": b})
    assert agg.window_start_s == pytest.approx(100)
    assert agg.window_end_s == pytest.approx(110)
    assert agg.aggregate_read_gb_s == pytest.approx(2.0)
    assert start_skew_s({"a": a, "b": b}) == pytest.approx(0.0, abs=1e-9)
    # Without the offsets the spans would barely overlap (102..107): the alignment is what makes it 10 s.
    raw = {n: NodeSeries(n, s.intervals) for n, s in {"a": a, "b": b}.items()}
    assert aggregate(raw).window_s == pytest.approx(2.0)


def test_late_starter_shrinks_the_window_and_is_not_credited_for_solo_time():
    a = steady("a", 0, 10, 2e9)           # alone for the first 4 s
    b = steady("b", 4, 10, 1e9)
    agg = aggregate({"a": a, "b": b})
    assert (agg.window_start_s, agg.window_end_s) == (pytest.approx(4), pytest.approx(10))
    assert agg.aggregate_read_gb_s == pytest.approx(3.0)
    # Sum of whole-run averages would be 2.0 + 1.0 = 3.0 too here, so check a case where it differs:
    c = steady("c", 0, 4, 4e9).intervals + steady("c", 4, 10, 1e9).intervals
    agg2 = aggregate({"c": NodeSeries("c", c), "b": b})
    assert agg2.aggregate_read_gb_s == pytest.approx(2.0)   # both at 1 GB/s while both read
    avg_c = (16e9 + 6e9) / 10 / 1e9
    assert avg_c + 1.0 != pytest.approx(agg2.aggregate_read_gb_s)
    assert start_skew_s({"a": a, "b": b}) == pytest.approx(4.0)


def test_gap_inside_the_window_counts_as_zero():
    a = steady("a", 0, 10, 1e9)
    b_ivs = steady("b", 0, 4, 1e9).intervals + steady("b", 6, 10, 1e9).intervals  # silent 4..6
    agg = aggregate({"a": a, "b": NodeSeries("b", b_ivs)})
    assert agg.window_s == pytest.approx(10)
    assert agg.per_node_read_gb_s["b"] == pytest.approx(0.8)
    assert agg.aggregate_read_gb_s == pytest.approx(1.8)
    assert agg.fairness_min_max == pytest.approx(0.8)


def test_partial_intervals_are_prorated_at_window_edges():
    ivs = [Interval(0, 1, 100), Interval(1, 2, 300)]
    assert bytes_in_window(ivs, 0.5, 1.5) == pytest.approx(50 + 150)
    assert bytes_in_window(ivs, 5, 6) == 0


def test_no_overlap_and_silent_node_give_a_reason_not_a_number():
    a = steady("a", 0, 5, 1e9)
    b = steady("b", 6, 9, 1e9)
    agg = aggregate({"a": a, "b": b})
    assert agg.aggregate_read_gb_s is None and "do not overlap" in agg.reason
    silent = NodeSeries("c", (Interval(0, 1, 0),))
    agg = aggregate({"a": a, "c": silent})
    assert agg.aggregate_read_gb_s is None and "no data from c" in agg.reason
    assert common_window({}) is None


def test_short_window_is_flagged():
    agg = aggregate({"a": steady("a", 0, 0.5, 1e9, step=0.1)}, min_window_s=1.0)
    assert agg.aggregate_read_gb_s is None and "shorter than the minimum" in agg.reason
    assert agg.window_s == pytest.approx(0.5)


def test_fairness_and_completion():
    assert fairness_min_max({"a": 1.0, "b": 0.5, "c": 0.8}) == pytest.approx(0.5)
    assert fairness_min_max({}) is None
    assert fairness_min_max({"a": 0.0}) == 0.0
    s = {"a": steady("a", 0, 1, 1), "b": steady("b", 0, 1, 1, completed=False)}
    assert nodes_completed(s) == 1


def test_nic_ceiling_ratio_converts_bits_to_bytes():
    assert nic_ceiling_ratio(12.5, 100) == pytest.approx(1.0)
    assert nic_ceiling_ratio(0.119, 1.0) == pytest.approx(0.952)
    with pytest.raises(ValueError):
        nic_ceiling_ratio(1.0, 0)


def test_clock_offset_uses_the_fastest_round_trip():
    # true offset +2.0 s; the slow sample's midpoint is off by its asymmetric delay.
    samples = [(10.0, 12.0 + 0.002, 10.004), (20.0, 22.0 + 0.090, 20.100), (30.0, 32.0 + 0.001, 30.002)]
    off = estimate_clock_offset(samples)
    assert off.offset_s == pytest.approx(2.0, abs=off.uncertainty_s)
    assert off.rtt_s == pytest.approx(0.002)
    with pytest.raises(ValueError):
        estimate_clock_offset([(5.0, 1.0, 4.0)])


def test_port_rate_cross_check_reads_sysfs_and_tbf():
    tc = json.dumps([{"kind": "tbf", "handle": "8001:", "root": True, "refcnt": 3,
                      "options": {"rate": 125000000, "burst": 262125, "lat": 50000}}])
    assert parse_tc_tbf_rate_gbit_s(tc) == pytest.approx(1.0)
    pr = cross_check_port_rate(1.0, "10000\n", tc)
    assert pr.sysfs_speed_gbit_s == 10.0 and pr.tbf_rate_gbit_s == pytest.approx(1.0)
    assert pr.notes == ()
    pr = cross_check_port_rate(100.0, "25000", None)
    assert "declared 100 Gbit/s but the port shows 25 Gbit/s" in pr.notes[0]
    assert "unknown" in cross_check_port_rate(1.0, "-1", None).notes[0]


# ---- fio bandwidth logs (captured) -------------------------------------------------------------

def fio_summary(folder):
    rows = [l.split() for l in (FIX / folder / "fio_json_summary.txt").read_text().splitlines() if l.strip()]
    return rows


def test_fio_log_bytes_match_fio_json_within_the_unlogged_tail():
    for folder, avg in (("rig8_shaped", 250), ("local_2jobs", 100)):
        logs = sorted((FIX / folder).glob("*_bw.*.log"))
        rows = fio_summary(folder)
        assert len(logs) == len(rows)
        for log, row in zip(logs, rows):
            io_bytes, runtime_ms = int(row[1]), int(row[3])
            ivs = parse_fio_bw_log(log.read_text(), avg, source=str(log))
            logged = sum(iv.nbytes for iv in ivs)
            # fio does not log the last partial window: at most one window (+ the first ramp) is missing.
            bw = int(row[2])
            assert io_bytes - 2 * bw * avg / 1000 <= logged <= io_bytes * 1.01, log.name
            span = ivs[-1].end_s - ivs[0].start_s
            assert span <= runtime_ms / 1000 + avg / 1000


def test_fio_relative_times_need_the_epoch_base():
    text = (FIX / "relative_time" / "rel_bw.1.log").read_text()
    ivs = parse_fio_bw_log(text, 50, epoch_base_ms=1_700_000_000_000)
    assert ivs[0].end_s == pytest.approx(1_700_000_000.143)
    # Rate capped at 100 MiB/s: every logged window reports about that.
    for iv in ivs:
        assert iv.nbytes / (iv.end_s - iv.start_s) == pytest.approx(100 * 2**20, rel=0.05)


def test_rig_fio_logs_aggregate_near_the_shaped_port():
    series = {}
    for log in sorted((FIX / "rig8_shaped").glob("*.log")):
        node = log.name.split("_")[0]
        series[node] = NodeSeries(node, parse_fio_bw_log(log.read_text(), 250, source=log.name))
    agg = aggregate(series)
    # The 8 readers shared a 1 Gbit/s tbf: while all read, the sum is near 125 MB/s and never above it.
    assert 0.85 * 0.125 <= agg.aggregate_read_gb_s <= 1.02 * 0.125
    assert agg.window_s > 2.0
    # Starts were sequential ssh calls: the skew shows it.
    assert start_skew_s(series) > 0.3


def test_fio_log_errors_name_file_and_line():
    with pytest.raises(SeriesParseError, match=r"x.log:2: expected 5 or 6"):
        parse_fio_bw_log("100, 5, 0, 0, 0\n200, 5\n", 100, source="x.log")
    with pytest.raises(SeriesParseError, match=r"x.log:2: time goes backwards"):
        parse_fio_bw_log("300, 5, 0, 0, 0\n200, 5, 0, 0, 0\n", 100, source="x.log")
    # write samples are skipped
    assert parse_fio_bw_log("100, 5, 1, 0, 0\n", 100) == ()


# ---- kvgate reader output ---------------------------------------------------------------------

def reader_lines(cut=False):
    recs = [
        {"type": "header", "schema": "kvgate-g3-reader/1", "node": "n1"},
        {"type": "armed", "t_s": 9.5, "files": 2, "bytes_expected": 300, "direct_used": True},
        {"type": "start", "t_s": 10.0, "go_s": 10.0},
        {"type": "sample", "t0_s": 10.0, "t1_s": 10.1, "bytes": 100},
        {"type": "sample", "t0_s": 10.1, "t1_s": 10.2, "bytes": 200},
        {"type": "end", "t_s": 10.2, "bytes": 300, "completed": True, "files_done": 2},
    ]
    text = "\n".join(json.dumps(r) for r in recs) + "\n"
    if cut:
        text = "\n".join(json.dumps(r) for r in recs[:4]) + '\n{"type": "sam'
    return text


def test_reader_output_complete_and_cut():
    out = parse_reader_output(reader_lines(), "n1", clock_offset_s=0.5)
    assert out.series.completed and not out.truncated
    assert out.series.aligned_start_s == pytest.approx(9.5)
    assert sum(iv.nbytes for iv in out.series.intervals) == 300
    cut = parse_reader_output(reader_lines(cut=True), "n1")
    assert cut.truncated and not cut.series.completed
    assert len(cut.series.intervals) == 1 and "cut off" in cut.errors[0]


def test_reader_output_rejects_foreign_schema():
    with pytest.raises(SeriesParseError, match="out.jsonl:1: schema"):
        parse_reader_output('{"type": "header", "schema": "other/9"}\n', "n1", source="out.jsonl")


def test_rate_series_is_each_nodes_rate_per_interval_from_the_common_start():
    a = steady("a", 100, 103, 2e9, offset=5.0)   # 2 GB/s, node clock 5 s ahead
    b = steady("b", 101, 103, 1e9, offset=-3.0)  # starts 1 s later, 1 GB/s
    s = rate_series({"a": a, "b": b})
    assert s["a"] == [(0.0, 2.0), (1.0, 2.0), (2.0, 2.0)]
    assert s["b"] == [(1.0, 1.0), (2.0, 1.0)]
    assert rate_series({"a": a}, t0_s=99.0)["a"][0] == (1.0, 2.0)


def test_g3_evidence_carries_the_series_and_line_rate_the_report_draws(tmp_path):
    from harness.execute.fanout import FailurePolicy
    from harness.parsers.g3series import PortRate
    from harness.report.render import gate_charts
    from harness.workloads.g3_shared_read import G3Evidence, evaluate_g3

    series = {n: steady(n, 100, 110, 0.5e9) for n in ("n1", "n2")}
    ev = G3Evidence(readers=["n1", "n2"], nodes={n: {"direct_used": True} for n in series})
    res = evaluate_g3(ev, series, PortRate(8.0, None, None, 8.0), FailurePolicy(), 1.0, 0.0, 100.0)
    assert res.metrics["aggregate_read_gb_s"] == pytest.approx(1.0)
    assert res.metrics["nic_ceiling_ratio"] == pytest.approx(1.0)  # 8 Gbit/s = 1 GB/s
    assert res.evidence.nic_line_rate_gb_s == 1.0 and len(res.evidence.series["n1"]) == 10
    verdict = {"gate_id": "G3", "metric": "aggregate_read_gb_s", "unit": "GB/s", "pass_threshold": ">= 0.9 GB/s",
               "evidence": res.evidence_dict()}
    caption, svg = gate_charts(verdict)["series"]
    assert all(f'id="{g}"' in svg for g in ("series-n1", "series-n2", "aggregate-line", "nic-ceiling-line"))
    # the evaluator says what the aggregate rests on; the report shows exactly that
    checks = {c.name: c for c in res.evidence.validity}
    assert all(c.ok for c in checks.values()) and checks["cold"].how == "n1: O_DIRECT; n2: O_DIRECT"
    assert (checks["nodes"].value, checks["common window"].unit) == (2, "s")


def test_g3_reader_without_o_direct_or_a_dropped_cache_is_invalid_and_its_validity_says_which():
    from harness.execute.fanout import FailurePolicy
    from harness.parsers.g3series import PortRate
    from harness.report.render import validity
    from harness.workloads.kit.base import CacheDrop
    from harness.workloads.g3_shared_read import G3Evidence, evaluate_g3

    series = {n: steady(n, 100, 110, 0.5e9) for n in ("n1", "n2")}
    ev = G3Evidence(readers=["n1", "n2"], nodes={"n1": {"direct_used": False}, "n2": {"direct_used": False}},
                    page_cache_dropped={"n1": CacheDrop(dropped=True), "n2": CacheDrop(dropped=False, error="EPERM")})
    res = evaluate_g3(ev, series, PortRate(8.0, None, None, 8.0), FailurePolicy(), 1.0, 0.0, 100.0)
    assert res.invalid_reason == "not cold: no O_DIRECT and the page cache was not dropped on n2"
    cold = next(c for c in res.evidence.validity if c.name == "cold")
    assert not cold.ok and cold.how == "n1: page cache dropped; n2: NEITHER O_DIRECT NOR a dropped page cache"
    shown = validity({"evidence": res.evidence_dict()})
    assert [(c["name"], c["proven"]) for c in shown] == [("nodes", True), ("common window", True), ("cold", False),
                                                         ("port rate", True), ("within line rate", True)]
    # the records stay the JSON the readers know: page_cache_dropped.<node>.dropped, nodes.<node>.direct_used
    d = res.evidence_dict()
    assert d["page_cache_dropped"]["n2"] == {"dropped": False, "error": "EPERM"} and d["nodes"]["n1"]["direct_used"] is False
