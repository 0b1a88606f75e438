"""`kvgate report` re-derives G3 from its raw reader streams (issue 35), not from result.json: the pure re-deriver
(harness.workloads.g3_shared_read.reevaluate_g3) on the files a scripted isolation run wrote, the same figures
as the run; raw streams that say 0.024 against a signed 0.984 come out different; a missing or empty stream is
an error, never the signed figure."""

from __future__ import annotations

import json

import pytest

from harness.errors import WorkloadError
from harness.parsers.g3series import port_rate
from harness.workloads.g3_shared_read import reevaluate_g3
from test_g3_isolation import nodes, run, suite


@pytest.fixture
def isolated_run(tmp_path):
    cfg = suite(tmp_path)
    res, ctx = run(tmp_path, cfg, nodes())
    assert res.error is None and res.invalid_reason is None, (res.error, res.invalid_reason)
    raw = {str(p.relative_to(ctx.gate_dir)): p.read_text() for p in ctx.gate_dir.glob("nodes/*/*.jsonl")}
    signed = json.loads(json.dumps(res.evidence_dict()))  # as result.json holds it
    return res, signed, raw, cfg.params["G3"]


def port(p):
    return port_rate(1.0, 1.0, None, p.port_rate_tolerance)  # st0: declared 1 Gbit/s, sysfs 1000 Mb/s


def test_the_raw_streams_give_the_runs_own_figures(isolated_run):
    res, signed, raw, p = isolated_run
    assert sorted(raw) == ["nodes/n1/reader-with-writer.jsonl", "nodes/n1/reader.jsonl",
                           "nodes/n2/reader-with-writer.jsonl", "nodes/n2/reader.jsonl", "nodes/w/writer.jsonl"]
    again = reevaluate_g3(signed, raw, p, port(p))
    assert again.metrics == res.metrics and again.invalid_reason is None and again.error is None


def test_raw_readers_at_a_fortieth_of_the_signed_rate_re_derive_a_fortieth(isolated_run):
    # the signer signed result.json's figures over raw streams that say otherwise: the re-derivation follows
    # the raw streams (ratio 0.024 against a signed 0.984 in issue 35's bundle)
    res, signed, raw, p = isolated_run
    slowed = dict(raw)
    for rel in ("nodes/n1/reader.jsonl", "nodes/n2/reader.jsonl"):
        lines = [json.loads(l) for l in raw[rel].splitlines()]
        for rec in lines:
            if rec["type"] == "sample":
                rec["bytes"] = rec["bytes"] // 41
            if rec["type"] == "end":
                rec["bytes"] = rec["bytes"] // 41
        slowed[rel] = "".join(json.dumps(r) + "\n" for r in lines)
    again = reevaluate_g3(signed, slowed, p, port(p))
    assert again.metrics["nic_ceiling_ratio"] == pytest.approx(res.metrics["nic_ceiling_ratio"] / 41, rel=0.02)
    assert again.metrics["nic_ceiling_ratio"] < 0.03 < 0.9 < res.metrics["nic_ceiling_ratio"]


@pytest.mark.parametrize("rel", ["nodes/n1/reader.jsonl", "nodes/n2/reader-with-writer.jsonl", "nodes/w/writer.jsonl"])
@pytest.mark.parametrize("text", [None, "", "\n"])
def test_a_missing_or_empty_raw_stream_is_an_error_not_the_signed_figure(isolated_run, rel, text):
    _, signed, raw, p = isolated_run
    raw = {**raw, rel: text}
    with pytest.raises(WorkloadError, match=f"{rel} is (missing|empty)"):
        reevaluate_g3(signed, raw, p, port(p))


def test_a_node_the_run_saw_fail_without_output_needs_no_raw_stream(isolated_run):
    _, signed, raw, p = isolated_run
    signed["nodes"]["n2"] = {"error": "unreachable: connection refused"}
    signed["failed_nodes"] = {"n2": "unreachable: connection refused"}
    raw = {k: v for k, v in raw.items() if not k.startswith("nodes/n2/reader.jsonl")}
    again = reevaluate_g3(signed, raw, p, port(p))
    assert again.error.startswith("1 of 2 nodes failed") and "n2" in again.error


def test_the_bounds_come_from_the_bundles_suite(isolated_run):
    # a stricter writer minimum in config/gates.yaml makes the same raw streams INVALID
    _, signed, raw, p = isolated_run
    strict = p.model_copy(update={"writer": p.writer.model_copy(update={"min_write_share": 0.9})})
    again = reevaluate_g3(signed, raw, strict, port(p))
    assert "below its stated minimum" in again.invalid_reason
    # a port whose measured rate the suite's tolerance refuses
    assert reevaluate_g3(signed, raw, p, port_rate(1.0, 10.0, None)).invalid_reason.startswith("port rate:")
