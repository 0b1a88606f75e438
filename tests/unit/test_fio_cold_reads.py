"""G1's cold proof for a buffered read (``direct: false``): a stream that read more than its region re-read it
from the page cache, so the run is INVALID, and the evidence says how many bytes were read against the region.
The rule lives in the pure evaluator, so re-evaluating a bundle applies it too."""

import json

import yaml

from harness.gates.reevaluate import reevaluate_bundle
from harness.parsers.fio import parse_fio_json
from harness.workloads.kit.base import StreamRow
from harness.workloads.fio_read import (FioNodeEvidence, FioRead, FioReadEvidence, FioReadParams, evaluate_fio_read,
                                        reevaluate_fio_read)
from report_fixture import fixed_run, g1_only

MIB = 1 << 20


def _ev(read_bytes: int, *, direct: bool = False, time_based: bool | None = None, ramp_s: float = 0.0,
        bw_gb_s: float = 1.0, region: int | None = 64 * MIB, numjobs: int = 1, total: int | None = None):
    node = FioNodeEvidence(target="kv", kind="file", path="/data/kv.bin", page_cache_dropped=True,
                           stream_region_bytes={"stream0": region} if region is not None else None,
                           region_total_bytes=total)
    return FioReadEvidence(ioengine="psync", direct=direct, rw="read", bs_bytes=MIB, iodepth=1, numjobs=numjobs,
                           runtime_s=2.0, ramp_s=ramp_s, time_based=time_based, nodes={"n1": node},
                           streams=[StreamRow(node="n1", label="stream0", read_gb_s=bw_gb_s, read_bytes=read_bytes)])


def test_a_buffered_read_of_more_bytes_than_its_region_is_invalid_and_says_how_many():
    res = evaluate_fio_read(_ev(3 * 64 * MIB, time_based=True))
    assert res.invalid_reason and "page cache" in res.invalid_reason
    assert f"read {3 * 64 * MIB} bytes" in res.invalid_reason and f"region of {64 * MIB} bytes" in res.invalid_reason
    assert evaluate_fio_read(_ev(64 * MIB, time_based=False)).invalid_reason is None  # read once: cold


def test_the_ramp_counts_for_a_time_based_buffered_read():
    # 40 MiB reported after a 1 s ramp at 0.05 GB/s (~50 MB more, unreported): more than the 64 MiB region
    res = evaluate_fio_read(_ev(40 * MIB, time_based=True, ramp_s=1.0, bw_gb_s=0.05))
    assert res.invalid_reason and "estimated during the ramp" in res.invalid_reason
    assert evaluate_fio_read(_ev(40 * MIB, time_based=True, ramp_s=0.1, bw_gb_s=0.05)).invalid_reason is None
    # recorded before kvgate said whether the job was time based: it was
    assert evaluate_fio_read(_ev(40 * MIB, ramp_s=1.0, bw_gb_s=0.05)).invalid_reason is not None


def test_clones_of_a_time_based_stream_each_read_only_their_slice():
    # 2 clones, each its own 32 MiB slice: 48 MiB in all may be one clone having wrapped
    assert evaluate_fio_read(_ev(48 * MIB, time_based=True, numjobs=2)).invalid_reason is not None
    assert evaluate_fio_read(_ev(30 * MIB, time_based=True, numjobs=2)).invalid_reason is None


def test_o_direct_reads_are_not_judged_by_the_page_cache_rule_and_an_unknown_region_is_not_cold():
    assert evaluate_fio_read(_ev(10 * 64 * MIB, direct=True, time_based=True)).invalid_reason is None
    res = evaluate_fio_read(_ev(MIB, region=None))
    assert res.invalid_reason and "region size not recorded" in res.invalid_reason
    # an older record: the regions follow from the node's total, as the job split it
    assert evaluate_fio_read(_ev(MIB, region=None, total=64 * MIB, time_based=False)).invalid_reason is None


def test_a_buffered_job_stops_at_the_end_of_its_region_and_an_o_direct_one_runs_its_time():
    class Node:
        name, work_dir, gpus, stream_count = "n1", "/w", [], 1
    wl = FioRead()
    buffered = wl._job(FioReadParams(target="kv", direct=False), Node(), "/data/kv.bin", 64 * MIB, None)
    assert "time_based=1" not in buffered and "size=67108864" in buffered and "direct=0" in buffered
    direct = wl._job(FioReadParams(target="kv"), Node(), "/data/kv.bin", 64 * MIB, None)
    assert "time_based=1" in direct


def test_reevaluating_a_bundle_applies_the_rule_from_the_raw_fio_output(tmp_path):
    run, pred = fixed_run(tmp_path)
    pred = g1_only(run, pred)
    gates = yaml.safe_load((run / "config" / "gates.yaml").read_text())
    gates["gates"][0]["params"]["direct"] = False
    (run / "config" / "gates.yaml").write_text(yaml.safe_dump(gates))
    res_path = run / "gates" / "G1" / "result.json"
    res = json.loads(res_path.read_text())
    ev = res["evidence"]
    ev["direct"], ev["time_based"] = False, True
    raw = {n: parse_fio_json((run / "gates" / "G1" / n / "fio.json").read_text()) for n in ev["nodes"]}
    # regions large enough for what n1 read, one stream of n2 smaller than what it read
    for n, r in raw.items():
        ev["nodes"][n]["stream_region_bytes"] = {g.label: 64 * g.read_bytes for g in r.groups}
    small = raw["n2"].groups[0]
    ev["nodes"]["n2"]["stream_region_bytes"][small.label] = small.read_bytes // 2
    res_path.write_text(json.dumps(res))
    check = reevaluate_bundle(run, pred).checks[0]
    assert check.reevaluated["outcome"] == "INVALID", check.reevaluated
    reason = check.reevaluated["reason"]
    assert f"n2 {small.label}: read {small.read_bytes} bytes" in reason and "n1" not in reason.split("page cache:")[1]
    dropped = {n: True for n in raw}
    _, invalid = reevaluate_fio_read(raw, ev, dropped, FioReadParams(target="kv", direct=False, ramp_s=0))
    assert invalid and f"region of {small.read_bytes // 2} bytes" in invalid
