"""The README's main command end to end: guest up -> loopback up -> suite -> bundle verifies -> down -> no qemu."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def qemu_running() -> list[str]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes()
                state = (d / "stat").read_text().split(")")[-1].split()[0]
            except OSError:
                continue
            if cmd.startswith(b"qemu-system") and state != "Z":
                out.append(d.name)
    return out


def test_run_loopback_suite_script(tmp_path):
    before = set(qemu_running())
    home = tmp_path / "home"
    env = dict(os.environ, KVGATE_HOME=str(home), KVGATE=f"{sys.executable} -m harness")
    r = subprocess.run(["bash", "scripts/run-loopback-suite.sh", str(tmp_path / "out")], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "L1     PASS" in r.stdout and "G1     PASS" in r.stdout
    tar = next((tmp_path / "out").glob("KVG-*.tar.gz"))
    v = subprocess.run([sys.executable, "-m", "harness", "verify", str(tar), "--pubkey",
                        str(home / "dev-signing.pub")], capture_output=True, text=True, cwd=ROOT)
    assert v.returncode == 0, v.stdout
    bundle = tar.with_name(tar.name[:-len(".tar.gz")])
    import json
    assert "emulation-bound" in (bundle / "config" / "gates.yaml").read_text()
    g1 = json.loads((bundle / "gates" / "G1" / "result.json").read_text())["evidence"]["nodes"]["guest"]
    assert g1["path"].startswith("/dev/nvme") and g1["page_cache_dropped"] is True  # read through NVMe/TCP, cold
    assert "guest stopped" in r.stderr
    assert set(qemu_running()) - before == set(), "qemu left running"
