"""A g2-load gate in the report: its charts, the accounting table (HTML and Markdown), every request in one CSV,
and its llm-d Benchmark Reports inside the signed bundle, checked by llm-d's own package."""

import json
import shutil
import time

import pandas as pd
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

import llmd_benchmark_report.core as br  # the test extra installs it (pyproject.toml)
from harness.parsers.poolloop import EvictWindow
from harness.engines.client import RequestRecord
from harness.engines.load import LoadRecord, load_point
from harness.gates.verdict import Outcome, Verdict
from harness.report.bundle import verify_bundle, write_bundle
from harness.report.render import _env, bundle_renderer, render_bundle_reports, signed_render_differences, write_reports
from harness.safeio import InputFileError
from harness.stats import percentile
from harness.workloads.kit.load import G2LoadEvidence, PointTrial, evaluate_load, point_invalid, token_accounting
from report_fixture import add_gate, fixed_run
from test_load_charts import vertices

RID = "KVG-20261201-" + "ab" * 32
FORMAT = _env(False).globals  # the formatters the report's templates are given


def size_text(n: float) -> str:
    """Bytes as the load section prints them: the report's byte formatter, else its formatter with a unit."""
    return FORMAT["fmt_bytes"](n) if "fmt_bytes" in FORMAT else FORMAT["fmt"](n, "B")


def rate_text(gb_s: float) -> str:
    return FORMAT["fmt_bytes"](gb_s * 1e9) + "/s" if "fmt_bytes" in FORMAT else FORMAT["fmt"](gb_s * 1000, "MB/s")
LADDER = [("r1", 1.0), ("r2", 2.0), ("r4", 4.0)]
SLO_S = 0.5
KV_BYTES_PER_TOKEN = 1024
PROMPT = 512
START_UNIX_S = 1_764_600_000.0
MAX_FAILED_SHARE = 0.2  # the gate lets a point fail 1 request in 5 (r4, trial 3 fails 1 of 8)


def records(label: str, rate: float, trial: int) -> list[LoadRecord]:
    """Eight requests sent on schedule at ``rate``: TTFT grows with the load (p95 past the SLO at 4 req/s)."""
    out = []
    for j in range(8):
        ttft = 0.04 * rate * rate + 0.01 * j + 0.002 * trial
        itl = (0.01,) * 3
        err = "HTTP 503: overloaded" if (label, trial, j) == ("r4", 3, 7) or label == "r8" else None
        lat = None if err else ttft + sum(itl)
        rec = RequestRecord(f"{label}-t{trial}-{j}", PROMPT, 0.0, None if err else ttft, () if err else itl, lat,
                            None if err else lat + 0.001, 0 if err else 4, "", 503 if err else 200, err)
        due = j / rate
        out.append(LoadRecord(due, due + 0.0002, rec))
    return out


def point(label: str, rate: float, trial: int, read_fraction: float = 0.9) -> tuple[PointTrial, list[LoadRecord]]:
    recs = records(label, rate, trial)
    fig = load_point(recs, SLO_S)
    ok = [r for r in recs if r.record.ok]
    prompt = PROMPT * len(ok)
    memory, tier = prompt // 4, prompt // 2  # a quarter from the engine's memory, half from the tier
    read = int(tier * KV_BYTES_PER_TOKEN * read_fraction)
    acc = token_accounting(prompt, float(prompt), float(memory), float(tier), KV_BYTES_PER_TOKEN, read,
                           3_000_000 * trial, fig.duration_s)
    pt = PointTrial(label=label, load=rate, load_kind="rate_rps", trial=trial, seed=7, requests=len(recs),
                    requests_file=f"requests-{label}-t{trial}.jsonl", started_unix_s=START_UNIX_S + 100 * trial,
                    figures=fig, accounting=acc,
                    invalid_reason=point_invalid(fig, acc, 0.001, 0.5, device_reads=True,
                                                 max_failed_share=MAX_FAILED_SHARE))
    return pt, recs


def load_run(tmp_path, bad_point: str | None = None, ladder=LADDER, spoil: bool | str = False):
    """The fixed run with a g2-load gate G2L added: a 3-point open-loop ladder x 3 trials, its requests files in
    gates/G2L/, its verdict from g2-load's own evaluator. ``bad_point``: that point reads 0.1 of its tier hits.
    ``spoil``: the first point's first attempt was spoiled by the client (sent 0.3 s late) and repeated; "cold": by
    the cold regime instead (sent on time, 3 reads before the evictor had dropped their store)."""
    run, pred = fixed_run(tmp_path)
    add_gate(run, "G2L", "g2-load")
    gate = run / "gates" / "G2L"
    gate.mkdir()
    points, by_file, spoiled = [], {}, []
    for trial in (1, 2, 3):
        for label, rate in ladder:
            pt, recs = point(label, rate, trial, 0.1 if label == bad_point else 0.9)
            if spoil and not points:
                late = [LoadRecord(r.due_s, r.due_s + (0.3 if spoil is True else 0.0), r.record) for r in recs]
                cold = EvictWindow(name=f"{label}-t{trial}", made_unix_s=1.0, seen_unix_s=9.0, breaches=3,
                                   first_breach="/pool/a/model.layers.0.safetensors") if spoil == "cold" else None
                spoiled.append(pt.model_copy(update={"figures": load_point(late, SLO_S), "cold": cold}))
                (gate / pt.requests_file).write_text("".join(json.dumps(r.to_dict()) + "\n" for r in late))
                pt = pt.model_copy(update={"attempt": 1, "requests_file": f"requests-{label}-t{trial}-a1.jsonl"})
            points.append(pt)
            by_file[pt.requests_file] = recs
            (gate / pt.requests_file).write_text("".join(json.dumps(r.to_dict()) + "\n" for r in recs))
    ev = G2LoadEvidence(engine="vllm", engine_version="0.11.0+cpu", engine_profile="vllm-cpu-prefix", load_kind="open",
                        loads=[r for _, r in ladder], burstiness=1.0, trials=3, requests_per_point=8,
                        ttft_slo_s=SLO_S, knee_percentile=95, max_client_lag_p99_s=0.001, min_read_fraction=0.5,
                        max_failed_share=MAX_FAILED_SHARE,
                        kv_bytes_per_token=KV_BYTES_PER_TOKEN, repeat_spoiled=2 if spoil else 0, spoiled=spoiled,
                        client_priority="nice -5 while sending (the thread's own: 0)" if spoil else None)
    result = evaluate_load(points, "open", SLO_S, 95, ev)
    (gate / "result.json").write_text(json.dumps(result.as_dict()))
    knee = result.metrics["knee_rate_rps"]
    outcome = Outcome.INVALID if result.invalid_reason else Outcome.PASS
    verdict = Verdict("G2L", "G2 under load", "knee_rate_rps", ">= 2 /s", None, knee, "/s", outcome,
                      result.invalid_reason or f"{knee:g} /s meets pass >= 2 /s", evidence=result.evidence_dict(),
                      metrics=result.metrics).to_dict()
    pred["verdicts"].append(verdict)
    return run, pred, result, by_file


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("load")
    run, pred, result, by_file = load_run(tmp)
    files = write_reports(RID, run, pred, tmp / "out")
    return tmp / "out", files, result, by_file


def test_a_load_gate_gets_its_charts_tables_and_one_llmd_report_per_point_and_trial(rendered):
    out, files, _, _ = rendered
    for f in ("charts/G2L-load-ttft.svg", "charts/G2L-load-throughput.svg", "charts/G2L-load-cdf.svg",
              "tables/G2L-requests.csv", "tables/G2L-accounting.csv", "tables/G2L-figures.csv"):
        assert f in files, f
    assert sorted(f for f in files if f.startswith("llmd/")) == sorted(
        f"llmd/G2L-{label}-t{t}.json" for label, _ in LADDER for t in (1, 2, 3))
    # the other gates render as before: nothing of theirs is a load gate's
    assert not any(f.startswith(("charts/G1-load", "tables/G2-accounting", "llmd/G1", "llmd/G2-")) for f in files)


def test_the_knee_and_the_slo_are_drawn_where_the_ladder_says(rendered):
    out, _, result, _ = rendered
    assert result.metrics["knee_rate_rps"] == 2.0  # p95 within 0.5 s at 2 req/s, past it at 4
    svg = (out / "charts" / "G2L-load-ttft.svg").read_text()
    p95 = vertices(svg, "ttft-p95")
    assert len(p95) == 3 and vertices(svg, "knee-line")[0][0] == pytest.approx(p95[1][0])
    assert 'id="slo-line"' in svg and 'id="band-p99"' in svg
    html = (out / "report.html").read_text()
    for kind in ("load-ttft", "load-throughput", "load-cdf"):
        assert f'id="chart-G2L-{kind}"' in html
    cdf = (out / "charts" / "G2L-load-cdf.svg").read_text()
    assert all(f'id="cdf-{label}_{rate:g}_req_s_"' in cdf for label, rate in LADDER)
    assert 'id="offered-line"' in (out / "charts" / "G2L-load-throughput.svg").read_text()


def test_every_request_of_every_point_in_one_csv(rendered):
    out, _, _, by_file = rendered
    t = pd.read_csv(out / "tables" / "G2L-requests.csv")
    assert list(t.columns) == ["point", "load", "trial", "request_id", "due_s", "sent_s", "lag_s", "ttft_s", "e2e_s",
                               "prompt_tokens", "output_tokens", "ok", "error"]
    assert len(t) == sum(len(r) for r in by_file.values()) == 72
    assert t.lag_s.to_numpy() == pytest.approx((t.sent_s - t.due_s).to_numpy())
    failed = t[~t.ok]
    assert failed.request_id.tolist() == ["r4-t3-7"] and failed.error.tolist() == ["HTTP 503: overloaded"]
    one = t[(t.point == "r2") & (t.trial == 2)]
    src = by_file["requests-r2-t2.jsonl"]
    assert one.ttft_s.tolist() == pytest.approx([r.record.ttft_s for r in src])


def test_the_accounting_table_in_html_markdown_and_csv_with_readable_units(rendered):
    out, _, result, _ = rendered
    acc = pd.read_csv(out / "tables" / "G2L-accounting.csv")
    assert len(acc) == 9
    row = acc[(acc.point == "r1") & (acc.trial == 2)].iloc[0]
    assert row.prompt_tokens == 4096 and row.memory_hit_share == 0.25 and row.tier_hit_share == 0.5
    assert row.recomputed_tokens == 1024 and row.device_read_bytes == int(2048 * 1024 * 0.9)
    assert row.read_fraction == pytest.approx(0.9)
    html = (out / "report.html").read_text()
    table = html[html.index('<table class="accounting">'):]
    table = table[:table.index("</table>")]
    # r1, trial 2: 4,096 prompt tokens, 1,024 (25.0 %) from memory, 2,048 (50.0 %) from the tier, 1887436 bytes
    # read of 2097152 expected (0.900), 6 MB written at 840 kB/s; sizes and rates as the report's formatter says them
    acc2 = result.evidence.points[3].accounting  # r1, trial 2
    read, expected = size_text(1887436), size_text(2097152)
    written, store = size_text(6_000_000), rate_text(acc2.store_write_gb_s)
    assert acc2.device_read_bytes == 1887436 and acc2.tier_hit_kv_bytes == 2097152
    assert "4,096" in table and "1,024 (25.0 %)" in table and "2,048 (50.0 %)" in table
    assert read in table and expected in table and "0.900" in table and written in table and store in table
    md = (out / "report.md").read_text()
    assert (f"| r1 | 2 | 4,096 | 1,024 (25.0 %) | 2,048 (50.0 %) | 1,024 (25.0 %) | {read} | {expected} | 0.900 "
            f"| {written} | {store} |") in md
    # the knee over trials, with its interval, in both
    assert "Knee" in md and "**2 req/s**" in md and "<strong>2 req/s</strong>" in html
    p95 = result.evidence.summary[1].figures["ttft_p95_s"]
    fmt = FORMAT["fmt"]
    # 3 trials give no 95 % interval for the median: the median, and the words saying so
    assert not p95.has_interval and f"{fmt(p95.median, 's')} (3 trials, no interval)" in md
    assert "3 trials, no interval" in html
    lag = fmt(0.2, "ms")  # 0.2 ms: every request left 0.2 ms after it was due
    assert "| r2 | 2 req/s | 24 / 24 / 0 |" in md and f"| {lag} (3 trials, no interval) | 0 |" in md  # none INVALID
    assert "| r4 | 4 req/s | 24 / 23 / 1 |" in md  # the failed request counted, over its 3 trials
    assert "<td class=\"num\">24 / 23 / 1</td>" in html


def test_the_gates_metrics_are_one_long_table_not_a_list_of_hundreds(rendered):
    out, _, result, _ = rendered
    fig = pd.read_csv(out / "tables" / "G2L-figures.csv")
    assert list(fig.columns) == ["point", "load", "figure", "median", "ci_low", "ci_high", "trials"]
    for _, row in fig.iterrows():
        name = row.figure if pd.isna(row.point) else f"{row.figure}@{row.point}"
        assert result.metrics[name] == pytest.approx(row["median"]), name
        iv = result.intervals[name]  # typed beside the metric; at most 3 trials: no bounds (empty cells)
        assert pd.isna(row.ci_low) and pd.isna(row.ci_high) and iv.ci_low is None and row.trials == iv.trials
        # a trial whose percentile fell on its failed request (r4, trial 3) gave no figure: a failed trial
        tails = {f"{f}@r4" for f in ("ttft_p90_s", "ttft_p95_s", "ttft_p99_s", "e2e_p99_s")}  # 1 of 8 infinite
        assert iv.asked == 3 and iv.trials == (2 if name in tails else 3), name
    assert len(fig) == len(result.metrics) == len(result.intervals)  # every metric a median with its interval
    md = (out / "report.md").read_text()
    assert "`ttft_p95_s@r2`" not in md and "| `" in md  # the load gate lists none; the others keep theirs


def test_an_invalid_point_names_its_reason_in_the_accounting_table(tmp_path):
    run, pred, result, _ = load_run(tmp_path, bad_point="r2")
    assert result.invalid_reason and "read fraction 0.1000" in result.invalid_reason
    write_reports(RID, run, pred, tmp_path / "out")
    md = (tmp_path / "out" / "report.md").read_text()
    rows = [line for line in md.splitlines() if line.startswith("| r2 |") and "%)" in line]  # accounting rows
    assert len(rows) == 3 and all("read fraction 0.1000 is below 0.5" in r for r in rows)
    assert not any("read fraction" in line for line in md.splitlines() if line.startswith("| r1 |"))


def test_the_llmd_reports_are_valid_and_carry_each_trials_own_figures(rendered):
    out, _, _, by_file = rendered
    for label, rate in LADDER:
        for trial in (1, 2, 3):
            doc = json.loads((out / "llmd" / f"G2L-{label}-t{trial}.json").read_text())
            report = br.load_benchmark_report(doc)  # llm-d's own validator
            assert report.run.uid == f"{RID}/G2L/{label}/trial-{trial}"
            recs = by_file[f"requests-{label}-t{trial}.jsonl"]
            fig = load_point(recs, SLO_S)
            agg = doc["results"]["request_performance"]["aggregate"]
            # llm-d's schema: percentiles of the successful requests, the failures counted beside them
            served = percentile([r.record.ttft_s for r in recs if r.record.ok], 99)
            assert agg["latency"]["time_to_first_token"]["p99"] == pytest.approx(served)
            assert agg["requests"]["failures"] == fig.failed
            assert doc["scenario"]["load"]["standardized"]["rate_qps"] == rate
            assert doc["scenario"]["stack"][0]["standardized"]["tool"] == "vllm"


def test_the_bundle_signs_the_llmd_reports_and_its_id_binds_them(tmp_path):
    run, pred, _, _ = load_run(tmp_path)
    key = Ed25519PrivateKey.generate()
    info = write_bundle(run, tmp_path / "bundles", key, pred, make_tar=False,
                        render=lambda rid, d: render_bundle_reports(rid, d, pred))
    res = verify_bundle(info.path, public_key=key.public_key())
    assert res.ok, res.error
    llmd = sorted(f for f in res.statement["predicate"]["rendered_files"] if f.startswith("llmd/"))
    assert len(llmd) == 9 and set(llmd) <= {s["name"] for s in res.statement["subject"]}
    for f in llmd:
        doc = json.loads((info.path / f).read_text())
        br.load_benchmark_report(doc)
        assert doc["run"]["uid"].startswith(info.report_id + "/G2L/")  # the signed file names its bundle
    # kvgate report renders the verified bundle again and finds every signed file, llm-d's too, byte for byte
    mine, differ = signed_render_differences(info.report_id, info.path, res.statement["predicate"], tmp_path / "rr")
    assert differ == [] and set(llmd) <= set(mine)
    copy = tmp_path / "copy"
    shutil.copytree(info.path, copy / info.report_id)
    target = copy / info.report_id / llmd[0]
    doc = json.loads(target.read_text())
    doc["results"]["request_performance"]["aggregate"]["latency"]["time_to_first_token"]["p99"] /= 2  # a better tail
    target.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    bad = verify_bundle(copy / info.report_id, public_key=key.public_key())
    assert not bad.ok and llmd[0] in bad.error


def test_a_request_line_of_another_shape_is_refused_naming_file_line_and_field(tmp_path):
    run, pred, _, _ = load_run(tmp_path)
    f = run / "gates" / "G2L" / "requests-r2-t1.jsonl"
    lines = f.read_text().splitlines()
    lines[2] = lines[2].replace('"sent_s": ', '"sent_s": "soon", "was": ')
    f.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputFileError, match=r"gates/G2L/requests-r2-t1.jsonl:3: sent_s: "):
        write_reports(RID, run, pred, tmp_path / "out")


def test_evidence_that_is_not_a_load_gates_draws_no_load_section(tmp_path):
    run, pred, _, _ = load_run(tmp_path)
    pred["verdicts"][-1]["evidence"]["points"] = "not a list"
    files = write_reports(RID, run, pred, tmp_path / "out")
    assert not any(f.startswith("llmd/") or "load-" in f or "accounting" in f for f in files)


def test_a_trace_replay_gets_its_cdf_accounting_and_a_valid_llmd_report_but_no_ladder_charts(tmp_path):
    run, pred = fixed_run(tmp_path)
    add_gate(run, "TR", "g2-load")
    gate = run / "gates" / "TR"
    gate.mkdir()
    pt, recs = point("trace", 3.0, 1)
    pt = pt.model_copy(update={"load_kind": "trace", "requests_file": "requests-trace-t1.jsonl"})
    (gate / pt.requests_file).write_text("".join(json.dumps(r.to_dict()) + "\n" for r in recs))
    ev = G2LoadEvidence(engine="cpu-reference", load_kind="trace", trials=1, ttft_slo_s=SLO_S, knee_percentile=95)
    result = evaluate_load([pt], "trace", SLO_S, 95, ev)
    assert result.evidence.knee is None
    pred["verdicts"].append(Verdict("TR", "trace replay", "ttft_p99_s@trace", "<= 2 s", None, 0.3, "s", Outcome.PASS,
                                    "ok", evidence=result.evidence_dict(), metrics=result.metrics).to_dict())
    files = write_reports(RID, run, pred, tmp_path / "out")
    assert "charts/TR-load-cdf.svg" in files and "tables/TR-accounting.csv" in files
    assert not any(f.startswith(("charts/TR-load-ttft", "charts/TR-load-throughput")) for f in files)
    doc = json.loads((tmp_path / "out" / "llmd" / "TR-trace-t1.json").read_text())
    br.load_benchmark_report(doc)
    assert "rate_qps" not in doc["scenario"]["load"]["standardized"]
    md = (tmp_path / "out" / "report.md").read_text()
    assert "Load: trace replay;" in md and "Knee (" not in md


def test_hostile_point_labels_and_request_file_names_stay_inside_and_inert(tmp_path):
    run, pred, _, _ = load_run(tmp_path)
    ev = pred["verdicts"][-1]["evidence"]
    ev["points"][0]["label"] = "../../escaped"
    ev["points"][1]["requests_file"] = "../../../G1/result.json"
    ev["summary"][0]["label"] = "<script>alert(1)</script>|`x`"
    files = write_reports(RID, run, pred, tmp_path / "out")
    assert "llmd/G2L-point0.json" in files and not any("escaped" in f for f in files)
    assert not any(f.startswith("llmd/G2L-r2-t1") for f in files)  # its file name leads out: not read
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "out" / "escaped").exists()
    html = (tmp_path / "out" / "report.html").read_text()
    assert "<script>alert" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    md = (tmp_path / "out" / "report.md").read_text()
    assert "\\<script>alert(1)\\</script>\\|\\`x\\`" in md


def test_loads_read_as_people_say_them():
    from harness.report.load_section import load_text

    assert [load_text(1.0, "closed"), load_text(4.0, "closed"), load_text(2.5, "open"), load_text(0.8333, "trace")] \
        == ["1 user", "4 users", "2.5 req/s", "0.8333 req/s (mean)"]


def test_a_point_whose_requests_all_failed_is_shown_not_drawn_at_zero(tmp_path):
    """8 req/s: the server refused every request (r8 in records()). Its row and accounting are there; the TTFT
    chart has no vertex for it, its llm-d report says 8 failures of 8 and is valid."""
    run, pred, result, _ = load_run(tmp_path, ladder=LADDER + [("r8", 8.0)])
    assert result.metrics["knee_rate_rps"] == 2.0 and result.error is None
    files = write_reports(RID, run, pred, tmp_path / "out")
    svg = (tmp_path / "out" / "charts" / "G2L-load-ttft.svg").read_text()
    assert len(vertices(svg, "ttft-p50")) == 3
    assert len(vertices((tmp_path / "out" / "charts" / "G2L-load-throughput.svg").read_text(), "goodput-line")) == 4
    doc = json.loads((tmp_path / "out" / "llmd" / "G2L-r8-t2.json").read_text())
    br.load_benchmark_report(doc)
    reqs = doc["results"]["request_performance"]["aggregate"]["requests"]
    assert (reqs["total"], reqs["failures"]) == (8, 8)
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| r8 | 8 req/s | 24 / 0 / 24 | — | — | — | — |" in md and "tables/G2L-requests.csv" in files


def test_the_runs_render_hook_writes_the_same_bundle_as_rendering_each_id_from_scratch(tmp_path):
    # bundle_renderer (what `kvgate run` signs with) builds the report once and writes it for the placeholder and
    # then the derived ID: the llm-d reports, which print the ID, must still name the final one, byte for byte
    run, pred, _, _ = load_run(tmp_path)
    key = Ed25519PrivateKey.generate()
    clock = lambda: time.strptime("2026-12-02T00:00:00Z", "%Y-%m-%dT%H:%M:%SZ")  # noqa: E731
    infos = [write_bundle(run, tmp_path / name, key, pred, make_tar=False, clock=clock, render=hook)
             for name, hook in (("scratch", lambda rid, d: render_bundle_reports(rid, d, pred)),
                                ("once", bundle_renderer(pred)))]
    assert infos[0].report_id == infos[1].report_id
    assert verify_bundle(infos[1].path, public_key=key.public_key()).ok
    files = sorted(p.relative_to(infos[0].path).as_posix() for p in infos[0].path.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(infos[1].path).as_posix() for p in infos[1].path.rglob("*") if p.is_file())
    llmd = [f for f in files if f.startswith("llmd/")]
    assert llmd and all(json.loads((infos[1].path / f).read_text())["run"]["uid"].startswith(infos[1].report_id)
                        for f in llmd)
    for f in files:
        if not f.startswith("signatures/") and f != "attestation.dsse.json":  # signing records are dated
            assert (infos[0].path / f).read_bytes() == (infos[1].path / f).read_bytes(), f


def test_an_attempt_set_aside_as_spoiled_is_named_in_the_report_with_its_lag_and_file(tmp_path):
    run, pred, result, _ = load_run(tmp_path, spoil=True)
    assert result.invalid_reason is None and len(result.evidence.spoiled) == 1
    write_reports(RID, run, pred, tmp_path / "out")
    for name in ("report.md", "report.html"):
        text = (tmp_path / "out" / name).read_text()
        assert "repeated with new prompts, 2 time(s) at most per engine; set aside: 1" in text, name
        assert "r1 trial 1 attempt 0 (client lag p99 300" in text and "requests-r1-t1.jsonl" in text, name
        assert "Client thread: nice -5 while sending" in text, name


def test_an_attempt_set_aside_because_the_cold_regime_fell_behind_is_named_with_its_breaches(tmp_path):
    run, pred, result, _ = load_run(tmp_path, spoil="cold")
    assert result.invalid_reason is None and result.evidence.spoiled[0].cold.breaches == 3
    write_reports(RID, run, pred, tmp_path / "out")
    for name in ("report.md", "report.html"):
        text = (tmp_path / "out" / name).read_text()
        assert "or with a read before the cold regime had dropped its store, is set aside" in text, name
        assert "r1 trial 1 attempt 0 (client lag p99 0" in text, name
        assert "3 read(s) before the cold regime dropped their store, requests-r1-t1.jsonl" in text, name


def test_a_gates_own_sections_are_found_by_its_workloads_name_in_the_bundles_config(tmp_path):
    """The same g2-load evidence draws its load section only when the bundle's config/gates.yaml names the gate a
    g2-load gate: the report does not guess a workload from its evidence's keys. A config that cannot be read draws
    no workload's section, and the report is still written."""
    from harness.report.render import gate_workloads
    run, pred, _, _ = load_run(tmp_path)
    assert gate_workloads(run)["G2L"] == "g2-load"
    files = write_reports(RID, run, pred, tmp_path / "out")
    assert any(f.startswith("llmd/") for f in files) and "tables/G2L-accounting.csv" in files
    gates = (run / "config" / "gates.yaml").read_text()
    (run / "config" / "gates.yaml").write_text(gates.replace("workload: g2-load", "workload: g2-ttft"))
    files = write_reports(RID, run, pred, tmp_path / "out2")
    assert not any(f.startswith("llmd/") or "G2L-accounting" in f for f in files)
    (run / "config" / "gates.yaml").write_text("- not\n- a mapping\n")
    assert gate_workloads(run) == {}
    assert "report.html" in write_reports(RID, run, pred, tmp_path / "out3")
