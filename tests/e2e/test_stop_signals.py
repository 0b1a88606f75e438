"""kvgate stopped by a signal, as a user (Ctrl-C), a closed terminal (SIGHUP) or a scheduler cancelling a job
(SIGTERM: CI, Slurm, Kubernetes) stops it: the signal goes to kvgate alone, mid-way through a long fio gate on a
local file. kvgate stops every process it started, keeps the partial results, writes no bundle, says in its log
that it was stopped and by what, and exits 128 + the signal's number. The processes are found by a tag unique
to the test in their environment, never by name."""

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from polling import wait_until
from signals import default_signals, processes_tagged

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def kill_tagged(tag: str) -> None:
    for pid in processes_tagged(tag):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGHUP, 129), (signal.SIGINT, 130)],
                         ids=["SIGTERM", "SIGHUP", "SIGINT"])
def test_a_stop_signal_stops_every_process_kvgate_started_and_keeps_partial_results(tmp_path, request, sig, code):
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump({"nodes": [{
        "name": "n1", "transport": "local", "work_dir": str(tmp_path / "work"), "read_streams": 3,
        "targets": [{"name": "scratch", "kind": "file", "path": str(tmp_path / "t.bin"), "size": "16 MiB"}]}]}))
    gates = tmp_path / "gates.yaml"
    gates.write_text(yaml.safe_dump({"suite": {"name": "long", "version": 1}, "gates": [{
        "id": "G1", "title": "a long read", "workload": "fio-read", "metric": "per_gpu_read_gb_s",
        "pass": ">= 1 MB/s", "params": {"target": "scratch", "runtime_s": 300, "ramp_s": 0, "bs": "4 KiB",
                                        "rw": "randread", "iodepth": 1, "drop_caches": False}}]}))
    out = tmp_path / "out"
    tag = f"kvgate-stop-test-{uuid.uuid4().hex}"
    env = dict(os.environ, KVGATE_HOME=str(tmp_path / "home"), KVGATE_STOP_TEST_TAG=tag)
    p = subprocess.Popen([sys.executable, "-m", "harness", "run", "-i", str(inv), "-g", str(gates), "--out", str(out)],
                         cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=default_signals)
    try:
        def cmdline(pid: int) -> list[bytes]:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    return f.read().split(b"\0")
            except OSError:
                return []

        def fio_running():  # the gate's fio read (not the facts' `fio --version`), and what else kvgate runs
            pids = [q for q in processes_tagged(tag) if q != p.pid]
            return pids if any(cmdline(q)[:2] == [b"fio", b"--output-format=json"] for q in pids) else []
        started = wait_until(fio_running, 120, "kvgate's fio running")
        assert p.poll() is None
        p.send_signal(sig)  # to kvgate only: its commands run in their own sessions
        stdout, stderr = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
        request.addfinalizer(lambda: kill_tagged(tag))  # what a failing kvgate left behind, found by the tag
    name = signal.Signals(sig).name
    assert p.returncode == code, stdout + stderr
    if sig != signal.SIGINT:
        assert f"kvgate: {name} received: stopping" in stderr, stderr
    stopped_by = name if sig != signal.SIGINT else "Ctrl-C"
    assert f"interrupted ({stopped_by}): partial results kept in" in stderr, stderr
    assert "no bundle was written" in stderr
    # no process kvgate started outlives it (the fio it ran included)
    wait_until(lambda: not processes_tagged(tag), 60, f"no process tagged {tag}: {processes_tagged(tag)}")
    assert all(not os.path.exists(f"/proc/{q}") for q in started)
    run_dirs = [d for d in out.iterdir() if d.name.startswith("run-")]
    assert len(run_dirs) == 1 and not [d for d in out.iterdir() if d.name.startswith("KVG-")]
    summary = json.loads((run_dirs[0] / "verdicts.json").read_text())
    assert summary["overall"] != "PASS" and summary["run"]["interrupted"] is True
    (g1,) = summary["verdicts"]
    stopped_by = name if sig != signal.SIGINT else "Ctrl-C"
    assert g1["outcome"] == "ERROR" and f"interrupted by the operator ({stopped_by})" in g1["reason"], g1
    assert (run_dirs[0] / "steps").is_dir()
