"""kv-read on the NVMe-oF loopback, through the real CLI as a user types it: the qemu guest (Debian's kernel)
connects itself over NVMe/TCP to a null_blk namespace of its own nvmet, kvgate makes ext4 on the blank
namespace and mounts it (`kvgate loopback up -i inventory/loopback-kv-read.yaml`), and the guest runs this
interpreter's torch and LMCache 0.5.6 from the host's tree, shared read-only over virtio-9p
(`kvgate loopback guest-up --engine-python PY --kernel-args nvme_core.multipath=N`: per-path namespace devices,
whose read counters prove the reads), to lay out and read back the KV on it
(`kvgate run -g gates/loopback-kv-read.yaml`).

Slow by nature: importing torch and LMCache under qemu TCG takes minutes on a 2-core host (392 s of a 437 s run,
measured: ~5,100 modules, transformers' alone 147 s and torch's 96 s, where the host imports them all in ~12 s; the
layout took 13 s, the reader's preparation 3 s and its reads 0.4 s). The gate imports them once (`import_once`): the
layout, the page-cache drop and the reader run in one interpreter, the layout and the reader in processes forked
from it; the test prints how much of the run the import took. The gate also makes vLLM unimportable in the reader
(`import_vllm: false`: LMCache imported ~2,000 of vLLM's modules only to seed its chunk hashes): in five runs
alone on the 2-core host, alternating, the import took 123 / 153 / 170 s and this test 147 / 180 / 203 s, against
177 / 217 s and 204 / 244 s with vLLM: ~48 s less on average than the runs beside each. And it defers
transformers until its first use (`defer_imports: [transformers]`: LMCache's token database imports it at its top,
with torch.distributed, torch._dynamo and sympy, for a token database the reader never builds), which the reader
never makes: four runs alone, alternating, import 43 / 40 s and the test 97 / 99 s, against 108 / 114 s and
161 / 167 s with transformers imported. The guest is stopped by
PID at the end, also on failure, and no qemu with its initrd may be left running.
"""

import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import yaml

from harness.rigs import guest as G
from harness.transport import SSHTransport

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(3600)]

REPO = Path(__file__).resolve().parents[2]


def _lmcache_here() -> bool:
    probe = subprocess.run([sys.executable, "-c", "import torch, lmcache"], capture_output=True, timeout=300)
    return probe.returncode == 0


needs_engine = pytest.mark.skipif(not _lmcache_here(),
                                  reason="needs torch and lmcache in this interpreter (scripts/setup.sh --test)")


def kvgate(home: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "KVGATE_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def loopback(tmp_path_factory):
    """The guest booted and the pool's filesystem up, through the CLI; torn down through it, then by PID."""
    if subprocess.run(["which", "qemu-system-x86_64"], capture_output=True).returncode:
        pytest.fail("qemu-system-x86_64 missing: apt-get install qemu-system-x86 (scripts/setup.sh installs it)")
    tmp = tmp_path_factory.mktemp("kv-read-loopback")
    state_dir, home = tmp / "guest", tmp / "home"
    inv = yaml.safe_load((REPO / "inventory" / "loopback-kv-read.yaml").read_text())
    inv["nodes"][0]["labels"]["kvgate-guest"] = str(state_dir)  # this module's guest, not the default one
    inv_path = tmp / "inventory.yaml"
    inv_path.write_text(yaml.safe_dump(inv, sort_keys=False))
    up = None
    try:
        boot = kvgate(home, "loopback", "guest-up", "--state-dir", str(state_dir), "--engine-python", sys.executable,
                      "--kernel-args", "nvme_core.multipath=N", "--boot-timeout-s", "600", timeout=900)
        assert boot.returncode == 0, boot.stderr[-2000:]
        up = kvgate(home, "loopback", "up", "-i", str(inv_path), "--state-dir", str(state_dir),
                    "--steps-dir", str(tmp / "up"), "--json", timeout=900)
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-2000:]
        yield inv_path, state_dir, home, json.loads(up.stdout)
    finally:
        state = G.guest_running(state_dir)
        try:
            if up is not None:
                down = kvgate(home, "loopback", "down", "-i", str(inv_path), "--state-dir", str(state_dir),
                              "--steps-dir", str(tmp / "down"), timeout=600)
                assert down.returncode == 0, down.stdout[-2000:] + down.stderr[-2000:]
        finally:
            G.stop_guest(state_dir)
            if state is not None:
                assert state.pid not in G.qemu_pids(state.initrd_path), "qemu left running"


def _guest_ssh(state_dir: Path) -> SSHTransport:
    st = G.guest_running(state_dir)
    assert st is not None
    return SSHTransport(st.host, st.ssh_port, st.user, st.identity_file, known_hosts_path=st.known_hosts_path,
                        name="guest", connect_timeout_s=90)


@needs_engine
def test_up_makes_ext4_on_the_blank_namespace_and_the_host_tree_is_read_only_in_the_guest(loopback):
    _, state_dir, _, up = loopback
    assert up["ok"] and up["integrity"]["ok"]  # the blank namespace's data checked before mkfs
    fs = up["summary"]["filesystem"]
    assert fs["mount_path"] == "/mnt/kvgate-kv" and fs["mounted"] == {"source": up["summary"]["device"],
                                                                        "type": "ext4"}
    names = [a["name"] for a in up["actions"]]
    assert names.index("mkfs") < names.index("mount")
    guard = up["write_guard"]  # asked before mkfs: a blank namespace, not mounted
    assert guard["allowed"] and guard["path"] == up["summary"]["device"], guard
    tr = _guest_ssh(state_dir)
    try:
        r = tr.run(["sh", "-c", "touch /host/kvgate-write-probe; echo rc=$?; grep ' /host ' /proc/mounts"],
                   timeout_s=120)
        assert "rc=1" in r.stdout and "Read-only file system" in r.stderr, (r.stdout, r.stderr)
        assert " /host 9p ro," in r.stdout
        r = tr.run([G.ENGINE_PYTHON, "-c", "import sys; print(sys.prefix)"], timeout_s=300)
        assert r.ok and r.stdout.strip() == sys.prefix, (r.stdout, r.stderr)
        # the engine's chroot has the guest's own /proc and /sys, not one of them twice (9p's multidevs=remap)
        r = tr.run([G.ENGINE_PYTHON, "-c", "import os; print(os.path.isfile('/proc/sys/vm/drop_caches'), "
                    "os.path.isfile('/proc/cpuinfo'), os.path.isdir('/sys/block'))"], timeout_s=300)
        assert r.ok and r.stdout.split() == ["True", "True", "True"], (r.stdout, r.stderr)
    finally:
        tr.close()
    assert not Path("/kvgate-write-probe").exists()


@needs_engine
def test_kv_read_through_lmcache_on_ext4_over_nvme_tcp_passes_with_the_device_reading_every_kv_byte(loopback,
                                                                                                    tmp_path):
    inv_path, _, home, up = loopback
    t0 = time.monotonic()
    run = kvgate(home, "run", "-i", str(inv_path), "-g", str(REPO / "gates" / "loopback-kv-read.yaml"),
                 "--out", str(tmp_path / "out"), timeout=3000)
    wall_s = time.monotonic() - t0
    (tar,) = sorted((tmp_path / "out").glob("KVG-*.tar.gz"))
    bundle = tmp_path / "out" / tar.name.removesuffix(".tar.gz")
    with tarfile.open(tar) as tf:
        member = next(m for m in tf.getmembers() if m.name.endswith("/verdicts.json"))
        v = json.load(tf.extractfile(member))["verdicts"][0]
    result = json.loads((bundle / "gates" / "G1C-tcp" / "result.json").read_text())
    assert run.returncode == 0 and v["outcome"] == "PASS", (v.get("reason"), run.stderr[-3000:])
    m, ev = result["metrics"], result["evidence"]
    layout_doc = json.loads((bundle / "gates" / "G1C-tcp" / "guest" / "layout.json").read_text())
    print(f"kv-read over NVMe/TCP in the guest: {wall_s:.0f} s, of which importing {layout_doc['import_s']:.0f} s and "
          f"the layout {layout_doc['elapsed_s']:.0f} s; connector {m['connector_read_gb_s'] * 1e3:.1f} MB/s, "
          f"fio {m['fio_read_gb_s'] * 1e3:.1f} MB/s, efficiency {m['connector_efficiency']:.2f}; "
          f"device read {m['device_read_bytes']:.0f} B for {m['kv_bytes_read']:.0f} B of KV")
    assert m["connector_read_gb_s"] > 0 and m["fio_read_gb_s"] > 0
    assert m["connector_efficiency"] == pytest.approx(m["connector_read_gb_s"] / m["fio_read_gb_s"])
    rec = ev["nodes"]["guest"]
    # the pool is the namespace read over NVMe/TCP, and the engine interpreter the host's, run in the guest
    assert rec["pool_device"] == up["summary"]["device"] and rec["pool_device"].startswith("/dev/nvme")
    assert rec["python"] == G.ENGINE_PYTHON and rec["versions"]["lmcache"] == "0.5.6"
    assert rec["layout"]["chunks"] == 12 and rec["mismatch_count"] == 0 and rec["missing_count"] == 0
    assert m["mismatched_chunks"] == 0 and m["missing_chunks"] == 0
    assert all(c["ok"] for c in ev["validity"]) and {c["name"] for c in ev["validity"]} == {"cold", "data"}
    assert rec["kv_bytes_read"] == 12 * 256 * 16384
    assert rec["device_read_bytes"] >= rec["kv_bytes_read"]  # the namespace read every KV byte
    assert rec["fio_device_read_bytes"] >= rec["kv_bytes_read"]
    assert rec["page_cache_dropped"] is True and rec["reader_start"] == "fork"  # dropped by the one interpreter
    # the gate's import_vllm: false: vLLM unimportable in the guest's reader, LMCache's chunk keys seeded with 0
    assert rec["vllm_imported"] is False and rec["none_hash"] == 0
    # the gate's defer_imports: [transformers]: LMCache's `from transformers import AutoTokenizer` bound a stand-in
    # that neither the layout nor the reader used, so transformers (and what it pulls in) was never imported
    assert rec["deferred_imports"] == {"transformers": "deferred"}, rec["deferred_imports"]
    assert layout_doc["deferred_imports"] == {"transformers": "deferred"}
    data = next(c for c in ev["validity"] if c["name"] == "data")
    assert "transformers on guest: never used by the layout or a reader" in data["how"], data["how"]
    steps = {p.name.split("-", 1)[1] for p in (bundle / "steps").iterdir()}
    assert "guest-kv-layout-read" in steps and not {"guest-kv-layout", "guest-kv-read"} & steps
    assert ev["parallel_read"]["odirect_effective"] is True
    # what laying out the KV cost the namespace: the block counters, and the nvmet target's own SMART data units
    # (null_blk backing: nvmet counts them from its block device) beside them, agreeing within one data unit
    e = ev["endurance"]
    smart = e["smart"]
    print(f"layout wrote {e['device_write_bytes']} B for {e['stored_kv_bytes']} B of KV "
          f"(x{e['write_amplification']:.3f}); SMART: {smart['data_units_written']} data units, {smart['note']}")
    assert e["stored_kv_bytes"] == rec["layout"]["kv_bytes"] == 12 * 256 * 16384
    assert e["device_write_bytes"] >= e["stored_kv_bytes"] and e["write_amplification"] >= 1.0
    assert smart["exposed"] and smart["device"] == rec["pool_device"] and smart["reconciled"] is True, smart
    assert smart["block_write_bytes"] == e["device_write_bytes"]
    report = (bundle / "report.md").read_text()
    assert "## What serving cost the drives" in report and "agrees with the block counters" in report
