"""Probes: a node command and its parser together, tested against captured output (tests/fixtures/), and the
steps fio-read and kv-read share (NUMA pinning, fio's result)."""

from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.errors import WorkloadError
from harness.execute.facts import FACTS
from harness.parsers.facts import NUMA_ARGV, NUMA_PROBE, parse_numa
from harness.parsers.g3series import parse_reader_output
from harness.parsers.pooldev import pool_blockstat_argv, pool_device_probe
from harness.transport.base import CommandResult
from harness.workloads.kit.probes import check_fio_groups, fio_json, pins_numa
from harness.parsers.fio import parse_fio_json

FIX = Path(__file__).resolve().parents[1] / "fixtures"


def test_numa_probe_reads_every_node_with_cpus_from_captured_output():
    assert NUMA_PROBE.parse((FIX / "provenance" / "numa_debian12_vm.txt").read_text()) == {0: "0-1"}
    text = (FIX / "provenance" / "numa_2socket_cxl_handwritten.txt").read_text()
    # a CPU-less memory node is no place to pin a stream; the facts still record every node
    assert NUMA_PROBE.parse(text) == {0: "0-15,32-47", 1: "16-31,48-63"}
    assert NUMA_PROBE.parse("0 0-3\n1 garbage\n") == {0: "0-3"}
    assert parse_numa("0 0-3\n1 4-7\n") == {0: "0-3", 1: "4-7"}


def test_the_numa_probe_is_the_fact_the_run_records():
    assert NUMA_PROBE.argv == NUMA_ARGV == next(f.argv for f in FACTS if f.key == "numa_nodes")


def test_streams_are_pinned_only_when_asked_and_a_gpu_names_its_numa_node():
    node = SimpleNamespace(gpus=[SimpleNamespace(numa_node=None), SimpleNamespace(numa_node=1)])
    assert pins_numa(True, node) and not pins_numa(False, node)
    assert not pins_numa(True, SimpleNamespace(gpus=[SimpleNamespace(numa_node=None)]))
    assert not pins_numa(True, SimpleNamespace(gpus=[]))


def test_the_pool_device_probe_is_the_command_kv_read_and_g2_send():
    probe = pool_device_probe("/pool")
    assert probe.argv == pool_blockstat_argv("/pool")
    dev = probe.parse((FIX / "pooldev" / "loop-ext4.out").read_text())
    assert dev.maj_min == "7:0"


def _result(stdout: str, rc: int = 0) -> CommandResult:
    return CommandResult(("fio",), rc, stdout, "fio: error\n" if rc else "", 1.0, False, None, "n1")


def test_fio_result_failed_errors_and_no_jobs_are_errors():
    text = (FIX / "fio" / "io_uring_2groups_2jobs_grouped.json").read_text()
    run = fio_json(_result(text))
    check_fio_groups(run)
    assert [g.label for g in run.groups] == ["gpu0", "gpu1"]
    with pytest.raises(WorkloadError, match="fio failed"):
        fio_json(_result(text, rc=1))
    with pytest.raises(WorkloadError, match="no jobs"):
        check_fio_groups(parse_fio_json('{"fio version": "fio-3.33", "jobs": []}'))


def test_the_g3_readers_armed_and_start_records_from_a_rig_reader():
    out = parse_reader_output((FIX / "g3" / "reader-netns-rig-n14.jsonl").read_text(), "n14")
    assert out.armed["direct_used"] is True and out.armed["direct_error"] is None
    assert out.start["start_priority"] == "fifo"
    assert out.series.completed and out.series.total_bytes == 67108920
    assert parse_reader_output('{"type": "sample", "t0_s": 1, "t1_s": 2, "bytes": 3}\n', "n").armed == {}


def test_a_loopback_target_resolves_to_the_namespace_its_loopback_connected(tmp_path):
    """fio-read reads a `kind: nvmeof-loopback` target through the /dev/nvmeXnY found by its NQN: the resolver
    is in the target table (workloads/kit/targets.py), not registered by importing another workload."""
    from test_workload_runs import context, loopback_node
    from harness.rigs.loopback import resolve_loopback_device
    from harness.workloads.kit.targets import TARGET_RESOLVERS, target_device

    assert TARGET_RESOLVERS["nvmeof-loopback"] is resolve_loopback_device
    cfg, node = loopback_node()
    ctx = context(cfg, "L1", {"guest": node}, tmp_path)
    inv_node = cfg.inventory.node("guest")
    assert target_device(ctx, inv_node, inv_node.target("kv0"), node) == ("/dev/nvme0n1", None)
