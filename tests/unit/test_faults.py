"""Faults (harness.rigs.faults): each fault's command and its inverse, run for real by sh against a tree shaped
like nvmet's configfs (directories, symlinks, attribute files); the clock stamp around them; the undo log."""

import re
import subprocess
from pathlib import Path

import pytest

from harness.execute.undo import UndoLog
from harness.rigs import faults as F
from harness.transport.doubles import Reply, ScriptedTransport

NQN = "nqn.2024-01.io.kvgate:loopback-kvmp"


def tree(tmp_path: Path) -> tuple[str, list[F.PortRef]]:
    """A configfs-shaped nvmet tree: one subsystem with namespace 1 enabled, on ports 4430 and 4431."""
    root = tmp_path / "nvmet"
    sub = root / "subsystems" / NQN
    (sub / "namespaces" / "1").mkdir(parents=True)
    (sub / "namespaces" / "1" / "enable").write_text("1")
    ports = []
    for svc in ("4430", "4431"):
        p = root / "ports" / svc
        (p / "subsystems").mkdir(parents=True)
        (p / "ana_groups" / "1").mkdir(parents=True)
        (p / "ana_groups" / "1" / "ana_state").write_text("optimized")
        (p / "subsystems" / NQN).symlink_to(sub)
        ports.append(F.PortRef(svc, svc, root=str(root)))
    return str(root), ports


def sh(argv) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=30)


def linked(port: F.PortRef) -> bool:
    return Path(port.dir, "subsystems", NQN).is_symlink()


def test_path_down_unlinks_one_port_and_its_inverse_links_it_again_idempotently(tmp_path):
    _, (a, b) = tree(tmp_path)
    apply, inverse = F.path_down(NQN, a)
    assert sh(apply).returncode == 0
    assert not linked(a) and linked(b)  # only that path is gone
    for _ in range(2):  # an inverse may run twice (the workload's, then the runner's): the second changes nothing
        r = sh(inverse)
        assert r.returncode == 0, r.stderr
        assert linked(a) and Path(a.dir, "subsystems", NQN).resolve() == Path(a.root, "subsystems", NQN)


def test_an_inverse_after_a_fault_that_never_landed_leaves_the_port_as_it_was(tmp_path):
    _, (a, _b) = tree(tmp_path)
    _, inverse = F.path_down(NQN, a)
    assert sh(inverse).returncode == 0 and linked(a)


def test_ana_change_writes_the_port_group_state_and_back(tmp_path):
    _, (a, b) = tree(tmp_path)
    apply, inverse = F.ana_change(a, "inaccessible")
    state = Path(a.dir, "ana_groups", "1", "ana_state")
    assert sh(apply).returncode == 0 and state.read_text() == "inaccessible"
    assert Path(b.dir, "ana_groups", "1", "ana_state").read_text() == "optimized"
    assert sh(inverse).returncode == 0 and state.read_text() == "optimized"
    with pytest.raises(ValueError):
        F.ana_change(a, "optimized")  # not a fault


def test_target_restart_takes_every_path_and_the_namespace_down_and_back(tmp_path):
    root, ports = tree(tmp_path)
    apply, inverse = F.target_restart(NQN, 1, ports)
    enable = Path(root, "subsystems", NQN, "namespaces", "1", "enable")
    assert sh(apply).returncode == 0
    assert not any(linked(p) for p in ports) and enable.read_text() == "0"
    assert sh(inverse).returncode == 0
    assert all(linked(p) for p in ports) and enable.read_text() == "1"


def test_an_inverse_that_cannot_restore_says_so_and_still_restores_the_rest(tmp_path):
    root, ports = tree(tmp_path)
    apply, inverse = F.target_restart(NQN, 1, ports)
    assert sh(apply).returncode == 0
    blocked = Path(ports[0].dir, "subsystems")
    blocked.rmdir()
    blocked.write_text("")  # not a directory: the link cannot be made again, even by root
    r = sh(inverse)
    assert r.returncode != 0  # the runner keeps it pending and the gate says the node was not put back
    assert linked(ports[1]) and Path(root, "subsystems", NQN, "namespaces", "1", "enable").read_text() == "1"


def test_slow_path_adds_only_kvgates_qdisc_and_removes_only_it():
    apply, inverse = F.slow_path("lo", F.PortRef("4430", "4430"), 50)
    assert "handle 4b56: prio" in apply[2] and "netem delay 50ms" in apply[2] and apply[-2:] == ("lo", "4430")
    # every handle a valid tc qdisc ID: a 16-bit major number, at most four hex digits
    handles = re.findall(r"handle ([0-9a-f]+):", apply[2])
    assert handles == ["4b56", "4b57"] and all(len(h) <= 4 for h in handles)
    assert 'grep -q "qdisc prio 4b56: root"' in inverse[2]  # someone else's root qdisc is left alone
    # iproute2's tc by its path: a busybox shell runs its own tc applet (no prio, no netem) before PATH lookup
    for script in (apply[2], inverse[2]):
        assert script.startswith(F.TC_PICK) and " tc " not in script.replace(F.TC_PICK, "")
    r = subprocess.run(["sh", "-c", F.TC_PICK + ' echo "$t"'], capture_output=True, text=True)
    assert r.stdout.strip() == ("/usr/sbin/tc" if Path("/usr/sbin/tc").exists() else "tc")


def test_clocked_stamps_the_node_clock_around_the_command_and_keeps_its_status():
    r = sh(F.clocked(("sh", "-c", "exit 3")))
    assert r.returncode == 3
    t0, t1 = F.parse_clocked(r.stdout)
    assert t0 is not None and t1 is not None and t1 >= t0 > 1.6e9
    assert F.parse_clocked("nothing\n") == (None, None)


def test_the_undo_log_runs_what_is_pending_newest_first_and_keeps_a_failed_one_pending(tmp_path):
    sent = []

    def handler(call):
        sent.append(call.argv)
        return Reply(rc=1 if call.argv[-1] == "bad" else 0, stderr="no" if call.argv[-1] == "bad" else "")
    node = ScriptedTransport(handler, name="n1")
    from harness.transport.steps import StepLog
    steps = StepLog(tmp_path / "run")
    log = UndoLog(tmp_path / "run" / "undo.json")
    first = log.register("n1", "first", ("echo", "one"))
    log.register("n1", "bad", ("echo", "bad"))
    done = log.register("n1", "done", ("echo", "done"))
    log.mark(done, True)
    ran = log.run_pending({"n1": node}, steps)
    assert [e.name for e in ran] == ["bad", "first"] and sent == [("echo", "bad"), ("echo", "one")]
    assert first.done and first.ran_by == "runner" and not ran[0].done and "exit 1" in ran[0].error
    assert [e.name for e in log.pending()] == ["bad"]
    assert '"ran_by": "runner"' in (tmp_path / "run" / "undo.json").read_text()
    log.run_pending({}, steps)  # a node with no connection: recorded, never raised
    assert "no open connection" in log.pending()[0].error


def faults_config(tmp_path, faults, target_side=True, extra=None):
    import yaml
    from harness.config import load_config
    from harness.workloads import WORKLOADS
    root = Path(__file__).resolve().parents[2]
    inv = yaml.safe_load((root / "inventory" / "loopback-faults.yaml").read_text())
    if not target_side:
        inv["nodes"][0]["targets"] = inv["nodes"][0]["targets"][1:]
    gates = yaml.safe_load((root / "gates" / "loopback-faults.yaml").read_text())
    gates["gates"] = gates["gates"][:1]
    gates["gates"][0]["params"]["faults"] = faults
    gates["gates"][0]["params"].update(extra or {})
    (tmp_path / "i.yaml").write_text(yaml.safe_dump(inv, sort_keys=False))
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(gates, sort_keys=False))
    return load_config(tmp_path / "i.yaml", tmp_path / "g.yaml", WORKLOADS)


@pytest.mark.parametrize("faults, extra, says", [
    ([{"kind": "path-down", "path": "kvmp-a", "at_s": 2, "duration_s": 4},
      {"kind": "ana", "path": "kvmp-b", "at_s": 5, "duration_s": 1}], None, "faults run one at a time"),
    ([{"kind": "path-down", "path": "kvmp-c", "at_s": 2, "duration_s": 1}], None, "is not one of paths"),
    ([{"kind": "target-restart", "path": "kvmp-a", "at_s": 2, "duration_s": 1}], None, "no path"),
    ([{"kind": "ana", "at_s": 2, "duration_s": 1}], None, "needs path"),
    ([{"kind": "path-down", "path": "kvmp-a", "at_s": 10, "duration_s": 5}], None, "not before the read ends"),
])
def test_a_fault_schedule_that_cannot_be_judged_is_refused_with_its_line(tmp_path, faults, extra, says):
    from harness.errors import ConfigError
    with pytest.raises(ConfigError) as ei:
        faults_config(tmp_path, faults, extra=extra)
    assert says in str(ei.value) and "g.yaml:" in str(ei.value)


def test_faults_need_kvgates_own_target_side(tmp_path):
    from harness.errors import ConfigError
    with pytest.raises(ConfigError) as ei:
        faults_config(tmp_path, [{"kind": "path-down", "path": "kvmp-a", "at_s": 2, "duration_s": 1}],
                      target_side=False)
    assert "nvmeof-loopback target with nqn nqn.2024-01.io.kvgate:loopback-kvmp" in str(ei.value)
    cfg = faults_config(tmp_path, [{"kind": "path-down", "path": "kvmp-a", "at_s": 2, "duration_s": 1}])
    assert cfg.params["F1-path-down"].faults[0].kind == "path-down"


def test_the_loopback_exports_one_namespace_on_every_port_and_down_removes_what_it_made():
    """extra_ports: up makes and links each port (the first keeps its step names), down undoes each."""
    from harness.parsers import nvme as P
    from harness.rigs import loopback as L
    spec = L.LoopbackSpec(name="kvmp", nqn=NQN, host_nqn="nqn.2024-01.io.kvgate:host-guest", host_id="x",
                          trsvcid="4430", extra_ports=(("10.0.2.15", "4431"),), connect_host=False)
    st = L.LoopbackState()
    st.nullb = {spec.nullb_name: P.NullbDevice(spec.nullb_name, {"power": "1", "index": "0"})}
    st.block_devices = {spec.nullb_name}
    acts = L.plan_target(spec, st)
    links = [a.argv for a in acts if a.name.endswith("link")]
    assert links == [("ln", "-s", spec.subsys_dir, f"{P.NVMET_ROOT}/ports/4430/subsystems/{NQN}"),
                     ("ln", "-s", spec.subsys_dir, f"{P.NVMET_ROOT}/ports/4431/subsystems/{NQN}")]
    assert [a.argv[4] for a in acts if a.name in ("port-traddr", "port4431-traddr")] == ["127.0.0.1", "10.0.2.15"]
    # both ports up, made by kvgate: down unlinks and removes both; a summary counts both
    st.nvmet = P.NvmetState(present=True, subsystems={NQN: P.SubsystemState(NQN)}, ports={
        pid: P.PortState(pid, "tcp", "ipv4", addr, pid, {NQN}) for pid, addr in (("4430", "127.0.0.1"),
                                                                                 ("4431", "10.0.2.15"))})
    st.record = L.LoopbackRecord("b", {a.creates: "" for a in acts if a.creates})
    down = [a.argv for a in L.plan_down(spec, st)]
    assert ("rmdir", f"{P.NVMET_ROOT}/ports/4430") in down and ("rmdir", f"{P.NVMET_ROOT}/ports/4431") in down
    assert L.summarize(spec, st)["layers"]["port_link"]
    st.nvmet.ports["4431"].subsystems.clear()  # one path's link gone (a path-down fault not undone)
    assert not L.summarize(spec, st)["layers"]["port_link"]


def test_the_clock_stamp_has_nanoseconds_where_a_busybox_date_comes_first_in_path(tmp_path):
    """The loopback guest's PATH finds busybox's date (which prints %N literally) before coreutils'."""
    import os
    import shutil
    bb = shutil.which("busybox")
    if bb is None or not os.access("/usr/bin/date", os.X_OK):
        pytest.fail("busybox and /usr/bin/date are needed (scripts/setup.sh --loopback installs busybox-static)")
    (tmp_path / "date").symlink_to(bb)
    r = subprocess.run(list(F.clocked(("true",))), capture_output=True, text=True, timeout=30,
                       env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
    t0, t1 = F.parse_clocked(r.stdout)
    assert t0 is not None and t1 is not None and (t0, t1) != (int(t0), int(t1)), r.stdout
    assert F.parse_clocked("kvgate-fault-clock 1796166923.%N\n") == (None, None)  # never whole seconds silently
