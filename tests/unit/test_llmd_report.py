"""A load point as llm-d's Benchmark Report v0.2.1, checked by llm-d's own package (llmd-benchmark-report)."""

import json

import pytest

from harness.engines.client import RequestRecord
from harness.engines.load import LoadRecord, load_point
from harness.report.llmd import EngineInfo, LoadInfo, benchmark_report, statistics

import llmd_benchmark_report.core as br  # noqa: E402 - the test extra installs it (pyproject.toml)


def rec(i, sent, ttft, chunks=4, error=None, prompt=512):
    itl = (0.02,) * (chunks - 1)
    lat = ttft + sum(itl) if ttft is not None else None
    return LoadRecord(sent, sent + 0.0001, RequestRecord(f"r{i}", prompt, 0.0, ttft, itl, lat,
                                                         (lat or 0) + 0.001, chunks if ttft else 0, "x", 200, error))


RECORDS = [rec(i, i * 0.25, 0.05 + 0.01 * i) for i in range(8)] + [rec(8, 2.0, None, error="HTTP 503: busy")]
ENGINE = EngineInfo(tool="vllm", tool_version="0.32.0+cpu", model="kvgate-random-llama",
                    args={"--block-size": 128, "--kv-transfer-config": {"kv_connector": "ExampleConnector"}})


def test_an_open_loop_point_is_a_valid_benchmark_report_with_kvgates_figures():
    doc = benchmark_report("KVG-20261201-abc/G2L/rate-4/trial-1", RECORDS, 1_764_600_000.0, ENGINE,
                           LoadInfo(rate_rps=4.0, stage=2), description="G2 under load")
    report = br.load_benchmark_report(json.loads(json.dumps(doc)))  # llm-d's validator, as a consumer reads it
    assert report.version == "0.2.1" and report.run.uid == "KVG-20261201-abc/G2L/rate-4/trial-1"
    agg = doc["results"]["request_performance"]["aggregate"]
    assert agg["requests"]["total"] == 9 and agg["requests"]["failures"] == 1
    point = load_point(RECORDS)
    # llm-d's schema: the percentiles of the served requests, the failures counted beside them (kvgate's own
    # figures count a failed request as an infinite TTFT: harness.engines.load.load_point)
    served = load_point(RECORDS[:8])
    assert agg["latency"]["time_to_first_token"]["p50"] == pytest.approx(served.ttft_p50_s)
    assert agg["latency"]["time_to_first_token"]["p99"] == pytest.approx(served.ttft_p99_s)
    assert point.ttft_p99_s is None and point.failed == 1
    assert agg["latency"]["time_per_output_token"]["mean"] == pytest.approx(0.02)
    assert agg["throughput"]["request_rate"]["mean"] == pytest.approx(point.request_rate_rps)
    assert agg["throughput"]["output_token_rate"]["mean"] == pytest.approx(point.output_token_rate_tps)
    load = doc["scenario"]["load"]["standardized"]
    assert load["rate_qps"] == 4.0 and load["tool"] == "kvgate" and load["input_seq_len"] == {
        "distribution": "fixed", "value": 512}
    assert doc["run"]["time"]["duration"].startswith("PT") and doc["run"]["time"]["start"].endswith("Z")


def test_a_closed_loop_point_with_varied_lengths_is_valid_too():
    recs = [rec(i, 0.0, 0.1, prompt=100 + i) for i in range(4)]
    doc = benchmark_report("u", recs, 0.0, EngineInfo("cpu-reference", "kvgate", "m"), LoadInfo(concurrency=4))
    br.load_benchmark_report(doc)
    assert doc["scenario"]["load"]["standardized"]["input_seq_len"]["distribution"] == "other"


def test_a_wrong_unit_would_be_refused_by_llmds_validator():
    """The check above can fail: llm-d's package refuses a TTFT in tokens/s."""
    doc = benchmark_report("u", RECORDS, 0.0, ENGINE, LoadInfo(rate_rps=1.0))
    doc["results"]["request_performance"]["aggregate"]["latency"]["time_to_first_token"]["units"] = "tokens/s"
    with pytest.raises(Exception, match="units"):
        br.load_benchmark_report(doc)


def test_statistics_percentiles_and_empty():
    s = statistics([1.0, 2.0, 3.0, 4.0], "s")
    assert (s["mean"], s["min"], s["max"], s["p50"]) == (2.5, 1.0, 4.0, 2.5)
    assert statistics([], "s") is None
