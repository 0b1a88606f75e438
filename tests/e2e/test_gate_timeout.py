"""A gate past its timeout_s: ERROR "timed out after N s", its fio stopped on the node (locally and over
SSH), the next gate still runs, and the bundle is written and verifies. Through the CLI, real fio."""

import json
import os
import time
from pathlib import Path

import pytest
import yaml

from kvgate_cli import kvgate

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def processes_with(text: str) -> list[int]:
    """PIDs whose command line contains ``text`` (read from /proc; processes that vanish are skipped)."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmd:
                pids.append(int(d.name))
    return pids


@pytest.mark.parametrize("transport", ["local", "ssh"])
def test_gate_past_timeout_is_error_its_fio_stopped_and_the_run_goes_on(tmp_path, request, transport):
    work = tmp_path / "work"
    node = {"name": "n1", "transport": "local"}
    extra = []
    if transport == "ssh":
        sshd = request.getfixturevalue("sshd")
        node = sshd.node_yaml("n1")
        extra = ["--known-hosts", sshd.known_hosts]
    node.update({"work_dir": str(work), "read_streams": 1,
                 "targets": [{"name": "scratch", "kind": "file", "path": str(tmp_path / "t.bin"), "size": "32 MiB"}]})
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump({"nodes": [node]}))
    read = {"workload": "fio-read", "metric": "per_gpu_read_gb_s", "pass": ">= 0.001 MB/s",
            "params": {"target": "scratch", "bs": "64 KiB", "iodepth": 1, "runtime_s": 1, "ramp_s": 0}}
    gates = tmp_path / "gates.yaml"
    gates.write_text(yaml.safe_dump({"suite": {"name": "timeout", "version": 1}, "gates": [
        dict(read, id="FILL", title="fills the target, reads 1 s"),
        # 30 s of fio in a gate allowed 3 s; no page-cache drop so fio is the only long step
        dict(read, id="LONG", title="30 s read, 3 s allowed", timeout_s=3,
             params=dict(read["params"], runtime_s=30, rw="randread", bs="4 KiB", drop_caches=False)),
        dict(read, id="AFTER", title="runs after the timed-out gate"),
    ]}, sort_keys=False))
    assert kvgate("keygen", "--out", tmp_path / "op").returncode == 0
    out = tmp_path / "out"
    r = kvgate("run", "-i", inv, "-g", gates, "--out", out, "--key", tmp_path / "op.key", *extra)
    assert r.returncode == 3, r.stdout + r.stderr  # a gate ERROR is an infrastructure error

    job = str(work / "kvgate-LONG-n1.fio")
    deadline = time.monotonic() + 60  # hang guard only: the run already stopped the process group
    while processes_with(job) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_with(job) == [], "fio of the timed-out gate still running"

    report_id = next(l.split(": ")[1] for l in r.stdout.splitlines() if l.startswith("report ID: "))
    bundle = out / report_id
    verdicts = {v["gate_id"]: v for v in json.loads((bundle / "verdicts.json").read_text())["verdicts"]}
    long = verdicts["LONG"]
    assert long["outcome"] == "ERROR" and long["reason"].startswith("timed out after 3 s"), long["reason"]
    assert long["evidence"]["stopped_process_groups"] == {"n1": 1}  # the running fio, killed as a group
    fio_step = next(d for d in (bundle / "steps").iterdir() if d.name.endswith("-n1-fio")
                    and "kvgate-LONG" in (d / "argv.json").read_text())
    assert json.loads((fio_step / "status.json").read_text())["status"] != "ok"
    assert verdicts["AFTER"]["outcome"] == "PASS", verdicts["AFTER"]["reason"]
    assert (bundle / "gates" / "AFTER" / "n1" / "fio.json").exists()
    v = kvgate("verify", f"{bundle}.tar.gz", "--pubkey", tmp_path / "op.pub")
    assert v.returncode == 0 and v.stdout.startswith(f"OK {report_id}"), v.stdout + v.stderr
