"""`kvgate report` on signed g2-load bundles as a user runs it: an honest one re-derives SAME and says how many gates
came from raw files; one whose config says min_read_fraction 0.5 while its evidence says 0, whose pool device read
0 bytes, with an empty requests file and a "degraded mode (recompute)" engine log line answers DIFFERS, exit 1
(issue 35)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from report_fixture import sign_run
from kvgate_cli import kvgate
from load_bundle import FALLBACK_LINE, load_run

pytestmark = pytest.mark.e2e


def _sign(tmp: Path, key: Path, edit=None) -> Path:
    run, pred = load_run(tmp, {"min_read_fraction": 0})
    if edit:
        edit(run)
    return sign_run(run, pred, tmp / "out", key, "2026-03-01T10:00:00Z")


def test_an_honest_load_bundle_is_same_with_every_gate_re_derived_from_raw_files(tmp_path, signer):
    b = _sign(tmp_path, signer[0])
    r = kvgate("report", b, "--pubkey", signer[1], "--out", tmp_path / "rr")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "verdicts: SAME as signed (overall PASS); 1 of 1 gates re-derived from raw files" in r.stdout
    assert json.loads((tmp_path / "rr" / "reevaluation.json").read_text())["gates"][0]["rederived"] is True


def test_a_signed_pass_with_config_0_5_evidence_0_no_device_bytes_an_empty_requests_file_and_a_fallback_differs(
        tmp_path, signer):
    def edit(run: Path):
        g = yaml.safe_load((run / "config" / "gates.yaml").read_text())
        g["gates"][0]["params"]["min_read_fraction"] = 0.5
        (run / "config" / "gates.yaml").write_text(yaml.safe_dump(g, sort_keys=False))
        log = run / "gates" / "L" / "engine-load.log"
        log.write_text(log.read_text() + FALLBACK_LINE)
        res = json.loads((run / "gates" / "L" / "result.json").read_text())
        (run / "gates" / "L" / res["evidence"]["points"][-1]["requests_file"]).write_text("")
    b = _sign(tmp_path, signer[0], edit)
    assert json.loads((b / "gates" / "L" / "result.json").read_text())["evidence"]["min_read_fraction"] == 0
    r = kvgate("report", b, "--pubkey", signer[1], "--out", tmp_path / "rr")
    assert r.returncode == 1, r.stdout + r.stderr
    assert ("verdicts: DIFFER from the signed ones (0 of 1 gates re-derived from raw files (raw files missing or "
            "unreadable, ERROR: L)):") in r.stdout
    assert "L: outcome signed 'PASS', re-evaluated 'ERROR'" in r.stdout  # the empty requests file first
    assert "a load point's requests is empty" in (tmp_path / "rr" / "report.md").read_text()


def test_a_signed_pass_whose_engine_log_says_it_fell_back_differs(tmp_path, signer):
    def edit(run: Path):
        log = run / "gates" / "L" / "engine-load.log"
        log.write_text(log.read_text() + FALLBACK_LINE)
    b = _sign(tmp_path, signer[0], edit)
    r = kvgate("report", b, "--pubkey", signer[1], "--out", tmp_path / "rr")
    assert r.returncode == 1 and "L: outcome signed 'PASS', re-evaluated 'INVALID'" in r.stdout, r.stdout
    assert "degraded mode (recompute)" in (tmp_path / "rr" / "report.md").read_text()


def test_a_signed_pass_judged_on_the_evidences_bound_not_the_configs_differs(tmp_path, signer):
    def edit(run: Path):
        g = yaml.safe_load((run / "config" / "gates.yaml").read_text())
        g["gates"][0]["params"]["min_read_fraction"] = 0.5
        (run / "config" / "gates.yaml").write_text(yaml.safe_dump(g, sort_keys=False))
    b = _sign(tmp_path, signer[0], edit)
    r = kvgate("report", b, "--pubkey", signer[1], "--out", tmp_path / "rr")
    assert r.returncode == 1 and "L: outcome signed 'PASS', re-evaluated 'INVALID'" in r.stdout, r.stdout
    assert "read fraction" in (tmp_path / "rr" / "report.md").read_text()
