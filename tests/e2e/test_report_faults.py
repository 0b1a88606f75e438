"""`kvgate report` on the captured fio-faults run (tests/fixtures/faults/: F1, path A down mid-read in the loopback
guest, PASS) signed as a run signs it: as captured it re-derives SAME; signed with path A idle before its fault (as
native multipath with iopolicy numa leaves it) or with fio's JSON cut short, the signed PASS DIFFERS, exit 1
(issue 35)."""

from __future__ import annotations

from pathlib import Path

import pytest

from faults_fixture import faults_run, idle_faulted_path, raw
from report_fixture import sign_run
from kvgate_cli import kvgate

pytestmark = pytest.mark.e2e


def _sign(tmp: Path, key: Path, edit=None) -> Path:
    run, pred = faults_run(tmp)
    if edit:
        edit(run)
    return sign_run(run, pred, tmp / "out", key, "2026-12-04T15:00:00Z")


def _report(tmp: Path, bundle: Path, pub: Path):
    return kvgate("report", bundle, "--pubkey", pub, "--out", tmp / "rr")


def test_the_captured_faulted_read_re_derives_same_from_its_raw_files(tmp_path, signer):
    r = _report(tmp_path, _sign(tmp_path, signer[0]), signer[1])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "verdicts: SAME as signed (overall PASS); 1 of 1 gates re-derived from raw files" in r.stdout


def test_fault_felt_a_signed_pass_whose_faulted_path_carried_no_reads_differs(tmp_path, signer):
    r = _report(tmp_path, _sign(tmp_path, signer[0], idle_faulted_path), signer[1])
    assert r.returncode == 1, r.stdout + r.stderr
    assert "F1-path-down: outcome signed 'PASS', re-evaluated 'INVALID'" in r.stdout
    assert "fault felt: not proven" in (tmp_path / "rr" / "report.md").read_text()


def test_failed_reads_unknown_a_signed_pass_whose_fio_json_is_cut_short_differs(tmp_path, signer):
    def cut(run: Path):
        text = raw(run, "fio.json").read_text()
        raw(run, "fio.json").write_text(text[: len(text) // 2])
    r = _report(tmp_path, _sign(tmp_path, signer[0], cut), signer[1])
    assert r.returncode == 1 and "F1-path-down: outcome signed 'PASS', re-evaluated 'INVALID'" in r.stdout, r.stdout
    assert "integrity checked: not proven" in (tmp_path / "rr" / "report.md").read_text()
