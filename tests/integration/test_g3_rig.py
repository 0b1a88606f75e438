"""G3 on the 8-node rig: real namespaces, real sshds, sshfs through one tbf-shaped port, kvgate over SSH.

Needs root, /dev/fuse, iproute2, openssh-server, sshfs (CI is root). One rig per module, torn down by
name/PID in the fixture's finally, also when a test fails.
"""

import json
import pwd
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml

from harness.report.bundle import generate_keypair, load_private_key, verify_bundle
from harness.config import load_config
from harness.workloads import WORKLOADS
from harness.rigs.netns import (RigSpec, check_prerequisites, kill_node, node_processes, rig_down, rig_status, rig_up,
                         set_node_link)
from harness.suite.runner import run_suite
from harness.gates.verdict import Outcome
import harness.workloads.g3_shared_read  # noqa: F401  (registers g3-shared-read)

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
missing = check_prerequisites()
if missing:
    pytest.skip(f"rig prerequisites missing: {', '.join(missing)}", allow_module_level=True)


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    # 500 Mbit/s: the shaped port, not this small shared CI machine's CPUs (ssh ciphers, FUSE), must be
    # the bottleneck for the ratio to mean anything; `kvgate rig up` defaults to 1 Gbit/s.
    spec = RigSpec(prefix="kvgt-", state_dir=tmp_path_factory.mktemp("rig"), node_count=8, port_rate_mbit=500)
    try:
        state = rig_up(spec)
        yield spec, state
    finally:
        rig_down(spec)
    assert not any(ns.startswith("kvgt-") for ns in __import__("harness.rigs.netns", fromlist=["x"]).existing_namespaces())


def suite_file(tmp_path, nodes=None, **params) -> Path:
    data = yaml.safe_load((REPO / "gates" / "g3-rig.yaml").read_text())
    data["gates"][0]["params"].update({"chunks": 4, "read_timeout_s": 90}, **params)
    if nodes is not None:
        data["gates"][0]["nodes"] = nodes
    p = tmp_path / "g3.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


def run_g3(rig, tmp_path, nodes=None, **params):
    spec, state = rig
    out = tmp_path / "out"
    out.mkdir()
    generate_keypair(out / "k")
    cfg = load_config(state.inventory_path, suite_file(tmp_path, nodes, **params), WORKLOADS)
    res = run_suite(cfg, out, load_private_key(out / "k.key"), known_hosts_path=state.known_hosts,
                    progress=lambda m: None)
    return res, out


def readers_left(spec):
    return {n: [c for _, c in node_processes(spec, n) if "g3_reader.py" in c] for n in spec.node_names()}


def test_rig_is_eight_ssh_nodes_behind_one_shaped_port(rig):
    spec, state = rig
    st = rig_status(spec)
    assert st["up"] and all(st["ssh_reachable"].values())
    inv = yaml.safe_load(Path(state.inventory_path).read_text())
    names = [n["name"] for n in inv["nodes"]]
    assert names == [f"n{i}" for i in range(1, 9)] + ["storage"]
    assert all(n["transport"] == "ssh" and n["host"] == "127.0.0.1" for n in inv["nodes"])
    storage = inv["nodes"][-1]
    assert storage["nics"] == [{"name": "st0", "line_rate_gbit_s": 0.5}]


def test_a_nodes_login_shell_reads_an_empty_bashrc_and_this_machines_is_left_alone(rig):
    # sshd runs every command as `bash -c`, which sources ~/.bashrc: this machine's is set up for people
    # (pyenv init alone costs ~0.1 CPU-s per command), which a fresh node's is not.
    spec, state = rig
    host_rc = Path(pwd.getpwnam("root").pw_dir) / ".bashrc"
    if not host_rc.is_file():
        pytest.skip(f"this machine has no {host_rc} to hide")
    before = host_rc.read_bytes()
    for who in ("n1", "storage"):
        cp = subprocess.run(["ssh", "-F", state.ssh_config, who, f"wc -c < {host_rc}"], capture_output=True,
                            text=True, timeout=30)
        assert (cp.returncode, cp.stdout.strip()) == (0, "0"), (who, cp.stderr)
    assert host_rc.read_bytes() == before


def test_g3_end_to_end_passes_near_the_shaped_ceiling_and_bundle_verifies(rig, tmp_path):
    spec, _ = rig
    res, out = run_g3(rig, tmp_path)
    v = res.verdicts[0]
    assert v.outcome is Outcome.PASS, v.reason
    m = v.metrics
    assert m["nodes_completed"] == 8
    # The tbf port is the bottleneck: the aggregate is near its rate and never above it.
    assert 0.90 <= m["nic_ceiling_ratio"] <= 1.02
    ev = v.evidence
    rates = ev["aggregate"]["per_node_read_gb_s"]
    assert len(rates) == 8 and all(r > 0 for r in rates.values())
    # TCP flows through one tbf are not perfectly fair; the metric reports it (slowest / fastest).
    assert m["fairness_min_max"] == pytest.approx(min(rates.values()) / max(rates.values()))
    assert ev["port_rate"]["tbf_rate_gbit_s"] == pytest.approx(0.5)
    assert all(n["direct_used"] for n in ev["nodes"].values())  # O_DIRECT works through this FUSE mount
    assert all(n["start_priority"] == "fifo" for n in ev["nodes"].values())  # root: realtime wake at the start
    assert all(d["dropped"] for d in ev["page_cache_dropped"].values())
    # All rig nodes share one clock: the node-clock start times give the true skew.
    starts = ev["start_times_node_clock_s"].values()
    assert max(starts) - min(starts) < 0.25
    assert verify_bundle(res.bundle.path, out / "k.pub").ok
    run_dir = res.run_dir
    for n in spec.node_names():
        assert (run_dir / "gates" / "G3" / "nodes" / n / "reader.jsonl").stat().st_size > 0
    assert readers_left(spec) == {n: [] for n in spec.node_names()}
    # The real bundle's report draws every reader's rate over time against the port's line rate.
    assert ev["nic_line_rate_gb_s"] == pytest.approx(0.5 / 8)
    assert sorted(ev["series"]) == spec.node_names() and all(len(ev["series"][n]) >= 2 for n in spec.node_names())
    svg = (run_dir / "charts" / "G3-series.svg").read_text()
    for gid in [f"series-{n}" for n in spec.node_names()] + ["aggregate-line", "nic-ceiling-line"]:
        assert f'id="{gid}"' in svg, gid
    assert 'id="chart-G3-series"' in (run_dir / "report.html").read_text()
    table = (run_dir / "tables" / "G3-series.csv").read_text().splitlines()
    assert table[0] == "node,t_s,read_gb_s" and {r.split(",")[0] for r in table[1:]} == set(spec.node_names())


def test_isolation_four_readers_alone_then_while_a_fifth_node_writes_through_the_port(rig, tmp_path):
    # Before the fault tests (they kill n3). The writer n8 writes into the pool through the same shaped port
    # (st0's two directions are shaped alike: its writes and the reads share the port, not one direction).
    spec, _ = rig
    readers = ["n1", "n2", "n3", "n4"]
    res, out = run_g3(rig, tmp_path, readers=readers, writer={"node": "n8", "files": 4})
    v = res.verdicts[0]
    assert v.outcome is Outcome.PASS, v.reason
    ev, m = v.evidence, v.metrics
    iso = ev["isolation"]
    assert iso["writer"] == "n8" and iso["compared"] == readers and sorted(ev["nodes"]) == readers
    # the writer wrote through the readers' whole window, its bytes counted and checked
    w = iso["writer_record"]
    assert w["completed"] and w["error"] is None and w["window_bytes"] > 0
    assert w["longest_idle_s"] <= 2.0 and w["bytes_written"] >= w["window_bytes"]
    assert m["writer_write_gb_s"] == pytest.approx(w["window_write_gb_s"]) and m["writer_write_gb_s"] > 0
    checks = {c["name"]: c["ok"] for c in ev["validity"]}
    assert checks["writer wrote"] and checks["comparison"] and checks["cold (with writer)"]
    # the loss is the readers' aggregate with the writer against the same readers' aggregate alone
    alone, with_w = iso["alone"], iso["with_writer"]
    assert m["readers_loss"] == pytest.approx(1 - with_w["aggregate_read_gb_s"] / alone["aggregate_read_gb_s"])
    assert sorted(iso["per_node_loss"]) == readers and sorted(with_w["per_node_read_gb_s"]) == readers
    assert with_w["aggregate_read_gb_s"] <= 1.02 * 0.5 / 8  # never above the shaped port
    g3 = res.run_dir / "gates" / "G3"
    for n in readers:
        assert (g3 / "nodes" / n / "reader-with-writer.jsonl").stat().st_size > 0
    assert '"mode":"write"' in (g3 / "nodes" / "n8" / "writer.jsonl").read_text()
    # what the writer wrote is removed, and nothing of kvgate's is left running on any node
    assert not (spec.pool_dir / "kvgate-g3-writes" / "n8").exists()
    assert readers_left(spec) == {n: [] for n in spec.node_names()}
    assert verify_bundle(res.bundle.path, out / "k.pub").ok


def test_node_killed_mid_read_is_error_with_partial_series_others_kept(rig, tmp_path):
    spec, _ = rig
    victim = "n3"
    series_file = spec.work_dir / f"g3-G3-{victim}" / "series.jsonl"  # rig nodes share this filesystem
    if series_file.exists():
        series_file.unlink()
    killed = []

    def killer():
        deadline = time.time() + 120
        while time.time() < deadline:
            if series_file.exists() and series_file.read_text().count('"sample"') >= 10:
                killed.extend(kill_node(spec, victim))
                return
            time.sleep(0.05)

    th = threading.Thread(target=killer, daemon=True)
    th.start()
    t0 = time.time()
    res, out = run_g3(rig, tmp_path)
    th.join(5)
    assert killed, "the reader on the victim never produced samples"
    assert time.time() - t0 < 150
    v = res.verdicts[0]
    assert v.outcome is Outcome.ERROR and victim in v.reason
    ev = v.evidence
    assert set(ev["failed_nodes"]) == {victim}
    node = ev["nodes"][victim]
    assert node["samples"] >= 1 and not node["completed"] and node["truncated"]
    partial = (res.run_dir / "gates" / "G3" / "nodes" / victim / "reader.jsonl").read_text()
    assert '"sample"' in partial and '"end"' not in partial
    others = [n for n in spec.node_names() if n != victim]
    assert all(ev["nodes"][n]["completed"] for n in others)
    assert v.metrics["nodes_completed"] == 7
    assert res.bundle is not None  # an ERROR run is still a signed bundle with everyone's data
    assert readers_left(spec) == {n: [] for n in spec.node_names()}


def test_node_unreachable_at_start_is_a_clear_error_and_nothing_reads(rig, tmp_path):
    spec, _ = rig
    kill_node(spec, "n3")  # idempotent: dead already after the previous test
    res, _ = run_g3(rig, tmp_path)
    v = res.verdicts[0]
    assert v.outcome is Outcome.ERROR
    assert "unreachable" in v.reason and "n3" in v.reason
    assert not (res.run_dir / "gates" / "G3" / "launch.json").exists()
    assert readers_left(spec) == {n: [] for n in spec.node_names()}


def test_node_whose_link_goes_down_mid_read_is_error_long_before_the_read_timeout(rig, tmp_path):
    # Runs last: the victim's sshfs mount does not survive its link going down. n3 is dead since the
    # kill test, so the gate runs on the other seven readers.
    spec, _ = rig
    victim = "n5"
    readers = [n for n in spec.node_names() if n != "n3"]
    series_file = spec.work_dir / f"g3-G3-{victim}" / "series.jsonl"
    if series_file.exists():
        series_file.unlink()
    downed = []

    def cut():
        deadline = time.time() + 120
        while time.time() < deadline:
            if series_file.exists() and series_file.read_text().count('"sample"') >= 10:
                set_node_link(spec, victim, up=False)
                downed.append(time.time())
                return
            time.sleep(0.05)

    th = threading.Thread(target=cut, daemon=True)
    th.start()
    try:
        res, out = run_g3(rig, tmp_path, nodes=readers + ["storage"], read_timeout_s=300,
                          stall_timeout_s=8)
        ended = time.time()
        th.join(5)
        assert downed, "the reader on the victim never produced samples"
        # Noticed by its silence (stall_timeout_s), not at the 300 s read timeout.
        assert ended - downed[0] < 120
        v = res.verdicts[0]
        assert v.outcome is Outcome.ERROR and victim in v.reason
        ev = v.evidence
        assert set(ev["failed_nodes"]) == {victim} and "no output" in ev["failed_nodes"][victim]
        assert ev["nodes"][victim]["samples"] >= 1 and not ev["nodes"][victim]["completed"]
        partial = (res.run_dir / "gates" / "G3" / "nodes" / victim / "reader.jsonl").read_text()
        assert '"sample"' in partial
        assert all(ev["nodes"][n]["completed"] for n in readers if n != victim)
        assert v.metrics["nodes_completed"] == len(readers) - 1
        assert verify_bundle(res.bundle.path, out / "k.pub").ok
        # Unreachable, the victim's reader still ends by itself (its pool mount and its SSH session
        # time out); none is left running anywhere.
        deadline = time.time() + 60
        while time.time() < deadline and any(readers_left(spec).values()):
            time.sleep(1)
        assert readers_left(spec) == {n: [] for n in spec.node_names()}
    finally:
        set_node_link(spec, victim, up=True)
