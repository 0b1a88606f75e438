"""A real G1 run (fio on this machine, the default local suite) feeds `kvgate cost` through its signed bundle."""

import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from harness.report import bundle

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("fio") is None, reason="fio not installed (scripts/setup.sh installs it)")
def test_real_g1_bundle_feeds_per_gpu_read(tmp_path):
    env = {"KVGATE_HOME": str(tmp_path / "home"), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    run = subprocess.run([sys.executable, "-m", "harness", "run", "--out", str(tmp_path / "runs")],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode in (0, 1), run.stderr  # PASS or FAIL both measured a bandwidth
    (tar,) = (tmp_path / "runs").glob("KVG-*.tar.gz")
    with tarfile.open(tar) as tf:
        member = next(m for m in tf.getmembers() if m.name.endswith("/verdicts.json"))
        verdicts = json.load(tf.extractfile(member))
    g1 = next(v for v in verdicts["verdicts"] if v["gate_id"] == "G1")
    assert g1["metric"] == "per_gpu_read_gb_s" and g1["actual"] > 0

    shutil.copytree(REPO / "workloads" / "models", tmp_path / "models")
    text = (REPO / "workloads" / "cost-params.example.yaml").read_text()
    params = tmp_path / "params.yaml"
    params.write_text(text.replace("\n  per_gpu_read: 5.23 GB/s\n", "\n"))
    out = tmp_path / "cost"
    cost = subprocess.run(
        [sys.executable, "-m", "harness", "cost", "--params", str(params), "--bundle", str(tar),
         "--pubkey", str(tmp_path / "home" / "dev-signing.pub"), "--out", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert cost.returncode == 0, cost.stderr
    (b,) = [p for p in out.iterdir() if p.is_dir()]
    result = bundle.verify_bundle(b, tmp_path / "home" / "dev-signing.pub")
    assert result.ok
    assert result.statement["predicate"]["input_report_ids"] == [tar.name.removesuffix(".tar.gz")]
    row = next(ln for ln in (b / "tables/inputs.csv").read_text().splitlines() if ln.startswith("per_gpu_read_gb_s,"))
    assert float(row.split(",")[1]) == pytest.approx(g1["actual"])
    assert f"measured: {tar.name.removesuffix('.tar.gz')} G1 per_gpu_read_gb_s" in row
