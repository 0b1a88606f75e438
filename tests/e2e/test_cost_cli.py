"""`kvgate cost` as a user runs it: signed output, verified inputs, refusals, rerun determinism.

Each command is a process forked from a server that imported kvgate once (tests/kvgate_fork.py, checked against
``python -m`` in tests/e2e/test_bad_inputs.py), in this test's environment."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from harness.report import bundle
from kvgate_fork import WITH_CHARTS, ForkServer

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "workloads" / "cost-params.example.yaml"


@pytest.fixture(autouse=True)
def kvgate_home(tmp_path, monkeypatch):
    """A private $KVGATE_HOME, so the development signing key is this test's own."""
    home = tmp_path / "kvgate-home"
    monkeypatch.setenv("KVGATE_HOME", str(home))
    return home


@pytest.fixture(scope="module")
def forks():
    with ForkServer(WITH_CHARTS) as server:
        yield server


@pytest.fixture()
def kvgate_cost(forks):
    """``kvgate cost ARGS`` from the checkout's root, in this test's environment (its $KVGATE_HOME)."""
    def cost(*args) -> subprocess.CompletedProcess:
        return forks.kvgate("cost", *args, timeout=120)

    return cost


@pytest.fixture()
def params(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "workloads" / "models", tmp_path / "models")
    p = tmp_path / "params.yaml"
    p.write_text(EXAMPLE.read_text())
    return p


def without_line(path: Path, needle: str) -> Path:
    lines = [ln for ln in path.read_text().splitlines(keepends=True)
             if not (needle in ln and not ln.lstrip().startswith("#"))]
    path.write_text("".join(lines))
    return path


@pytest.fixture()
def g1_bundle(tmp_path: Path) -> tuple[Path, Path, str]:
    """A real signed bundle (foundation bundle code) whose verdicts.json reports a G1 measurement.
    The verdict numbers are written here (synthetic: no G1 run happens in this test)."""
    run = tmp_path / "g1-run"
    run.mkdir()
    (run / "verdicts.json").write_text(json.dumps({
        "suite": {"name": "t", "version": "1"},
        "verdicts": [{"gate_id": "G1", "title": "per-GPU cold read", "metric": "per_gpu_read_gb_s",
                      "pass_threshold": ">= 5.0 GB/s", "stop_loss_threshold": "< 3.0 GB/s", "actual": 6.1,
                      "unit": "GB/s", "outcome": "PASS", "reason": "ok", "evidence": {}, "reference": {},
                      "metrics": {"per_gpu_read_gb_s": 6.1}}],
        "overall": "PASS",
    }))
    key, pub = bundle.generate_keypair(tmp_path / "g1-signer")
    info = bundle.write_bundle(run, tmp_path / "g1-out", bundle.load_private_key(key), {"suite": "t"})
    return info.path, pub, info.report_id


def only_bundle(out: Path) -> Path:
    (b,) = [p for p in out.iterdir() if p.is_dir() and p.name.startswith("KVG-")]
    return b


def test_writes_a_signed_bundle_with_tables_charts_and_reports(params, tmp_path, kvgate_home, kvgate_cost):
    out = tmp_path / "out"
    proc = kvgate_cost("--params", params, "--out", out)
    assert proc.returncode == 0, proc.stderr
    b = only_bundle(out)
    assert f"report {b.name}" in proc.stdout
    pub = kvgate_home / "dev-signing.pub"
    result = bundle.verify_bundle(b, pub)
    assert result.ok, result.error
    assert result.report_id == b.name
    pred = result.statement["predicate"]
    assert pred["kind"] == "kvgate-cost/v1" and pred["input_report_ids"] == []
    assert pred["signing_key"]["kind"] == "development" and "development key" in proc.stderr
    for rel in ("tables/inputs.csv", "tables/results.csv", "tables/tornado.csv", "tables/net_vs_hit_rate.csv",
                "tables/break_even.csv", "charts/tornado.svg", "charts/break_even.svg", "report.md",
                "report.html", "params/params.yaml", "params/llama-3-70b.json"):
        assert (b / rel).is_file(), rel
    assert (b / "params/params.yaml").read_bytes() == params.read_bytes()
    page = (b / "report.html").read_text()
    assert b.name in page and page.count("<svg") == 2
    # self-contained: nothing to fetch (no src=, no <link>, every href an in-page fragment)
    assert "src=" not in page and "<link" not in page
    assert all(h.startswith("#") for h in re.findall(r'href="([^"]*)"', page))
    assert b.name in (b / "report.md").read_text()
    results = dict(line.split(",")[:2] for line in (b / "tables/results.csv").read_text().splitlines()[1:])
    assert float(results["kv_bytes_per_session"]) == 32768 * 327680
    # the reports are signed subjects too: changing one breaks verification
    (b / "report.md").write_text("# edited\n")
    assert not bundle.verify_bundle(b, pub).ok


def test_same_params_give_byte_identical_tables(params, tmp_path, kvgate_cost):
    runs = []
    for name in ("a", "b"):
        proc = kvgate_cost("--params", params, "--out", tmp_path / name)
        assert proc.returncode == 0, proc.stderr
        runs.append(only_bundle(tmp_path / name))
    tables = sorted(p.name for p in (runs[0] / "tables").iterdir())
    assert len(tables) == 5
    for t in tables:
        assert (runs[0] / "tables" / t).read_bytes() == (runs[1] / "tables" / t).read_bytes(), t
    # and a changed parameter changes them
    params.write_text(params.read_text().replace("hit_rate: 90 %", "hit_rate: 80 %"))
    assert kvgate_cost("--params", params, "--out", tmp_path / "c").returncode == 0
    c = only_bundle(tmp_path / "c")
    assert (c / "tables/results.csv").read_bytes() != (runs[0] / "tables/results.csv").read_bytes()


def test_measured_input_from_a_verified_bundle_is_used_and_cited(params, tmp_path, g1_bundle, kvgate_cost):
    path, pub, report_id = g1_bundle
    without_line(params, "per_gpu_read: 5.23 GB/s")
    key, my_pub = bundle.generate_keypair(tmp_path / "operator")
    out = tmp_path / "out"
    proc = kvgate_cost("--params", params, "--bundle", path, "--pubkey", pub, "--out", out, "--key", key)
    assert proc.returncode == 0, proc.stderr
    b = only_bundle(out)
    result = bundle.verify_bundle(b, my_pub)
    assert result.ok and result.statement["predicate"]["input_report_ids"] == [report_id]
    assert result.statement["predicate"]["signing_key"]["kind"] == "operator"
    rows = {ln.split(",")[0]: ln for ln in (b / "tables/inputs.csv").read_text().splitlines()}
    assert rows["per_gpu_read_gb_s"].startswith("per_gpu_read_gb_s,6.1,")
    assert f"measured: {report_id} G1 per_gpu_read_gb_s (PASS)" in rows["per_gpu_read_gb_s"]
    assert report_id in (b / "report.html").read_text()
    measured = json.loads((b / "measured_inputs.json").read_text())
    assert measured == [{"name": "per_gpu_read_gb_s", "value": 6.1, "report_id": report_id, "gate_id": "G1",
                         "metric": "per_gpu_read_gb_s", "outcome": "PASS"}]


def test_tar_archive_input_is_accepted(params, tmp_path, g1_bundle, kvgate_cost):
    path, pub, report_id = g1_bundle
    without_line(params, "per_gpu_read: 5.23 GB/s")
    tar = path.parent / f"{report_id}.tar.gz"
    proc = kvgate_cost("--params", params, "--bundle", tar, "--pubkey", pub, "--out", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr


def test_parameter_may_not_override_a_measured_input(params, tmp_path, g1_bundle, kvgate_cost):
    path, pub, report_id = g1_bundle
    out = tmp_path / "out"
    proc = kvgate_cost("--params", params, "--bundle", path, "--pubkey", pub, "--out", out)
    assert proc.returncode == 2
    line = next(i for i, ln in enumerate(params.read_text().splitlines(), 1)
                if "per_gpu_read: 5.23 GB/s" in ln and not ln.lstrip().startswith("#"))
    assert f"{params}:{line}: tier.per_gpu_read:" in proc.stderr and report_id in proc.stderr
    assert not out.exists() or not any(p.name.startswith("KVG-") for p in out.iterdir())


def test_tampered_input_bundle_is_refused(params, tmp_path, g1_bundle, kvgate_cost):
    path, pub, report_id = g1_bundle
    without_line(params, "per_gpu_read: 5.23 GB/s")
    v = json.loads((path / "verdicts.json").read_text())
    v["verdicts"][0]["actual"] = 60.0  # a better number than was measured
    (path / "verdicts.json").write_text(json.dumps(v))
    out = tmp_path / "out"
    proc = kvgate_cost("--params", params, "--bundle", path, "--pubkey", pub, "--out", out)
    assert proc.returncode == 2
    assert "refused" in proc.stderr and "verdicts.json" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_bundle_signed_by_another_key_is_refused(params, tmp_path, g1_bundle, kvgate_cost):
    path, _, _ = g1_bundle
    without_line(params, "per_gpu_read: 5.23 GB/s")
    _, other_pub = bundle.generate_keypair(tmp_path / "other")
    proc = kvgate_cost("--params", params, "--bundle", path, "--pubkey", other_pub, "--out", tmp_path / "out")
    assert proc.returncode == 2 and "signature does not verify" in proc.stderr


def test_bad_params_exit_2_with_every_issue_on_its_own_line(params, tmp_path, kvgate_cost):
    params.write_text(params.read_text().replace("  per_gpu_read: 5.23 GB/s", "  per_gpu_read: 5.23 s")
                      .replace("revisit_rate: 0.5", "revisit_rate: 1.5"))
    proc = kvgate_cost("--params", params, "--out", tmp_path / "out")
    assert proc.returncode == 2
    errs = proc.stderr.strip().splitlines()
    assert errs[-1] == "2 configuration error(s)"
    errs = errs[:-1]
    assert len(errs) == 2
    assert all(e.startswith(f"{params}:") for e in errs)
    assert any("tier.per_gpu_read" in e and "bandwidth" in e for e in errs)
    assert any("fleet.revisit_rate" in e for e in errs)
