"""kvgate as a user runs it: over real SSH to localhost, real fio on a file target, signed bundle.

The runs are ``python -m harness run``; keygen, plan and verify are processes forked from a server that imported
kvgate once (tests/kvgate_fork.py, checked against ``python -m`` in tests/e2e/test_bad_inputs.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from polling import wait_no_process
from signals import default_signals
import yaml

from kvgate_cli import kvgate as kvgate_python_m
from kvgate_fork import ForkServer

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def kvgate():
    """``kvgate ARGS`` (home=, env=) as tests/kvgate_cli.py runs it, each command forked from one server."""
    with ForkServer() as server:
        yield server.kvgate


def write_inventory(tmp_path, sshd, target_path):
    node = sshd.node_yaml("sshlocal")
    node.update({"work_dir": str(tmp_path / "work"), "read_streams": 2,
                 "targets": [{"name": "scratch", "kind": "file", "path": str(target_path), "size": "64 MiB"}]})
    inv = tmp_path / "inventory.yaml"
    inv.write_text(yaml.safe_dump({"nodes": [node]}))
    return inv


def write_gates(tmp_path, g1_pass, g1_stop, name="gates.yaml"):
    g1 = {"id": "G1", "title": "cold read", "workload": "fio-read",
          "params": {"target": "scratch", "bs": "256 KiB", "iodepth": 4, "runtime_s": 1, "ramp_s": 0},
          "metric": "per_gpu_read_gb_s", "pass": g1_pass, "stop_loss": g1_stop,
          "reference": {"value": "5.23 GB/s"}}
    g1b = dict(g1, id="G1b", title="random 4k read", params=dict(g1["params"], rw="randread", bs="4 KiB"),
               **{"pass": ">= 1 MB/s", "stop_loss": "< 0.001 MB/s"})
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"suite": {"name": "e2e", "version": 1}, "gates": [g1, g1b]}, sort_keys=False))
    return path


def test_run_over_ssh_produces_a_bundle_that_verifies(tmp_path, sshd, kvgate):
    # shell metacharacters stay one literal argument on the remote side
    target = tmp_path / "data" / "target bin &|`touch pwned`$(touch pwned)"
    inv = write_inventory(tmp_path, sshd, target)
    gates = write_gates(tmp_path, ">= 1 MB/s", "< 0.01 MB/s")
    assert kvgate("keygen", "--out", tmp_path / "op").returncode == 0
    out = tmp_path / "out"
    r = kvgate_python_m("run", "-i", inv, "-g", gates, "--out", out, "--key", tmp_path / "op.key",
                        "--known-hosts", sshd.known_hosts)
    assert r.returncode == 0, r.stdout + r.stderr
    report_id = next(l.split(": ")[1] for l in r.stdout.splitlines() if l.startswith("report ID: "))
    bundle = out / report_id
    assert (bundle / "report.md").read_text().count(report_id) >= 1
    assert target.exists() and target.stat().st_size == 64 * 2**20
    assert not list(tmp_path.rglob("pwned"))
    v = kvgate("verify", f"{bundle}.tar.gz", "--pubkey", tmp_path / "op.pub")
    assert v.returncode == 0 and v.stdout.startswith(f"OK {report_id}"), v.stdout
    verdicts = json.loads((bundle / "verdicts.json").read_text())
    assert [x["outcome"] for x in verdicts["verdicts"]] == ["PASS", "PASS"]
    g1 = verdicts["verdicts"][0]
    assert g1["evidence"]["nodes"]["sshlocal"]["page_cache_dropped"] is True
    assert len(g1["evidence"]["streams"]) == 2
    # raw fio output and every step's argv/stdout/stderr/rc are in the bundle
    assert (bundle / "gates" / "G1" / "sshlocal" / "fio.json").exists()
    fio_steps = [d for d in (bundle / "steps").iterdir() if d.name.endswith("-fio")]
    assert fio_steps and all((d / f).exists() for d in fio_steps for f in ("argv.json", "stdout", "stderr", "rc", "status.json"))
    assert not list(bundle.rglob("*.key"))
    assert "PRIVATE KEY" not in "".join(p.read_text(errors="replace") for p in bundle.rglob("*") if p.is_file())
    # a tampered raw file is caught
    (bundle / "gates" / "G1" / "sshlocal" / "fio.json").write_text("{}")
    v = kvgate("verify", bundle, "--pubkey", tmp_path / "op.pub")
    assert v.returncode == 1 and "gates/G1/sshlocal/fio.json" in v.stdout


def test_stop_loss_ends_with_exit_4_and_skips_later_gates(tmp_path, sshd):
    inv = write_inventory(tmp_path, sshd, tmp_path / "t.bin")
    gates = write_gates(tmp_path, ">= 10000 GB/s", "< 5000 GB/s")
    r = kvgate_python_m("run", "-i", inv, "-g", gates, "--out", tmp_path / "out", "--known-hosts",
                        sshd.known_hosts, env={"KVGATE_HOME": str(tmp_path / "home")})
    assert r.returncode == 4, r.stdout + r.stderr
    lines = {l.split()[0]: l.split()[1] for l in r.stdout.splitlines() if l.startswith("G1")}
    assert lines == {"G1": "STOP", "G1b": "SKIPPED"}
    assert "overall: STOP" in r.stdout
    bundle = next(p for p in (tmp_path / "out").iterdir() if p.is_dir() and p.name.startswith("KVG-"))
    md = (bundle / "report.md").read_text()
    assert "DEVELOPMENT key" in md and "skipped: stop-loss hit at G1" in md


def test_unknown_host_key_is_an_infrastructure_error(tmp_path, sshd):
    inv = write_inventory(tmp_path, sshd, tmp_path / "t.bin")
    gates = write_gates(tmp_path, ">= 1 MB/s", "< 0.01 MB/s")
    r = kvgate_python_m("run", "-i", inv, "-g", gates, "--out", tmp_path / "out", "--known-hosts",
                        tmp_path / "none", env={"KVGATE_HOME": str(tmp_path / "home")})
    assert r.returncode == 3
    assert "unknown host key" in r.stderr and "ERROR" in r.stdout
    assert "overall: ERROR" in r.stdout


def test_plan_runs_nothing(tmp_path, sshd, kvgate):
    target = tmp_path / "never-created.bin"
    inv = write_inventory(tmp_path, sshd, target)
    gates = write_gates(tmp_path, ">= 1 MB/s", "< 0.01 MB/s")
    r = kvgate("plan", "-i", inv, "-g", gates)
    assert r.returncode == 0
    assert "fio --output-format=json" in r.stdout and "[sshlocal]" in r.stdout
    assert not target.exists()


def test_default_run_without_arguments(tmp_path, kvgate):
    r = kvgate_python_m("run", "--out", tmp_path / "out", env={"KVGATE_HOME": str(tmp_path / "home")})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "development key" in r.stderr
    tar = next((tmp_path / "out").glob("KVG-*.tar.gz"))
    v = kvgate("verify", tar, "--pubkey", tmp_path / "home" / "dev-signing.pub")
    assert v.returncode == 0 and "(development key)" in v.stdout


def test_ctrl_c_stops_remote_fio_keeps_partial_results_and_writes_no_bundle(tmp_path, sshd):
    import signal
    import time
    inv = write_inventory(tmp_path, sshd, tmp_path / "t.bin")
    gates = tmp_path / "long.yaml"
    gates.write_text(yaml.safe_dump({"suite": {"name": "long", "version": 1}, "gates": [{
        "id": "G1", "title": "long read", "workload": "fio-read", "metric": "per_gpu_read_gb_s",
        "pass": ">= 1 MB/s", "params": {"target": "scratch", "runtime_s": 120, "ramp_s": 0, "bs": "4 KiB",
                                        "rw": "randread", "iodepth": 1}}]}))
    out = tmp_path / "out"
    e = dict(os.environ, KVGATE_HOME=str(tmp_path / "home"))
    p = subprocess.Popen([sys.executable, "-m", "harness", "run", "-i", str(inv), "-g", str(gates), "--out", str(out),
                          "--known-hosts", str(sshd.known_hosts)], cwd=ROOT, env=e, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True,
                         preexec_fn=default_signals)  # Ctrl-C works whatever SIGINT was for the suite
    job = str(tmp_path / "work")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if subprocess.run(["pgrep", "-f", f"fio --output-format=json {job}"], capture_output=True).stdout:
            break
        time.sleep(0.2)
    else:
        p.kill()
        pytest.fail("fio never started")
    time.sleep(1)
    p.send_signal(signal.SIGINT)
    stdout, stderr = p.communicate(timeout=60)
    assert p.returncode == 130, stdout + stderr
    assert "no bundle was written" in stderr
    wait_no_process(f"fio --output-format=json {job}")
    run_dirs = [d for d in out.iterdir() if d.name.startswith("run-")]
    assert len(run_dirs) == 1 and not [d for d in out.iterdir() if d.name.startswith("KVG-")]
    summary = json.loads((run_dirs[0] / "verdicts.json").read_text())
    assert summary["overall"] != "PASS" and summary["run"]["interrupted"] is True
    assert (run_dirs[0] / "steps").is_dir()
