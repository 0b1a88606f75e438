"""Every registered workload's plan lists exactly the commands its run sends (docs/architecture.md, "plan").

One scripted run per workload in the registry (``harness.workloads.WORKLOADS``): a scripted node
(``harness.transport.doubles.ScriptedTransport``) answers every command, engines answer over an
``httpx.MockTransport``, and the commands each node was sent are compared with the plan's steps for that node
(``harness.suite.plan.plan_mismatch``: in order, each planned command once, a poll once or more, a conditional
step sent or not, nothing unplanned). A workload registered without a scenario here fails the test: a new
workload is covered as soon as it is registered.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest
import yaml

from harness.config import load_config
from harness.suite.plan import gate_plan, plan_mismatch
from harness.transport.doubles import Reply, ScriptedTransport
from harness.workloads import WORKLOADS
from harness.workloads.kit.base import PlannedStep
from doubles import EngineServer, engine_node, pool_blockstat
from test_g2_attach import attach_config, pool_node
from test_g2_load import BASE as G2_LOAD_LADDER, PrefixEngine, gate_config, scripted_node
from test_kv_read import g1c_context, g1c_gate, reader_node
from test_pd_handoff import Tier, attached, pd_config
from test_r3 import r3_config, r3_node
from test_workload_runs import context, fio_node, g2_config, local_suite, loopback_node

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures"


class Scenario:
    """A scripted run of one workload: its config and gate, its scripted nodes, the engines' HTTP answers."""

    def __init__(self, cfg, gate_id: str, nodes: dict[str, ScriptedTransport], http=None, ctx=None):
        self.cfg, self.gate_id, self.nodes, self.http, self.ctx = cfg, gate_id, nodes, http, ctx


def fio_read(tmp_path) -> Scenario:
    cfg = local_suite(tmp_path)
    fio_json = (FIX / "fio" / "io_uring_2groups_2jobs_grouped.json").read_text().replace('"gpu0"', '"stream0"') \
        .replace('"gpu1"', '"stream1"')
    node = fio_node(fio_json)
    return Scenario(cfg, "G1", {"localhost": node})


def kv_read(tmp_path) -> Scenario:
    node = reader_node("read-fs-2streams.json")
    cfg, gate = g1c_gate()
    return Scenario(cfg, gate.id, {"localhost": node}, ctx=g1c_context(tmp_path, node))


def nvme_integrity(tmp_path) -> Scenario:
    cfg, node = loopback_node()
    return Scenario(cfg, "L1", {"guest": node})


def g2_ttft(tmp_path) -> Scenario:
    cfg = g2_config(tmp_path)
    engine = EngineServer()
    node = engine_node("n1", pool_blockstat("/dev/loop0", "7:0", iter(range(1000, 10 ** 8, 40000))), engine=engine)
    return Scenario(cfg, "G2", {"n1": node}, http=httpx.MockTransport(engine))


def g2_answer(tmp_path) -> Scenario:
    """g2-answer with a corruption on the scripted cpu-reference node: the flip is one more planned command between
    the engine's stop and the read-back (the scripted node answers it with nothing: no byte flipped, INVALID)."""
    g2_config(tmp_path)
    suite = yaml.safe_load((tmp_path / "g.yaml").read_text())
    suite["gates"][0].update(workload="g2-answer", metric="answer_mismatched_prompts", **{"pass": "<= 0"})
    suite["gates"][0].pop("stop_loss", None)
    suite["gates"][0].pop("reference", None)
    suite["gates"][0]["params"].update(corrupt={"byte_offset": "middle", "files": 1}, request_extra={})
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(suite))
    cfg = load_config(tmp_path / "i.yaml", tmp_path / "g.yaml", WORKLOADS)
    engine = EngineServer()
    node = engine_node("n1", pool_blockstat("/dev/loop0", "7:0", iter(range(1000, 10 ** 8, 40000))), engine=engine)
    return Scenario(cfg, "G2", {"n1": node}, http=httpx.MockTransport(engine))


def r3_cross_instance(tmp_path) -> Scenario:
    """The writer and the reader node as test_r3 scripts them (the client prints what it printed on the rig)."""
    cfg = r3_config(tmp_path)
    nodes = {"n1": r3_node("n1", "writer"), "n2": r3_node("n2", "reader")}
    return Scenario(cfg, "R3", nodes, http=httpx.MockTransport(EngineServer()))


READER_OUTPUT = (FIX / "g3" / "reader-netns-rig-n14.jsonl").read_text()


def g3_shared_read(tmp_path) -> Scenario:
    """Two readers and the storage node of the netns rig; each reader prints what a rig reader printed."""
    gates = yaml.safe_load((ROOT / "gates" / "g3-rig.yaml").read_text())
    gates["gates"][0]["params"].update(read_timeout_s=5, arm_timeout_s=5, stall_timeout_s=5)
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(gates))
    nodes = [{"name": n, "transport": "local", "work_dir": "/w", "nics": [{"name": "eth0", "line_rate_gbit_s": 10.0}],
              "targets": [{"name": "kvpool", "kind": "directory", "path": "/mnt/pool"}]} for n in ("n1", "n2")]
    nodes.append({"name": "storage", "transport": "local", "work_dir": "/w",
                  "nics": [{"name": "st0", "line_rate_gbit_s": 1.0}],
                  "targets": [{"name": "kvpool", "kind": "directory", "path": "/srv/pool"}]})
    (tmp_path / "i.yaml").write_text(yaml.safe_dump({"nodes": nodes}))
    cfg = load_config(tmp_path / "i.yaml", tmp_path / "g.yaml", WORKLOADS)

    def handler(call):
        argv = call.argv
        if argv == ("sh", "-c", "while read -r _; do date +%s.%N; done"):  # the clock probe's session
            import time
            return Reply(stdout=f"{time.time():.6f}\n")
        if "kvgate-launch" in argv:  # the armed reader: arms, reads once released, ends
            return Reply(stdout=READER_OUTPUT, exit_after_s=1.0)
        if argv[:1] == ("cat",) and argv[1].endswith("/speed"):
            return Reply(stdout="1000\n")
        if argv[:2] == ("tc", "-j"):
            return Reply(stdout="[]\n")
        if argv[:1] == ("cat",):  # no manifest yet: the copy is laid out
            return Reply(rc=1, stderr="cat: no such file\n")
        return Reply()

    scripted = {n: ScriptedTransport(handler, name=n, sessions=True) for n in ("n1", "n2", "storage")}
    return Scenario(cfg, "G3", scripted)


def g3_isolation(tmp_path) -> Scenario:
    """G3 with a writer (isolation): readers n1, n2 read alone and again while w writes, as test_g3_isolation
    scripts them."""
    from test_g3_isolation import nodes, suite
    return Scenario(suite(tmp_path), "G3", nodes())


def g2_ttft_attached(tmp_path) -> Scenario:
    """G2 on an engine someone else runs: the operator's restart on one node, the pool on another."""
    cfg = attach_config(tmp_path, log="journalctl -u vllm --no-pager")
    engine = EngineServer()
    handler = pool_node(3, engine)

    def with_log(call):
        if call.argv[:2] == ("sh", "-c") and "journalctl" in call.argv[2]:
            return Reply(stdout="INFO engine started\n")
        return handler(call)
    nodes = {n: ScriptedTransport(with_log, name=n) for n in ("gpu1", "ctl")}
    return Scenario(cfg, "G2", nodes, http=httpx.MockTransport(engine))


def g2_load(tmp_path) -> Scenario:
    """A concurrency ladder (2 loads x 2 trials) on the cpu-reference engine, as test_g2_load scripts it."""
    d = gate_config(tmp_path, G2_LOAD_LADDER, pass_=">= 2", stop=None)
    cfg = load_config(d / "i.yaml", d / "g.yaml", WORKLOADS, trials_rule=False)  # 2 trials: short, never PASS
    return Scenario(cfg, "L", {"n1": scripted_node()}, http=httpx.MockTransport(PrefixEngine()))


def pd_handoff(tmp_path) -> Scenario:
    """A producer and a consumer vllm serve on one node sharing one pool, as test_pd_handoff scripts them."""
    tier = Tier()
    return Scenario(pd_config(tmp_path), "PD", {"n1": tier.node("n1")}, http=httpx.MockTransport(tier.http))


def pd_handoff_two_nodes(tmp_path) -> Scenario:
    """The producer on one node, the consumer on another, the pool mounted on both."""
    tier = Tier()
    return Scenario(pd_config(tmp_path, ("p1", "d1")), "PD", {n: tier.node(n) for n in ("p1", "d1")},
                    http=httpx.MockTransport(tier.http))


def pd_handoff_storage_side(tmp_path) -> Scenario:
    """The producer and the consumer on two nodes that mount the pool over a network (no block device there), its
    device counted on the storage-side node that holds it (pool_storage)."""
    tier = Tier(device_on={"st"})
    return Scenario(pd_config(tmp_path, ("p1", "d1"), storage="st", pool_storage="st:kvpool"), "PD",
                    {n: tier.node(n) for n in ("p1", "d1", "st")}, http=httpx.MockTransport(tier.http))


def pd_handoff_attached(tmp_path) -> Scenario:
    """A deployment's prefill and decode instances by URL, their logs by the operator's command."""
    cfg, tier, nodes = attached(tmp_path)
    return Scenario(cfg, "PD", nodes, http=httpx.MockTransport(tier.http))


def fio_faults(tmp_path, **params) -> Scenario:
    """G1 under a path fault on the loopback's two-path namespace, its node answering as the guest did (the
    captured native multipath head nvme0n1 over nvme0c0n1 and nvme0c1n1); ``params``: more of the gate's."""
    gates = yaml.safe_load((ROOT / "gates" / "loopback-faults.yaml").read_text())
    gates["gates"] = gates["gates"][:1]
    gates["gates"][0]["params"].update(runtime_s=1, region="8 MiB",
                                       faults=[{"kind": "path-down", "path": "kvmp-a", "at_s": 0.1, "duration_s": 0.1}],
                                       **params)
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(gates))
    cfg = load_config(ROOT / "inventory" / "loopback-faults.yaml", tmp_path / "g.yaml", WORKLOADS)
    fx = {p.stem: p.read_text() for p in (FIX / "nvmeof" / "multipath-tcp").glob("*.out")}
    from harness.execute.nvmeof import NvmeofSpec, probe_commands
    probes = {argv: fx[name] for name, argv in probe_commands(NvmeofSpec.from_target(
        cfg.inventory.node("guest").target("kvmp-a"))).items()}
    stat = lambda sectors: f"nvme0c0n1 {sectors} 0 {sectors} 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n" \
        f"nvme0c1n1 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n"  # noqa: E731
    clat = "".join(f"{1000000 + i * 10}, 500, 0, 1048576, 0\n" for i in range(300))
    cats = {".json": '{"jobs": [{"total_err": 0}]}', "_clat.1.log": clat, "-fio.log": "",
            "-paths.log": f"T 1000.0\n{stat(0)}T 1003.1\n{stat(2048)}"}

    def handler(call):
        argv = call.argv
        if argv in probes:
            return Reply(stdout=probes[argv])
        if "kvgate-path-probe" in argv:
            return Reply(stdout="block\nforeign\n268435456\n")
        if argv[:1] == ("lsblk",):
            return Reply(stdout=json.dumps({"blockdevices": [{"name": "nvme0n1", "path": "/dev/nvme0n1",
                                                              "type": "disk", "size": 268435456, "ro": False}]}))
        if argv[:1] == ("blkid",):
            return Reply(rc=2)
        if "kvgate-path-stats" in argv:
            return Reply(stdout=stat(0))
        if call.log_path:  # the sampler and the read, spawned
            return Reply(exit_after_s=0.05)
        if "kvgate-fault" in argv:
            return Reply(stdout="kvgate-fault-clock 1000.5\nkvgate-fault-clock 1000.6\n")
        if argv[:1] == ("cat",):
            return Reply(stdout=next(v for k, v in cats.items() if argv[1].endswith(k)))
        if "kvgate-cat" in argv:  # fio's completion logs, one per job
            return Reply(stdout=clat)
        return Reply()
    return Scenario(cfg, "F1-path-down", {"guest": ScriptedTransport(handler, name="guest")})


def g2_gain(tmp_path) -> Scenario:
    """Both arms of a 2 x 2 concurrency ladder on the cpu-reference engine, as test_g2_gain scripts it."""
    from test_g2_gain import BASE as GAIN_LADDER, TwoArms, gain_gate
    d = gain_gate(tmp_path, GAIN_LADDER)
    cfg = load_config(d / "i.yaml", d / "g.yaml", WORKLOADS, trials_rule=False)  # 2 trials: short, never PASS
    return Scenario(cfg, "GAIN", {"n1": scripted_node()}, http=httpx.MockTransport(TwoArms()))


def g2_gain_multi_turn(tmp_path) -> Scenario:
    """The shipped G2-multiturn gate (g2-gain on multi-turn sessions), as test_g2_multi_turn scripts it."""
    from test_g2_multi_turn import multi_turn_scenario
    cfg, node, engine, _ = multi_turn_scenario(tmp_path)
    return Scenario(cfg, cfg.suite.gates[0].id, {"n1": node}, http=httpx.MockTransport(engine))


def g2_faults(tmp_path) -> Scenario:
    """The pool's path lost and restored under the shipped cpu-reference gate, as test_g2_faults scripts it (the
    pool mount's server found with findmnt)."""
    from test_g2_faults import Tier, faulty_node, suite
    tier = Tier()
    return Scenario(suite(tmp_path), "G2-F1-pool-faults", {"n1": faulty_node(tier, [])},
                    http=httpx.MockTransport(tier))


def g2_tenancy(tmp_path) -> Scenario:
    """Tenants A and B on a tier that keys stored prompts by the salt, as test_g2_tenancy scripts it (one start)."""
    from test_g2_tenancy import POOL_FILE_BYTES, tenancy_config
    engine = EngineServer(salt_field="cache_salt")
    node = engine_node("n1", engine=engine, pool=(POOL_FILE_BYTES,) * 2)
    return Scenario(tenancy_config(tmp_path), "T", {"n1": node}, http=httpx.MockTransport(engine))


SCENARIOS: dict[str, Callable[[Any], Scenario]] = {
    "fio-read": fio_read, "kv-read": kv_read, "nvme-integrity": nvme_integrity, "g2-ttft": g2_ttft,
    "g2-answer": g2_answer,
    "r3-cross-instance": r3_cross_instance, "g3-shared-read": g3_shared_read,
    "g2-load": g2_load, "pd-handoff": pd_handoff, "fio-faults": fio_faults, "g2-gain": g2_gain,
    "g2-faults": g2_faults, "g2-tenancy": g2_tenancy,
}
# More ways to run a workload than its first scenario: (workload, id, scenario)
MORE_SCENARIOS = [("g2-ttft", "g2-ttft-attached", g2_ttft_attached),
                  ("g2-gain", "g2-gain-multi-turn", g2_gain_multi_turn),
                  ("g3-shared-read", "g3-isolation", g3_isolation),
                  ("pd-handoff", "pd-handoff-two-nodes", pd_handoff_two_nodes),
                  ("pd-handoff", "pd-handoff-storage-side", pd_handoff_storage_side),
                  ("pd-handoff", "pd-handoff-attached", pd_handoff_attached)]


def _params():
    runs = [(name, name, SCENARIOS.get(name)) for name in sorted(WORKLOADS)] + MORE_SCENARIOS
    for name, run_id, scenario in runs:
        yield pytest.param(name, scenario, id=run_id)


@pytest.mark.parametrize("workload, scenario", list(_params()))
def test_a_scripted_run_sends_exactly_the_planned_commands(workload, scenario, tmp_path, request):
    assert scenario is not None, f"workload {workload!r} is registered but has no scripted run in {__file__}"
    sc = scenario(tmp_path)
    gate = next(g for g in sc.cfg.suite.gates if g.id == sc.gate_id)
    ctx = sc.ctx or context(sc.cfg, sc.gate_id, sc.nodes, tmp_path, http=sc.http)
    result = WORKLOADS[workload]().run(ctx)
    planned = gate_plan(sc.cfg, gate)
    for name, node in sc.nodes.items():
        mine = [s for s in planned if s.node == name]
        assert plan_mismatch(mine, node.commands) is None, (name, plan_mismatch(mine, node.commands))
    assert result.error is None, result.error  # the whole procedure ran, not a path cut short
    _compare_with_baseline(request.node.callspec.id, _record(planned, sc.nodes, ctx.gate_dir, result, tmp_path))


# ----------------------------------------------------------------------------------------- the recorded baseline
# Behaviour kept across a restructure (issue 37): for every scenario above, what was planned, what each node was
# sent, the files the gate left and its result are recorded under tests/fixtures/plan_run_baseline/ and compared
# on every run. Only what a run cannot repeat is masked: the interpreter, the checkout's path, the test's
# directory, decimal figures (times, rates taken from the clock), long hex (run tags, digests of timed files), free
# ports, drawn seeds, scripted pids; each node's commands are recorded as a sorted set (their order is checked
# against the plan above). Write the records again (after a change of behaviour one means to make) with
# KVGATE_RECORD_BASELINE=1.
BASELINE = Path(os.environ.get("KVGATE_BASELINE_DIR", FIX / "plan_run_baseline"))
_DECIMAL = re.compile(r"-?\d+\.\d+(?:e-?\d+)?")
_HEX = re.compile(r"\b[0-9a-f]{8,}\b")
_DIGITS = re.compile(r"\d{9,}")  # unix times, nanosecond clocks
_PORT = re.compile(r"(:|--port |\"port\": )\d{4,5}\b")  # an engine's free port
_SEEDED_ID = re.compile(r"\bs\d{5,}-")  # a request id that starts with the drawn prompt seed
_PID = re.compile(r"\bpid \d+")  # the scripted node numbers processes as they start: two at once in either order
_UNREPEATABLE_KEYS = {"port", "prompt_seed", "pid"}  # a free port, a seed drawn when the gate gives none, a pid
# The scripted tier of the g2-faults scenario serves or fails a request by the wall clock (a request sent while the
# fault is on fails), so how many fell back varies with the machine's speed: its files and result are compared by
# name only; what was planned and sent in full.
_TIMED_RESULT = {"g2-faults"}


def _mask(text: str, tmp_path) -> str:
    # the interpreter the tests run with (a scripted node's engine python) and the checkout's place: a clean clone
    # elsewhere records the same
    text = text.replace(sys.executable, "<python>").replace(str(ROOT), "<repo>")
    text = _PORT.sub(r"\1<port>", text.replace(str(tmp_path), "<tmp>"))
    text = _PID.sub("pid <pid>", _SEEDED_ID.sub("s<seed>-", text))
    return _DIGITS.sub("<n>", _HEX.sub("<hex>", _DECIMAL.sub("<x>", text)))


def _mask_json(value, tmp_path):
    if isinstance(value, float):
        return "<x>"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10 ** 9:
        return "<n>"
    if isinstance(value, str):
        return _mask(value, tmp_path)
    if isinstance(value, list):  # per-node records come in the order the nodes answered
        items = [_mask_json(v, tmp_path) for v in value]
        if any(isinstance(v, dict) and "node" in v for v in items):
            items.sort(key=lambda v: json.dumps(v, sort_keys=True))
        return items
    if isinstance(value, dict):
        return {_mask(k, tmp_path): "<masked>" if k in _UNREPEATABLE_KEYS else _mask_json(v, tmp_path)
                for k, v in value.items()}
    return value


def _distinct(argvs, tmp_path) -> list[str]:
    """Each node's distinct commands, masked and sorted: their order (engines started at once, arms set up in
    parallel, polls repeated as long as they take) is the plan matcher's to check above, not the record's."""
    return sorted({_mask(" ".join(argv), tmp_path) for argv in argvs})


def _record(planned, nodes, gate_dir: Path, result, tmp_path) -> dict:
    files = {}
    for f in sorted(p for p in gate_dir.rglob("*") if p.is_file()):
        try:
            text = f.read_text()
            if f.suffix == ".json":  # compared as data: per-node lists in it sorted as in the result
                files[str(f.relative_to(gate_dir))] = _mask_json(json.loads(text), tmp_path)
            else:
                files[str(f.relative_to(gate_dir))] = _mask(text, tmp_path).splitlines()
        except (UnicodeDecodeError, json.JSONDecodeError):
            files[str(f.relative_to(gate_dir))] = f"<{f.stat().st_size} bytes>"
    record = {"planned": [[s.node, s.description, " ".join(s.argv), s.optional, s.repeats] for s in planned],
              "sent": {name: _distinct(node.commands, tmp_path) for name, node in sorted(nodes.items())},
              "files": files, "result": result.as_dict()}
    return _mask_json(json.loads(json.dumps(record, default=str)), tmp_path)


def _compare_with_baseline(run_id: str, record: dict) -> None:
    path = BASELINE / f"{run_id}.json"
    if os.environ.get("KVGATE_RECORD_BASELINE") == "1":
        BASELINE.mkdir(exist_ok=True)
        path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        return
    assert path.exists(), f"no recorded baseline {path}: record it with KVGATE_RECORD_BASELINE=1"
    recorded = json.loads(path.read_text())
    if run_id in _TIMED_RESULT:
        record, recorded = ({"planned": r["planned"], "sent": r["sent"], "files": sorted(r["files"])}
                            for r in (record, recorded))
    for node, sent in record.get("sent", {}).items():  # a command's difference named, not the whole lists
        was = recorded["sent"].get(node, [])
        assert sent == was, (f"{run_id}: {node} was sent {sorted(set(sent) - set(was))} and not "
                             f"{sorted(set(was) - set(sent))} ({path})")
    for part in record:
        assert record[part] == recorded[part], f"{run_id}: the {part} differ from {path}"


def _step(argv, optional=False, repeats=False) -> PlannedStep:
    return PlannedStep("n", "step", tuple(argv), optional=optional, repeats=repeats)


def test_the_plan_matcher_allows_only_what_the_plan_says():
    plan = [_step(["mkdir", "-p", "/w"]), _step(["fill", "<the device>"], optional=True),
            _step(["find", "/pool"], repeats=True), _step(["fio", "job"])]
    assert plan_mismatch(plan, [("mkdir", "-p", "/w"), ("find", "/pool"), ("find", "/pool"), ("fio", "job")]) is None
    assert plan_mismatch(plan, [("mkdir", "-p", "/w"), ("fill", "/dev/nvme0n1"), ("find", "/pool"),
                                ("fio", "job")]) is None
    # an unplanned command, a planned one missing, a repeat of a step that is not a poll, a wrong order
    assert "not planned" in plan_mismatch(plan, [("mkdir", "-p", "/w"), ("rm", "-rf", "/"), ("find", "/pool"),
                                                 ("fio", "job")])
    assert "never sent: fio job" in plan_mismatch(plan, [("mkdir", "-p", "/w"), ("find", "/pool")])
    assert "not planned" in plan_mismatch(plan, [("mkdir", "-p", "/w"), ("mkdir", "-p", "/w"), ("find", "/pool"),
                                                 ("fio", "job")])
    assert "not planned" in plan_mismatch(plan, [("find", "/pool"), ("mkdir", "-p", "/w"), ("fio", "job")])
    # a placeholder stands for text the run found, never for an empty or a missing argument
    assert "not planned" in plan_mismatch(plan, [("mkdir", "-p", "/w"), ("fill", ""), ("find", "/pool"),
                                                 ("fio", "job")])
    assert "not planned" in plan_mismatch(plan, [("mkdir", "-p", "/w"), ("fill",), ("find", "/pool"),
                                                 ("fio", "job")])
