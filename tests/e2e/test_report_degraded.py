"""`kvgate report` on a signed g2-faults bundle whose result is DEGRADED (requests the engine re-computed while its
path to the tier was lost): result.json's ``degraded`` key is read back, the verdict re-derived from the raw request
records, SAME, exit 0 (issue 35: it was refused, "unknown key 'degraded'")."""

from __future__ import annotations

import json
import time

import pytest

from g2_faults_fixture import Tier, signed_faults_run
from harness.report.bundle import generate_keypair, load_private_key, write_bundle
from kvgate_cli import kvgate

pytestmark = pytest.mark.e2e


def test_degraded_key_a_signed_degraded_g2_faults_bundle_re_verifies_same(tmp_path):
    key, pub = generate_keypair(tmp_path / "signer")
    run = tmp_path / "run"
    run.mkdir()
    result, pred, ctx = signed_faults_run(run, Tier())
    assert "degraded" in json.loads((ctx.gate_dir / "result.json").read_text())
    b = write_bundle(run, tmp_path / "out", load_private_key(key), pred, make_tar=False,
                     clock=lambda: time.strptime("2026-12-04T15:00:00Z", "%Y-%m-%dT%H:%M:%SZ")).path
    r = kvgate("report", b, "--pubkey", pub, "--out", tmp_path / "rr")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "verdicts: SAME as signed (overall PASS); 1 of 1 gates re-derived from raw files" in r.stdout
    assert "DEGRADED:" in (tmp_path / "rr" / "report.md").read_text()
