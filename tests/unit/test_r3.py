"""R3: the evaluation from both phases' records (the node client's output, captured from a real cpu-reference +
LMCache 0.5.6 run on the rig), validity rules, the suite's config checks against an inventory, the plan, and a
scripted run through the engine handles and the one phase runner that sends exactly the planned commands."""

import json
from pathlib import Path

import pytest
import yaml

import harness.workloads.r3_cross_instance  # noqa: F401  (registers r3-cross-instance)
from doubles import EngineServer, Router, argv_has, argv_starts, gate_context, normalized, ok, pool_files, preflight, spawned
from harness.config import load_config
from harness.engines import load_profile
from harness.errors import ConfigError
from harness.gates.verdict import Outcome, evaluate
from harness.suite.plan import gate_plan
from harness.transport.doubles import Reply, ScriptedTransport
from harness.workloads import WORKLOADS
from harness.workloads.kit.engine import LogMark
from harness.workloads.kit.phases import EngineLog, PhaseRecord
from harness.workloads.r3_cross_instance import evaluate_r3

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "r3"
REPO = Path(__file__).resolve().parents[2]
PROF = load_profile("cpu-reference")
HM = PROF.hit_metrics
DEGRADED = ". System will operate in degraded mode (recompute). (manager.py:107:lmcache.v1.manager)"


def captured(role: str, failed: int = 0) -> PhaseRecord:
    """A phase as the node client printed it on the rig: the engine's counters before and after, its records."""
    records = [{"id": f"p{i}", "ok": i >= failed, "error": None if i >= failed else "timeout"} for i in range(2)]
    return PhaseRecord(role, {"metrics_before": (FIX / f"metrics-{role}-before.prom").read_text(),
                              "metrics_after": (FIX / f"metrics-{role}-after.prom").read_text(),
                              "records": records}, {})


def counters(hit, query, read=0):
    if hit is None:
        return "kvgate_cpu_ref_requests_total 1\n"
    return (f"kvgate_cpu_ref_external_hit_tokens_total {hit}\nkvgate_cpu_ref_external_query_tokens_total {query}\n"
            f"kvgate_cpu_ref_external_read_bytes_total {read}\n")


def phase(role, hit, query, before=(0, 0), records=({"id": "p0", "ok": True},)):
    return PhaseRecord(role, {"metrics_before": counters(*before) if hit is not None else counters(None, None),
                              "metrics_after": counters(hit, query), "records": list(records)}, {})


def test_captured_run_reader_hit_every_token_the_writer_stored():
    res = evaluate_r3(captured("writer"), captured("reader"), HM, 18874704, 18874368)
    assert res.metrics == {"hit_rate": 1.0}
    assert res.error is None and res.invalid_reason is None
    ev = res.evidence
    assert (ev.writer_hit_tokens, ev.writer_query_tokens, ev.reader_hit_tokens, ev.reader_query_tokens) == \
        (0, 3072, 3072, 3072)
    # The writer stored what the reader then read: same bytes through LMCache's counters.
    assert ev.reader_read_bytes == 3072 * 6144 and ev.reader_query_tokens_before == 0


def test_partial_hits_give_the_ratio_and_a_writer_hit_is_invalid():
    assert evaluate_r3(phase("writer", 0, 3072), phase("reader", 2816, 3072), HM, 1, 1).metrics["hit_rate"] == \
        pytest.approx(2816 / 3072)
    res = evaluate_r3(phase("writer", 512, 3072), phase("reader", 3072, 3072), HM, 1, 1)
    assert "not new" in res.invalid_reason


def test_no_pool_bytes_is_a_miss_not_an_excuse_and_failed_requests_are_error():
    res = evaluate_r3(phase("writer", 0, 3072), phase("reader", 0, 3072), HM, 0, 18874368)
    assert res.metrics["hit_rate"] == 0.0 and res.invalid_reason is None and res.error is None
    assert evaluate_r3(captured("writer"), captured("reader", failed=1), HM, 1, 1).error == \
        "1 request(s) failed; first: reader p0: timeout"
    assert "no hit/query counters" in evaluate_r3(phase("writer", 0, 3072), phase("reader", None, None), HM, 1, 1).error


def test_the_evaluator_states_what_r3_proved_in_its_validity_list():
    def checks(res):
        return {c.name: c for c in res.evidence.validity}
    ok = checks(evaluate_r3(captured("writer"), captured("reader"), HM, 18874704, 18874368))
    assert all(c.ok for c in ok.values()) and set(ok) == {"requests", "no fall-back", "new prompts", "fresh reader",
                                                          "reader measured", "pool populated"}
    assert ok["pool populated"].figure_text() == "pool bytes after the writer: 18.0 MiB (18874704 bytes)"
    assert ok["reader measured"].value == 1.0
    # the writer hit some (the prompts were not new), the pool never got the writer's KV (a FAIL, shown as not
    # holding), a failed request: each check says so with its figure
    bad = checks(evaluate_r3(phase("writer", 512, 3072), phase("reader", 0, 3072), HM, 0, 18874368))
    assert not bad["new prompts"].ok and bad["new prompts"].value == 512
    assert not bad["pool populated"].ok and bad["pool populated"].value == 0
    failed = checks(evaluate_r3(captured("writer"), captured("reader", failed=1), HM, 1, 1))
    assert not failed["requests"].ok and "timeout" in failed["requests"].how


def test_an_engines_fall_back_and_a_reader_that_looked_up_before_are_invalid_the_fall_back_first():
    w, r = phase("writer", 0, 3072), phase("reader", 3072, 3072)
    fell = {"writer": EngineLog(LogMark(1, ""), LogMark(1, "ready\n")),
            "reader": EngineLog(LogMark(1, ""), LogMark(1, f"ready\n{DEGRADED}\n"))}
    res = evaluate_r3(w, r, HM, 1, 1, logs=fell, fallback_patterns=PROF.fallback_patterns)
    assert res.invalid_reason.startswith("the engine fell back in the reader engine's phase")
    looked = phase("reader", 3072, 6144, before=(0, 3072))
    assert evaluate_r3(w, looked, HM, 1, 1).invalid_reason.startswith("the reader engine had looked up")
    assert evaluate_r3(w, looked, HM, 1, 1, logs=fell).invalid_reason.startswith("the engine fell back")


def test_suite_against_an_inventory_without_the_shared_pool_names_file_line_field(tmp_path):
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump({"nodes": [
        {"name": "n1", "transport": "local", "targets": [{"name": "kvpool", "kind": "directory", "path": "/tmp/p"}]},
        {"name": "n2", "transport": "local"}]}))
    with pytest.raises(ConfigError) as ei:
        load_config(inv, REPO / "gates" / "r3-cpu-reference.yaml", WORKLOADS)
    msg = str(ei.value)
    assert "r3-cpu-reference.yaml" in msg and "pool_target" in msg and "'n2' has no directory target 'kvpool'" in msg


def test_plan_names_both_engines_the_shared_pool_run_dir_and_runs_nothing(tmp_path):
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump({"nodes": [
        {"name": n, "transport": "local", "targets": [{"name": "kvpool", "kind": "directory", "path": "/mnt/pool"}]}
        for n in ("n1", "n2")]}))
    cfg = load_config(inv, REPO / "gates" / "r3-cpu-reference.yaml", WORKLOADS)
    steps = WORKLOADS["r3-cross-instance"]().plan(gate_context(None, cfg))
    starts = [s for s in steps if "start a fresh" in s.description]
    assert [s.node for s in starts] == ["n1", "n2"]
    # the engine is the program kvgate puts into each node's run directory: the node needs no kvgate
    assert all(s.argv[1].endswith("/cpu_reference.py") and s.argv[1].startswith(s.argv[s.argv.index("--model-config") + 1]
               .rsplit("/", 1)[0]) for s in starts)
    pools = [s.argv[3] for s in steps if s.argv[:2] == ("mkdir", "-p")]
    assert pools[0] == pools[1] == "/mnt/pool/kvgate-r3/run-<run>"
    assert all("fs://localhost:0/mnt/pool/kvgate-r3/run-<run>" in "".join(s.files.values())
               for s in steps if s.files)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inv.yaml"]  # nothing was written or run


# ------------------------------------------------------------------------------------------ a scripted run

def r3_config(tmp_path, nodes=("n1", "n2")):
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump({"nodes": [
        {"name": n, "transport": "local", "work_dir": "/w",
         "targets": [{"name": "kvpool", "kind": "directory", "path": "/mnt/pool"}]} for n in nodes]}))
    suite = yaml.safe_load((REPO / "gates" / "r3-cpu-reference.yaml").read_text())
    suite["gates"][0]["params"].update(python="/engine/bin/python", populate_timeout_s=5)
    (tmp_path / "r3.yaml").write_text(yaml.safe_dump(suite))
    return load_config(inv, tmp_path / "r3.yaml", WORKLOADS)


def r3_node(name: str, role: str, engine_log: str = "ready\n", reader_sees: int = 2) -> ScriptedTransport:
    """A rig node: its engine's client prints what the real client printed on the rig (writer: 3072 new tokens;
    reader: all 3072 hit), the pool holds the writer's chunk files (the reader sees ``reader_sees`` of them)."""
    out = {"metrics_before": (FIX / f"metrics-{role}-before.prom").read_text(),
           "metrics_after": (FIX / f"metrics-{role}-after.prom").read_text(),
           "records": [{"id": f"p{i}", "ok": True, "elapsed_s": 0.5, "usage": None} for i in range(2)]}
    files = [9437352] * (2 if role == "writer" else reader_sees)
    device = (REPO / "tests" / "fixtures" / "pooldev" / "loop-ext4.out").read_text()  # the pool device probe
    return ScriptedTransport(Router(preflight(), pool_files(files), (spawned, Reply(stdout=engine_log)),
                                    (argv_has("kvgate-pool-blockstat"), Reply(stdout=device)),
                                    (lambda c: c.argv[1:2] and c.argv[1].endswith("/r3_client.py"),
                                     Reply(stdout=json.dumps(out))),
                                    *ok(argv_starts("mkdir"), argv_starts("sync"))), name=name)


def run_r3(tmp_path, **kw):
    cfg = r3_config(tmp_path)
    nodes = {"n1": r3_node("n1", "writer", **kw), "n2": r3_node("n2", "reader", **kw)}
    ctx = gate_context(tmp_path / "run", cfg, transports=nodes, http=EngineServer())
    return cfg, ctx, nodes, WORKLOADS["r3-cross-instance"]().run(ctx)


def test_a_scripted_run_sends_exactly_the_planned_commands_on_each_node_and_passes(tmp_path):
    cfg, ctx, nodes, result = run_r3(tmp_path)
    assert result.error is None and result.invalid_reason is None, (result.error, result.invalid_reason)
    assert evaluate(ctx.gate, result, "ratio").outcome is Outcome.PASS and result.metrics["hit_rate"] == 1.0
    ev = result.evidence
    plan = gate_plan(cfg, ctx.gate)
    for name, node in nodes.items():
        # the run's own values (its tag, the free port found for its engine) are the plan's placeholders
        sent = normalized(node.commands, {ev.run_tag: "<run>", str(ev.layout[name]["port"]): "<port>"})
        assert sent == [s.argv for s in plan if s.argv and s.node == name], name
    # the client the plan names is the one put into the run directory, and the engines ran from there too
    client = next(s.argv[1] for s in plan if s.argv[1:2] and s.argv[1].endswith("/r3_client.py") and s.node == "n1")
    assert any(e.kind == "put" and e.path == client.replace("<run>", ev.run_tag) for e in nodes["n1"].events)
    assert all(sum(e.kind == "kill" for e in n.events) == 1 for n in nodes.values())  # both engines stopped
    assert (ctx.gate_dir / "metrics-reader-after.prom").read_text() == (FIX / "metrics-reader-after.prom").read_text()
    # the writer's stores priced on the writer's pool device (the captured reading twice: nothing written), over
    # the pool's growth and the writer client's time
    e = ev.endurance
    assert ev.pool_device == "/dev/loop0" and e["device_write_bytes"] == 0 and e["write_bytes_per_mtok"] == 0
    assert e["stored_kv_bytes"] == 2 * 9437352 and e["served_tokens"] == 3072
    assert ev.writer_window_s is not None and e["window_s"] == ev.writer_window_s


def test_an_engine_whose_log_says_it_fell_back_makes_the_run_invalid(tmp_path):
    _, _, _, result = run_r3(tmp_path, engine_log=f"ready\n{DEGRADED}\n")
    assert result.invalid_reason.startswith("the engine fell back in the writer engine's phase")
    assert result.metrics["hit_rate"] == 1.0  # measured, and still not a PASS


def test_a_reader_that_sees_none_of_the_writers_files_is_recorded(tmp_path):
    _, _, _, result = run_r3(tmp_path, reader_sees=0)
    assert result.evidence.pool_seen_from_reader_before.files == 0
    assert result.evidence.pool_after_writer.files == 2


def _r3_rederived(tmp_path, edit=None, **kw):
    """The scripted run, then `kvgate report`'s r3 re-deriver on its raw files after ``edit(gate_dir)``."""
    cfg, ctx, _, result = run_r3(tmp_path, **kw)
    if edit:
        edit(ctx.gate_dir)
    signed = json.loads(json.dumps(result.as_dict(), default=str))
    return result, WORKLOADS["r3-cross-instance"].rederive(ctx.gate_dir, signed, cfg.params[ctx.gate.id],
                                                   {"bundle_dir": tmp_path / "run"})


def test_r3_re_derives_the_same_figures_from_the_clients_records_counters_and_logs(tmp_path):
    result, again = _r3_rederived(tmp_path)
    assert again.metrics == result.metrics and again.invalid_reason is None and again.error is None


def test_r3_engine_log_rescanned_a_fall_back_line_is_invalid(tmp_path):
    def edit(gate_dir):
        log = gate_dir / "engine-reader.log"
        log.write_text(log.read_text() + DEGRADED + "\n")
    _, again = _r3_rederived(tmp_path, edit)
    assert again.invalid_reason.startswith("the engine fell back in the reader engine's phase")


def test_r3_the_readers_counters_are_re_read_from_its_raw_prometheus_text(tmp_path):
    """A reader whose counters say it hit nothing: the re-derived hit rate follows the raw text, whatever the
    evidence records."""
    def edit(gate_dir):
        (gate_dir / "metrics-reader-after.prom").write_text((gate_dir / "metrics-reader-before.prom").read_text())
    _, again = _r3_rederived(tmp_path, edit)
    assert again.metrics.get("hit_rate") is None and again.error is not None


def test_r3_empty_requests_file_is_an_error(tmp_path):
    from harness.errors import HarnessError
    with pytest.raises(HarnessError, match="requests-reader.json: the reader's requests is empty"):
        _r3_rederived(tmp_path, lambda d: (d / "requests-reader.json").write_text(""))
