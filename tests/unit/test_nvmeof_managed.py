"""``kind: nvmeof`` through a scripted node whose NVMe-oF state is one of the scenarios captured from the real
guest (tests/fixtures/nvmeof/): ``nvme connect`` and ``nvme disconnect`` move it from one capture to the next.
Covers connect: managed (discover, connect, only kvgate's controllers disconnected, a target that does not
answer), and whole runs: the check before any device is read, a failed gate and Ctrl-C still disconnecting,
the write guard on a namespace holding a filesystem."""

import json
import os
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from harness.config import load_config
from harness.execute import nvmeof as N
from harness.parsers.nvme import NVME_SYSFS_ARGV
from harness.parsers.rdma import IB_SYSFS_ARGV, RDMA_LINK_ARGV
from harness.suite.plan import facts_plan, gate_plan, managed_nvmeof_plan
from harness.suite.runner import run_suite
from harness.transport.doubles import Reply, ScriptedTransport
from harness.workloads import WORKLOADS
from facts_double import answer_facts, is_facts_call
from signals import signal_raises

ROOT = Path(__file__).resolve().parents[2]
FX = ROOT / "tests" / "fixtures" / "nvmeof"
KV0 = "nqn.2024-01.io.kvgate:loopback-kv0"
KV1 = "nqn.2024-01.io.kvgate:loopback-kv1"
HOST = "nqn.2024-01.io.kvgate:host-guest"
FIO_JSON = (ROOT / "tests" / "fixtures" / "fio" / "io_uring_2groups_2jobs_grouped.json").read_text()
PROBES = {argv: name for name, argv in N.probe_commands(replace(
    N.NvmeofSpec("x", KV1, "rdma", "10.0.2.15"))).items()}


def capture(scenario: str, name: str) -> Reply:
    d = FX / scenario
    if not (d / f"{name}.out").exists():
        return Reply(rc=0, stdout="")
    return Reply(rc=int((d / f"{name}.rc").read_text()), stdout=(d / f"{name}.out").read_text(),
                 stderr=(d / f"{name}.err").read_text() if (d / f"{name}.err").exists() else "")


class Fabric:
    """A node's NVMe-oF state as captured scenarios; connect and disconnect switch between them."""

    def __init__(self, scenario="none", after_connect="rdma", discover="discover-rdma", connect="connect-rdma",
                 hang: tuple[str, ...] = (), fail: dict | None = None, lsblk: dict | None = None):
        self.scenario, self.after_connect = scenario, after_connect
        self.discover, self.connect = discover, connect
        self.before = scenario
        self.hang, self.fail = hang, fail or {}
        self.lsblk = lsblk
        self.node = ScriptedTransport(self.handler, name="n1")

    def answer(self, argv) -> Reply:
        if argv in PROBES:
            return capture(self.scenario, PROBES[argv])
        if argv == IB_SYSFS_ARGV:
            return capture(self.scenario, "rdma-sysfs")
        return None

    def handler(self, call):
        argv = call.argv
        word = " ".join(argv[:2])
        if word in self.hang:
            return Reply(hang=True)
        if word in self.fail:
            return self.fail[word]
        if is_facts_call(call):
            return answer_facts(call, lambda a: self.answer(a) or Reply(rc=127, error="not installed")
                                if a[0] in ("nvidia-smi", "nvme") else self.answer(a) or Reply())
        hit = self.answer(argv)
        if hit is not None:
            return hit
        if word == "nvme discover":
            return capture(self.discover, "discover")
        if word == "nvme connect":
            r = capture(self.connect, "connect")
            if r.rc == 0:
                self.scenario = self.after_connect
            return r
        if word == "nvme disconnect":
            self.scenario = self.before
            return Reply(stdout="NQN:... disconnected 1 controller(s)\n")
        if argv[0] == "blockdev":
            return Reply(stdout=f"{256 << 20}\n")
        if argv[0] == "lsblk":
            dev = argv[-1]
            d = {"name": dev.rsplit("/", 1)[-1], "path": dev, "type": "disk", "size": 256 << 20, "ro": False,
                 "fstype": None, "pttype": None, "serial": "f1d527792f87a4f2bf9b", "model": "Linux",
                 "mountpoint": None, **(self.lsblk or {})}
            return Reply(stdout=json.dumps({"blockdevices": [d]}))
        if argv[0] == "blkid":
            fs = (self.lsblk or {}).get("fstype")
            return Reply(rc=0, stdout=f"DEVNAME={argv[-1]}\nTYPE={fs}\nUSAGE=filesystem\n") if fs else Reply(rc=2)
        if argv[:2] == ("sh", "-c") and argv[3:4] == ("kvgate-path-probe",):
            return Reply(stdout=f"block\nforeign\n{256 << 20}\n")
        if argv[:2] == ("fio", "--output-format=json"):
            return Reply(stdout=FIO_JSON)
        return Reply()

    @property
    def commands(self):
        return self.node.commands


def host(fabric: Fabric, spec: N.NvmeofSpec) -> N.NvmeofHost:
    return N.NvmeofHost(lambda name, argv, t: fabric.node.run(list(argv), timeout_s=t), spec, node="n1",
                        sleep=lambda s: time.sleep(min(s, 0.05)))


RDMA = N.NvmeofSpec(name="kv-rdma", nqn=KV1, transport="rdma", traddr="10.0.2.15", trsvcid="4421",
                    connect="managed", host_nqn=HOST, connect_timeout_s=5)
TCP = replace(RDMA, name="kv-tcp", nqn=KV0, transport="tcp", traddr="127.0.0.1", trsvcid="4420")


def sent(fabric, word):
    return [c for c in fabric.commands if " ".join(c[:2]) == word]


# ------------------------------------------------------------------------------------------ connect: managed


def test_managed_connect_discovers_connects_and_disconnects_only_its_controller():
    fab = Fabric()
    rec = host(fab, RDMA).connect()
    assert rec.ok and rec.issued and not rec.already_connected, rec.error
    assert rec.controllers == ["nvme0"] and rec.resolution["device"] == "/dev/nvme0n1"
    assert [d["subnqn"] for d in rec.discovery if d["subnqn"] != N.DISCOVERY_NQN] == [KV1]
    words = [" ".join(c[:2]) for c in fab.commands if c[0] == "nvme" and c[1] in ("discover", "connect")]
    assert words == ["nvme discover", "nvme connect"]
    host(fab, RDMA).disconnect(rec)
    assert sent(fab, "nvme disconnect") == [("nvme", "disconnect", "-d", "nvme0")]
    assert rec.disconnected == ["nvme0"] and rec.left_connected == []


def test_a_subsystem_found_connected_is_used_and_left_connected():
    fab = Fabric(scenario="rdma")
    rec = host(fab, RDMA).connect()
    assert rec.ok and rec.already_connected and not rec.issued and rec.controllers == []
    assert not sent(fab, "nvme discover") and not sent(fab, "nvme connect")
    host(fab, RDMA).disconnect(rec)
    assert not sent(fab, "nvme disconnect")


def test_only_kvgates_own_controller_is_disconnected_when_the_check_fails_after_connect():
    # kv0 was connected over TCP (nvme0) before kvgate came; kvgate's RDMA connect adds nvme1; two transports
    # on one subsystem fail the check, so kvgate takes back its nvme1 and leaves nvme0 alone
    fab = Fabric(scenario="tcp", after_connect="mixed", discover="discover-tcp")
    spec = replace(RDMA, nqn=KV0, connect_timeout_s=0.5)
    fab.discover = "discover-tcp"
    rec = host(fab, replace(spec, transport="rdma")).connect()
    assert not rec.ok and "I/O would not go over rdma only" in rec.error
    assert rec.before == ["nvme0"] and rec.controllers == ["nvme1"]
    assert sent(fab, "nvme disconnect") == [("nvme", "disconnect", "-d", "nvme1")]


def test_discovery_that_does_not_offer_the_nqn_connects_nothing():
    fab = Fabric(discover="discover-tcp")  # offers kv0 only
    rec = host(fab, RDMA).connect()
    assert not rec.ok and f"does not offer {KV1} (offered: {KV0})" in rec.error
    assert not sent(fab, "nvme connect") and not sent(fab, "nvme disconnect")


def test_a_target_that_does_not_answer_is_an_error_within_the_connect_timeout_and_leaves_nothing():
    fab = Fabric(hang=("nvme discover",))
    t0 = time.monotonic()
    rec = host(fab, replace(RDMA, connect_timeout_s=1)).connect()
    assert time.monotonic() - t0 < 10
    assert not rec.ok and "failed within 1 s" in rec.error and "timed out" in rec.error
    assert not sent(fab, "nvme connect") and rec.left_connected == []
    # nvme connect itself refused (captured: connection refused): an error, and nothing left connected
    fab = Fabric(connect="connect-tcp-refused", discover="discover-tcp")
    rec = host(fab, TCP).connect()
    assert not rec.ok and "connection refused" in rec.error and rec.left_connected == []


# ------------------------------------------------------------------------------------------ whole runs


def suite(tmp_path, target: dict, gates: list[dict]):
    inv = {"nodes": [{"name": "n1", "transport": "local", "work_dir": "/w", "read_streams": 1,
                      "targets": [target]}]}
    (tmp_path / "inv.yaml").write_text(yaml.safe_dump(inv))
    (tmp_path / "gates.yaml").write_text(yaml.safe_dump({"suite": {"name": "t", "version": 1}, "gates": gates}))
    return load_config(tmp_path / "inv.yaml", tmp_path / "gates.yaml", WORKLOADS)


RDMA_TARGET = {"name": "kv-rdma", "kind": "nvmeof", "connect": "managed", "nqn": KV1, "transport": "rdma",
               "traddr": "10.0.2.15", "trsvcid": "4421", "host_nqn": HOST, "connect_timeout_s": 5}
G1 = {"id": "G1", "title": "read", "workload": "fio-read", "metric": "per_gpu_read_gb_s", "pass": ">= 0.1 GB/s",
      "params": {"target": "kv-rdma", "runtime_s": 1, "ramp_s": 0}}
L1 = {"id": "L1", "title": "integrity", "workload": "nvme-integrity", "metric": "mismatched_bytes",
      "pass": "<= 0 B", "params": {"target": "kv-rdma"}}


def run(cfg, tmp_path, fab):
    return run_suite(cfg, tmp_path / "out", Ed25519PrivateKey.generate(), transports={"n1": fab.node},
                     progress=lambda m: None, make_tar=False)


def test_a_managed_run_connects_first_reads_the_checked_device_and_disconnects_at_the_end(tmp_path):
    cfg = suite(tmp_path, RDMA_TARGET, [G1])
    fab = Fabric()
    out = run(cfg, tmp_path, fab)
    assert out.overall.value == "PASS", [v.reason for v in out.verdicts]
    cmds = fab.commands
    connect = cmds.index(next(c for c in cmds if c[:2] == ("nvme", "connect")))
    facts = next(i for i, c in enumerate(cmds) if c[:2] == ("sh", "-c") and "kvgate-fact-section" in c[2])
    fio = next(i for i, c in enumerate(cmds) if c[:2] == ("fio", "--output-format=json"))
    disconnect = cmds.index(("nvme", "disconnect", "-d", "nvme0"))
    assert connect < facts < fio < disconnect  # the snapshot sees the connection; the gate reads it
    assert ("blockdev", "--getsize64", "/dev/nvme0n1") in cmds
    ev = json.loads((out.bundle.path / "gates" / "G1" / "result.json").read_text())["evidence"]["nodes"]["n1"]
    assert ev["path"] == "/dev/nvme0n1" and ev["nvmeof"]["transport"] == "rdma"
    assert ev["nvmeof"]["rdma"][0]["device"] == "kvgate-eth0" and ev["nvmeof"]["rdma"][0]["netdev"] == "eth0"
    assert ev["nvmeof"]["managed"]["connected_by_kvgate"] is True
    managed = json.loads((out.bundle.path / "nodes" / "n1" / "nvmeof-managed.json").read_text())
    assert managed[0]["disconnected"] == ["nvme0"] and managed[0]["left_connected"] == []
    snap = json.loads((out.bundle.path / "nodes" / "n1" / "snapshot.json").read_text())
    assert snap["rdma_links"][0]["netdev"] == "eth0" and snap["rdma_devices"][0]["ports"][0]["link_layer"] == "Ethernet"
    assert [(c["transport"], c["queue_count"]) for c in snap["nvme_fabric_controllers"]] == [("rdma", 3)]
    # the report names the gate's transport and the RDMA device under it, and the node's RDMA devices
    report = (out.bundle.path / "report.md").read_text()
    assert "read /dev/nvme0n1 (target kv-rdma, nqn.2024-01.io.kvgate:loopback-kv1) over **rdma**, RDMA device " \
           "kvgate-eth0 port 1 on eth0" in report
    assert "| kvgate-eth0 | 1 | ACTIVE | Ethernet | RoCE v2 | eth0 |" in report
    assert "connect: managed kv-rdma" in report and "disconnected nvme0 at the end" in report
    assert "RoCE v2" in (out.bundle.path / "report.html").read_text()
    # kvgate plan lists every command the run sent, in the order it sent them
    attach, detach = managed_nvmeof_plan(cfg)
    planned = [s.argv for s in attach + facts_plan(cfg.inventory.nodes) + gate_plan(cfg, cfg.suite.gates[0])
               + detach if s.argv]
    def matches(p, c):  # a planned <placeholder> stands for what the run found (the device, the controller)
        return len(p) == len(c) and all(a == b or a.startswith("<") for a, b in zip(p, c))
    firsts = [c for i, c in enumerate(cmds) if c not in cmds[:i]]
    assert all(any(matches(p, c) for p in planned) for c in firsts), \
        [c for c in firsts if not any(matches(p, c) for p in planned)]
    order = [next(i for i, p in enumerate(planned) if matches(p, c)) for c in firsts]
    assert order == sorted(order)


def test_a_failed_gate_still_disconnects(tmp_path):
    cfg = suite(tmp_path, RDMA_TARGET, [G1])
    fab = Fabric(fail={"fio --output-format=json": Reply(rc=1, stderr="fio: io_u error on file /dev/nvme0n1")})
    out = run(cfg, tmp_path, fab)
    assert out.verdicts[0].outcome.value == "ERROR"
    assert sent(fab, "nvme disconnect") == [("nvme", "disconnect", "-d", "nvme0")]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["SIGINT", "SIGTERM", "SIGHUP"])
def test_ctrl_c_during_a_managed_run_disconnects_what_kvgate_connected(tmp_path, sig):
    """Ctrl-C, and the signals that get its handling (a scheduler's SIGTERM, a hang-up)."""
    cfg = suite(tmp_path, RDMA_TARGET, [G1])
    fab = Fabric(hang=("fio --output-format=json",))

    def interrupt():
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not sent(fab, "fio --output-format=json"):
            time.sleep(0.02)
        os.kill(os.getpid(), sig)
    with signal_raises(sig):  # whatever the signal was when the suite started (nohup, a background job)
        threading.Thread(target=interrupt, daemon=True).start()
        out = run(cfg, tmp_path, fab)
    assert out.interrupted and out.bundle is None
    assert getattr(out.interrupt, "signum", signal.SIGINT) == sig
    kill = next(i for i, e in enumerate(fab.node.events) if e.kind == "kill")
    disc = next(i for i, e in enumerate(fab.node.events) if e.argv[:2] == ("nvme", "disconnect"))
    assert kill < disc and fab.node.events[disc].argv == ("nvme", "disconnect", "-d", "nvme0")
    managed = json.loads((out.run_dir / "nodes" / "n1" / "nvmeof-managed.json").read_text())
    assert managed[0]["disconnected"] == ["nvme0"]


def test_existing_nqn_not_on_the_node_is_an_error_and_nothing_is_read(tmp_path):
    target = {k: v for k, v in RDMA_TARGET.items() if k != "connect_timeout_s"} | {"connect": "existing"}
    cfg = suite(tmp_path, target, [G1, L1])
    fab = Fabric(scenario="tcp")  # only kv0 is connected, over TCP
    out = run(cfg, tmp_path, fab)
    for v in out.verdicts:
        assert v.outcome.value == "ERROR" and f"{KV1} is not connected" in v.reason
        assert f"subsystems seen: {KV0}" in v.reason
    assert not [c for c in fab.commands if c[0] in ("fio", "dd", "blockdev")]
    assert not sent(fab, "nvme connect") and not sent(fab, "nvme disconnect")
    kept = out.bundle.path / "gates" / "G1" / "n1" / "nvme-list-subsys.json"
    assert KV0 in kept.read_text()


def test_inventory_says_rdma_and_the_live_controller_is_tcp(tmp_path):
    target = {"name": "kv-rdma", "kind": "nvmeof", "connect": "existing", "nqn": KV0, "transport": "rdma",
              "traddr": "127.0.0.1", "trsvcid": "4420"}
    cfg = suite(tmp_path, target, [G1])
    fab = Fabric(scenario="tcp")
    out = run(cfg, tmp_path, fab)
    (v,) = out.verdicts
    assert v.outcome.value == "ERROR" and "expected rdma traddr=127.0.0.1,trsvcid=4420; found nvme0 tcp" in v.reason
    assert v.actual is None and not [c for c in fab.commands if c[0] in ("fio", "blockdev")]


def test_a_managed_target_that_does_not_answer_is_an_error_and_nothing_stays_connected(tmp_path):
    cfg = suite(tmp_path, RDMA_TARGET | {"connect_timeout_s": 1}, [G1])
    fab = Fabric(hang=("nvme discover",))
    t0 = time.monotonic()
    out = run(cfg, tmp_path, fab)
    assert time.monotonic() - t0 < 30
    (v,) = out.verdicts
    assert v.outcome.value == "ERROR" and "connect: managed failed: discovery at rdma traddr=10.0.2.15" in v.reason
    assert not sent(fab, "nvme connect") and not sent(fab, "nvme disconnect") and fab.scenario == "none"


def test_a_namespace_holding_a_filesystem_is_not_written_without_allow_destructive(tmp_path):
    cfg = suite(tmp_path, RDMA_TARGET, [L1])
    fab = Fabric(lsblk={"fstype": "ext4"})
    out = run(cfg, tmp_path, fab)
    (v,) = out.verdicts
    assert v.outcome.value == "ERROR" and "refusing to write to /dev/nvme0n1" in v.reason
    assert "holds filesystem ext4" in v.reason and "nothing was written" in v.reason
    assert not [c for c in fab.commands if c[0] == "dd"]
    guard = json.loads((out.bundle.path / "gates" / "L1" / "n1" / "write-guard.json").read_text())
    assert guard["allowed"] is False and guard["device_serial"] == "f1d527792f87a4f2bf9b"
    assert sent(fab, "nvme disconnect")  # and the managed connect was taken back


def test_allow_destructive_with_the_namespace_serial_writes_through_the_fabric_and_reads_back(tmp_path):
    target = RDMA_TARGET | {"allow_destructive": True, "serial": "f1d527792f87a4f2bf9b"}
    cfg = suite(tmp_path, target, [L1])
    fab = Fabric(lsblk={"fstype": "ext4"})
    disk = bytearray(8 << 20)

    def dd(call):
        a = dict(x.split("=", 1) for x in call.argv[1:] if "=" in x)
        bs, count = int(a["bs"]), int(a["count"])
        if a["of"] == "/dev/nvme0n1":
            off = int(a["seek"]) * bs
            disk[off:off + bs * count] = fab.node.files[a["if"]]
        else:
            off = int(a["skip"]) * bs
            fab.node.files[a["of"]] = bytes(disk[off:off + bs * count])
        return Reply()
    inner = fab.handler
    fab.node.handler = lambda call: dd(call) if call.argv[0] == "dd" else inner(call)
    out = run(cfg, tmp_path, fab)
    (v,) = out.verdicts
    assert v.outcome.value == "PASS", v.reason
    checks = json.loads((out.bundle.path / "gates" / "L1" / "result.json").read_text())["evidence"]["nodes"]["n1"]
    assert [c["direction"] for c in checks["checks"]] == ["nvme->nvme"] and checks["mismatched_bytes"] == 0
    assert checks["nvmeof"]["transport"] == "rdma"


@pytest.mark.parametrize("mode", ["existing", "managed"])
def test_plan_lists_the_check_before_the_gate_reads(tmp_path, mode):
    target = RDMA_TARGET if mode == "managed" else \
        {k: v for k, v in RDMA_TARGET.items() if k != "connect_timeout_s"} | {"connect": "existing"}
    cfg = suite(tmp_path, target, [G1])
    attach, detach = managed_nvmeof_plan(cfg)
    assert bool(attach) == (mode == "managed") and bool(detach) == (mode == "managed")
    steps = gate_plan(cfg, cfg.suite.gates[0])
    assert [s.argv for s in steps[:5]] == list(N.probe_commands(N.NvmeofSpec.from_target(
        cfg.inventory.nodes[0].targets[0])).values())
