"""kvgate report and kvgate compare as a user runs them, on bundles of real local G1 runs (real fio).

The runs are ``python -m harness run``; report and compare are processes forked from a server that imported
kvgate once (tests/kvgate_fork.py, checked against ``python -m`` in tests/e2e/test_bad_inputs.py)."""

import json
import shutil
import tarfile
from pathlib import Path

import pytest
import yaml

from kvgate_cli import kvgate as kvgate_python_m
from kvgate_fork import WITH_CHARTS, ForkServer

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def kvgate():
    """``kvgate ARGS`` (home=, env=) as tests/kvgate_cli.py runs it, each command forked from one server."""
    with ForkServer(WITH_CHARTS) as server:
        yield server.kvgate


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two real runs of a small local G1 suite, signed with a development key in a private KVGATE_HOME."""
    tmp = tmp_path_factory.mktemp("report-cli")
    home = tmp / "home"
    inv = tmp / "inventory.yaml"
    inv.write_text(yaml.safe_dump({"nodes": [{
        "name": "localhost", "transport": "local", "work_dir": str(tmp / "work"), "read_streams": 2,
        "targets": [{"name": "scratch", "kind": "file", "path": "t.bin", "size": "64 MiB"}]}]}))
    gates = tmp / "gates.yaml"
    gates.write_text(yaml.safe_dump({"suite": {"name": "report-e2e", "version": 1}, "gates": [{
        "id": "G1", "title": "cold read", "workload": "fio-read",
        "params": {"target": "scratch", "bs": "256 KiB", "iodepth": 4, "runtime_s": 1, "ramp_s": 0},
        "metric": "per_gpu_read_gb_s", "pass": ">= 1 MB/s", "stop_loss": "< 0.01 MB/s",
        "reference": {"value": "5.23 GB/s"}}]}, sort_keys=False))
    bundles = []
    for i in range(2):
        r = kvgate_python_m("run", "-i", inv, "-g", gates, "--out", tmp / f"out{i}", home=home)
        assert r.returncode == 0, r.stdout + r.stderr
        rid = next(l.split(": ")[1] for l in r.stdout.splitlines() if l.startswith("report ID: "))
        bundles.append(tmp / f"out{i}" / f"{rid}.tar.gz")
    return tmp, home, bundles


def test_report_reproduces_verdicts_and_bytes(runs, kvgate):
    tmp, home, (a, _) = runs
    out = tmp / "rerender"
    r = kvgate("report", a, "--out", out, home=home)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "signature and every file verified" in r.stdout
    assert "G1: signed PASS, re-evaluated PASS (raw output re-parsed (fio-read))" in r.stdout
    assert "verdicts: SAME as signed (overall PASS)" in r.stdout
    rid = a.name[: -len(".tar.gz")]
    bundle = a.parent / rid
    for f in ("report.md", "report.html", "junit.xml", "charts/G1-streams.svg", "tables/G1-streams.csv"):
        assert (out / f).read_bytes() == (bundle / f).read_bytes(), f
    assert json.loads((out / "reevaluation.json").read_text())["same"] is True
    # the run recorded provenance, and the report shows it
    prov = json.loads((bundle / "nodes" / "localhost" / "provenance.json").read_text())
    snap = json.loads((bundle / "nodes" / "localhost" / "snapshot.json").read_text())
    assert "nics" in snap and "versions" in prov  # /sys/class/net is read once, into the snapshot
    assert "## Provenance" in (bundle / "report.md").read_text()


def test_tampered_raw_file_is_caught_before_any_rerender(runs, kvgate):
    tmp, home, (a, _) = runs
    work = tmp / "tampered"
    with tarfile.open(a) as tf:
        tf.extractall(work, filter="data")
    bundle = next(work.iterdir())
    fio = bundle / "gates" / "G1" / "localhost" / "fio.json"
    fio.write_text(fio.read_text().replace('"bw_bytes"', '"bw_bytes" ', 1))
    out = tmp / "never"
    r = kvgate("report", bundle, "--out", out, home=home)
    assert r.returncode == 1
    assert "FAILED verification: gates/G1/localhost/fio.json: sha256 does not match" in r.stdout
    assert not out.exists()


def test_signed_but_wrong_verdict_is_reported_as_different(runs, kvgate):
    """A bundle correctly signed whose verdict does not follow from its raw fio output."""
    from harness.report.bundle import load_private_key, write_bundle
    from harness.report.render import render_bundle_reports

    tmp, home, (a, _) = runs
    work = tmp / "lying"
    with tarfile.open(a) as tf:
        tf.extractall(work, filter="data")
    src = next(work.iterdir())
    env = json.loads((src / "attestation.dsse.json").read_text())
    import base64

    pred = json.loads(base64.b64decode(env["payload"]))["predicate"]
    run = tmp / "lying-run"
    shutil.copytree(src, run, ignore=shutil.ignore_patterns("attestation.dsse.json", *pred["rendered_files"]))
    for f in pred["rendered_files"]:
        (run / f).unlink(missing_ok=True)
    shutil.rmtree(run / "charts", ignore_errors=True)
    shutil.rmtree(run / "tables", ignore_errors=True)
    shutil.rmtree(run / "signatures", ignore_errors=True)  # the signing records of the old statement
    pred = {k: v for k, v in pred.items() if k not in ("report_id", "rendered_files", "created_utc")}
    pred["verdicts"][0]["actual"] *= 10
    key = load_private_key(home / "dev-signing.key")
    info = write_bundle(run, tmp / "lying-out", key, pred, make_tar=False,
                        render=lambda rid, d: render_bundle_reports(rid, d, pred))
    r = kvgate("report", info.path, "--out", tmp / "lying-rerender", home=home)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "verdicts: DIFFER" in r.stdout and "re-evaluated from raw data" in r.stdout
    md = (tmp / "lying-rerender" / "report.md").read_text()
    assert "differ from the signed ones" in md


def test_report_needs_the_signers_key(runs, tmp_path, kvgate):
    _, _, (a, _) = runs
    r = kvgate("report", a, home=tmp_path / "other-home")
    assert r.returncode == 2 and "give --pubkey" in r.stderr


def test_compare_two_runs(runs, kvgate):
    tmp, home, (a, b) = runs
    out = tmp / "cmp"
    r = kvgate("compare", a, b, "--out", out, home=home)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "G1: PASS -> PASS" in r.stdout
    import pandas as pd

    f = pd.read_csv(out / "compare.csv")
    assert set(f.metric) == {"per_gpu_read_gb_s", "per_gpu_read_gb_s_mean", "node_read_gb_s_min", "total_read_gb_s"}
    row = f[f.metric == "per_gpu_read_gb_s"].iloc[0]
    assert row.delta == pytest.approx(row.b - row.a) and bool(row.judged)
    html = (out / "compare.html").read_text()
    assert 'id="deltas"' in html and 'id="chart-compare"' in html and "<svg" in html
