"""fio-faults' pure parts: fio's completion log and verify failures, the paths' counters, and the judgement of
each fault (stall, recovery, bytes per path) and of the gate (bounds, integrity, validity)."""

import json

import pytest

from harness.workloads.kit.faults import AppliedFault, ScheduledFault
from harness.parsers.blockdev import parse_block_stat
from harness.parsers.faultio import (Completion, parse_clat_log, parse_path_samples, parse_path_stats,
                                     parse_verify_failures)
from harness.workloads.fio_faults import (FaultRecord, FioFaultsEvidence, PathRead, evaluate_faults, judge_fault,
                                          longest_gap, recovery_s)

MIB = 1 << 20


def steady(t0: float, t1: float, every_s: float, bs: int = MIB) -> list[Completion]:
    n = int(round((t1 - t0) / every_s))
    return [Completion(round(t0 + i * every_s, 3), bs) for i in range(n)]


def stat(read_sectors: int) -> str:
    return f"   10 0 {read_sectors} 5 0 0 0 0 0 5 5 0 0 0 0 0 0"


def test_clat_log_lines_become_completions_in_time_order():
    log = "1796164059962, 1538450, 0, 1048576, 0\n1796164059960, 3159513, 0, 1048576, 1048576\n\n"
    done = parse_clat_log(log)
    assert [c.t_s for c in done] == [1796164059.96, 1796164059.962] and {c.bytes for c in done} == {MIB}
    with pytest.raises(ValueError, match="line 1"):
        parse_clat_log("12, x\n")


def test_verify_failures_are_read_from_fios_stderr():
    err = ("crc32c: verify failed at file /dev/nvme1n1 offset 3145728, length 1048576 (requested block: ...)\n"
           "       Expected CRC: 08880f6f\n"
           "crc32c: verify failed at file /dev/nvme1n1 offset 3145728, length 1048576 (requested block: ...)\n")
    assert parse_verify_failures(err) == [(3145728, MIB), (3145728, MIB)]


def test_path_counters_and_samples_parse_per_device():
    st = parse_path_stats(f"nvme1c1n1 {stat(2048)}\nnvme1c2n1 \n")
    assert list(st) == ["nvme1c1n1"] and st["nvme1c1n1"].read_bytes == MIB  # an unreadable stat is left out
    samples = parse_path_samples(f"T 100.0\nnvme1c1n1 {stat(0)}\nT 100.5\nnvme1c1n1 {stat(4096)}\n")
    assert [t for t, _ in samples] == [100.0, 100.5] and samples[1][1]["nvme1c1n1"].read_bytes == 2 * MIB


def test_the_stall_is_the_longest_gap_across_the_fault_window():
    times = [0.0, 0.1, 0.2, 3.2, 3.3, 9.0]
    assert longest_gap(times, 0.15, 3.25) == pytest.approx(3.0)  # 0.2 -> 3.2 spans the fault at 0.15
    assert longest_gap(times, 3.25, 5.0) == pytest.approx(5.7)  # crosses the window's end: counted
    assert longest_gap([0.0, 0.1], 1.0, 4.0) == pytest.approx(3.9)  # nothing after the fault: from the last to the end


def test_recovery_is_the_first_window_back_at_the_fraction_of_the_rate_before():
    done = steady(0, 4, 0.01) + steady(6, 12, 0.01)  # 100 MiB/s, nothing from 4 to 6 s
    assert recovery_s(done, 4.0, 104.8, 0.5) == pytest.approx(2.0, abs=0.02)
    assert recovery_s(done, 4.0, 104.8, 1.5) is None  # never back at 150 %
    assert recovery_s(steady(0, 4, 0.01), 4.0, 104.8, 0.5) is None  # the log ended


def fault(t_apply: float, **kw) -> FaultRecord:
    return FaultRecord(index=0, kind="path-down", path="kvmp-a", detail="path kvmp-a down", applied_ok=True,
                       undone_ok=True, undone_by="workload", t_apply_s=t_apply, **kw)


# path kvmp-a's device (nvme1c1n1) reading 1 MiB every 0.5 s up to the fault at 4 s (a fault it can feel), then
# kvmp-b's (nvme1c2n1) carrying the read
BUSY_A = [(t, {"nvme1c1n1": parse_block_stat(stat(int(min(t, 3.9) * 4096))),
               "nvme1c2n1": parse_block_stat(stat(int(max(0, t - 3.9) * 4096)))}) for t in (2.0, 2.5, 3.0, 3.5, 3.9, 12.0)]


def judged(done: list[Completion], rec: FaultRecord, end: float, samples=BUSY_A) -> FaultRecord:
    """judge_fault on path kvmp-a (device nvme1c1n1), its samples ``samples`` (busy before the fault by default)."""
    return judge_fault(done, rec, end, 0.5, samples, "nvme1c1n1")


def evidence(**kw) -> FioFaultsEvidence:
    base = dict(region_bytes=64 * MIB, bs_bytes=MIB, jobs=4, runtime_s=12, recover_fraction=0.5,
                recovery_bound_s=10, completions=1000, read_bytes=1000 * MIB, corrupted_chunks=0, failed_reads=0,
                fio_exit_code=0,
                paths=[PathRead(target="kvmp-a", read_bytes=600 * MIB), PathRead(target="kvmp-b", read_bytes=400 * MIB)])
    base.update(kw)
    return FioFaultsEvidence(**base)


def test_a_fault_is_judged_from_the_log_and_the_path_samples():
    done = steady(0, 4, 0.01) + steady(5, 12, 0.01)
    samples = [(t, {"nvme1c1n1": parse_block_stat(stat(a)), "nvme1c2n1": parse_block_stat(stat(b))})
               for t, a, b in ((3.9, 1000, 0), (8.1, 1000, 4096))]
    rec = judge_fault(done, fault(4.0), 8.0, 0.5, samples)
    assert rec.stall_s == pytest.approx(1.01, abs=0.02) and rec.recovery_s == pytest.approx(1.0, abs=0.02)
    assert rec.pre_rate_mb_s == pytest.approx(104.9, abs=0.5)
    assert rec.path_read_bytes == {"nvme1c1n1": 0, "nvme1c2n1": 2 * MIB}  # the survivor carried the read


def test_a_gate_within_its_bounds_with_data_intact_has_its_stall_as_metric_and_no_failure():
    done = steady(0, 4, 0.01) + steady(5, 12, 0.01)
    rec = judged(done, fault(4.0), 12.0)
    res = evaluate_faults(evidence(faults=[rec]))
    assert res.metrics["max_stall_s"] == rec.stall_s and res.failed_check is None and res.invalid_reason is None
    assert {c.name for c in res.evidence.validity} >= {"reads logged", "faults made", "faults undone",
                                                        "rate before each fault", "integrity checked"}


@pytest.mark.parametrize("change, says", [
    (dict(corrupted_chunks=2, corrupted_offsets=[0, MIB]), "2 corrupted chunk"),
    (dict(failed_reads=3), "3 read(s) failed"),
])
def test_a_corrupted_chunk_or_a_lost_read_is_a_failure_whatever_the_stall(change, says):
    done = steady(0, 4, 0.01) + steady(4.2, 12, 0.01)
    rec = judged(done, fault(4.0), 12.0)
    res = evaluate_faults(evidence(faults=[rec], **change))
    assert says in res.failed_check and res.metrics["max_stall_s"] < 1


def test_a_recovery_past_its_bound_or_never_is_a_failure():
    done = steady(0, 4, 0.01) + steady(4.1, 12, 0.05)  # back, at a fifth of the rate: never recovers to 50 %
    rec = judged(done, fault(4.0), 12.0)
    res = evaluate_faults(evidence(faults=[rec]))
    assert rec.recovery_s is None and "no recovery to 50%" in res.failed_check


def test_a_fault_not_undone_or_without_a_rate_before_it_is_not_proven():
    done = steady(0, 12, 0.01)
    undone = fault(4.0).model_copy(update=dict(undone_ok=False, undo_error="rm: exit 1"))
    res = evaluate_faults(evidence(faults=[judged(done, undone, 12.0)]))
    assert "faults undone: not proven" in res.invalid_reason
    early = judge_fault(done, fault(0.2), 12.0, 0.5, [])  # 0.2 s of log before it: no baseline
    res = evaluate_faults(evidence(faults=[early]))
    assert early.pre_rate_mb_s is None and "rate before each fault: not proven" in res.invalid_reason


def test_the_timeline_chart_marks_each_fault_and_its_inverse_on_the_paths_rates():
    from harness.report.charts import node_series_svg
    series = {"kvmp-a": [(0.5, 0.1), (4.0, 0.1), (4.5, 0.0), (8.5, 0.05)],
              "kvmp-b": [(0.5, 0.0), (4.5, 0.1), (8.5, 0.05)]}
    svg = node_series_svg(series, unit="GB/s", marks=[(4.1, "fault 0: path kvmp-a down"), (8.1, "fault 0 undone")])
    assert 'id="mark-0"' in svg and 'id="mark-1"' in svg and 'id="series-kvmp-a"' in svg
    assert "fault 0: path kvmp-a down" in svg
    assert 'id="mark-0"' not in node_series_svg(series)  # nothing marked where nothing happened


def test_an_operators_fault_is_timed_from_the_first_lost_io_not_from_the_prompt():
    from harness.workloads.fio_faults import first_lost_io
    times = [c.t_s for c in steady(0, 6, 0.01) + steady(8.5, 12, 0.01)]  # prompted at 4 s, cable pulled at ~6 s
    assert first_lost_io(times, 4.0, 10.0) == pytest.approx(5.99, abs=0.01)
    assert first_lost_io([c.t_s for c in steady(0, 12, 0.01)], 4.0, 10.0) is None  # nothing lost: no such time
    assert first_lost_io(times, 9.0, 12.0) is None  # the gap ended before the window: not this fault's


def test_an_operator_fault_says_what_the_operator_does_and_runs_its_command_with_its_undo():
    from pydantic import ValidationError

    from harness.workloads.fio_faults import FaultSpec
    ok = FaultSpec(kind="operator", description="controller A takeover", command=["array-cli", "takeover", "A"],
                   undo=["array-cli", "giveback", "A"], at_s=4, duration_s=10)
    assert ok.command and ok.undo
    FaultSpec(kind="operator", description="pull the cable of path A", at_s=4, duration_s=10)  # by hand
    for bad in (dict(kind="operator", at_s=4, duration_s=1),
                dict(kind="operator", description="x", command=["a"], at_s=4, duration_s=1),
                dict(kind="path-down", path="a", description="x", at_s=4, duration_s=1)):
        with pytest.raises(ValidationError):
            FaultSpec(**bad)


def test_an_operators_fault_is_judged_from_the_lost_io(tmp_path):
    from types import SimpleNamespace

    from harness.execute.undo import UndoEntry
    from harness.workloads.fio_faults import FaultSpec, FioFaults, FioFaultsParams
    f = FaultSpec(kind="operator", description="pull the cable of path A", at_s=4, duration_s=6)
    params = FioFaultsParams(target="kvmp-a", paths=["kvmp-a", "kvmp-b"], runtime_s=14, faults=[f])
    done = steady(1000, 1006, 0.01) + steady(1008, 1014, 0.01)  # prompted at 1004, I/O lost from ~1006 to 1008
    ran = SimpleNamespace(ok=True, stdout="kvgate-fault-clock 1004.0\nkvgate-fault-clock 1004.01\n")
    undone = SimpleNamespace(ok=True, stdout="kvgate-fault-clock 1010.0\nkvgate-fault-clock 1010.01\n")
    entry = UndoEntry("guest", "fault0-operator", ("true",), done=True, ran_by="workload", ok=True)
    ctx = SimpleNamespace(params=params, gate_dir=tmp_path)
    made = AppliedFault(ScheduledFault(0, f, "operator: pull", ("true",), ("true",)), ran, entry, undone, 4.0, 10.0)
    res = FioFaults._judge(ctx, evidence(runtime_s=14), done, [], [made], [])
    (rec,) = res.evidence.faults
    assert rec.timed_from == "first lost I/O" and rec.t_apply_s == pytest.approx(5.99, abs=0.01)
    assert rec.stall_s == pytest.approx(2.0, abs=0.02) and res.metrics["max_stall_s"] == rec.stall_s
    assert [m[1] for m in res.evidence.series_marks] == ["fault 0: operator: pull", "fault 0 undone"]


def test_a_bundle_is_rejudged_from_its_raw_files_to_the_same_figures_and_a_tampered_log_fails():
    from harness.workloads.fio_faults import FioFaultsParams, FaultSpec, judge_run, reevaluate_faults
    clat = "".join(f"{int(c.t_s * 1000)}, 500, 0, {c.bytes}, 0\n"
                   for c in steady(1000, 1004, 0.01) + steady(1005.2, 1012, 0.01))
    paths = (f"T 1003.9\nnvme0c0n1 {stat(1000)}\nnvme0c1n1 {stat(0)}\n"
             f"T 1008.1\nnvme0c0n1 {stat(1000)}\nnvme0c1n1 {stat(4096)}\n")
    raw = {"clat": clat, "paths": paths, "log": "", "json": '{"jobs": [{"total_err": 0}]}'}
    params = FioFaultsParams(target="kvmp-a", paths=["kvmp-a", "kvmp-b"], runtime_s=12,
                             faults=[FaultSpec(kind="path-down", path="kvmp-a", at_s=4, duration_s=4)])
    rec = fault(1004.0).model_copy(update=dict(t_undo_s=1008.0))
    ev = evidence(paths=[PathRead(target="kvmp-a", device="nvme0c0n1"), PathRead(target="kvmp-b", device="nvme0c1n1")])
    run = judge_run(ev, parse_clat_log(clat), parse_path_samples(paths), [rec], 0.5)
    again = reevaluate_faults(run.evidence.as_dict(), raw, params)
    assert again.metrics == run.metrics and again.failed_check is None and run.metrics["max_stall_s"] > 1
    assert again.evidence.faults[0].path_read_bytes == {"kvmp-a": 0, "kvmp-b": 2 * MIB}
    bad = dict(raw, log="crc32c: verify failed at file /dev/nvme0n1 offset 4194304, length 1048576 (x)\n",
               json='{"jobs": [{"total_err": 1}]}')
    worse = reevaluate_faults(run.evidence.as_dict(), bad, params)
    assert "1 corrupted chunk" in worse.failed_check and worse.metrics["corrupted_chunks"] == 1


def test_fault_felt_a_path_down_while_the_other_path_carried_every_read_is_invalid_not_a_pass():
    """Native multipath with iopolicy numa keeps every read on one path: path A taken down while B carried every
    read stalls nothing (0.01 s) and proves nothing about failover: INVALID, never PASS."""
    done = steady(0, 12, 0.01)  # the read never paused
    idle_a = [(t, {"nvme1c1n1": parse_block_stat(stat(0)), "nvme1c2n1": parse_block_stat(stat(int(t * 4096)))})
              for t in (2.0, 2.5, 3.0, 3.5, 3.9, 12.0)]
    rec = judged(done, fault(4.0), 12.0, samples=idle_a)
    res = evaluate_faults(evidence(faults=[rec]))
    assert rec.stall_s == pytest.approx(0.01, abs=0.005) and rec.path_read_bytes_before == 0
    assert res.failed_check is None and "fault felt: not proven" in res.invalid_reason
    assert "fault 0 (kvmp-a): 0 B" in res.invalid_reason
    felt = next(c for c in res.evidence.validity if c.name == "fault felt")
    assert not felt.ok and felt.value == 0.0
    # no samples of the faulted path before the fault: not known, not felt
    res = evaluate_faults(evidence(faults=[judged(done, fault(4.0), 12.0, samples=[])]))
    assert "fault 0 (kvmp-a): unknown" in res.invalid_reason
    # the same read with path A busy before its fault: felt, and this check holds
    assert evaluate_faults(evidence(faults=[judged(done, fault(4.0), 12.0)])).invalid_reason is None


def test_fault_felt_a_bundle_whose_faulted_path_was_idle_is_rejudged_invalid_from_its_path_samples():
    from harness.workloads.fio_faults import FioFaultsParams, FaultSpec, judge_run, reevaluate_faults
    clat = "".join(f"{int(c.t_s * 1000)}, 500, 0, {c.bytes}, 0\n" for c in steady(1000, 1012, 0.01))
    paths = "".join(f"T {t}\nnvme0c0n1 {stat(0)}\nnvme0c1n1 {stat(int((t - 1000) * 4096))}\n"
                    for t in (1001.0, 1002.0, 1003.0, 1003.9, 1008.1, 1011.0))
    raw = {"clat": clat, "paths": paths, "log": "", "json": '{"jobs": [{"total_err": 0}]}'}
    params = FioFaultsParams(target="kvmp-a", paths=["kvmp-a", "kvmp-b"], runtime_s=12,
                             faults=[FaultSpec(kind="path-down", path="kvmp-a", at_s=4, duration_s=4)])
    rec = fault(1004.0).model_copy(update=dict(t_undo_s=1008.0))
    ev = evidence(paths=[PathRead(target="kvmp-a", device="nvme0c0n1"), PathRead(target="kvmp-b", device="nvme0c1n1")])
    signed = ev.as_dict()
    signed["faults"] = [rec.model_copy(update=dict(t_apply_unix_s=1004.0, t_undo_unix_s=1008.0,
                                                   path_read_bytes_before=1 << 30)).model_dump()]  # a claim
    again = reevaluate_faults(signed, raw, params)
    assert again.evidence.faults[0].path_read_bytes_before == 0
    assert "fault felt: not proven" in again.invalid_reason
    assert judge_run(ev, parse_clat_log(clat), parse_path_samples(paths), [rec], 0.5).invalid_reason == \
        again.invalid_reason


def test_failed_reads_unknown_a_truncated_fio_json_is_invalid_and_integrity_not_checked():
    from harness.workloads.fio_faults import integrity_of
    offsets, failed = integrity_of("", '{"jobs": [{"total_err": 0, "read": {"io_b')  # cut mid-write
    assert offsets == [] and failed is None
    done = steady(0, 12, 0.01)
    res = evaluate_faults(evidence(faults=[judged(done, fault(4.0), 12.0)], failed_reads=failed))
    checked = next(c for c in res.evidence.validity if c.name == "integrity checked")
    assert not checked.ok and "integrity checked: not proven" in res.invalid_reason
    assert "failed_reads" not in res.metrics


@pytest.mark.parametrize("rc, says", [(1, "the exit status of the spawned fio read: 1"),
                                      (None, "the exit status of the spawned fio read: not recorded")])
def test_fio_exit_a_non_zero_or_unknown_exit_of_the_faulted_read_is_invalid(rc, says):
    done = steady(0, 12, 0.01)
    res = evaluate_faults(evidence(faults=[judged(done, fault(4.0), 12.0)], fio_exit_code=rc))
    assert res.failed_check is None and f"fio finished: not proven ({says})" in res.invalid_reason
    # a corrupted read is still a FAIL whatever fio's exit status (a failed check comes before INVALID)
    bad = evaluate_faults(evidence(faults=[judged(done, fault(4.0), 12.0)], fio_exit_code=rc, corrupted_chunks=1,
                                   corrupted_offsets=[0]))
    assert "1 corrupted chunk" in bad.failed_check


# ------------------------------------------------------------------ the captured guest run (tests/fixtures/faults/)


def test_the_captured_guest_run_re_derives_same_and_its_fault_was_felt(tmp_path):
    from faults_fixture import faults_run
    from harness.gates.reevaluate import reevaluate_bundle
    run, pred = faults_run(tmp_path)
    re = reevaluate_bundle(run, pred)
    assert re.same and re.checks[0].rederived, re.differences
    (fault,) = json.loads((run / "gates" / "F1-path-down" / "result.json").read_text())["evidence"]["faults"]
    assert fault["path_read_bytes_before"] > 0


def test_fault_felt_the_captured_run_with_path_a_idle_as_iopolicy_numa_leaves_it_is_invalid(tmp_path):
    from faults_fixture import faults_run, idle_faulted_path
    from harness.gates.reevaluate import reevaluate_bundle
    run, pred = faults_run(tmp_path)
    idle_faulted_path(run)
    again = reevaluate_bundle(run, pred).checks[0].reevaluated
    assert again["outcome"] == "INVALID" and "fault felt: not proven" in again["reason"]
    assert "fault 0 (kvmp-a): 0 B" in again["reason"]


def test_failed_reads_unknown_the_captured_run_with_its_fio_json_cut_short_is_invalid(tmp_path):
    from faults_fixture import faults_run, raw
    from harness.gates.reevaluate import reevaluate_bundle
    run, pred = faults_run(tmp_path)
    text = raw(run, "fio.json").read_text()
    raw(run, "fio.json").write_text(text[: len(text) // 2])
    again = reevaluate_bundle(run, pred).checks[0].reevaluated
    assert again["outcome"] == "INVALID" and "integrity checked: not proven" in again["reason"]


@pytest.mark.parametrize("name", ["fio-clat.log", "paths.log", "fio.json"])
def test_empty_raw_file_of_the_captured_run_is_an_error(tmp_path, name):
    from faults_fixture import faults_run, raw
    from harness.gates.reevaluate import reevaluate_bundle
    run, pred = faults_run(tmp_path)
    raw(run, name).write_text("")
    again = reevaluate_bundle(run, pred).checks[0].reevaluated
    assert again["outcome"] == "ERROR" and f"gates/F1-path-down/guest/{name}" in again["reason"]


def test_a_slow_path_is_judged_from_when_its_command_returned_not_from_when_it_started():
    """The slow path's delay starts with its last tc command: a fault whose commands took 3 s (the qemu TCG guest)
    read at full rate for those 3 s. Its rate in force counts only from the command's return to the undo, and a
    bundle re-judged from its raw files gets the same figure."""
    from harness.workloads.fio_faults import FioFaultsParams, FaultSpec, judge_run, reevaluate_faults
    done = steady(1000, 1007, 0.01) + steady(1007, 1012, 0.125) + steady(1012, 1016, 0.01)  # 4 x 1 MiB / 0.5 s
    rec = FaultRecord(index=0, kind="slow-path", path="kvmp-a", detail="path kvmp-a slow (500 ms on lo)",
                      applied_ok=True, undone_ok=True, undone_by="workload", t_apply_s=1004.0, t_undo_s=1012.0,
                      t_in_force_s=1007.0)
    paths = "".join(f"T {t}\nnvme0c0n1 {stat(int((t - 1000) * 4096))}\nnvme0c1n1 {stat(0)}\n"
                    for t in (1001.0, 1002.0, 1003.0, 1003.9, 1012.1, 1016.0))
    ev = evidence(paths=[PathRead(target="kvmp-a", device="nvme0c0n1"), PathRead(target="kvmp-b", device="nvme0c1n1")])
    run = judge_run(ev, done, parse_path_samples(paths), [rec], 0.5)
    (f,) = run.evidence.faults
    assert f.in_force_rate_mb_s == pytest.approx(4 * MIB / 0.5 / 1e6, rel=0.01)  # 8.39 MB/s: the delay felt
    assert f.pre_rate_mb_s == pytest.approx(104.9, rel=0.01)
    assert f.t_in_force_s == pytest.approx(7.0) and f.t_in_force_unix_s == 1007.0 and f.t_apply_s == 4.0
    from_start = sum(c.bytes for c in done if 1004.5 <= c.t_s < 1012.0) / 7.5 / 1e6
    assert from_start > 4 * f.in_force_rate_mb_s  # timed from the command's start, the 3 s hide the delay
    # its recovery too: from 1007 the read crawled until the undo at 1012 (timed from the command's start, 1004, the
    # first second was fast and the recovery 0.0)
    assert 4.5 <= f.recovery_s <= 5.0, f.recovery_s
    clat = "".join(f"{int(round(c.t_s * 1000))}, 500, 0, {c.bytes}, 0\n" for c in done)
    raw = {"clat": clat, "paths": paths, "log": "", "json": '{"jobs": [{"total_err": 0}]}'}
    params = FioFaultsParams(target="kvmp-a", paths=["kvmp-a", "kvmp-b"], runtime_s=16,
                             faults=[FaultSpec(kind="slow-path", path="kvmp-a", delay_ms=500, at_s=4, duration_s=8)])
    again = reevaluate_faults(run.evidence.as_dict(), raw, params)
    assert again.evidence.faults[0].in_force_rate_mb_s == f.in_force_rate_mb_s
    assert again.evidence.faults[0].recovery_s == f.recovery_s


def slow(t_in_force: float | None, rate: float | None, undo: float = 12.0) -> FaultRecord:
    return FaultRecord(index=0, kind="slow-path", path="kvmp-a", detail="path kvmp-a slow (500 ms on lo)",
                       applied_ok=True, undone_ok=True, undone_by="workload", t_apply_s=4.0, t_undo_s=undo,
                       t_in_force_s=t_in_force, in_force_rate_mb_s=rate, delay_ms=500.0, pre_rate_mb_s=100.0,
                       path_read_bytes_before=MIB)


def test_a_slowed_path_is_not_held_to_the_recovery_bound_but_to_slowed_min_fraction_when_the_gate_sets_it():
    """A slowed path does not stop the read: a read that crawled through it (numa) recovers only at the undo, and
    that is reported, not FAIL; a gate that asks the head to keep a share of its rate while slowed gets FAIL below
    it. A path that went down is still held to the recovery bound."""
    crawled = slow(7.0, 6.4).model_copy(update={"recovery_s": 21.0})
    res = evaluate_faults(evidence(faults=[crawled]))
    assert res.failed_check is None and res.invalid_reason is None, res.failed_check
    assert res.metrics["max_recovery_s"] == 21.0  # reported
    strict = evidence(faults=[crawled]).model_copy(update={"slowed_min_fraction": 0.5})
    res = evaluate_faults(strict)
    assert "fault 0 (path kvmp-a slow (500 ms on lo)): the read kept 6.4% of 100 MB/s while the path was slowed, " \
           "below slowed_min_fraction 0.5" in res.failed_check, res.failed_check
    routed = slow(7.0, 95.0).model_copy(update={"recovery_s": 0.0})  # queue-depth: the other path took the reads
    res = evaluate_faults(evidence(faults=[routed]).model_copy(update={"slowed_min_fraction": 0.5}))
    assert res.failed_check is None, res.failed_check
    down = fault(4.0).model_copy(update={"recovery_s": 21.0, "pre_rate_mb_s": 100.0})
    res = evaluate_faults(evidence(faults=[down]))
    assert "no recovery to 50% of 100 MB/s within 10 s (took 21 s)" in res.failed_check, res.failed_check


def test_delay_felt_a_slow_path_that_did_not_slow_the_read_is_invalid_not_a_pass():
    from harness.workloads.fio_faults import slow_path_bound_mb_s
    # 4 readers of 1 MiB, 500 ms per reply, over 5 s in force: at most 11 reads each, 9.23 MB/s
    assert slow_path_bound_mb_s(4, MIB, 500, 5.0) == pytest.approx(4 * MIB * 11 / 5 / 1e6)
    ok = evaluate_faults(evidence(faults=[slow(7.0, 6.4)]))
    check = next(c for c in ok.evidence.validity if c.name == "delay felt")
    assert check.ok and ok.invalid_reason is None and check.value == pytest.approx(6.4 / 9.227, rel=0.01)
    fast = evaluate_faults(evidence(faults=[slow(7.0, 60.0)]))
    assert "delay felt: not proven" in fast.invalid_reason and "above the 9.23 MB/s 4 readers" in fast.invalid_reason
    late = evaluate_faults(evidence(faults=[slow(13.0, None)]))  # its command returned after the undo was due
    assert "fault 0: not in force before its undo" in late.invalid_reason
    assert "delay felt" not in {c.name for c in evaluate_faults(evidence(faults=[fault(4.0)])).evidence.validity}
