"""Every control-host file a gate names (a trace, a model config) is checked by ``kvgate validate`` and by ``kvgate
run`` before anything starts: missing, not a regular file or not parsing is exit 2 with one line naming the gate's
FILE:LINE and the file's path once."""

from pathlib import Path

import pytest
import yaml

from kvgate_cli import kvgate

pytestmark = pytest.mark.e2e


def gate(tmp_path: Path, **params) -> tuple[Path, Path]:
    suite = {"suite": {"name": "s", "version": "1"}, "gates": [{
        "id": "G2-trace", "title": "t", "workload": "g2-load",
        "params": {"engine": "cpu-reference", "ttft_slo_s": 5.0, "trials": 6, **params},
        "metric": "ttft_p95_s@trace", "pass": "<= 5 s"}]}
    g = tmp_path / "g.yaml"
    g.write_text(yaml.safe_dump(suite, sort_keys=False))
    inv = tmp_path / "i.yaml"
    inv.write_text(yaml.safe_dump({"nodes": [{"name": "n1", "transport": "local", "work_dir": str(tmp_path / "w")}]}))
    return inv, g


def line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


@pytest.mark.parametrize("make, why", [
    (lambda d: d / "gone.jsonl", "no such file"),
    (lambda d: (d / "adir").mkdir() or d / "adir", "not a regular file"),
])
def test_a_missing_trace_is_exit_2_with_the_gate_line_and_the_path_once_from_validate_and_run(tmp_path, make, why):
    missing = make(tmp_path)
    inv, g = gate(tmp_path, load={"path": str(missing)})
    for cmd in (("validate",), ("run", "--out", tmp_path / "out")):
        r = kvgate(*cmd, "-i", inv, "-g", g, home=tmp_path / "home")
        lines = r.stderr.splitlines()
        assert r.returncode == 2 and lines[-1] == "1 configuration error(s)", r.stdout + r.stderr
        problem = [l for l in lines if str(g) in l]
        assert problem == [f"{g}:{line_of(g, 'path:')}: gates[0].params.load.path: trace {missing}: {why}"]
        assert problem[0].count(str(missing)) == 1 and "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "w").exists()  # nothing started


def test_a_trace_that_does_not_parse_and_a_model_config_that_is_not_json_are_named_too(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [1]}\n')
    config = tmp_path / "config.json"
    config.write_text("{not json")
    inv, g = gate(tmp_path, load={"path": str(trace)}, model_config=str(config))
    r = kvgate("validate", "-i", inv, "-g", g, home=tmp_path / "home")
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"{g}:{line_of(g, 'path:')}: gates[0].params.load.path: trace: {trace}:1: hash_ids: 1 hash ids for " \
           "600 input tokens" in r.stderr
    model = [l for l in r.stderr.splitlines() if "model_config" in l]
    assert len(model) == 1 and model[0].startswith(f"{g}:{line_of(g, 'model_config:')}: gates[0].params.model_config: "
                                                   f"model config: {config}:1: invalid JSON")


def test_a_gate_naming_a_shipped_trace_by_its_name_validates_from_any_directory(tmp_path):
    inv, g = gate(tmp_path, load={"path": "traces/mooncake-conversation-3000.jsonl", "max_requests": 8})
    r = kvgate("validate", "-i", inv, "-g", g, home=tmp_path / "home")
    assert r.returncode == 0 and r.stdout.startswith("OK:"), r.stdout + r.stderr
