"""R3 evaluation from both engines' counters (captured from a real cpu-reference + LMCache 0.5.6 run on
the rig), validity rules, and the suite's config checks against an inventory."""

from pathlib import Path

import pytest
import yaml

import harness.workloads.r3_cross_instance  # noqa: F401  (registers r3-cross-instance)
from harness.config import load_config
from harness.workloads import WORKLOADS
from harness.engines import load_profile
from harness.parsers.prometheus import metric_total, parse_prometheus
from harness.errors import ConfigError
from harness.workloads.r3_cross_instance import evaluate_r3

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "r3"
REPO = Path(__file__).resolve().parents[2]
HM = load_profile("cpu-reference").hit_metrics


def delta(role, names):
    a = metric_total(parse_prometheus((FIX / f"metrics-{role}-before.prom").read_text()), names)
    b = metric_total(parse_prometheus((FIX / f"metrics-{role}-after.prom").read_text()), names)
    return b - a


def test_captured_run_reader_hit_every_token_the_writer_stored():
    wh, wq = delta("writer", HM.hit_tokens), delta("writer", HM.query_tokens)
    rh, rq = delta("reader", HM.hit_tokens), delta("reader", HM.query_tokens)
    assert (wh, wq, rh, rq) == (0, 3072, 3072, 3072)
    res = evaluate_r3(wh, wq, rh, rq, [], 18874704, 18874368)
    assert res.metrics == {"hit_rate": 1.0}
    assert res.error is None and res.invalid_reason is None
    # The writer stored what the reader then read: same bytes through LMCache's counters.
    assert delta("reader", HM.read_bytes) == 3072 * 6144


def test_partial_hits_give_the_ratio_and_a_writer_hit_is_invalid():
    assert evaluate_r3(0, 3072, 2816, 3072, [], 1, 1).metrics["hit_rate"] == pytest.approx(2816 / 3072)
    res = evaluate_r3(512, 3072, 3072, 3072, [], 1, 1)
    assert "not new" in res.invalid_reason


def test_no_pool_bytes_is_a_miss_not_an_excuse_and_failed_requests_are_error():
    res = evaluate_r3(0, 3072, 0, 3072, [], 0, 18874368)
    assert res.metrics["hit_rate"] == 0.0 and res.invalid_reason is None and res.error is None
    assert evaluate_r3(0, 3072, 3072, 3072, ["reader s1: timeout"], 1, 1).error.startswith("1 request(s) failed")
    assert "no hit/query counters" in evaluate_r3(0, 3072, None, None, [], 1, 1).error


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
    from harness.workloads import WORKLOADS, GateContext

    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump({"nodes": [
        {"name": n, "transport": "local", "targets": [{"name": "kvpool", "kind": "directory", "path": "/mnt/pool"}]}
        for n in ("n1", "n2")]}))
    cfg = load_config(inv, REPO / "gates" / "r3-cpu-reference.yaml", WORKLOADS)
    gate = cfg.suite.gates[0]
    ctx = GateContext(gate=gate, params=cfg.params[gate.id], nodes={n.name: n for n in cfg.gate_nodes(gate)},
                      transports={}, steps=None, gate_dir=tmp_path)
    steps = WORKLOADS["r3-cross-instance"]().plan(ctx)
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
