"""gates/loopback-faults.yaml in the real qemu guest (Debian's kernel): a two-path NVMe/TCP namespace read
through the native multipath head while a path goes down and comes back, a path turns ANA inaccessible and
back, the target restarts, and a path is slowed (netem on the guest's lo, the replies of the path's port only). One
guest boot and one run for every case (qemu TCG is slow); the target side is
torn down and qemu stopped by PID at the end, also on failure.
"""

import json
from pathlib import Path

import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from harness.config import load_config, load_inventory
from harness.rigs.loopback import Loopback, LoopbackSpec
from harness.suite.runner import run_suite
from harness.workloads import WORKLOADS

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def faulted_run(qemu_guest, tmp_path_factory):
    """The suite's one run over the guest (the target side up as `kvgate loopback up` makes it): its outcome,
    each gate's result, and the path configfs state after the run."""
    tr, _state, state_dir = qemu_guest
    tmp = tmp_path_factory.mktemp("faults-guest")
    inv = yaml.safe_load((ROOT / "inventory" / "loopback-faults.yaml").read_text())
    inv["nodes"][0]["labels"]["kvgate-guest"] = str(state_dir)
    inv_path = tmp / "inventory.yaml"
    inv_path.write_text(yaml.safe_dump(inv, sort_keys=False))
    node = load_inventory(inv_path).node("guest")
    lb = Loopback(tr, LoopbackSpec.from_target(node.target("kvmp"), "guest", node))
    try:
        up = lb.up(wait_s=120)
        assert up.ok, up.error
        assert up.summary["layers"]["port_link"], up.summary  # both ports carry the subsystem
        cfg = load_config(inv_path, ROOT / "gates" / "loopback-faults.yaml", WORKLOADS)
        from harness.rigs.guest import open_guest_transports
        transports = open_guest_transports(cfg.inventory)
        outcome = run_suite(cfg, tmp / "runs", Ed25519PrivateKey.generate(), key_kind="development",
                            transports=transports, make_tar=False, progress=print)
        links = tr.run(["sh", "-c", "ls /sys/kernel/config/nvmet/ports/*/subsystems/; "
                        "cat /sys/kernel/config/nvmet/ports/*/ana_groups/1/ana_state; "
                        "cat /sys/kernel/config/nvmet/subsystems/*/namespaces/1/enable; "
                        "tc qdisc show dev lo"], timeout_s=120)
        results = {g: json.loads((outcome.run_dir / "gates" / g / "result.json").read_text())
                   for g in ("F1-path-down", "F2-ana", "F3-target-restart", "F4-slow-path")}
        yield outcome, results, links.stdout
    finally:
        tr.run(["nvme", "disconnect", "-n", "nqn.2024-01.io.kvgate:loopback-kvmp"], timeout_s=120)
        lb.down()


def test_path_down_fails_over_within_the_bound_with_every_block_verified(faulted_run):
    outcome, results, _ = faulted_run
    v = {x.gate_id: x for x in outcome.verdicts}
    assert v["F1-path-down"].outcome.value == "PASS", v["F1-path-down"].reason
    ev = results["F1-path-down"]["evidence"]
    (fault,) = ev["faults"]
    assert fault["applied_ok"] and fault["undone_ok"] and fault["undone_by"] == "workload"
    assert fault["stall_s"] <= 5 and fault["recovery_s"] is not None
    assert ev["corrupted_chunks"] == 0 and ev["failed_reads"] == 0
    # the head counts nothing on 6.1: every byte is on a path, and the survivor carried the read while A was down
    by_path = {p["target"]: p["read_bytes"] for p in ev["paths"]}
    assert set(by_path) == {"kvmp-a", "kvmp-b"} and sum(by_path.values()) >= ev["read_bytes"] * 0.9
    assert fault["path_read_bytes"]["kvmp-b"] > 0
    # the fault was felt: path A carried reads in the 2 s before it went down (its own sampled counters)
    assert fault["path_read_bytes_before"] > 0 and ev["fio_exit_code"] == 0
    assert {c["name"] for c in ev["validity"]} >= {"fault felt", "fio finished"}
    assert all(c["ok"] for c in ev["validity"]), ev["validity"]


def test_ana_inaccessible_moves_the_read_and_comes_back(faulted_run):
    outcome, results, _ = faulted_run
    v = {x.gate_id: x for x in outcome.verdicts}
    assert v["F2-ana"].outcome.value == "PASS", v["F2-ana"].reason
    ev = results["F2-ana"]["evidence"]
    (fault,) = ev["faults"]
    assert fault["undone_ok"] and fault["path_read_bytes"]["kvmp-b"] > 0
    assert fault["path_read_bytes_before"] > 0  # felt: path A carried reads before it turned inaccessible
    assert ev["corrupted_chunks"] == 0 and ev["failed_reads"] == 0


def test_target_restart_stalls_then_recovers_with_data_intact(faulted_run):
    outcome, results, _ = faulted_run
    v = {x.gate_id: x for x in outcome.verdicts}
    ev = results["F3-target-restart"]["evidence"]
    (fault,) = ev["faults"]
    # every path is gone for duration_s: a real stall, measured, and the read came back
    assert fault["stall_s"] >= 1.0 and fault["recovery_s"] is not None, fault
    assert ev["corrupted_chunks"] == 0 and ev["failed_reads"] == 0
    assert v["F3-target-restart"].outcome.value == "PASS", v["F3-target-restart"].reason


def test_every_fault_is_undone_on_the_target(faulted_run):
    _, _, after = faulted_run
    lines = after.split()
    assert lines.count("nqn.2024-01.io.kvgate:loopback-kvmp") == 2  # linked to both ports again
    assert "inaccessible" not in lines and "1" in lines
    assert "4b56:" not in after and "netem" not in after  # the slow path's qdisc is gone from lo


def test_the_report_draws_each_paths_rate_with_the_fault_and_its_inverse_marked(faulted_run):
    outcome, _, _ = faulted_run
    svg = (outcome.run_dir / "charts" / "F1-path-down-series.svg").read_text()
    assert 'id="series-kvmp-a"' in svg and 'id="series-kvmp-b"' in svg
    assert 'id="mark-0"' in svg and 'id="mark-1"' in svg


def test_a_slowed_path_is_felt_and_ridden_out_with_every_block_verified(faulted_run):
    outcome, results, _ = faulted_run
    v = {x.gate_id: x for x in outcome.verdicts}
    assert v["F4-slow-path"].outcome.value == "PASS", v["F4-slow-path"].reason
    ev = results["F4-slow-path"]["evidence"]
    (fault,) = ev["faults"]
    assert fault["applied_ok"] and fault["undone_ok"] and fault["stall_s"] <= 5, fault
    assert ev["corrupted_chunks"] == 0 and ev["failed_reads"] == 0
    # the delay felt while it was surely in force (from the tc commands' return to the undo): 4 readers of 1 MiB
    # each waiting 500 ms per read reach ~8.4 MB/s at most, where the path read at tens of MB/s before
    felt = next(c for c in ev["validity"] if c["name"] == "delay felt")
    in_force_s = fault["t_undo_s"] - fault["t_in_force_s"]
    print(f"F4: apply took {fault['t_in_force_s'] - fault['t_apply_s']:.1f} s; {fault['pre_rate_mb_s']:.1f} MB/s "
          f"before, {fault['in_force_rate_mb_s']:.2f} MB/s over {in_force_s:.1f} s in force")
    assert felt["ok"] and in_force_s >= 5, (felt, fault)
    assert fault["in_force_rate_mb_s"] <= 0.5 * fault["pre_rate_mb_s"], fault
    # its recovery timed from when the delay was in force: the guest's policy (numa) kept every read on the slowed
    # path, so the read got back to half its rate only after the undo (or not before the read ended); reported,
    # not bound (the gate sets no slowed_min_fraction)
    assert fault["recovery_s"] is None or fault["recovery_s"] >= in_force_s - 1.0, (fault, in_force_s)
