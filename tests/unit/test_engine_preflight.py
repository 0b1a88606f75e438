"""Engine pre-flight: before a launch, the node's engine interpreter must be able to run the profile's engine.
Parsers are checked on output captured from real interpreters (tests/fixtures/preflight/: kvgate's own venv,
whose vLLM is a CUDA build, and the vLLM CPU engine environment, both made by scripts/setup.sh --test; the
machine's bare python3 without torch)."""

import json
from pathlib import Path

import pytest
import yaml

from harness.config import load_config
from harness.config.loading import load_inventory
from harness.engines import load_profile
from harness.engines.preflight import MARK, parse_preflight, preflight_argv, preflight_problem
from harness.transport.doubles import Reply, ScriptedTransport
from doubles import gate_context
from harness.workloads import WORKLOADS

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "preflight"


def _report(name):
    return parse_preflight(("INFO some import chatter\n" if name != "no-torch" else "") + (FIX / f"{name}.stdout").read_text())


def test_a_cuda_build_of_vllm_on_a_node_without_a_gpu_is_named():
    why = preflight_problem(_report("vllm-cuda-build-no-gpu"), load_profile("vllm-cpu-disk"))
    assert why is not None and "vLLM 0.33.0 found no device" in why and "CUDA build" in why


def test_the_vllm_cpu_engine_environment_passes_for_both_vllm_profiles():
    rep = _report("vllm-cpu-build")
    assert rep.vllm_device == "cpu" and rep.versions["vllm"] == "0.32.0+cpu"
    for prof in ("vllm-cpu-disk", "vllm-lmcache"):
        assert preflight_problem(rep, load_profile(prof)) is None


def test_missing_modules_are_each_named_and_a_capable_interpreter_passes():
    prof = load_profile("cpu-reference")
    why = preflight_problem(_report("no-torch"), prof)
    assert why == ("cannot import torch (ModuleNotFoundError: No module named 'torch'); "
                   "cannot import lmcache (ModuleNotFoundError: No module named 'lmcache')")
    assert preflight_problem(_report("cpu-reference"), prof) is None


def test_output_without_the_probe_line_is_an_error_not_a_pass():
    with pytest.raises(ValueError):
        parse_preflight("Traceback (most recent call last):\n  ...\nSyntaxError: invalid syntax\n")


def test_the_command_asks_for_the_profiles_modules_and_vllm_for_a_device_check():
    argv = preflight_argv("/opt/e/bin/python", load_profile("vllm-cpu-disk"))
    assert argv[:2] == ["/opt/e/bin/python", "-c"] and MARK in argv[2]
    spec = json.loads(argv[3])
    assert spec["modules"] == ["vllm"] and spec["vllm_device"] is True


def _g2_ctx(tmp_path, node):
    suite = yaml.safe_load((ROOT / "gates" / "g2-vllm-cpu.yaml").read_text())
    (tmp_path / "gates.yaml").write_text(yaml.safe_dump(suite))
    (tmp_path / "inv.yaml").write_text(yaml.safe_dump({"nodes": [
        {"name": "n1", "transport": "local", "work_dir": str(tmp_path / "work"), "engine_python": "/opt/wrong/python"}]}))
    cfg = load_config(tmp_path / "inv.yaml", tmp_path / "gates.yaml", WORKLOADS)
    return gate_context(tmp_path / "run", cfg, transports={"n1": node})


def test_g2_on_an_interpreter_that_cannot_run_vllm_ends_in_one_line_before_anything_is_launched(tmp_path):
    captured = (FIX / "vllm-cuda-build-no-gpu.stdout").read_text()

    def handler(call):
        if MARK in " ".join(call.argv):
            return Reply(stdout=captured)
        return Reply()

    node = ScriptedTransport(handler, name="n1")
    result = WORKLOADS["g2-ttft"]().run(_g2_ctx(tmp_path, node))
    assert result.error is not None and "\n" not in result.error
    assert result.error.startswith("engine pre-flight on node n1: /opt/wrong/python cannot run vllm-cpu-disk: vLLM")
    assert "engine_python for node n1" in result.error and ".venv-engines/vllm-cpu" in result.error
    assert result.evidence.versions["vllm"] == "0.33.0"  # what the node has, for the evidence
    # nothing but the pre-flight ran: no directories, no model build, no engine
    assert len(node.commands) == 1


def test_an_interpreter_that_does_not_start_is_named_with_its_error(tmp_path):
    node = ScriptedTransport(lambda call: Reply(rc=127, stderr="sh: 1: /opt/wrong/python: not found\n"), name="n1")
    result = WORKLOADS["g2-ttft"]().run(_g2_ctx(tmp_path, node))
    assert result.error == ("engine pre-flight on node n1: /opt/wrong/python could not run (rc 127: sh: 1: "
                            "/opt/wrong/python: not found); set engine_python for node n1 in the inventory (or the "
                            "gate's params.python) to the engine's own environment; on a CPU machine "
                            "`scripts/setup.sh --vllm` makes .venv-engines/vllm-cpu (inventory/localhost-vllm-cpu.yaml "
                            "points at it)")


def test_a_local_nodes_relative_engine_python_is_relative_to_the_inventory_file(tmp_path):
    d = tmp_path / "site" / "inv"
    d.mkdir(parents=True)
    (d / "i.yaml").write_text(yaml.safe_dump({"nodes": [
        {"name": "a", "transport": "local", "engine_python": "../envs/vllm/bin/python"},
        {"name": "b", "transport": "local", "engine_python": "python3"},
        {"name": "c", "transport": "ssh", "host": "h", "engine_python": "envs/bin/python"}]}))
    nodes = {n.name: n.engine_python for n in load_inventory(d / "i.yaml").nodes}
    assert nodes == {"a": str(tmp_path / "site" / "envs" / "vllm" / "bin" / "python"),  # not through links
                     "b": "python3",  # a bare name is looked up on PATH
                     "c": "envs/bin/python"}  # an SSH node's path is the node's own


def test_the_shipped_vllm_cpu_inventory_points_at_the_environment_setup_makes():
    inv = load_inventory(ROOT / "inventory" / "localhost-vllm-cpu.yaml")
    assert inv.nodes[0].engine_python == str(ROOT / ".venv-engines" / "vllm-cpu" / "bin" / "python")
