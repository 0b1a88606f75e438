#!/usr/bin/env python3
"""G1 through the KV connector against fio on the same chunk files, over the NVMe-oF loopback, for many rounds in
one guest boot: how much of fio's rate LMCache's read reaches (connector efficiency), with its median and spread.

The shipped gate gates/loopback-kv-read.yaml runs once as a user runs it (`kvgate loopback guest-up --engine-python
... ; kvgate loopback up -i inventory/loopback-kv-read.yaml ; kvgate run ...`): it lays the KV out (48 MiB, 12
chunks of 4 MiB) on ext4 on the namespace read over NVMe/TCP, reads it back through LMCache 0.5.6 and reads the
same files with fio, once each. Then, on the layout it left, one engine interpreter in the guest imports torch and
LMCache once (kv_reader.py's own ``preload``) and, on request, drops the page cache and reads the KV back through
LMCache in a process forked from it (kv_reader.py's ``read``, as the gate's import_once does), while fio reads the
same files with the gate's own job file between those reads (the page cache dropped first), alternating which
goes first by round. Each read's pool-device bytes are counted (the namespace must read every KV byte: cold).

    python3 benchmarks/kv_read_loopback_rounds.py [--rounds 10] [--out DIR]

Figures are qemu TCG's (emulation-bound): what is compared is the two readers on the same device at the same time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.parsers.fio import parse_fio_json  # noqa: E402
from harness.parsers.kvread import parse_read  # noqa: E402
from harness.rigs import guest as G  # noqa: E402
from harness.transport import SSHTransport  # noqa: E402
from harness.workloads.kv_read import READER_ENV  # noqa: E402

GATE = "G1C-tcp"
DRIVER = r'''
import json, sys, time
sys.path.insert(0, sys.argv[1])
import kv_reader as K
spec = K.load_spec(sys.argv[1] + "/spec.json")
print(json.dumps({"type": "import", "import_s": K.preload()}), flush=True)
for line in sys.stdin:
    if line.strip() != "read":
        break
    drop = K.drop_page_cache()
    t0 = time.monotonic()
    doc = K.read(spec, start_method="fork")
    print(json.dumps({"type": "read", "drop": drop, "wall_s": time.monotonic() - t0, "doc": doc}), flush=True)
'''


def kvgate(home: Path, *args: str, timeout: int = 1800) -> subprocess.CompletedProcess:
    env = dict(os.environ, KVGATE_HOME=str(home))
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def must(cp: subprocess.CompletedProcess, what: str) -> subprocess.CompletedProcess:
    if cp.returncode != 0:
        raise SystemExit(f"{what} failed (exit {cp.returncode}): {cp.stdout[-2000:]}\n{cp.stderr[-3000:]}")
    return cp


def spread(values: list[float]) -> str:
    v = sorted(values)
    q = statistics.quantiles(v, n=4) if len(v) > 1 else [v[0]] * 3
    return (f"{v[0]:.3f} | {q[0]:.3f} | {statistics.median(v):.3f} | {q[2]:.3f} | {v[-1]:.3f} | "
            f"{v[-1] / v[0]:.2f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="kvgate-kv-read-rounds-"))
    out.mkdir(parents=True, exist_ok=True)
    home, state_dir = out / "home", out / "guest"
    inv = yaml.safe_load((ROOT / "inventory" / "loopback-kv-read.yaml").read_text())
    inv["nodes"][0]["labels"]["kvgate-guest"] = str(state_dir)
    inv_path = out / "inventory.yaml"
    inv_path.write_text(yaml.safe_dump(inv, sort_keys=False))
    t0 = time.monotonic()
    must(kvgate(home, "loopback", "guest-up", "--state-dir", str(state_dir), "--engine-python", sys.executable,
                "--kernel-args", "nvme_core.multipath=N", "--boot-timeout-s", "600"), "guest-up")
    rows, gate = [], {}
    try:
        must(kvgate(home, "loopback", "up", "-i", str(inv_path), "--state-dir", str(state_dir), "--steps-dir",
                    str(out / "up")), "loopback up")
        try:
            run = kvgate(home, "run", "-i", str(inv_path), "-g", str(ROOT / "gates" / "loopback-kv-read.yaml"),
                         "--out", str(out / "run"), timeout=3000)
            result = json.loads(next((out / "run").glob(f"KVG-*/gates/{GATE}/result.json")).read_text())
            gate = {k: result["metrics"].get(k) for k in ("connector_read_gb_s", "fio_read_gb_s",
                                                          "connector_efficiency")}
            text = next((out / "run").glob(f"KVG-*/gates/{GATE}/guest/fio.json")).read_text()
            gate["fio_clat_max_s"] = json.loads(text[text.index("{"):])["jobs"][0]["read"]["clat_ns"]["max"] / 1e9
            print(f"the gate as shipped (exit {run.returncode}): {gate}", file=sys.stderr, flush=True)
            rows = rounds(state_dir, inv, a.rounds, out)
        finally:
            kvgate(home, "loopback", "down", "-i", str(inv_path), "--state-dir", str(state_dir), "--steps-dir",
                   str(out / "down"))
    finally:
        G.stop_guest(state_dir)
    (out / "rounds.json").write_text(json.dumps({"gate": gate, "rounds": rows}, indent=1))
    good = [r for r in rows if r.get("connector_mb_s") and r.get("fio_mb_s")]
    if not good:
        print(f"no round with both figures: {out}")
        return 1
    print(f"\nkv-read over NVMe/TCP in the guest, {len(good)} rounds ({time.monotonic() - t0:.0f} s in all; {out})")
    print("| figure | min | p25 | median | p75 | max | max/min |\n|---|---:|---:|---:|---:|---:|---:|")
    for name, key in (("connector MB/s", "connector_mb_s"), ("fio MB/s", "fio_mb_s"),
                      ("efficiency (connector / fio)", "efficiency")):
        print(f"| {name} | {spread([r[key] for r in good])} |")
    for first in ("connector", "fio"):
        mine = [r["efficiency"] for r in good if r["first"] == first]
        if mine:
            print(f"{first} first: efficiency median {statistics.median(mine):.3f} ({min(mine):.3f}-{max(mine):.3f})")
    cold = all((r["connector_device_bytes"] or 0) >= r["kv_bytes"] and (r["fio_device_bytes"] or 0) >= r["kv_bytes"]
               for r in good)
    print(f"every read cold (the namespace read every KV byte, both readers, every round): {cold}")
    return 0 if good and cold else 1


def rounds(state_dir: Path, inv: dict, n: int, out: Path) -> list[dict]:
    """``n`` alternating rounds of the connector's read (from one pre-imported interpreter) and fio's."""
    st = G.guest_running(state_dir)
    tr = SSHTransport(st.host, st.ssh_port, st.user, st.identity_file, known_hosts_path=st.known_hosts_path,
                      name="guest", connect_timeout_s=90)
    run_dir = f"{inv['nodes'][0]['work_dir']}/kvgate-kvread-{GATE}-guest"
    drv = f"{run_dir}/rounds_driver.py"
    (out / "rounds_driver.py").write_text(DRIVER)
    tr.put(out / "rounds_driver.py", drv)
    spec = json.loads((next((out / "run").glob(f"KVG-*/gates/{GATE}/guest/spec.json"))).read_text())
    ssh = ["ssh", "-i", str(st.identity_file), "-o", f"UserKnownHostsFile={st.known_hosts_path}",
           "-o", "BatchMode=yes", "-p", str(st.ssh_port), f"{st.user}@{st.host}"]
    # the reader's environment as the gate sets it (PYTHONHASHSEED=0: LMCache's chunk keys hash as the layout's did)
    env = [f"{k}={v}" for k, v in READER_ENV.items()]
    proc = subprocess.Popen(ssh + ["env", *env, G.ENGINE_PYTHON, drv, run_dir], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE,
                            stderr=open(out / "driver.stderr", "w"), text=True)
    rows = []
    try:
        first = json.loads(proc.stdout.readline())
        print(f"driver imported torch and LMCache in {first['import_s']:.0f} s", file=sys.stderr, flush=True)
        for rnd in range(n):
            row = {"round": rnd, "first": "connector" if rnd % 2 == 0 else "fio"}
            for side in (("connector", "fio") if rnd % 2 == 0 else ("fio", "connector")):
                if side == "connector":
                    proc.stdin.write("read\n")
                    proc.stdin.flush()
                    line = proc.stdout.readline()
                    with open(out / "driver.jsonl", "a") as fh:
                        fh.write(line)
                    doc = json.loads(line)
                    rr = parse_read(json.dumps(doc["doc"]))
                    (s,) = rr.streams
                    row.update(connector_mb_s=s.read_gb_s * 1e3 if s.read_gb_s else None, kv_bytes=rr.kv_bytes,
                               connector_device_bytes=rr.device_read_bytes, dropped=doc["drop"]["dropped"],
                               mismatches=len(s.mismatches), missing=len(s.missing),
                               retrieve_max_s=max(s.retrieve_s) if s.retrieve_s else None)
                else:
                    r = tr.run(["sh", "-c", f"sync && echo 3 > /proc/sys/vm/drop_caches && cat {spec['device_stat']} "
                                f"&& fio --output-format=json {run_dir}/kv-fio.job > {run_dir}/rounds-fio.json && "
                                f"cat {spec['device_stat']}"], timeout_s=900)
                    if not r.ok:
                        raise SystemExit(f"fio round {rnd}: {r.summary()}")
                    before, after = (int(line.split()[2]) * 512 for line in r.stdout.strip().splitlines()[-2:])
                    text = tr.run(["cat", f"{run_dir}/rounds-fio.json"], timeout_s=60).stdout
                    (out / f"fio-{rnd}.json").write_text(text)
                    fio = parse_fio_json(text)
                    job = json.loads(text[text.index("{"):])["jobs"][0]["read"]
                    row.update(fio_mb_s=min(g.read_gb_s for g in fio.groups) * 1e3, fio_device_bytes=after - before,
                               fio_clat_max_s=job["clat_ns"]["max"] / 1e9)
            row["efficiency"] = (row["connector_mb_s"] / row["fio_mb_s"]) if row.get("connector_mb_s") and \
                row.get("fio_mb_s") else None
            print(f"  round {rnd} ({row['first']} first): connector {row.get('connector_mb_s') or 0:.1f} MB/s "
                  f"(slowest retrieve {row.get('retrieve_max_s') or 0:.3f} s), fio {row.get('fio_mb_s') or 0:.1f} MB/s "
                  f"(slowest I/O {row.get('fio_clat_max_s') or 0:.3f} s), efficiency {row['efficiency'] or 0:.3f}",
                  file=sys.stderr, flush=True)
            rows.append(row)
    finally:
        if proc.stdin:
            proc.stdin.close()
        proc.wait(120)
        tr.close()
    return rows


if __name__ == "__main__":
    sys.exit(main())
