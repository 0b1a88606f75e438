"""kvgate run as a user runs it, with secrets in an engine profile: the real cpu-reference engine (real LMCache)
on the local transport, its profile's environment holding a token and a licence that the engine prints into its
log. Every process's command line is watched while the run goes on; afterwards no byte of the bundle, its
archive, or what kvgate printed holds a secret, and the engine did get them."""

import json
import os
import secrets
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import pytest
import yaml

from kvgate_cli import ROOT as CHECKOUT, kvgate

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def canary() -> str:
    return "kvcanary" + secrets.token_hex(12)


class CmdlineWatch:
    """Reads every process's /proc/PID/cmdline until stopped; keeps those that hold one of ``values``."""

    def __init__(self, values):
        self.values = [v.encode() for v in values]
        self.seen: list[str] = []
        self.scans = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        while not self._stop.is_set():
            for pid in os.listdir("/proc"):
                if not pid.isdigit():
                    continue
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                if any(v in cmd for v in self.values):
                    self.seen.append(pid + ": " + cmd.replace(b"\0", b" ").decode(errors="replace"))
            self.scans += 1
            self._stop.wait(0.02)

    def stop(self):
        self._stop.set()
        self._t.join(10)


def test_a_cli_run_with_profile_secrets_leaves_them_nowhere(tmp_path):
    token, licence = canary(), canary()
    prof = yaml.safe_load((ROOT / "workloads" / "engines" / "cpu-reference.yaml").read_text())
    prof["env"].update(HF_TOKEN=token, VENDOR_LICENSE=licence)
    prof["secret_env"] = ["VENDOR_LICENSE"]
    # the engine prints its environment's secrets into its log first, then becomes the engine
    prof["argv"] = ["sh", "-c", 'echo "engine env: HF_TOKEN=$HF_TOKEN licence=$VENDOR_LICENSE"; exec "$0" "$@"'] \
        + prof["argv"]
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "secret-engine.yaml").write_text(yaml.safe_dump(prof))
    suite = yaml.safe_load((ROOT / "gates" / "g2-cpu-reference.yaml").read_text())
    suite["gates"] = suite["gates"][:1]
    suite["gates"][0]["params"].update(engine=str(cfg / "secret-engine.yaml"), python=sys.executable)
    (cfg / "gates.yaml").write_text(yaml.safe_dump(suite, sort_keys=False))
    (cfg / "inv.yaml").write_text(yaml.safe_dump({"nodes": [{"name": "localhost", "transport": "local",
                                                             "work_dir": str(tmp_path / "work")}]}))
    assert kvgate("keygen", "--out", tmp_path / "op").returncode == 0

    plan = kvgate("plan", "-i", cfg / "inv.yaml", "-g", cfg / "gates.yaml")
    assert plan.returncode == 0 and "cpu_reference.py" in plan.stdout, plan.stderr
    assert token not in plan.stdout + plan.stderr and licence not in plan.stdout + plan.stderr

    watch = CmdlineWatch([token, licence])
    try:
        r = subprocess.run([sys.executable, "-m", "harness", "run", "-i", str(cfg / "inv.yaml"),
                            "-g", str(cfg / "gates.yaml"), "--out", str(tmp_path / "out"),
                            "--key", str(tmp_path / "op.key")],
                           capture_output=True, text=True, cwd=CHECKOUT, timeout=900)
    finally:
        watch.stop()
    assert watch.scans > 0 and watch.seen == []
    assert r.returncode in (0, 1), r.stdout + r.stderr  # PASS or a measured FAIL, not an error
    report_id = next(l.split(": ")[1] for l in r.stdout.splitlines() if l.startswith("report ID: "))
    bundle = tmp_path / "out" / report_id
    # the engine got its secrets (it printed them), and its log is in the bundle, redacted
    logs = sorted((bundle / "gates" / "G2").glob("engine-*.log"))
    assert logs and all("engine env: HF_TOKEN=REDACTED licence=REDACTED" in p.read_text() for p in logs)
    spawn = json.loads(next((bundle / "steps").glob("*-spawn-*/argv.json")).read_text())
    assert spawn["env"]["HF_TOKEN"] == spawn["env"]["VENDOR_LICENSE"] == "REDACTED"
    leaks = []
    for p in sorted((tmp_path / "out").rglob("*")):
        if p.is_file():
            data = [p.read_bytes()]
            if p.name.endswith(".tar.gz"):
                with tarfile.open(p) as tf:
                    data += [tf.extractfile(m).read() for m in tf.getmembers() if m.isfile()]
            leaks += [str(p) for d in data for v in (token, licence) if v.encode() in d]
    assert leaks == []
    assert token not in r.stdout + r.stderr and licence not in r.stdout + r.stderr
    rep = kvgate("report", bundle, "--out", tmp_path / "report", "--pubkey", tmp_path / "op.pub")
    assert rep.returncode in (0, 1), rep.stderr
    for p in (tmp_path / "report").rglob("*"):
        assert not p.is_file() or (token.encode() not in p.read_bytes() and licence.encode() not in p.read_bytes())
