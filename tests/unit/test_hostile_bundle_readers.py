"""What a reader takes from a signed bundle cannot break it: a predicate of the wrong shape is one line naming
the bundle and the field (exit 2), and text quoted from a bundle into Markdown or HTML stays text.

The bundles here are signed by kvgate's own writer (a hostile signer needs nothing else): the fixed report run
(tests/fixtures/reports/) with one field changed before signing."""

from __future__ import annotations

import re

import jinja2
import pytest

from harness.report import render
from harness.report.predicate import check_predicate
from harness.safeio import InputFileError
from report_fixture import FIXED_ID, fixed_run

HOSTILE = ("PASS | forged | cell\n\n# G1: PASS\n`code` <script>alert(1)</script> <img src=x onerror=alert(1)> "
           "[click](javascript:alert(1)) ![x](https://evil.example/x.png) \\| ]: /evil")


def _lines_of_table(md: str, header: str) -> list[str]:
    lines = md.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    out = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        out.append(line)
    return out


def _cells(row: str) -> int:
    """Cells of a GFM table row: pipes that are not escaped."""
    return len(re.findall(r"(?<!\\)\|", row)) - 1


@pytest.fixture
def hostile(tmp_path):
    run, pred = fixed_run(tmp_path)
    g1 = pred["verdicts"][0]
    g1["reason"] = HOSTILE
    g1["title"] = HOSTILE
    g1["unit"] = "GB/s<script>"
    g1["reference"] = {"value": HOSTILE, "source": HOSTILE, "note": HOSTILE}
    pred["suite"]["name"] = HOSTILE
    pred["suite"]["description"] = HOSTILE
    pred["kvgate"]["version"] = HOSTILE
    pred["rerender_notice"] = HOSTILE
    snap = run / "nodes" / "n1" / "snapshot.json"
    snap.write_text(snap.read_text().replace('"kernel": "', '"kernel": "' + HOSTILE.replace("\n", "\\n")
                                             .replace('"', "'").replace("\\|", "|") + " "))
    r = render.build(FIXED_ID, run, pred)
    return r


def test_markdown_quotes_bundle_text_inert(hostile):
    md = render.render_markdown_view(hostile)
    gates = _lines_of_table(md, "| Gate | Title |")
    assert len(gates) == 2 + 3 and all(_cells(row) == 9 for row in gates), gates  # no cell or row injected
    for bad in ("<script", "<img", "](javascript:", "![x](", "`code`"):  # none of these unescaped
        assert not re.search(r"(?<!\\)" + re.escape(bad), md), bad
    assert "\n# G1: PASS" not in md
    assert "\\<script>alert(1)\\</script>" in md and "\\[click\\](javascript:alert(1))" in md
    # the reason paragraph starts a line: its "# G1: PASS" (after the newlines became spaces) is no heading
    assert not any(line.startswith(("# G1", "#G1")) for line in md.splitlines())
    assert "\nPASS \\| forged \\| cell  # G1: PASS" in md


def test_html_report_autoescapes_bundle_text(hostile):
    html = render.render_html_view(hostile)
    for bad in ("<script", "<img", 'href="javascript:'):
        assert bad not in html.lower(), bad
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    env = render._env(True)
    assert env.autoescape is True or (callable(env.autoescape) and env.autoescape("report.html.j2"))


def test_library_page_autoescapes():
    from harness.report.library import render_index
    entry = {"report_id": "KVG-20260101-0123abcd", "content_sha256": "0" * 64, "archive": "bundles/x.tar.gz",
             "status": "failed", "reason": HOSTILE, "signers": [], "cited_by": []}
    page = render_index([entry], [], "2026-01-01T00:00:00Z")
    assert "<script>alert" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page


@pytest.mark.parametrize("field, value, expect", [
    ("gate_id", ["G1"], "predicate.verdicts[0].gate_id: expected a gate ID string, got an array"),
    ("gate_id", None, "predicate.verdicts[0].gate_id: expected a gate ID string, got null"),
    ("gate_id", "../../x", "predicate.verdicts[0].gate_id: '../../x' is not a gate ID"),
    ("actual", "5.2", "predicate.verdicts[0].actual: expected a number or null, got a string"),
    ("actual", 10 ** 400, "predicate.verdicts[0].actual: expected a number or null, got a number too large"),
    ("outcome", "PASSED", "predicate.verdicts[0].outcome: 'PASSED' is not an outcome"),
    ("metrics", {"x": None}, "predicate.verdicts[0].metrics.x: expected a number, got null"),
    ("metric_units", {"x": 5}, "predicate.verdicts[0].metric_units.x: expected a unit string, got a number"),
    ("metric_units", ["B"], "predicate.verdicts[0].metric_units: expected an object or null, got an array"),
    ("reference", {"value": 5}, "predicate.verdicts[0].reference.value: expected a string or null, got a number"),
    ("evidence", [], "predicate.verdicts[0].evidence: expected an object or null, got an array"),
])
def test_a_verdict_of_the_wrong_shape_is_one_line_naming_the_field(field, value, expect):
    _, pred = fixed_run_pred()
    pred["verdicts"][0][field] = value
    with pytest.raises(InputFileError) as e:
        check_predicate(pred, "KVG-x/attestation.dsse.json payload")
    assert str(e.value).startswith("KVG-x/attestation.dsse.json payload: " + expect)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("mutate, expect", [
    (lambda p: p["suite"].update(name=5), "predicate.suite.name: expected a string or null, got a number"),
    (lambda p: p.update(suite=["x"]), "predicate.suite: expected an object or null, got an array"),
    (lambda p: p.update(verdicts={"G1": {}}), "predicate.verdicts: expected an array of verdicts, got an object"),
    (lambda p: p.update(verdicts=[p["verdicts"][0], p["verdicts"][0]]), "predicate.verdicts[1].gate_id: G1 has two"),
    (lambda p: p.update(created_utc="2026-13-01T00:00:00Z"), "predicate.created_utc: '2026-13-01T00:00:00Z' is not"),
    (lambda p: p.update(overall=None) or p.update(overall=["PASS"]), "predicate.overall: expected an outcome"),
    (lambda p: p["kvgate"].update(commit=12), "predicate.kvgate.commit: expected a string or null, got a number"),
    (lambda p: p.update(input_report_ids=[1]), "predicate.input_report_ids[0]: expected a string, got a number"),
])
def test_a_predicate_of_the_wrong_shape_is_one_line(mutate, expect):
    _, pred = fixed_run_pred()
    mutate(pred)
    with pytest.raises(InputFileError, match=re.escape(expect)):
        check_predicate(pred, "P")


def test_the_predicates_kvgate_writes_pass_the_check():
    _, pred = fixed_run_pred()
    check_predicate(pred, "P")
    check_predicate({"kind": "kvgate-cost/v1", "input_report_ids": ["KVG-20260101-0123abcd"], "model": "m",
                     "measured_inputs": [], "timing": {}, "created_utc": "2026-01-01T00:00:00Z"}, "P")


def fixed_run_pred():
    import copy
    import json
    from report_fixture import FIXED
    return None, copy.deepcopy(json.loads((FIXED / "predicate.json").read_text()))


def test_odd_evidence_leaves_read_as_unknown_not_a_crash():
    v = {"gate_id": "G2", "metric": "m", "outcome": "PASS",
         "evidence": {"validity": [{"name": "cold", "ok": ["x"]}, "x", {"name": "data", "ok": True, "claim": "c",
                                                                           "how": "h", "value": "many", "unit": 5}]}}
    assert [(i["name"], i["proven"]) for i in render.validity(v)] == [("cold", None), ("?", None), ("data", None)]
    assert render.validity_text(render.validity(v)) == "cold unknown; ? unknown; data unknown"
    v["evidence"] = {"validity": {"cold": {"proven": ["x"]}}, "x_proven": {"a": 1}}
    assert render.validity(v) == []
    v["evidence"] = {"nodes": {"n1": {"nvmeof": {"managed": ["yes"], "paths": "p"}}}}
    assert render.nvmeof_rows(v)[0]["managed"] is False
    v["evidence"] = {"streams": [{"node": "n1", "label": "g", "read_gb_s": float("inf")}]}
    assert render.chart_inputs(v).streams == [] and render.gate_charts(v) == {}


# --------------------------------------------------------------------------- the command line, in-process


@pytest.fixture
def key(tmp_path):
    from harness.report.bundle import generate_keypair
    return generate_keypair(tmp_path / "keys" / "signer")


def _one_line_refusal(r, code: int, *needles: str) -> None:
    assert r.raised is None, f"{type(r.raised).__name__}: {r.raised}"
    assert r.rc == code, (r.rc, r.out, r.err)
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.err, r.err
    for n in needles:
        assert n in lines[0], lines[0]


def test_report_refuses_a_signed_list_gate_id_in_one_line(tmp_path, key):
    from hostile_fixture import kvgate_inproc, sign_run
    b = sign_run(tmp_path, key[0], pred_edit=lambda p: p["verdicts"][0].update(gate_id=["G1"]))
    r = kvgate_inproc("report", b.path, "--pubkey", key[1], "--out", tmp_path / "out")
    _one_line_refusal(r, 2, f"{b.path}: attestation.dsse.json payload: predicate.verdicts[0].gate_id")
    assert not (tmp_path / "out").exists()  # nothing rendered from it


def test_report_refuses_a_deeply_nested_request_log_line_naming_file_and_line(tmp_path, key):
    from hostile_fixture import kvgate_inproc, sign_run

    def deep(run):
        (run / "gates" / "G1" / "requests-readback.jsonl").write_text('{"ttft_s": 1}\n' + "[" * 50_000 + "]" * 50_000)
    b = sign_run(tmp_path, key[0], run_edit=deep)
    r = kvgate_inproc("report", b.path, "--pubkey", key[1], "--out", tmp_path / "out")
    _one_line_refusal(r, 2, "gates/G1/requests-readback.jsonl:2: nested deeper than 64 levels")


def test_compare_refuses_a_null_gate_id_in_one_line(tmp_path, key):
    from hostile_fixture import kvgate_inproc, sign_run
    good = sign_run(tmp_path, key[0], name="good")
    bad = sign_run(tmp_path, key[0], name="bad", pred_edit=lambda p: p["verdicts"][0].update(gate_id=None))
    r = kvgate_inproc("compare", good.path, bad.path, "--pubkey", key[1])
    _one_line_refusal(r, 2, f"{bad.path}: attestation.dsse.json payload: predicate.verdicts[0].gate_id: expected a "
                            "gate ID string, got null")


def test_library_build_lists_a_misshapen_bundle_as_failed_and_goes_on(tmp_path, key):
    """Suite names of mixed types made the trend charts' sort raise TypeError; a list gate_id made the page's
    gate index raise. Each such bundle is a failed row; the others are published."""
    import json
    import shutil
    from hostile_fixture import kvgate_inproc, sign_run
    bundles = tmp_path / "bundles"
    good = sign_run(tmp_path, key[0], name="good", created_utc="2026-01-03T00:00:00Z")
    num = sign_run(tmp_path, key[0], name="num", pred_edit=lambda p: p["suite"].update(name=5))
    lst = sign_run(tmp_path, key[0], name="lst", created_utc="2026-01-04T00:00:00Z",
                   pred_edit=lambda p: p["verdicts"][0].update(gate_id=["G1"]))
    for b in (good, num, lst):
        shutil.copytree(b.path, bundles / b.report_id)
    r = kvgate_inproc("library", "build", bundles, "--pubkey", key[1], "--out", tmp_path / "site")
    assert r.raised is None, f"{type(r.raised).__name__}: {r.raised}"
    assert r.rc in (0, 1) and "Traceback" not in r.err, (r.rc, r.out, r.err)
    lib = {e["report_id"]: e for e in json.loads((tmp_path / "site" / "library.json").read_text())["bundles"]}
    assert lib[good.report_id]["status"] == "verified"
    assert lib[num.report_id]["status"] == "failed"
    assert lib[num.report_id]["reason"] == ("attestation.dsse.json payload: predicate.suite.name: expected a string "
                                            "or null, got a number")
    assert lib[lst.report_id]["status"] == "failed" and "predicate.verdicts[0].gate_id" in lib[lst.report_id]["reason"]
    # kvgate's own render is published for the verified bundle only; every bundle is there as its archive
    assert (tmp_path / "site" / "reports" / good.report_id / "report.html").is_file()
    assert not (tmp_path / "site" / "reports" / num.report_id).exists()
    assert not (tmp_path / "site" / "reports" / lst.report_id).exists()


def test_compare_markdown_escapes_metric_names_and_notes():
    import copy
    from harness.report.compare import compare_predicates, outcome_changes, render_markdown
    _, a = fixed_run_pred()
    a["verdicts"][0]["metrics"]["x | <script>alert(1)</script> [l](javascript:alert(1))"] = 1.0
    b = copy.deepcopy(a)
    frame = compare_predicates(a, b)
    md = render_markdown("KVG-a", "KVG-b", frame, outcome_changes(a, b), ["KVG-x`<img src=x>` is NOT verified\n# h"])
    assert not re.search(r"(?<!\\)(<script|<img|\]\(javascript)", md), md
    row = next(line for line in md.splitlines() if "alert" in line and line.startswith("|"))
    assert _cells(row) == 7
    assert "\n# h" not in md
