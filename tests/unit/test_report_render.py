"""report.md snapshot of a fixed bundle, and what the rendered files must hold (tables, charts, JUnit, IDs)."""

import io
import json
import os
import re
import xml.etree.ElementTree as ET

import pandas as pd
import pytest

from harness.report.bundle import verify_bundle, write_bundle
from harness.report.render import render_bundle_reports, threshold_in, validity, validity_text, write_reports
from report_fixture import FIXED, FIXED_ID, fixed_run

SNAPSHOT = FIXED / "report.md.snap"


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fixed")
    run, pred = fixed_run(tmp)
    files = render_bundle_reports(FIXED_ID, run, pred)
    return run, pred, files


def test_report_md_snapshot(rendered):
    run, _, _ = rendered
    text = (run / "report.md").read_text()
    if os.environ.get("KVGATE_UPDATE_SNAPSHOTS") == "1":
        SNAPSHOT.write_text(text)
    assert text == SNAPSHOT.read_text(), "report.md changed; if intended, rerun with KVGATE_UPDATE_SNAPSHOTS=1"


def test_rendered_files_and_report_id(rendered):
    run, _, files = rendered
    assert files == sorted([
        "REPORT_ID", "report.md", "report.html", "junit.xml", "tables/verdicts.csv", "tables/G1-streams.csv",
        "tables/G1-jobs.csv", "tables/G2-ttft.csv", "tables/G3-series.csv", "charts/G1-streams.svg",
        "charts/G2-ttft.svg", "charts/G3-series.svg"])
    for f in ("report.md", "report.html", "junit.xml", "REPORT_ID"):
        assert FIXED_ID in (run / f).read_text(), f


def test_html_is_self_contained_with_table_and_every_chart(rendered):
    run, _, _ = rendered
    html = (run / "report.html").read_text()
    assert not re.search(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", html), "no network references"
    assert "<script" not in html and "<link" not in html
    assert html.count("<svg") == 3
    for chart in ("chart-G1-streams", "chart-G2-ttft", "chart-G3-series"):
        assert f'id="{chart}"' in html
    for gid in ('id="pass-line"', 'id="stop-loss-line"', 'id="ecdf-recompute"', 'id="ecdf-readback"',
                'id="aggregate-line"', 'id="nic-ceiling-line"'):
        assert gid in html
    row = re.search(r'<tr id="verdict-G1">(.*?)</tr>', html, re.S).group(1)
    assert "FAIL" in row and "0.29 GB/s" in row and "5.23 GB/s" in row and "cold proven" in row


def test_csv_tables_hold_every_series(rendered):
    run, pred, _ = rendered
    streams = pd.read_csv(run / "tables" / "G1-streams.csv")
    assert list(streams[["node", "label"]].itertuples(index=False, name=None)) == [
        ("n1", "gpu0"), ("n1", "gpu1"), ("n2", "gpu0"), ("n2", "gpu1")]
    assert streams.read_gb_s.min() == pytest.approx(pred["verdicts"][0]["actual"])
    jobs = pd.read_csv(run / "tables" / "G1-jobs.csv")
    assert len(jobs) == 6  # n1 grouped: 2 entries; n2 ungrouped: 4 jobs
    assert jobs[jobs.node == "n2"].read_gb_s.sum() == pytest.approx(0.289980444 + 0.805077602)
    ttft = pd.read_csv(run / "tables" / "G2-ttft.csv")
    ev2 = pred["verdicts"][1]["evidence"]
    assert ttft[ttft["mode"] == "readback"].ttft_s.tolist() == pytest.approx(ev2["ttft_readback_s"])
    series = pd.read_csv(run / "tables" / "G3-series.csv")
    assert series.groupby("node").size().to_dict() == {f"n{k}": 10 for k in range(1, 9)}
    verdicts = pd.read_csv(run / "tables" / "verdicts.csv")
    assert verdicts.outcome.tolist() == ["FAIL", "PASS", "PASS"]


def test_junit_maps_outcomes(rendered):
    run, _, _ = rendered
    root = ET.parse(run / "junit.xml").getroot()
    suite = root.find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped")) == ("3", "1", "0", "0")
    cases = {c.get("name").split()[0]: c for c in suite.iter("testcase")}
    assert cases["G1"].find("failure").get("type") == "FAIL"
    assert cases["G2"].find("failure") is None and cases["G2"].get("time") == "300.000"
    props = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert props["report_id"] == FIXED_ID and props["overall"] == "FAIL"


def test_rendering_is_deterministic(tmp_path, rendered):
    run, pred, files = rendered
    again = write_reports(FIXED_ID, run, pred, tmp_path / "again")
    assert again == files
    for f in files:
        assert (tmp_path / "again" / f).read_bytes() == (run / f).read_bytes(), f


def test_bundle_signs_the_rendered_reports(tmp_path):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    run, pred = fixed_run(tmp_path)
    key = Ed25519PrivateKey.generate()
    info = write_bundle(run, tmp_path / "out", key, pred, make_tar=False,
                        render=lambda rid, d: render_bundle_reports(rid, d, pred))
    res = verify_bundle(info.path, public_key=key.public_key())
    assert res.ok, res.error
    assert set(res.statement["predicate"]["rendered_files"]) >= {"report.html", "report.md", "junit.xml",
                                                                  "charts/G1-streams.svg", "tables/G3-series.csv"}
    assert f"# kvgate acceptance report {info.report_id}" in (info.path / "report.md").read_text()
    (info.path / "charts" / "G1-streams.svg").write_text("<svg/>")
    assert "charts/G1-streams.svg" in verify_bundle(info.path, public_key=key.public_key()).error


def test_validity_is_what_the_evaluator_recorded_and_nothing_else():
    check = {"name": "data", "ok": True, "claim": "what was read equals what was written",
             "how": "a pattern written on one path, read back on the other", "figure": "bytes compared",
             "value": 2097152.0, "unit": "B"}
    assert validity({"evidence": {"validity": [check]}}) == [
        {"name": "data", "proven": True, "detail": "what was read equals what was written. Checked: a pattern "
                                                   "written on one path, read back on the other; bytes compared: "
                                                   "2.0 MiB (2097152 bytes)"}]
    # the shapes the report used to guess from say nothing now: an older bundle reads "not recorded"
    for ev in ({"direct": False, "nodes": {"a": {"page_cache_dropped": True}, "b": {"page_cache_dropped": False}}},
               {"hits_proven": False, "hits_detail": "3/24 hit"},
               {"nodes": {"a": {"direct_used": True}}},
               {"readback_hit_tokens": 0.0, "readback_query_tokens": 1000.0, "readback_device_read_bytes": 5},
               {"validity": {"cold": {"proven": True, "detail": "kv-read's older mapping"}}},
               {}):
        assert validity({"evidence": ev}) == [] and validity_text(validity({"evidence": ev})) == "not recorded"


def test_a_bundle_without_validity_renders_not_recorded_per_gate(tmp_path):
    """A bundle an older kvgate wrote (no validity list on any gate) renders, each gate saying "not recorded"."""
    run, pred = fixed_run(tmp_path)
    for v in pred["verdicts"]:
        v["evidence"].pop("validity", None)
    write_reports(FIXED_ID, run, pred, tmp_path / "out")
    md = (tmp_path / "out" / "report.md").read_text()
    rows = [line for line in md.splitlines() if re.match(r"\| G\d ", line)]
    assert len(rows) == 3 and all(row.endswith("| not recorded |") for row in rows)
    html = (tmp_path / "out" / "report.html").read_text()
    assert html.count('<span class="unknown">not recorded</span>') == 3


def test_threshold_in_converts_units():
    assert threshold_in(">= 100 MB/s", "GB/s") == pytest.approx(0.1)
    assert threshold_in("< 2 x", "GB/s") is None
    assert threshold_in(None, "GB/s") is None


def test_a_gate_that_priced_its_writes_gets_a_row_in_the_endurance_table_md_html_and_csv(tmp_path):
    """The fixed bundle's G2 with an endurance record (as g2-ttft writes it): the report's table, in both views, and
    tables/endurance.csv with the numbers; a bundle without any (the snapshot above) has no such section."""
    from harness.endurance import DriveRating, endurance
    run, pred = fixed_run(tmp_path)
    g2 = next(v for v in pred["verdicts"] if v["gate_id"] == "G2")
    g2.setdefault("evidence", {})["endurance"] = endurance(
        2_000_000_000, 4_000_000, 1_600_000_000, 100.0, DriveRating(3_840_000_000_000, 1.0)).to_dict()
    render_bundle_reports(FIXED_ID, run, pred)
    md, html = (run / "report.md").read_text(), (run / "report.html").read_text()
    assert "## What serving cost the drives" in md
    assert "| G2 | 2,000,000,000 B | 0.500 GB | 1.25 x | 0.0200 GB/s | 3.84 TB, 1 DWPD | 0.45 | 4,056 | — |" in md
    assert '<section id="endurance">' in html and "<td>3.84 TB, 1 DWPD</td>" in html
    csv = pd.read_csv(run / "tables" / "endurance.csv")
    assert list(csv["gate"]) == ["G2"] and csv["write_amplification"][0] == pytest.approx(1.25)
    assert "What serving cost the drives" not in SNAPSHOT.read_text()
