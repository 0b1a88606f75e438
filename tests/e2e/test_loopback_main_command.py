"""The README's main command end to end: guest up -> loopback up (target sides) -> suite over NVMe/TCP and NVMe/RDMA
through connect: managed targets -> bundle verifies -> down -> no qemu."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

# a hang guard: the qemu TCG guest is slow on a loaded 2-core host (about 2 minutes when the host is idle)
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(2400)]

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
    try:
        r = subprocess.run(["bash", "scripts/run-loopback-suite.sh", str(tmp_path / "out")], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=2100)
    except subprocess.TimeoutExpired:
        # the script was killed before its trap could stop qemu (its own session): stop it here
        subprocess.run([sys.executable, "-m", "harness", "loopback", "guest-down"], cwd=ROOT, env=env, timeout=120)
        raise
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for gate in ("L1-tcp", "G1-tcp", "L1-rdma", "G1-rdma"):  # integrity and G1 over NVMe/TCP and NVMe/RDMA
        assert f"{gate} PASS" in r.stdout, r.stdout[-3000:]
    tar = next((tmp_path / "out").glob("KVG-*.tar.gz"))
    v = subprocess.run([sys.executable, "-m", "harness", "verify", str(tar), "--pubkey",
                        str(home / "dev-signing.pub")], capture_output=True, text=True, cwd=ROOT)
    assert v.returncode == 0, v.stdout
    bundle = tar.with_name(tar.name[:-len(".tar.gz")])
    import json
    assert "emulation-bound" in (bundle / "config" / "gates.yaml").read_text()
    for transport in ("tcp", "rdma"):  # each read through the kind: nvmeof target kvgate connected, cold
        g1 = json.loads((bundle / "gates" / f"G1-{transport}" / "result.json").read_text())["evidence"]["nodes"]["guest"]
        assert g1["path"].startswith("/dev/nvme") and g1["page_cache_dropped"] is True
        nv = g1["nvmeof"]
        assert nv["transport"] == transport and nv["managed"]["connected_by_kvgate"] is True
        assert [p["state"] for p in nv["paths"]] == ["live"]
        if transport == "rdma":  # the soft-RoCE device on the guest's virtio NIC, not lo
            assert (nv["rdma"][0]["device"], nv["rdma"][0]["netdev"]) == ("kvgate-eth0", "eth0")
    managed = json.loads((bundle / "nodes" / "guest" / "nvmeof-managed.json").read_text())
    assert [(m["target"], m["left_connected"]) for m in managed] == [("kv-tcp", []), ("kv-rdma", [])]
    assert all(m["disconnected"] == m["controllers"] != [] for m in managed)
    report = (bundle / "report.md").read_text()
    assert "over **rdma**, RDMA device kvgate-eth0 port 1 on eth0" in report and "| kvgate-eth0 | 1 | ACTIVE |" in report
    for gate in ("L1-tcp", "L1-rdma"):  # the integrity gates say what they proved, their figures readable
        row = next(line for line in report.splitlines() if line.startswith(f"| {gate} |"))
        assert row.endswith("| data proven; no mismatch proven |"), row
    assert re.search(r"\| `checked_bytes` \| \d+\.\d MiB \(\d+ bytes\) \|", report), report
    assert "guest stopped" in r.stderr
    assert set(qemu_running()) - before == set(), "qemu left running"
