"""Real signed bundles for the cosign / keyring / library tests, made with kvgate's own bundle code.

Acceptance bundles are the fixed report run (tests/fixtures/reports/) signed by ``write_bundle`` with the
reports rendered by ``render_bundle_reports``, as a run writes them; only the predicate's suite name,
verdict figures and creation time vary (``clock`` is write_bundle's seam for the creation time). Cost
bundles here are minimal (a results table and the cost predicate's citing fields): the real ``kvgate cost``
path is exercised in tests/e2e/test_evidence_cli.py.
"""

from __future__ import annotations

import base64
import json
import shutil
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from harness.report.bundle import BundleInfo, key_fingerprint, load_private_key, write_bundle
from harness.report.render import render_bundle_reports
from report_fixture import fixed_run

UTC = "%Y-%m-%dT%H:%M:%SZ"


def clock_at(utc: str):
    return lambda: time.strptime(utc, UTC)


def acceptance_bundle(tmp: Path, out: Path, key_path: Path, created_utc: str, *, suite: str = "fixed-report",
                      g1_gb_s: float | None = None, make_tar: bool = True) -> BundleInfo:
    """The fixed three-gate run as a signed bundle created at ``created_utc``; G1's figure set to ``g1_gb_s``
    when given, judged against a >= 5 GB/s pass and < 3 GB/s stop-loss (the verdict says so too)."""
    key = load_private_key(key_path)
    work = Path(tmp) / f"src-{suite}-{created_utc.replace(':', '')}-{g1_gb_s}"
    work.mkdir(parents=True)
    run, pred = fixed_run(work)
    pred["suite"]["name"] = suite
    pred["signing_key"] = {"kind": "operator", "fingerprint": key_fingerprint(key.public_key())}
    if g1_gb_s is not None:
        g1 = pred["verdicts"][0]
        g1["actual"] = g1_gb_s
        g1["metrics"] = dict(g1.get("metrics") or {}, per_gpu_read_gb_s=g1_gb_s)
        g1["pass_threshold"], g1["stop_loss_threshold"] = ">= 5 GB/s", "< 3 GB/s"
        g1["outcome"] = "PASS" if g1_gb_s >= 5.0 else "STOP" if g1_gb_s < 3.0 else "FAIL"
        pred["overall"] = "PASS" if all(v["outcome"] == "PASS" for v in pred["verdicts"]) else g1["outcome"]
    return write_bundle(run, out, key, pred, make_tar=make_tar, clock=clock_at(created_utc),
                        render=lambda rid, d: render_bundle_reports(rid, d, pred))


def cost_bundle(tmp: Path, out: Path, key_path: Path, created_utc: str, cites: list[str],
                net_usd_per_month: float = 1234.5) -> BundleInfo:
    """A minimal signed cost bundle citing ``cites`` (the fields the library reads from a kvgate cost bundle)."""
    key = load_private_key(key_path)
    run = Path(tmp) / f"cost-src-{created_utc.replace(':', '')}"
    (run / "tables").mkdir(parents=True)
    (run / "tables" / "results.csv").write_text(
        f"output,value,unit\nnet_usd_per_month,{net_usd_per_month},USD/month\nbreak_even_hit_rate,0.125,ratio\n")
    pred = {"kind": "kvgate-cost/v1", "input_report_ids": list(cites), "measured_inputs": [], "model": "test-model",
            "signing_key": {"kind": "operator", "fingerprint": key_fingerprint(key.public_key())}}

    def render(rid: str, d: Path) -> list[str]:
        (d / "report.md").write_text(f"# cost {rid}\n")
        (d / "report.html").write_text(f"<!DOCTYPE html><html><head><title>{rid} kvgate cost</title></head>"
                                       f"<body><h1>{rid}</h1></body></html>\n")
        return ["report.html", "report.md"]

    return write_bundle(run, out, key, pred, clock=clock_at(created_utc), render=render, move=True)


def statement(bundle_dir: Path) -> tuple[dict, bytes]:
    env = json.loads((Path(bundle_dir) / "attestation.dsse.json").read_text())
    payload = base64.b64decode(env["payload"])
    return json.loads(payload), payload


def created_of(bundle_dir: Path) -> datetime:
    st, _ = statement(bundle_dir)
    return datetime.strptime(st["predicate"]["created_utc"], UTC).replace(tzinfo=timezone.utc)


def later(t: datetime, **kw) -> datetime:
    return t + timedelta(**kw)


def copy_bundle(src: Path, dst_parent: Path) -> Path:
    dst_parent.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copytree(src, dst_parent / src.name))
