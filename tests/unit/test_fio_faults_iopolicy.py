"""fio-faults' multipath I/O policy: the gate reads under the policy it names (numa, round-robin, queue-depth),
the node's own put back after the read whatever ended it, a policy the kernel refuses or a policy that cannot be
read is the gate's error with nothing changed; and a slow path's delay is judged on the slowed path's own
counters, so a policy that routes reads around it is seen doing so, not taken for a delay that was not felt."""

from __future__ import annotations

import subprocess

import pytest

from harness.execute.undo import UndoLog
from harness.parsers.blockdev import parse_block_stat
from harness.parsers.faultio import Completion, iopolicy_argv, parse_iopolicy
from harness.suite.plan import gate_plan, plan_mismatch
from harness.transport.doubles import Reply, ScriptedTransport
from harness.workloads import WORKLOADS
from harness.workloads.fio_faults import FaultRecord, FioFaultsEvidence, PathRead, evaluate_faults, judge_fault
from test_plan_equals_run import fio_faults
from test_workload_runs import context

NQN = "nqn.2024-01.io.kvgate:loopback-kvmp"
MIB = 1 << 20


# ------------------------------------------------------------------------------ the node command, run for real


def sysfs(tmp_path, policies: dict[str, tuple[str, str]]):
    """A /sys/class/nvme-subsystem-shaped tree: subsystem -> (subsysnqn, iopolicy)."""
    root = tmp_path / "nvme-subsystem"
    for name, (nqn, policy) in policies.items():
        d = root / name
        d.mkdir(parents=True)
        (d / "subsysnqn").write_text(nqn + "\n")
        (d / "iopolicy").write_text(policy + "\n")
    return root


def sh(argv) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=30)


def test_the_policy_is_read_and_set_on_the_subsystem_of_the_nqn_only(tmp_path):
    root = sysfs(tmp_path, {"nvme-subsys0": ("nqn.other", "numa"), "nvme-subsys1": (NQN, "numa")})
    r = sh(iopolicy_argv(NQN, root=str(root)))
    assert r.returncode == 0 and parse_iopolicy(r.stdout) == "numa"
    assert r.stdout.split()[0].endswith("/nvme-subsys1")
    r = sh(iopolicy_argv(NQN, "round-robin", root=str(root)))
    assert r.returncode == 0 and parse_iopolicy(r.stdout) == "round-robin"
    assert (root / "nvme-subsys1" / "iopolicy").read_text().strip() == "round-robin"
    assert (root / "nvme-subsys0" / "iopolicy").read_text().strip() == "numa"  # another subsystem untouched


def test_no_subsystem_of_the_nqn_or_a_refused_write_exits_non_zero(tmp_path):
    root = sysfs(tmp_path, {"nvme-subsys0": ("nqn.other", "numa")})
    r = sh(iopolicy_argv(NQN, root=str(root)))
    assert r.returncode == 1 and parse_iopolicy(r.stdout) is None
    (root / "nvme-subsys1").mkdir()
    (root / "nvme-subsys1" / "subsysnqn").write_text(NQN + "\n")
    (root / "nvme-subsys1" / "iopolicy").mkdir()  # a write that fails, as the kernel's EINVAL does
    r = sh(iopolicy_argv(NQN, "queue-depth", root=str(root)))
    assert r.returncode == 3


def test_two_subsystems_of_one_nqn_that_disagree_give_no_policy():
    out = "/sys/class/nvme-subsystem/nvme-subsys0 numa\n/sys/class/nvme-subsystem/nvme-subsys1 round-robin\n"
    assert parse_iopolicy(out) is None
    assert parse_iopolicy(out.replace("round-robin", "numa")) == "numa"
    assert parse_iopolicy("") is None and parse_iopolicy("sh: cannot create\n") is None


# ------------------------------------------------------------------------------ the gate on a scripted node


def policy_node(sc, own: str | None, refuse: set[str] = frozenset()):
    """The scenario's guest, answering the iopolicy command as a kernel whose policy is ``own`` (None: no
    subsystem) and that refuses the policies in ``refuse``; returns (node, the policy's history)."""
    state = {"now": own}
    history: list[str | None] = [own]
    inner = sc.nodes["guest"].handler

    def handler(call):
        if "kvgate-iopolicy" in call.argv:
            want = call.argv[-1]
            if state["now"] is None:
                return Reply(rc=1)
            if want:
                if want in refuse:
                    return Reply(rc=3, stderr="sh: echo: write error: Invalid argument")
                state["now"] = want
                history.append(want)
            return Reply(stdout=f"/sys/class/nvme-subsystem/nvme-subsys0 {state['now']}\n")
        return inner(call)
    return ScriptedTransport(handler, name="guest"), history


def run_gate(tmp_path, own, refuse=frozenset(), **params):
    sc = fio_faults(tmp_path, **params)
    node, history = policy_node(sc, own, refuse)
    ctx = context(sc.cfg, sc.gate_id, {"guest": node}, tmp_path)
    ctx.undo = UndoLog()
    result = WORKLOADS["fio-faults"]().run(ctx)
    gate = next(g for g in sc.cfg.suite.gates if g.id == sc.gate_id)
    return result, node, history, ctx, gate_plan(sc.cfg, gate)


def sets(node) -> list[str]:
    return [c[-1] for c in node.commands if "kvgate-iopolicy" in c and c[-1]]


def test_the_gate_reads_under_its_policy_and_puts_the_nodes_back_after(tmp_path):
    result, node, history, ctx, planned = run_gate(tmp_path, "numa", iopolicy="round-robin")
    assert result.error is None, result.error
    ev = result.evidence
    assert ev.iopolicy == "round-robin" and ev.iopolicy_before == "numa"
    assert sets(node) == ["round-robin", "numa"] and history[-1] == "numa"
    cmds = node.commands
    set_at = next(i for i, c in enumerate(cmds) if "kvgate-iopolicy" in c and c[-1] == "round-robin")
    back_at = next(i for i, c in enumerate(cmds) if "kvgate-iopolicy" in c and c[-1] == "numa")
    read_at = next(i for i, c in enumerate(cmds) if c[:1] == ("fio",) and "--verify=crc32c" in c
                   and "--rw=read" in c)
    assert set_at < read_at < back_at  # the read, and only the read, under the gate's policy
    assert [e.done for e in ctx.undo.entries if e.name == "iopolicy"] == [True]
    assert plan_mismatch([s for s in planned if s.node == "guest"], cmds) is None


def test_a_policy_the_node_has_already_is_not_set_and_none_is_only_recorded(tmp_path):
    result, node, _, ctx, _ = run_gate(tmp_path, "round-robin", iopolicy="round-robin")
    assert result.error is None and sets(node) == []
    assert not [e for e in ctx.undo.entries if e.name == "iopolicy"]
    assert result.evidence.iopolicy == result.evidence.iopolicy_before == "round-robin"
    (tmp_path / "own").mkdir()
    result, node, _, _, _ = run_gate(tmp_path / "own", "numa")
    assert result.error is None and sets(node) == [] and result.evidence.iopolicy == "numa"


def test_a_policy_the_kernel_refuses_is_the_gates_error_and_the_node_is_put_back(tmp_path):
    result, node, history, ctx, _ = run_gate(tmp_path, "numa", refuse={"queue-depth"}, iopolicy="queue-depth")
    assert "the kernel refused iopolicy queue-depth" in result.error and "6.11" in result.error
    assert not any(c[:1] == ("fio",) for c in node.commands)  # nothing read under the wrong policy
    assert sets(node) == ["queue-depth", "numa"] and history[-1] == "numa"
    assert all(e.done for e in ctx.undo.entries)


def test_a_policy_that_cannot_be_read_is_not_set(tmp_path):
    result, node, _, ctx, _ = run_gate(tmp_path, None, iopolicy="round-robin")
    assert "iopolicy could not be read" in result.error and sets(node) == [] and not ctx.undo.entries
    assert not any(c[:1] == ("fio",) for c in node.commands)


def test_a_read_that_raises_still_puts_the_policy_back(tmp_path, monkeypatch):
    from harness.workloads import fio_faults as FF

    def boom(*a, **k):
        raise RuntimeError("a bug mid-read")
    monkeypatch.setattr(FF.FioFaults, "_faulted_read", boom)
    sc = fio_faults(tmp_path, iopolicy="round-robin")
    node, history = policy_node(sc, "numa")
    ctx = context(sc.cfg, sc.gate_id, {"guest": node}, tmp_path)
    ctx.undo = UndoLog()
    with pytest.raises(RuntimeError, match="a bug mid-read"):
        WORKLOADS["fio-faults"]().run(ctx)
    assert history == ["numa", "round-robin", "numa"]
    assert [e.done for e in ctx.undo.entries] == [True]


# ------------------------------------------------------------------------------ a slow path routed around


def stat(sectors: int) -> str:
    return f"   10 0 {sectors} 5 0 0 0 0 0 5 5 0 0 0 0 0 0"


def samples(rate_a_mib_s, rate_b_mib_s, times):
    """Path A (nvme0c0n1) and B (nvme0c1n1) counters: A at 100 MiB/s to 7 s then at ``rate_a``, B at ``rate_b``
    from 7 s."""
    out = []
    for t in times:
        a = 100 * min(t, 7.0) + rate_a_mib_s * max(0.0, t - 7.0)
        b = rate_b_mib_s * max(0.0, t - 7.0)
        out.append((t, {"nvme0c0n1": parse_block_stat(stat(int(a * 2048))),
                        "nvme0c1n1": parse_block_stat(stat(int(b * 2048)))}))
    return out


def slow_fault():
    return FaultRecord(index=0, kind="slow-path", path="kvmp-a", detail="path kvmp-a slow (500 ms on lo)",
                       applied_ok=True, undone_ok=True, undone_by="workload", t_apply_s=4.0, t_undo_s=12.0,
                       t_in_force_s=7.0, delay_ms=500.0)


def evidence(rec):
    return FioFaultsEvidence(region_bytes=64 * MIB, bs_bytes=MIB, jobs=4, runtime_s=16, recover_fraction=0.5,
                             recovery_bound_s=10, completions=1000, read_bytes=1000 * MIB, corrupted_chunks=0,
                             failed_reads=0, fio_exit_code=0, faults=[rec],
                             paths=[PathRead(target="kvmp-a", device="nvme0c0n1"),
                                    PathRead(target="kvmp-b", device="nvme0c1n1")])


HEAD_FAST = [Completion(round(i * 0.01, 3), MIB) for i in range(1600)]  # the head never slowed: 104.9 MB/s
TIMES = [2.0, 3.0, 4.0, 6.9, 7.4, 8.0, 9.0, 10.0, 11.0, 11.6, 12.5, 16.0]


def test_a_slow_path_the_policy_routes_around_is_felt_on_the_path_while_the_head_reads_on():
    """queue-depth's shape: path A, slowed, completes ~1 read per delay per reader it still gets; path B carries
    the rest; the head's rate stays up. The delay is felt where it was put, and the head's rate says the policy
    rode it out."""
    rec = judge_fault(HEAD_FAST, slow_fault(), 16.0, 0.5, samples(2.0, 98.0, TIMES), "nvme0c0n1")
    assert rec.in_force_path_mb_s == pytest.approx(2 * MIB / 1e6, rel=0.01)
    assert rec.in_force_path_window_s == pytest.approx(11.6 - 7.4)  # samples inside the window only
    assert rec.in_force_rate_mb_s == pytest.approx(104.9, rel=0.01)
    res = evaluate_faults(evidence(rec))
    felt = next(c for c in res.evidence.validity if c.name == "delay felt")
    assert felt.ok and "the slowed path's counters" in felt.how, felt


def test_a_slow_path_whose_own_reads_went_on_at_speed_is_not_felt():
    rec = judge_fault(HEAD_FAST, slow_fault(), 16.0, 0.5, samples(100.0, 0.0, TIMES), "nvme0c0n1")
    res = evaluate_faults(evidence(rec))
    assert "delay felt: not proven" in res.invalid_reason and "above the" in res.invalid_reason


def test_a_sample_before_the_delay_was_in_force_is_not_counted_on_the_path():
    """The last sample before the command returned (6.9 s, path A at 100 MiB/s) is outside the window: counting
    from it would add 0.5 s of undelayed reads to the slowed path."""
    rec = judge_fault(HEAD_FAST, slow_fault(), 16.0, 0.5, samples(2.0, 98.0, [6.9, 7.4, 11.6]), "nvme0c0n1")
    assert rec.in_force_path_mb_s == pytest.approx(2 * MIB / 1e6, rel=0.01)
    none = judge_fault(HEAD_FAST, slow_fault(), 16.0, 0.5, samples(2.0, 98.0, [6.9, 7.4, 12.5]), "nvme0c0n1")
    assert none.in_force_path_mb_s is None  # one sample inside: the head's rate stands in
    res = evaluate_faults(evidence(none))
    assert "the head's completions" in next(c for c in res.evidence.validity if c.name == "delay felt").how
