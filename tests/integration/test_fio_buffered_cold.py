"""A buffered G1 read (``direct: false``) with real fio on a small file: kvgate's job reads each byte of its
region once (fio stops at the region's end) and the evidence says so; a time based buffered job over the same
file wraps around and re-reads the region from the page cache, and the evaluator makes it INVALID."""

import json
import shutil
import subprocess

import pytest
import yaml

from harness.parsers.fio import StreamSpec, job_file, parse_fio_json
from harness.workloads.fio_read import FioNodeEvidence, FioReadEvidence, evaluate_fio_read
from harness.workloads.kit.probes import fio_stream_rows

pytestmark = pytest.mark.integration

SIZE = 16 << 20


@pytest.fixture(autouse=True)
def _fio():
    if shutil.which("fio") is None:
        pytest.fail("fio missing (scripts/setup.sh installs it)")


def test_kvgates_buffered_read_reads_its_region_once_and_stays_valid(tmp_path):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from harness.config import load_config
    from harness.suite.runner import run_suite
    from harness.workloads import WORKLOADS

    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump({"nodes": [{
        "name": "n1", "transport": "local", "work_dir": str(tmp_path / "work"), "read_streams": 1,
        "targets": [{"name": "kv", "kind": "file", "path": str(tmp_path / "kv.bin"), "size": "16 MiB"}]}]}))
    gates = tmp_path / "gates.yaml"
    gates.write_text(yaml.safe_dump({"suite": {"name": "buffered", "version": 1}, "gates": [{
        "id": "G1", "title": "buffered", "workload": "fio-read", "metric": "per_gpu_read_gb_s",
        "pass": ">= 0.001 MB/s",
        # 2 s of reading at page-cache or disk speed is far more than 16 MiB: a time based job would wrap
        "params": {"target": "kv", "direct": False, "ioengine": "psync", "runtime_s": 2, "ramp_s": 0.5}}]}))
    res = run_suite(load_config(inv, gates, WORKLOADS), tmp_path / "out", Ed25519PrivateKey.generate(),
                    progress=lambda m: None, make_tar=False)
    (v,) = res.verdicts
    ev = json.loads((res.bundle.path / "gates" / "G1" / "result.json").read_text())["evidence"]
    rows = ev["nodes"]["n1"]["stream_reads"]
    assert [(r["label"], r["region_bytes"], r["wrapped"], r["time_based"]) for r in rows] == \
        [("stream0", SIZE, False, False)], rows
    assert 0 < rows[0]["read_bytes"] <= SIZE  # what fio read after the ramp: within the region
    assert "time_based" not in (res.bundle.path / "gates" / "G1" / "n1" / "job.fio").read_text()
    if ev["nodes"]["n1"]["page_cache_dropped"]:
        assert v.outcome.value == "PASS", v.reason
    else:  # a node where the page cache cannot be dropped: not cold for that reason, never for re-reading
        assert v.outcome.value == "INVALID" and "re-read" not in v.reason


def test_a_time_based_buffered_job_that_wraps_is_invalid_with_the_bytes_read(tmp_path):
    data = tmp_path / "kv.bin"
    with open(data, "wb") as f:
        f.write(b"\x5a" * SIZE)
    job = tmp_path / "job.fio"
    job.write_text(job_file(str(data), [StreamSpec("stream0", 0, SIZE)], ioengine="psync", iodepth=1,
                            runtime_s=1, ramp_s=0, direct=False, time_based=True))
    r = subprocess.run(["fio", "--output-format=json", str(job)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    run = parse_fio_json(r.stdout)
    (group,) = run.groups
    assert group.read_bytes > SIZE  # fio wrapped: the figure is the page cache's
    ev = FioReadEvidence(ioengine="psync", direct=False, rw="read", bs_bytes=1 << 20, iodepth=1, numjobs=1,
                         runtime_s=1, ramp_s=0, time_based=True, streams=fio_stream_rows("n1", run, {}),
                         nodes={"n1": FioNodeEvidence(target="kv", kind="file", path=str(data), page_cache_dropped=True,
                                                      region_total_bytes=SIZE,
                                                      stream_region_bytes={"stream0": SIZE})})
    res = evaluate_fio_read(ev)
    assert res.invalid_reason is not None
    assert f"n1 stream0: read {group.read_bytes} bytes from a region of {SIZE} bytes" in res.invalid_reason
