"""kind: nvmeof in the real qemu guest (Debian's kernel): NVMe/TCP and NVMe/RDMA over soft-RoCE (rdma_rxe on the
guest's virtio NIC), the target side provisioned by the loopback as an array would be, the host side through the
code path a real array takes. The faults the issue lists, each for real: an NQN that is not there, a transport
that is not the inventory's, a managed target that does not answer, Ctrl-C during a managed run, a namespace
holding a filesystem.

One guest per module (the build is cached); the target sides are torn down and qemu is stopped by PID at the end,
also on failure. Every command has a generous hang guard: the TCG guest is slow on a loaded 2-core host.
"""

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from harness.config import load_config, load_inventory
from harness.execute import nvmeof as N
from harness.parsers.nvme import parse_list_subsys
from harness.rigs import guest as G
from harness.rigs.loopback import Loopback, LoopbackSpec
from harness.suite.runner import run_suite
from harness.workloads import WORKLOADS
from signals import default_signals

# hang guards sized for a TCG guest on a loaded 2-core host (the module's guest boots in its first test)
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
T = 180  # hang guard per command


def inventory_for(state_dir: Path, tmp: Path) -> Path:
    """inventory/loopback.yaml with its guest label pointing at this module's guest."""
    inv = yaml.safe_load((ROOT / "inventory" / "loopback.yaml").read_text())
    inv["nodes"][0]["labels"]["kvgate-guest"] = str(state_dir)
    path = tmp / "inventory.yaml"
    path.write_text(yaml.safe_dump(inv, sort_keys=False))
    return path


class Guest:
    def __init__(self, tr, state, state_dir, inv_path):
        self.tr, self.state, self.state_dir, self.inv_path = tr, state, state_dir, inv_path
        self.node = load_inventory(inv_path).node("guest")

    def run(self, argv, timeout_s=T):
        return self.tr.run(list(argv), timeout_s=timeout_s)

    def spec(self, name: str) -> N.NvmeofSpec:
        return N.NvmeofSpec.from_target(self.node.target(name))

    def host(self, spec: N.NvmeofSpec) -> N.NvmeofHost:
        return N.NvmeofHost(lambda name, argv, t: self.run(argv, t), spec, node="guest")

    def controllers(self) -> dict[str, list[str]]:
        """NQN -> its controllers, as the guest's nvme-cli shows them now."""
        r = self.run(["nvme", "list-subsys", "-o", "json"])
        subs = parse_list_subsys(r.stdout) if r.ok else []
        return {s.nqn: [p.controller for p in s.paths] for s in subs if s.paths}

    def disconnect_all(self) -> None:
        for nqn in self.controllers():
            self.run(["nvme", "disconnect", "-n", nqn])


@pytest.fixture(scope="module")
def guest(qemu_guest, tmp_path_factory):
    """The module's guest with the target sides of inventory/loopback.yaml up, as `kvgate loopback up` makes them;
    torn down (host sides disconnected, target sides removed) before the guest stops."""
    tr, state, state_dir = qemu_guest
    g = Guest(tr, state, state_dir, inventory_for(state_dir, tmp_path_factory.mktemp("nvmeof-guest")))
    lbs = [Loopback(tr, LoopbackSpec.from_target(t, "guest", g.node)) for t in g.node.targets
           if t.kind == "nvmeof-loopback"]
    try:
        for lb in lbs:  # the target side, as `kvgate loopback up` makes it
            up = lb.up(wait_s=120)
            assert up.ok, up.error
            assert up.summary["host_side"].startswith("left to")  # the kind: nvmeof targets connect
        yield g
    finally:
        g.disconnect_all()
        for lb in reversed(lbs):
            lb.down()


@pytest.fixture
def clean(guest):
    """Each test starts and ends with nothing connected on the host side."""
    guest.disconnect_all()
    yield guest
    guest.disconnect_all()


@pytest.mark.parametrize("target", ["kv-rdma", "kv-tcp"])
def test_managed_connect_checks_the_namespace_and_disconnects_only_what_it_connected(clean, target):
    g = clean
    spec = g.spec(target)
    t0 = time.monotonic()
    rec = g.host(spec).connect()
    assert rec.ok, rec.error
    assert rec.issued and rec.controllers and time.monotonic() - t0 < spec.connect_timeout_s
    res = rec.resolution
    assert res["transport"] == spec.transport and res["device"].startswith("/dev/nvme")
    (path,) = res["paths"]
    assert path["state"] == "live" and path["ana_state"] == "optimized" and path["queue_count"] >= 2
    if spec.transport == "rdma":
        (dev,) = res["rdma"]
        assert (dev["device"], dev["netdev"]) == ("kvgate-eth0", "eth0") and dev["queues"] == path["queue_count"]
    assert g.controllers() == {spec.nqn: rec.controllers}
    # the same data both ways: the null_blk backing read directly equals what the namespace returns
    digest = [g.run(["sh", "-c", f"dd if={dev} bs=65536 count=16 iflag=direct 2>/dev/null | sha256sum"])
              for dev in (res["device"], f"/dev/kvgate-{'kv1' if spec.transport == 'rdma' else 'kv0'}")]
    assert digest[0].ok and digest[0].stdout.split()[0] == digest[1].stdout.split()[0]
    g.host(spec).disconnect(rec)
    assert rec.disconnected == rec.controllers and rec.left_connected == []
    assert g.controllers() == {}


def test_the_nqn_not_on_the_node_and_another_transport_are_errors_naming_what_was_found(clean):
    g = clean
    tcp = g.spec("kv-tcp")
    assert g.run(tcp.connect_argv()).ok  # connected by someone else: kvgate only looks (connect: existing)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not N.resolve(tcp, g.host(tcp).probe()).ok:
        time.sleep(0.5)
    missing = N.resolve(replace(g.spec("kv-rdma"), connect="existing"), g.host(tcp).probe())
    assert not missing.ok and f"{g.spec('kv-rdma').nqn} is not connected" in missing.error
    assert f"subsystems seen: {tcp.nqn}" in missing.error
    wrong = N.resolve(replace(tcp, transport="rdma"), g.host(replace(tcp, transport="rdma")).probe())
    assert not wrong.ok and "expected rdma traddr=127.0.0.1,trsvcid=4420; found" in wrong.error
    assert " tcp traddr=127.0.0.1,trsvcid=4420" in wrong.error


def test_a_managed_target_that_does_not_answer_is_an_error_within_its_timeout_leaving_nothing(clean):
    g = clean
    spec = replace(g.spec("kv-rdma"), traddr="10.0.2.99", connect_timeout_s=45)  # nobody at that address
    t0 = time.monotonic()
    rec = g.host(spec).connect()
    took = time.monotonic() - t0
    assert not rec.ok and "10.0.2.99" in rec.error, rec
    assert took < spec.connect_timeout_s + 2 * N.PROBE_TIMEOUT_S  # the connect bounded; probes are hang guards
    assert g.controllers() == {} and rec.left_connected == []
    assert g.run(["sh", "-c", "ls /sys/class/nvme | wc -l"]).stdout.strip() == "0"


# busybox-static has no pgrep: the guest's fio processes by their comm
FIO_PIDS = ["sh", "-c", 'for p in /proc/[0-9]*; do [ "$(cat "$p/comm" 2>/dev/null)" = fio ] && echo "${p#/proc/}"; '
            'done; true']


def _long_g1(tmp: Path) -> Path:
    gates = tmp / "long.yaml"
    gates.write_text(yaml.safe_dump({"suite": {"name": "long", "version": 1}, "gates": [{
        "id": "G1", "title": "long read over rdma", "workload": "fio-read", "metric": "per_gpu_read_gb_s",
        "pass": ">= 1 MB/s", "params": {"target": "kv-rdma", "runtime_s": 600, "ramp_s": 0, "ioengine": "libaio",
                                        "bs": "1 MiB", "iodepth": 4}}]}))
    return gates


def test_ctrl_c_during_a_managed_run_disconnects_what_kvgate_connected(clean, tmp_path):
    g = clean
    env = dict(os.environ, KVGATE_HOME=str(tmp_path / "home"))
    p = subprocess.Popen([sys.executable, "-m", "harness", "run", "-i", str(g.inv_path), "-g", str(_long_g1(tmp_path)),
                          "--out", str(tmp_path / "out")], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True,
                         preexec_fn=default_signals)  # Ctrl-C works whatever SIGINT was for the suite
    try:
        deadline = time.monotonic() + 900  # connect, facts and the gate's checks first: slow on a loaded host
        while time.monotonic() < deadline and p.poll() is None:
            if g.run(FIO_PIDS).stdout.strip():
                break
            time.sleep(1)
        else:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
            out, err = p.communicate(timeout=300)
            pytest.fail(f"fio never started (rc {p.returncode}): {out[-2000:]} {err[-4000:]}")
        assert g.spec("kv-rdma").nqn in g.controllers()  # kvgate connected it
        p.send_signal(signal.SIGINT)
        stdout, stderr = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 130, stdout + stderr
    assert g.controllers() == {}, stderr  # disconnected on the way out
    assert "disconnected nvme" in stderr
    (run_dir,) = [d for d in (tmp_path / "out").iterdir() if d.name.startswith("run-")]
    managed = json.loads((run_dir / "nodes" / "guest" / "nvmeof-managed.json").read_text())
    assert managed[0]["disconnected"] and managed[0]["left_connected"] == []
    deadline = time.monotonic() + 60  # fio's process group was stopped too
    while time.monotonic() < deadline and g.run(FIO_PIDS).stdout.strip():
        time.sleep(1)
    assert not g.run(FIO_PIDS).stdout.strip()


def test_a_namespace_holding_a_filesystem_is_refused_before_any_write(clean, tmp_path):
    g = clean
    backing = "/dev/kvgate-kv0"  # what the kv-tcp namespace serves
    assert g.run(["busybox", "mke2fs", "-F", backing], timeout_s=600).ok

    def digest() -> str:
        r = g.run(["sh", "-c", f"sha256sum {backing}"], timeout_s=600)
        assert r.ok, r.summary()
        return r.stdout.split()[0]
    before = digest()
    gates = tmp_path / "l1.yaml"
    gates.write_text(yaml.safe_dump({"suite": {"name": "l1", "version": 1}, "gates": [{
        "id": "L1", "title": "integrity", "workload": "nvme-integrity", "metric": "mismatched_bytes",
        "pass": "<= 0 B", "params": {"target": "kv-tcp"}, "timeout_s": 900}]}))
    cfg = load_config(g.inv_path, gates, WORKLOADS)
    try:
        out = run_suite(cfg, tmp_path / "out", Ed25519PrivateKey.generate(), progress=lambda m: None,
                        transports=G.open_guest_transports(cfg.inventory), make_tar=False)
        (v,) = out.verdicts
        assert v.outcome.value == "ERROR", v.reason
        assert "refusing to write to /dev/nvme" in v.reason and "holds filesystem ext2" in v.reason
        guard = json.loads((out.bundle.path / "gates" / "L1" / "guest" / "write-guard.json").read_text())
        assert guard["allowed"] is False and guard["evidence"]["blkid"]["TYPE"] == "ext2"
        steps = [json.loads(p.read_text())["argv"] for p in (out.bundle.path / "steps").glob("*/argv.json")]
        assert not [a for a in steps if a[0] == "dd"]  # nothing was written, or read, by the integrity check
        assert digest() == before
        assert g.controllers() == {}  # and the managed connect was taken back
    finally:
        g.run(["dd", "if=/dev/zero", f"of={backing}", "bs=1M", "count=4", "oflag=direct"])
