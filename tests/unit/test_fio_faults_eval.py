"""fio-faults' pure parts: fio's completion log and verify failures, the paths' counters, and the judgement of
each fault (stall, recovery, bytes per path) and of the gate (bounds, integrity, validity)."""

import pytest

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


def evidence(**kw) -> FioFaultsEvidence:
    base = dict(region_bytes=64 * MIB, bs_bytes=MIB, jobs=4, runtime_s=12, recover_fraction=0.5,
                recovery_bound_s=10, completions=1000, read_bytes=1000 * MIB, corrupted_chunks=0, failed_reads=0,
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
    rec = judge_fault(done, fault(4.0), 12.0, 0.5, [])
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
    rec = judge_fault(done, fault(4.0), 12.0, 0.5, [])
    res = evaluate_faults(evidence(faults=[rec], **change))
    assert says in res.failed_check and res.metrics["max_stall_s"] < 1


def test_a_recovery_past_its_bound_or_never_is_a_failure():
    done = steady(0, 4, 0.01) + steady(4.1, 12, 0.05)  # back, at a fifth of the rate: never recovers to 50 %
    rec = judge_fault(done, fault(4.0), 12.0, 0.5, [])
    res = evaluate_faults(evidence(faults=[rec]))
    assert rec.recovery_s is None and "no recovery to 50%" in res.failed_check


def test_a_fault_not_undone_or_without_a_rate_before_it_is_not_proven():
    done = steady(0, 12, 0.01)
    undone = fault(4.0).model_copy(update=dict(undone_ok=False, undo_error="rm: exit 1"))
    res = evaluate_faults(evidence(faults=[judge_fault(done, undone, 12.0, 0.5, [])]))
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
    res = FioFaults._judge(ctx, evidence(runtime_s=14), done, [], [(0, f, "operator: pull", ran, entry, undone)], [])
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
