"""Chart functions, JUnit mapping, offline re-evaluation and run comparison, on plain inputs."""

import json
import xml.etree.ElementTree as ET

import pytest

from harness.report import charts as rc
from harness.report.compare import compare_predicates, direction
from harness.report.junit import verdicts_to_junit
from harness.gates.reevaluate import reevaluate_bundle
from report_fixture import FIXED_ID, fixed_run, g1_only


def test_aggregate_series_sample_and_hold():
    series = {"a": [(1, 1.0), (2, 2.0), (3, 3.0)], "b": [(1.5, 10.0), (2.5, 20.0)]}
    # at 1: a=1; 1.5: a=1 + b=10; 2: 2+10; 2.5: 2+20; 3: a=3, b has ended (last sample 2.5)
    assert rc.aggregate_series(series) == [(1.0, 1.0), (1.5, 11.0), (2.0, 12.0), (2.5, 22.0), (3.0, 3.0)]
    assert rc.aggregate_series({}) == []


def test_percentile_and_ecdf():
    from harness.stats import percentile  # the one percentile: charts and TTFT statistics alike
    assert percentile([4, 1, 3, 2], 50) == 2.5
    assert percentile([4, 1, float("nan"), 3, 2], 50) == 2.5  # non-finite values are not samples
    with pytest.raises(ValueError):
        percentile([], 50)
    assert rc.ecdf([3, 1, 2]) == ([1.0, 2.0, 3.0], [1 / 3, 2 / 3, 1.0])


def test_stream_bars_lines_and_off_scale_reference():
    svg = rc.stream_bars_svg([("gpu0", 5.1), ("gpu1", 4.2)], pass_value=5.0, stop_value=3.0, reference_value=5.23)
    for gid in ("bar-gpu0", "bar-gpu1", "pass-line", "stop-loss-line", "reference-line"):
        assert f'id="{gid}"' in svg
    far = rc.stream_bars_svg([("s0", 0.3)], pass_value=0.1, reference_value=5.23)
    assert 'id="reference-line"' not in far and 'id="reference-note"' in far
    assert far == rc.stream_bars_svg([("s0", 0.3)], pass_value=0.1, reference_value=5.23)  # deterministic


def test_ttft_and_series_charts():
    svg = rc.ttft_distribution_svg([12.0, 11.5, 12.4], [0.9, 1.0], reference_p50_s=11.85)
    assert all(f'id="{g}"' in svg for g in ("ecdf-recompute", "ecdf-readback", "reference-line", "box-read-back"))
    only_rb = rc.ttft_distribution_svg([], [0.9, 1.0])
    assert 'id="ecdf-recompute"' not in only_rb and 'id="ecdf-readback"' in only_rb
    s = rc.node_series_svg({"n1": [(0, 1.0), (1, 1.2)], "n2": [(0, 1.1)]}, nic_line_rate_gb_s=12.5, pass_value=11)
    assert all(f'id="{g}"' in s for g in ("series-n1", "series-n2", "aggregate-line", "nic-ceiling-line", "pass-line"))


def _legend_texts(svg: str) -> int:
    legend = svg[svg.index('<g id="legend_1">'):]
    return legend.count('<g id="text_')


def test_the_series_legend_names_each_node_up_to_a_bound_then_counts_them():
    few = {f"n{i}": [(0, 1.0), (1, 1.1)] for i in range(1, rc.LEGEND_NODES + 1)}
    many = {f"n{i}": [(0, 1.0), (1, 1.1)] for i in range(1, rc.LEGEND_NODES + 2)}
    s_few, s_many = rc.node_series_svg(few, pass_value=11), rc.node_series_svg(many, pass_value=11)
    assert _legend_texts(s_few) == rc.LEGEND_NODES + 2  # every node, the aggregate, the pass line
    assert _legend_texts(s_many) == 1 + 2  # "33 nodes, one line each", the aggregate, the pass line
    assert all(f'id="series-{n}"' in s_many for n in many)  # every node's line is drawn and findable


def _v(gid, outcome):
    return {"gate_id": gid, "title": f"gate {gid}", "metric": "m", "pass_threshold": ">= 1 GB/s",
            "stop_loss_threshold": None, "actual": 0.5, "unit": "GB/s", "outcome": outcome, "reason": f"why {gid}"}


def test_junit_every_outcome():
    outcomes = ["PASS", "INFO", "FAIL", "STOP", "ERROR", "INVALID", "SKIPPED"]
    xml = verdicts_to_junit("KVG-1", {"name": "s", "version": 1}, [_v(f"G{i}", o) for i, o in enumerate(outcomes)], "STOP")
    suite = ET.fromstring(xml).find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped")) == ("7", "2", "2", "1")
    kinds = [[child.tag for child in tc if child.tag != "system-out"] for tc in suite.iter("testcase")]
    assert kinds == [[], [], ["failure"], ["failure"], ["error"], ["error"], ["skipped"]]
    assert suite.findall("testcase")[3].find("failure").get("type") == "STOP"


def test_reevaluation_reproduces_g1_from_raw_fio(tmp_path):
    run, pred = fixed_run(tmp_path)
    pred = g1_only(run, pred)
    re = reevaluate_bundle(run, pred)
    assert re.same, re.differences
    assert re.checks[0].source.startswith("raw output re-parsed")
    assert re.checks[0].reevaluated["outcome"] == "FAIL"


def test_reevaluation_says_what_differs(tmp_path):
    run, pred = fixed_run(tmp_path)
    pred = g1_only(run, pred)
    # a signed verdict that does not follow from its raw data
    pred["verdicts"][0].update(outcome="PASS", actual=0.9)
    pred["overall"] = "PASS"
    # and a result.json metric that disagrees with fio.json
    res_path = run / "gates" / "G1" / "result.json"
    res = json.loads(res_path.read_text())
    res["metrics"]["per_gpu_read_gb_s"] = 0.9
    res_path.write_text(json.dumps(res))
    re = reevaluate_bundle(run, pred)
    text = "\n".join(re.differences)
    assert "G1: outcome signed 'PASS', re-evaluated 'FAIL'" in text
    assert "measured per_gpu_read_gb_s signed 0.9, re-evaluated from raw data 0.28998" in text
    assert "overall signed PASS, re-evaluated FAIL" in text
    assert re.verdicts_for_render()[0]["outcome"] == "FAIL"


@pytest.mark.parametrize("old_validity", [None, {"cold": {"proven": True, "detail": "kv-read's older mapping"}}])
def test_an_older_bundle_without_the_validity_list_reevaluates_and_renders_not_recorded(tmp_path, old_validity):
    """A bundle an older kvgate wrote has no validity list (or kv-read's older mapping): its evidence is read back
    as recorded (RecordedEvidence), re-evaluated, and the re-rendered report says "not recorded", never crashes."""
    from harness.report.render import write_reports
    run, pred = fixed_run(tmp_path)
    pred = g1_only(run, pred)
    res_path = run / "gates" / "G1" / "result.json"
    res = json.loads(res_path.read_text())
    res["evidence"].pop("validity")
    if old_validity is not None:
        res["evidence"]["validity"] = old_validity
    res["metrics"]["per_gpu_read_gb_s"] = 0.9  # differs from fio.json: the re-evaluated verdict is the one rendered
    res_path.write_text(json.dumps(res))
    pred["verdicts"][0]["evidence"] = res["evidence"]
    re = reevaluate_bundle(run, pred)
    again = re.checks[0].reevaluated
    assert again["outcome"] == "FAIL" and again["evidence"] == res["evidence"]  # kept as recorded, no key added
    write_reports(FIXED_ID, run, {**pred, "verdicts": re.verdicts_for_render()}, tmp_path / "out")
    row = next(line for line in (tmp_path / "out" / "report.md").read_text().splitlines() if line.startswith("| G1 "))
    assert row.endswith("| not recorded |")
    assert "Evidence validity:" not in (tmp_path / "out" / "report.md").read_text()


def test_reevaluation_catches_lost_cold_proof(tmp_path):
    run, pred = fixed_run(tmp_path)
    pred = g1_only(run, pred)
    (run / "steps" / "004-n2-drop-caches" / "rc").write_text("1\n")
    import yaml

    gates = yaml.safe_load((run / "config" / "gates.yaml").read_text())
    gates["gates"][0]["params"]["direct"] = False  # without O_DIRECT, only a dropped page cache proves cold
    (run / "config" / "gates.yaml").write_text(yaml.safe_dump(gates))
    re = reevaluate_bundle(run, pred)
    assert re.checks[0].reevaluated["outcome"] == "INVALID"
    assert "not cold" in re.checks[0].reevaluated["reason"] and "n2" in re.checks[0].reevaluated["reason"]


def test_reevaluation_with_unknown_workload_reports_it(tmp_path):
    run, pred = fixed_run(tmp_path)
    re = reevaluate_bundle(run, pred)  # G2's workload is not part of this kvgate
    assert not re.same and "does not load" in re.differences[0] and "g2-ttft" in re.differences[0]


def test_compare_shared_metrics_and_direction():
    a = {"verdicts": [dict(_v("G1", "FAIL"), metric="per_gpu_read_gb_s", actual=4.0,
                           metrics={"per_gpu_read_gb_s": 4.0, "total_read_gb_s": 32.0, "only_a": 1.0}),
                      dict(_v("G2", "PASS"), metric="ttft_p50_s", pass_threshold="<= 2 s", actual=1.0,
                           metrics={"ttft_p50_s": 1.0})]}
    b = {"verdicts": [dict(_v("G1", "PASS"), metric="per_gpu_read_gb_s", actual=5.0,
                           metrics={"per_gpu_read_gb_s": 5.0, "total_read_gb_s": 30.0}),
                      dict(_v("G2", "PASS"), metric="ttft_p50_s", pass_threshold="<= 2 s", actual=1.5,
                           metrics={"ttft_p50_s": 1.5}),
                      _v("G3", "PASS")]}
    f = compare_predicates(a, b)
    rows = {(r.gate, r.metric): r for r in f.itertuples()}
    assert set(rows) == {("G1", "per_gpu_read_gb_s"), ("G1", "total_read_gb_s"), ("G2", "ttft_p50_s")}
    g1 = rows[("G1", "per_gpu_read_gb_s")]
    assert (g1.delta, g1.delta_pct, g1.change, g1.outcome_a, g1.outcome_b) == (1.0, 25.0, "better", "FAIL", "PASS")
    assert rows[("G1", "total_read_gb_s")].change == "worse"
    assert rows[("G2", "ttft_p50_s")].change == "worse"  # lower is better: "<=" pass threshold
    assert direction("foo", {"metric": "bar"}) is None


def test_g2_raw_request_records_feed_tables_chart_and_validity(tmp_path):
    """g2-ttft keeps per-request records in requests-<phase>.jsonl; failed requests have no TTFT."""
    from harness.report.render import gate_charts, gate_tables, validity

    def rec(rid, ttft, error=None):
        return json.dumps({"request_id": rid, "prompt_tokens": 100, "queue_s": 0.0, "ttft_s": ttft, "itl_s": [0.01],
                           "latency_s": None, "e2e_s": None, "output_chunks": 1, "output_text": "x",
                           "http_status": 200 if error is None else 500, "error": error}) + "\n"

    (tmp_path / "requests-recompute.jsonl").write_text("".join(rec(f"r{i}", 11.0 + i) for i in range(3)))
    (tmp_path / "requests-readback.jsonl").write_text(rec("b0", 0.9) + rec("b1", None, "HTTP 500"))
    v = {"gate_id": "G2", "metric": "readback_speedup_p50", "unit": "x",
         "evidence": {"readback_hit_tokens": 0.0, "readback_query_tokens": 1000.0,
                      "readback_device_read_bytes": 5_000_000, "page_cache_dropped": False}}
    t = gate_tables(v, tmp_path)
    assert len(t["requests"]) == 5 and "output_text" not in t["requests"].columns
    assert t["ttft"].groupby("mode").ttft_s.apply(list).to_dict() == {"readback": [0.9], "recompute": [11.0, 12.0, 13.0]}
    assert 'id="ecdf-readback"' in gate_charts(v, tmp_path)["ttft"][1]
    assert validity(v) == []  # validity is the evaluator's (evaluate_g2), never guessed from these keys


def test_request_logs_that_are_not_regular_files_draw_nothing_and_do_not_hang(tmp_path):
    """A FIFO named like a request log would block a plain read forever; the report skips it."""
    import os
    from harness.report.render import request_records
    (tmp_path / "requests-recompute.jsonl").write_text('{"ttft_s": 1.0}\n\n')
    os.mkfifo(tmp_path / "requests-readback.jsonl")
    recs = request_records(tmp_path)
    assert recs == {"recompute": [{"ttft_s": 1.0}]}


@pytest.mark.parametrize("line, why", [
    ("[" * 100_000 + "]" * 100_000, "nested deeper than 64 levels"),  # a RecursionError in json.loads before
    ('{"ttft_s": 1.0, "ttft_s": 2.0}', "duplicate key"),
    ("not json", "invalid JSON"),
    ("[1, 2]", "expected a JSON object per line"),
])
def test_a_request_log_line_that_is_not_a_json_object_is_one_line_naming_file_and_line(tmp_path, line, why):
    from harness.report.render import request_records
    from harness.safeio import InputFileError
    gate = tmp_path / "G2"
    gate.mkdir()
    (gate / "requests-readback.jsonl").write_text('{"ttft_s": 1.0}\n' + line + "\n")
    with pytest.raises(InputFileError) as e:
        request_records(gate)
    msg = str(e.value)
    assert msg.startswith("gates/G2/requests-readback.jsonl:2: ") and why in msg and "\n" not in msg
    assert len(msg) < 300
