"""A g2-faults gate's timeline: the pure time line of its recorded requests and faults
(harness.workloads.g2_faults.faults_timeline) and the chart the report draws from the gate's evidence alone
(harness.report.faults_section), on the verdict captured from the shipped cpu-reference gate on the rig
(gates/g2-faults-cpu-reference.yaml: a pool-path-loss stall, then a pool-unmount whose requests were re-computed)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from harness.report.faults_section import faults_charts
from harness.report.render import write_reports
from harness.workloads.g2_faults import EngineFaultRecord, FaultedRequest, G2FaultsEvidence, faults_timeline
from report_fixture import add_gate, fixed_run

CAPTURED = Path(__file__).resolve().parents[1] / "fixtures" / "g2" / "g2_faults_verdict_cpu_reference.json"
RID = "KVG-20261202-" + "cd" * 32
GATE = "G2-F1-pool-faults"


def captured() -> dict:
    return json.loads(CAPTURED.read_text())


def ids(svg: str) -> set[str]:
    return set(re.findall(r'id="([^"]+)"', svg))


def req(i, t0, t1, served, ttft=0.1, hit=None):
    return FaultedRequest(index=i, request_id=f"r{i}", t_start_s=t0, t_end_s=t1,
                          ttft_s=None if served == "failed" else ttft,
                          hit_tokens=hit if hit is not None else (512 if served == "tier" else 0),
                          expected_hit_tokens=512, served=served, window="before",
                          error="HTTP 500" if served == "failed" else None)


def fault(i, apply, undo, kind="pool-path-loss", undone_ok=True):
    return EngineFaultRecord(index=i, kind=kind, detail=kind, applied_ok=apply is not None, undone_ok=undone_ok,
                             t_apply_s=apply, t_undo_s=undo)


# ------------------------------------------------------------------------------------------ the pure time line


def test_the_captured_runs_time_line_places_the_stall_and_the_fall_backs_in_their_fault_windows():
    ev = G2FaultsEvidence.model_validate(captured()["evidence"])
    tl = faults_timeline(ev.requests, ev.faults)
    assert [p.index for p in tl.points] == list(range(12))  # every request, in send order
    assert [(w.index, w.kind, w.t_apply_s, w.t_undo_s) for w in tl.windows] == [
        (0, "pool-path-loss", 2.001, 5.016), (1, "pool-unmount", 7.009, 10.046)]
    loss, unmount = tl.windows
    # the path lost: one request sent inside the window waited out the outage, then was served from the tier
    (stalled,) = [p for p in tl.points if loss.t_apply_s <= p.t_sent_s <= loss.t_undo_s]
    assert stalled.served == "tier" and stalled.wait_s == stalled.ttft_s > 0.5 * (loss.t_undo_s - loss.t_apply_s)
    assert stalled.tier_tokens == stalled.expected_tier_tokens == 512
    # the pool detached: the requests sent inside it were re-computed, no token of theirs read from the tier
    inside = [p for p in tl.points if unmount.t_apply_s <= p.t_sent_s <= unmount.t_undo_s]
    assert [p.served for p in inside] == ["re-compute"] * 3 and all(p.tier_tokens == 0 for p in inside)
    assert sum(p.served == "tier" for p in tl.points) == 9
    assert tl.t_end_s == max(p.t_end_s for p in tl.points) == 11.127


def test_a_failed_request_waits_until_its_error_and_unplaceable_records_are_left_off():
    reqs = [req(2, 5.0, 5.5, "tier", hit=float("nan")), req(0, 0.0, 0.1, "tier"), req(1, 2.5, 4.0, "failed"),
            req(3, float("nan"), 6.0, "tier")]
    faults = [fault(1, None, None), fault(0, 2.0, None, undone_ok=False)]
    tl = faults_timeline(reqs, faults)
    assert [p.index for p in tl.points] == [0, 1, 2]  # send order; a request with no finite send time is off
    failed = tl.points[1]
    assert failed.served == "failed" and failed.ttft_s is None and failed.wait_s == pytest.approx(1.5)
    assert tl.points[2].tier_tokens is None  # a counter that is not a number: no bar, not a zero
    # a fault never made is not on the line; one whose inverse did not return runs to the line's end
    assert [(w.index, w.t_undo_s, w.undone_ok) for w in tl.windows] == [(0, None, False)]
    assert tl.t_end_s == 5.5
    assert faults_timeline([], []).t_end_s == 0.0 and faults_timeline([], []).points == ()


# ------------------------------------------------------------------------------------------ the chart


def test_the_chart_marks_each_source_each_fault_and_its_inverse():
    (kind, (caption, svg)), = faults_charts(captured(), "g2-faults").items()
    assert kind == "timeline" and "pool device's read rate is not sampled" in caption
    got = ids(svg)
    assert {"ttft-tier", "ttft-re-compute", "fault-window-0", "fault-window-1", "fault-made-0", "fault-made-1",
            "fault-undone-0", "fault-undone-1", "stored-tokens"} <= got
    assert "ttft-failed" not in got  # no request failed in this run: no marker claims one
    assert {f"tier-tokens-re-compute-{i}" for i in (7, 8, 9)} <= got and "tier-tokens-tier-2" in got
    assert "served from the tier (9)" in svg and "re-computed (fell back) (3)" in svg
    assert "fault 0 (pool-path-loss) made 2.001 s" in svg and "fault 1 undone 10.046 s" in svg
    assert faults_charts(captured(), "g2-faults")["timeline"][1] == svg  # deterministic: the same bytes on every render
    assert "<dc:date>" not in svg


def test_a_failed_request_and_a_fault_left_in_place_are_drawn():
    v = captured()
    ev = v["evidence"]
    ev["requests"][8].update(served="failed", ttft_s=None, error="HTTP 500", answer_matches=None)
    ev["faults"][1].update(t_undo_s=None, undone_ok=False)
    svg = faults_charts(v, "g2-faults")["timeline"][1]
    assert {"ttft-failed", "fault-window-1", "fault-made-1"} <= ids(svg) and "fault-undone-1" not in ids(svg)
    assert "failed (time until its error) (1)" in svg


@pytest.mark.parametrize("evidence", [
    {},  # no evidence
    {"requests": [], "faults": [], "recovery_bound_s": 10},  # nothing on the line
    {"requests": [{"index": "x"}], "faults": [], "recovery_bound_s": 10},  # not g2-faults' records
    {"faults": [{"index": 0, "kind": "path-down"}], "series": {}},  # a G1 fault gate (fio-faults): its own chart
    {"requests": [], "faults": [], "recovery_bound_s": 10, "streams": []},  # a key g2-faults never writes
])
def test_a_gate_that_is_not_g2_faults_gets_no_timeline(evidence):
    assert faults_charts({"gate_id": "X", "evidence": evidence}, "g2-faults") == {}


def test_the_report_of_a_g2_faults_gate_holds_the_timeline_drawn_from_the_bundle(tmp_path):
    run, pred = fixed_run(tmp_path)
    add_gate(run, GATE, "g2-faults")
    pred["verdicts"].append(captured())
    files = write_reports(RID, run, pred, tmp_path / "out")
    svg = f"charts/{GATE}-timeline.svg"
    assert svg in files
    assert ids((tmp_path / "out" / svg).read_text()) >= {"ttft-tier", "ttft-re-compute", "fault-window-0"}
    html = (tmp_path / "out" / "report.html").read_text()
    assert f'id="chart-{GATE}-timeline"' in html and 'id="fault-made-1"' in html  # the SVG inlined
    assert f"]({svg})" in (tmp_path / "out" / "report.md").read_text()
    # the other gates' charts are as before: no timeline of theirs
    assert [f for f in files if f.endswith("-timeline.svg")] == [svg]
    # re-rendered from the same bundle files: byte for byte the same chart
    write_reports(RID, run, pred, tmp_path / "again")
    assert (tmp_path / "again" / svg).read_bytes() == (tmp_path / "out" / svg).read_bytes()
