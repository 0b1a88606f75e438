"""G3's isolation mode (``writer:``) on scripted nodes: the readers read alone, then again while a further node
writes through the same port; the readers' loss, the writer's bandwidth in their window, and INVALID when the
writer did not write through it. Every branch of the evaluator and the run, no rig."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from harness.config import load_config
from harness.errors import ConfigError
from harness.execute.fanout import FailurePolicy
from harness.parsers.g3series import Interval, NodeSeries, PortRate, longest_idle_s
from harness.suite.plan import gate_plan, plan_mismatch
from harness.transport.doubles import Reply, ScriptedTransport
from harness.workloads import WORKLOADS
from harness.workloads.g3_shared_read import G3Evidence, G3Isolation, G3NodeRecord, G3WriterRecord, evaluate_g3
from doubles import gate_context

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_796_000_000.0
MB = 1e6


def stream(node, start, seconds, rate_bytes_s, *, mode=None, idle=None, interval=0.1, completed=True,
           end=True, direct=True):
    """A G3 reader's (or, mode='write', writer's) JSON-lines output: samples of ``rate_bytes_s`` from ``start``
    for ``seconds``, none in the ``idle`` (from, to) stretch."""
    recs = [{"type": "header", "schema": "kvgate-g3-reader/1", "node": node, **({"mode": mode} if mode else {})},
            {"type": "armed", "t_s": start - 0.5, "files": 2, "bytes_expected": None, "direct_used": direct},
            {"type": "start", "t_s": start, "go_s": start, "start_priority": "fifo"}]
    total, t = 0, start
    while t < start + seconds - 1e-9:
        t1 = t + interval
        b = 0 if idle and idle[0] <= t - start < idle[1] else int(rate_bytes_s * interval)
        recs.append({"type": "sample", "t0_s": t, "t1_s": t1, "bytes": b})
        total += b
        t = t1
    if end:
        recs.append({"type": "end", "t_s": t, "bytes": total, "completed": completed, "files_done": 2,
                     **({"stopped": completed} if mode else {})})
    return "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in recs)


def suite(tmp_path, writer=None, nodes=("n1", "n2", "w"), **params):
    """g3-rig.yaml's gate on scripted readers n1, n2, a further node w and the storage node, the writer on w."""
    gates = yaml.safe_load((ROOT / "gates" / "g3-rig.yaml").read_text())
    p = gates["gates"][0]["params"]
    p.update(read_timeout_s=10, arm_timeout_s=5, stall_timeout_s=5, **params)
    if writer is not False:
        p["writer"] = writer or {"node": "w", "files": 2, "file": "8 MiB"}
    gates["gates"][0]["metric"] = "readers_loss"
    gates["gates"][0]["pass"] = "<= 0.30 ratio"
    gates["gates"][0]["stop_loss"] = "> 0.60 ratio"
    del gates["gates"][0]["reference"]
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(gates, sort_keys=False))
    inv = [{"name": n, "transport": "local", "work_dir": "/w", "nics": [{"name": "eth0", "line_rate_gbit_s": 10.0}],
            "targets": [{"name": "kvpool", "kind": "directory", "path": "/mnt/pool"}]} for n in nodes]
    inv.append({"name": "storage", "transport": "local", "work_dir": "/w",
                "nics": [{"name": "st0", "line_rate_gbit_s": 1.0}],
                "targets": [{"name": "kvpool", "kind": "directory", "path": "/srv/pool"}]})
    (tmp_path / "i.yaml").write_text(yaml.safe_dump({"nodes": inv}))
    return load_config(tmp_path / "i.yaml", tmp_path / "g.yaml", WORKLOADS)


ALONE = {"n1": stream("n1", T0, 4, 60 * MB), "n2": stream("n2", T0, 4, 60 * MB)}
WITH = {"n1": stream("n1", T0 + 10, 6, 45 * MB), "n2": stream("n2", T0 + 10, 6, 40 * MB)}
WRITES = stream("w", T0 + 10, 6.2, 50 * MB, mode="write")


def nodes(with_writer=None, writer=WRITES, writer_reply=None, alone=None):
    """The scripted nodes: each reader prints ALONE (or ``alone``) for its first read and WITH (or
    ``with_writer``) for the second; the writer prints ``writer`` (or answers ``writer_reply``)."""
    with_writer = {**WITH, **(with_writer or {})}
    alone = {**ALONE, **(alone or {})}

    def handler(name):
        def answer(call):
            argv = call.argv
            if argv == ("sh", "-c", "while read -r _; do date +%s.%N; done"):
                return Reply(stdout=f"{time.time():.6f}\n")
            if "kvgate-launch" in argv and "write" in argv:
                return writer_reply or Reply(stdout=writer, exit_after_s=0.3)
            if "kvgate-launch" in argv:
                out = with_writer[name] if any("-with-writer" in a for a in argv) else alone[name]
                return out if isinstance(out, Reply) else Reply(stdout=out, exit_after_s=0.2)
            if argv[:1] == ("cat",) and argv[1].endswith("/speed"):
                return Reply(stdout="1000\n")
            if argv[:2] == ("tc", "-j"):
                return Reply(stdout="[]\n")
            if argv[:1] == ("cat",):
                return Reply(rc=1, stderr="cat: no such file\n")
            return Reply()
        return answer
    return {n: ScriptedTransport(handler(n), name=n, sessions=True) for n in ("n1", "n2", "w", "storage")}


def sub(tmp_path, name):
    d = tmp_path / name
    d.mkdir()
    return d


def run(tmp_path, cfg, scripted):
    ctx = gate_context(tmp_path, cfg, "G3", transports=scripted)
    return WORKLOADS["g3-shared-read"]().run(ctx), ctx


def test_the_readers_loss_compares_their_read_alone_with_their_read_while_the_writer_writes(tmp_path):
    cfg = suite(tmp_path)
    scripted = nodes()
    res, ctx = run(tmp_path, cfg, scripted)
    assert res.error is None and res.invalid_reason is None, (res.error, res.invalid_reason)
    m = res.metrics
    assert m["aggregate_read_gb_s"] == pytest.approx(0.120, rel=0.03)
    assert m["aggregate_read_gb_s_with_writer"] == pytest.approx(0.085, rel=0.03)
    assert m["readers_loss"] == pytest.approx(1 - 85 / 120, abs=0.02)
    assert m["writer_write_gb_s"] == pytest.approx(0.050, rel=0.03)
    iso = res.evidence.isolation
    assert iso.writer == "w" and iso.compared == ["n1", "n2"]
    assert iso.per_node_loss["n1"] == pytest.approx(0.25, abs=0.02)
    assert iso.per_node_loss["n2"] == pytest.approx(1 - 40 / 60, abs=0.02)
    assert iso.alone.per_node_read_gb_s["n1"] == pytest.approx(0.060, rel=0.03)
    assert iso.with_writer.per_node_read_gb_s["n2"] == pytest.approx(0.040, rel=0.03)
    rec = iso.writer_record
    assert rec.completed and rec.error is None and rec.longest_idle_s < 0.2
    assert rec.bytes_written == pytest.approx(50 * MB * 6.2, rel=0.02)
    assert sorted(iso.series) == ["n1", "n2", "w (writer)"]
    checks = {c.name: c for c in res.evidence.validity}
    assert checks["writer wrote"].ok and checks["comparison"].ok and checks["cold (with writer)"].ok
    # the writer was told to stop with its stop file, after the readers were done; what it wrote is removed
    w = scripted["w"]
    puts = [e.path for e in w.events if e.kind == "put"]
    assert any(p.endswith("/stop-writer") for p in puts)
    assert w.commands[-1] == ("rm", "-rf", "--", "/mnt/pool/kvgate-g3-writes/w")
    # the readers read twice, the page cache dropped before each read; the writer is not a reader
    for n in ("n1", "n2"):
        d = ctx.gate_dir / "nodes" / n
        assert (d / "reader.jsonl").read_text() == ALONE[n] and (d / "reader-with-writer.jsonl").read_text() == WITH[n]
        assert sum(1 for c in scripted[n].commands if "drop_caches" in " ".join(c)) == 2
    assert res.evidence.readers == ["n1", "n2"] and "w" not in res.evidence.nodes
    assert (ctx.gate_dir / "nodes" / "w" / "writer.jsonl").read_text() == WRITES
    # plan == run, the isolation steps included
    planned = gate_plan(cfg, next(g for g in cfg.suite.gates if g.id == "G3"))
    for name, node in scripted.items():
        assert plan_mismatch([s for s in planned if s.node == name], node.commands) is None, name


@pytest.mark.parametrize("writes, why", [
    (stream("w", T0 + 10, 6.2, 0, mode="write"), "did not write through the readers' window: 0 bytes"),
    # the writer stopped writing 2 s into the readers' 6 s
    (stream("w", T0 + 10, 6.2, 50 * MB, mode="write", idle=(2.0, 9.0)), "longest idle stretch 4.00 s"),
    # it started 3 s late
    (stream("w", T0 + 13, 3.2, 50 * MB, mode="write"), "longest idle stretch 3.00 s"),
])
def test_a_writer_that_did_not_write_through_the_readers_window_makes_the_run_invalid(tmp_path, writes, why):
    res, _ = run(tmp_path, suite(tmp_path), nodes(writer=writes))
    assert res.error is None and why in res.invalid_reason, res.invalid_reason
    check = next(c for c in res.evidence.validity if c.name == "writer wrote")
    assert not check.ok and why in check.how
    # the numbers are still shown: the readers' loss and the writer's own bandwidth
    assert "readers_loss" in res.metrics and "writer_write_gb_s" in res.metrics


def test_a_writer_that_failed_or_never_armed_makes_the_run_invalid_never_a_pass(tmp_path):
    # the writer ended by itself, not on its stop file (e.g. a write failed): its error is the reason
    failed = stream("w", T0 + 10, 6.2, 50 * MB, mode="write", completed=False)
    res, _ = run(tmp_path, suite(tmp_path), nodes(writer_reply=Reply(stdout=failed, rc=7, exit_after_s=0.3)))
    assert res.invalid_reason.startswith("the writer w failed: exited with rc=7"), res.invalid_reason
    # never armed: the second read is not started, the run is not a comparison
    res, _ = run(sub(tmp_path, "b"), suite(tmp_path / "b"),
                 nodes(writer_reply=Reply(rc=3, stdout='{"type":"header","schema":"kvgate-g3-reader/1"}\n',
                                          exit_after_s=0.05)))
    assert res.error is None
    assert res.invalid_reason == "the writer w failed: arming: exited with rc=3 before arming"
    # the readers stopped for the writer's sake are not counted as the readers' failures
    assert res.evidence.isolation.failed_nodes == {} and res.evidence.isolation.nodes == {}
    assert "readers_loss" not in res.metrics and res.evidence.isolation.with_writer.aggregate_read_gb_s is None


def test_a_reader_lost_in_the_second_read_is_an_error_by_the_failure_policy(tmp_path):
    cut = WITH["n2"].splitlines(keepends=True)
    res, _ = run(tmp_path, suite(tmp_path), nodes(with_writer={"n2": Reply(stdout="".join(cut[:20]), rc=137,
                                                                          exit_after_s=0.2)}))
    assert res.error.startswith("with the writer:") and "n2" in res.error, res.error
    assert "n2" in res.evidence.isolation.failed_nodes and res.evidence.failed_nodes == {}
    # with a failure share that tolerates it, the loss compares the reader that read both times
    res, _ = run(sub(tmp_path, "c"), suite(tmp_path / "c", max_failed_share=0.5),
                 nodes(with_writer={"n2": Reply(stdout="".join(cut[:20]), rc=137, exit_after_s=0.2)}))
    assert res.error is None and res.evidence.isolation.compared == ["n1"]
    assert res.metrics["readers_loss"] == pytest.approx(0.25, abs=0.02)


def test_a_first_read_failed_beyond_the_policy_is_the_error_and_the_writer_is_never_started(tmp_path):
    cut = ALONE["n2"].splitlines(keepends=True)[:10]
    scripted = nodes(alone={"n2": Reply(stdout="".join(cut), rc=137, exit_after_s=0.2)})
    res, _ = run(tmp_path, suite(tmp_path), scripted)
    assert res.error.startswith("1 of 2 nodes failed") and "n2" in res.error, res.error
    assert not any("write" in c for c in scripted["w"].commands)
    assert not any("-with-writer" in " ".join(c) for c in scripted["n1"].commands)


# ---- the pure evaluator ---------------------------------------------------------------------------------

def steady(node, start, end, rate, offset=0.0):
    ivs = tuple(Interval(t + offset, t + 1 + offset, rate) for t in range(int(start), int(end)))
    return NodeSeries(node, ivs, clock_offset_s=offset, started_at_s=start + offset, completed=True,
                      total_bytes=rate * (end - start))


def evaluate(with_writer, writer, drops=None, direct=True, **iso):
    alone = {n: steady(n, 0, 10, 1e9) for n in ("a", "b")}
    ev = G3Evidence(readers=["a", "b"], nodes={n: {"direct_used": True} for n in alone},
                    isolation=G3Isolation(writer="w", nodes={n: G3NodeRecord(direct_used=direct) for n in with_writer},
                                          page_cache_dropped=drops or {}, writer_record=G3WriterRecord(node="w"),
                                          **iso))
    return evaluate_g3(ev, alone, PortRate(16.0, None, None, 16.0), FailurePolicy(), 1.0, 0.0, 0.0,
                       with_writer, writer, 2.0)


def test_the_writers_clock_offset_is_removed_before_its_bytes_are_set_against_the_readers_window():
    readers = {n: steady(n, 100, 110, 0.5e9) for n in ("a", "b")}
    # the writer's node clock runs 30 s ahead: aligned, it wrote exactly through the readers' window
    res = evaluate(readers, steady("w", 100, 110, 0.25e9, offset=30.0))
    assert res.invalid_reason is None and res.metrics["readers_loss"] == pytest.approx(0.5)
    assert res.metrics["writer_write_gb_s"] == pytest.approx(0.25)
    # without the offset (raw node-clock times) it would have written 30 s after the readers
    res = evaluate(readers, NodeSeries("w", steady("w", 130, 140, 0.25e9).intervals))
    assert "0 bytes" in res.invalid_reason


def test_no_with_writer_aggregate_or_a_warm_second_read_is_invalid():
    silent = {n: NodeSeries(n, (Interval(0, 1, 0),), completed=True) for n in ("a", "b")}
    res = evaluate(silent, None)
    assert "wrote nothing the readers' window can be checked against" in res.invalid_reason
    assert next(c for c in res.evidence.validity if c.name == "comparison").how.startswith("no with-writer aggregate")
    readers = {n: steady(n, 100, 110, 0.5e9) for n in ("a", "b")}
    from harness.workloads.kit.base import CacheDrop
    res = evaluate(readers, steady("w", 100, 110, 0.1e9), direct=False,
                   drops={"a": CacheDrop(dropped=True), "b": CacheDrop(dropped=False, error="EPERM")})
    assert res.invalid_reason == "not cold with the writer: b"
    # a gain is reported as it is: a negative loss
    res = evaluate({n: steady(n, 100, 110, 1.5e9) for n in ("a", "b")}, steady("w", 100, 110, 0.1e9))
    assert res.invalid_reason is None and res.metrics["readers_loss"] == pytest.approx(-0.5)


def test_longest_idle_counts_the_edges_and_the_gaps_inside_the_window():
    ivs = [Interval(1, 2, 5), Interval(2, 3, 0), Interval(4, 5, 5), Interval(8, 9, 5)]
    assert longest_idle_s(ivs, 0, 10) == pytest.approx(3.0)  # 5..8
    assert longest_idle_s(ivs, 0.5, 5) == pytest.approx(2.0)  # 2..4
    assert longest_idle_s([], 0, 4) == pytest.approx(4.0)
    assert longest_idle_s([Interval(0, 10, 1)], 2, 3) == 0.0


# ---- config --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("writer, nodes_, params, message", [
    ({"node": "x"}, ("n1", "n2", "w"), {}, "writer.node: writer 'x' is not among the gate's nodes"),
    ({"node": "storage"}, ("n1", "n2", "w"), {}, "writer.node: writer 'storage' is the port's node"),
    ({"node": "n1"}, ("n1", "n2", "w"), {"readers": ["n1", "n2"]}, "writer.node: writer 'n1' is also a reader"),
    ({"node": "w"}, ("n1", "n2", "w"), {"launcher": "slurm"}, "writer: a writer (isolation) runs with launcher ssh"),
    ({"node": "w", "block": "1000"}, ("n1", "n2", "w"), {}, "writer.block"),
    ({"node": "w", "speed": 1}, ("n1", "n2", "w"), {}, "writer.speed"),
])
def test_writer_config_errors_name_the_file_line_and_field(tmp_path, writer, nodes_, params, message):
    with pytest.raises(ConfigError) as exc:
        suite(tmp_path, writer, nodes_, **params)
    text = str(exc.value)
    assert message in text, text
    assert f"{tmp_path / 'g.yaml'}:" in text and any(ch.isdigit() for ch in text.split("g.yaml:")[1][:3])


def test_without_a_writer_every_gate_node_but_the_port_reads_and_with_one_the_writer_does_not(tmp_path):
    cfg = suite(tmp_path, writer=False)
    plan = gate_plan(cfg, cfg.suite.gates[0])
    assert {s.node for s in plan if "armed reader" in s.description} == {"n1", "n2", "w"}
    assert not any("write" in s.argv for s in plan if s.argv)
    cfg = suite(sub(tmp_path, "x"))
    plan = gate_plan(cfg, cfg.suite.gates[0])
    assert {s.node for s in plan if "armed reader" in s.description} == {"n1", "n2"}
    assert [s.description.split(":")[0] for s in plan if s.node == "w"] == [
        "create the node's directory for kvgate's reader", "measure clock offset", "armed writer",
        "remove what the writer wrote"]


def test_render_k8s_refuses_a_g3_writer_at_its_line(tmp_path, capsys):
    # the Kubernetes launcher starts readers only: a writer would be dropped without a word, so it is refused
    from harness.cli.main import main
    from test_k8s import write_suite
    inv, gates = write_suite(tmp_path, "/mnt/pool")
    i, g = yaml.safe_load(inv.read_text()), yaml.safe_load(gates.read_text())
    i["nodes"].insert(0, {**i["nodes"][0], "name": "w"})
    g["gates"][0]["params"]["writer"] = {"node": "w"}
    inv.write_text(yaml.safe_dump(i, sort_keys=False))
    gates.write_text(yaml.safe_dump(g, sort_keys=False))
    assert main(["render", "k8s", str(inv), str(gates), "-o", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert f"{gates}:" in err and "params.writer: gate G3: render k8s: a G3 writer (isolation) runs with the ssh" in err
    assert "Traceback" not in err and not (tmp_path / "m").exists()
