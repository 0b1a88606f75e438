"""kvgate report and the library as a user runs them on a bundle whose signer's HTML lies (issue 21): a signed
report.html that shows PASS over FAIL evidence verifies (its signer signed it), but it is not what kvgate
renders from the verified files, so `kvgate report` answers no (exit 1, naming the file) and the library
links only kvgate's own render. Also: a hostile evidence key never writes outside --out."""

from __future__ import annotations

from pathlib import Path

import pytest

from evidence_fixture import clock_at
from harness.report.bundle import generate_keypair, load_private_key, write_bundle
from harness.report.keyring import keyring_from_pubkeys
from harness.report.library import build_library, check_library
from harness.report.render import render_bundle_reports
from kvgate_cli import kvgate
from report_fixture import fixed_run, g1_only

pytestmark = pytest.mark.e2e


def _bundle(tmp: Path, key: Path, name: str, lie: bool = False, mutate=None) -> Path:
    """The fixed run's G1 (fio-read, re-evaluable) signed as a run signs it; with ``lie`` the signer's render
    hook turns every FAIL of report.html into PASS after kvgate rendered it."""
    run, pred = fixed_run(tmp / name)
    pred = g1_only(run, pred)
    if mutate:
        mutate(pred)

    def render(rid, d):
        files = render_bundle_reports(rid, d, pred)
        if lie:
            html = d / "report.html"
            html.write_text(html.read_text().replace("FAIL", "PASS"))
        return files

    return write_bundle(run, tmp / name / "out", load_private_key(key), pred, make_tar=False, render=render,
                        clock=clock_at("2026-03-01T10:00:00Z")).path


@pytest.fixture(scope="module")
def signer(tmp_path_factory):
    return generate_keypair(tmp_path_factory.mktemp("keys") / "signer")


def test_an_honest_bundle_reports_identical_renders(tmp_path, signer):
    b = _bundle(tmp_path, signer[0], "honest")
    r = kvgate("report", b, "--pubkey", signer[1], "--out", tmp_path / "rr")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "signed reports: IDENTICAL" in r.stdout and "verdicts: SAME as signed (overall FAIL)" in r.stdout


def test_a_signed_html_that_differs_from_the_render_is_a_negative_answer(tmp_path, signer):
    b = _bundle(tmp_path, signer[0], "lying", lie=True)
    assert "PASS" in (b / "report.html").read_text() and "FAIL" not in (b / "report.html").read_text()
    out = tmp_path / "rr"
    r = kvgate("report", b, "--pubkey", signer[1], "--out", out)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "signed reports: DIFFER from kvgate's render of the verified files: report.html " in r.stdout
    assert "verdicts: SAME as signed (overall FAIL)" in r.stdout
    assert "FAIL" in (out / "report.html").read_text()  # the re-render shows the evidence's outcome


def test_the_library_links_only_kvgates_render(tmp_path, signer):
    b = _bundle(tmp_path, signer[0], "lying", lie=True)
    site = tmp_path / "site"
    res = build_library([b.parent], site, keyring_from_pubkeys([signer[1]]), built_utc="2026-07-01T00:00:00Z")
    (e,) = res.entries
    assert e["status"] == "verified" and e["signed_render_differs"] == ["report.html"]
    linked = site / e["report_html"]
    assert linked.is_relative_to(site / "reports") and "FAIL" in linked.read_text()
    assert not any(p.name == "report.html" and "FAIL" not in p.read_text() for p in site.rglob("report.html"))
    page = (site / "index.html").read_text()
    assert "signed report differs from kvgate's render of its files (report.html)" in page
    assert check_library(site, keyring_from_pubkeys([signer[1]])).ok


def test_a_hostile_evidence_key_writes_nothing_outside_out(tmp_path, signer):
    """The signed predicate's evidence key ``x/../../../../escaped`` named tables/G1-x/../../../../escaped.csv."""
    def hostile(pred):
        pred["verdicts"][0]["evidence"]["x/../../../../escaped"] = [{"node": "n1", "read_gb_s": 1.0}]

    b = _bundle(tmp_path, signer[0], "hostile", mutate=hostile)
    out = tmp_path / "a" / "b" / "c" / "rr"
    r = kvgate("report", b, "--pubkey", signer[1], "--out", out)
    assert r.returncode == 0, r.stdout + r.stderr
    assert [p for p in tmp_path.rglob("escaped*.csv") if not p.resolve().is_relative_to(out.resolve())
            and not p.resolve().is_relative_to(b.resolve())] == []
    assert len(list((out / "tables").glob("G1-x_.._.._.._.._escaped-*.csv"))) == 1


def test_a_signed_cost_report_is_shown_only_sandboxed(tmp_path, signer):
    """kvgate cannot re-render a cost bundle in the library: its signed report.html (here with a script and a
    remote image) appears only escaped inside a sandboxed frame of kvgate's own page, never as a page itself."""
    run = tmp_path / "cost-run"
    (run / "tables").mkdir(parents=True)
    (run / "tables" / "results.csv").write_text("output,value,unit\nnet_usd_per_month,1,USD/month\n")
    evil = '<html><body><script>alert(document.domain)</script><img src="https://example.com/t.png">{rid}</body></html>'

    def render(rid, d):
        (d / "report.html").write_text(evil.format(rid=rid))
        return ["report.html"]

    pred = {"kind": "kvgate-cost/v1", "input_report_ids": [], "model": "m"}
    b = write_bundle(run, tmp_path / "out", load_private_key(signer[0]), pred, make_tar=False, render=render,
                     clock=clock_at("2026-03-02T10:00:00Z")).path
    site = tmp_path / "site"
    res = build_library([b.parent], site, keyring_from_pubkeys([signer[1]]), built_utc="2026-07-01T00:00:00Z")
    (e,) = res.entries
    assert e["status"] == "verified" and e["report_shown"] == "signed render, sandboxed"
    page = (site / e["report_html"]).read_text()
    assert '<iframe sandbox="" ' in page and "<script" not in page and 'src="https:' not in page
    assert "&lt;script&gt;alert(document.domain)&lt;/script&gt;" in page
    assert "default-src 'none'" in page
    assert not [p for p in site.rglob("*") if p.is_file() and "<script>alert" in p.read_text(errors="replace")]
    assert check_library(site, keyring_from_pubkeys([signer[1]])).ok
