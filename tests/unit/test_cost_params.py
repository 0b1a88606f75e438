"""kvgate cost params: strict validation with file:line errors, units, sources, measured inputs."""

import shutil
from pathlib import Path

import pytest

from harness.cost import params as cp

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "workloads" / "cost-params.example.yaml"


def write_params(tmp_path: Path, text: str) -> Path:
    shutil.copytree(REPO / "workloads" / "models", tmp_path / "models")
    path = tmp_path / "params.yaml"
    path.write_text(text)
    return path


def example_with(tmp_path: Path, old: str, new: str) -> Path:
    """The example with ``old`` replaced on its first non-comment line."""
    lines = EXAMPLE.read_text().splitlines(keepends=True)
    for i, line in enumerate(lines):
        if old in line and not line.lstrip().startswith("#"):
            lines[i] = line.replace(old, new, 1)
            return write_params(tmp_path, "".join(lines))
    raise AssertionError(f"{old!r} not in the example")


def line_of(path: Path, needle: str) -> int:
    lines = path.read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if needle in line and not line.lstrip().startswith("#"))


def test_example_resolves_with_every_input_sourced():
    r = cp.resolve(EXAMPLE)
    assert r.arch.kv_bytes_per_token == 327_680
    assert r.inputs["per_gpu_read_gb_s"].value == pytest.approx(5.23)
    assert r.inputs["hit_rate"].value == pytest.approx(0.9)  # "90 %"
    assert r.inputs["capacity_overhead_ratio"].value == pytest.approx(0.1)  # "10 %"
    src = r.inputs["context_tokens"].source
    assert src == f"{EXAMPLE}:{line_of(EXAMPLE, 'context_tokens: 32768')}"
    assert r.measured == () and r.input_report_ids == []
    assert r.sensitivity_ranges["per_gpu_read_gb_s"] == (2.0, 10.0)


def test_defaults_are_cited_by_source(tmp_path):
    p = example_with(tmp_path, "gpu_usd_per_hour: 2.0", "# removed")
    r = cp.resolve(p)
    assert r.inputs["gpu_usd_per_hour"].kind == "default"
    assert "$2 per GPU-hour" in r.inputs["gpu_usd_per_hour"].source


@pytest.mark.parametrize(
    "old, new, field, needle",
    [
        ("per_gpu_read: 5.23 GB/s", "per_gpu_read: 5.23", "tier.per_gpu_read", "bare number"),
        ("per_gpu_read: 5.23 GB/s", "per_gpu_read: 5.23 s", "tier.per_gpu_read", "bandwidth"),
        ("per_gpu_read: 5.23 GB/s", "per_gpu_read: fast", "tier.per_gpu_read", "bandwidth"),
        ("readback_fixed: 0 s", "readback_fixed: 2 GB", "tier.readback_fixed", "time"),
        ("hit_rate: 90 %", "hit_rate: 120 %", "fleet.hit_rate", "1"),
        ("context_tokens: 32768", "context_tokens: -5", "workload.context_tokens", "0"),
        ("context_tokens: 32768", "context_tokens: 32768\n  contxt_tokens: 1", "workload.contxt_tokens", "unknown key"),
        ("timing: model", "timing: guess", "timing", "model"),
    ],
)
def test_bad_value_is_one_line_error_with_file_line_and_field(tmp_path, old, new, field, needle):
    p = example_with(tmp_path, old, new)
    with pytest.raises(cp.ConfigError) as err:
        cp.resolve(p)
    issues = err.value.issues
    assert len(issues) == 1, [str(i) for i in issues]
    issue = issues[0]
    assert issue.file == str(p)
    assert issue.line == line_of(p, new.split("\n")[-1].strip())
    assert field in issue.path
    assert needle in issue.message
    assert "\n" not in str(issue) and str(issue).startswith(f"{p}:{issue.line}:")


def test_all_errors_reported_at_once(tmp_path):
    text = EXAMPLE.read_text().replace("per_gpu_read: 5.23 GB/s", "per_gpu_read: 5.23 s").replace(
        "revisit_rate: 0.5", "revisit_rate: 2"
    )
    p = write_params(tmp_path, text)
    with pytest.raises(cp.ConfigError) as err:
        cp.resolve(p)
    assert {i.path for i in err.value.issues} == {"tier.per_gpu_read", "fleet.revisit_rate"}


def test_missing_required_section(tmp_path):
    text = EXAMPLE.read_text()
    start = text.index("fleet:")
    end = text.index("prices:")
    p = write_params(tmp_path, text[:start] + text[end:])
    with pytest.raises(cp.ConfigError) as err:
        cp.resolve(p)
    assert any(i.path == "fleet" for i in err.value.issues)


G1 = cp.MeasuredInput("per_gpu_read_gb_s", 6.1, "KVG-20250101-aaaaaaaa", "G1", "per_gpu_read_gb_s", "PASS")


def test_parameter_overriding_a_measured_input_is_an_error(tmp_path):
    p = write_params(tmp_path, EXAMPLE.read_text())
    with pytest.raises(cp.ConfigError) as err:
        cp.resolve(p, [G1])
    (issue,) = err.value.issues
    assert issue.line == line_of(p, "per_gpu_read: 5.23 GB/s")
    assert issue.path == "tier.per_gpu_read"
    assert "KVG-20250101-aaaaaaaa" in issue.message and "override" in issue.message


def test_measured_input_replaces_default_and_is_cited(tmp_path):
    p = example_with(tmp_path, "per_gpu_read: 5.23 GB/s", "# removed")
    r = cp.resolve(p, [G1])
    v = r.inputs["per_gpu_read_gb_s"]
    assert (v.value, v.kind) == (6.1, "measured")
    assert "KVG-20250101-aaaaaaaa" in v.source and "G1" in v.source
    assert r.input_report_ids == ["KVG-20250101-aaaaaaaa"]


def test_two_bundles_measuring_the_same_input_is_an_error(tmp_path):
    p = example_with(tmp_path, "per_gpu_read: 5.23 GB/s", "# removed")
    other = cp.MeasuredInput("per_gpu_read_gb_s", 4.0, "KVG-20250102-bbbbbbbb", "G1", "per_gpu_read_gb_s", "FAIL")
    with pytest.raises(cp.ConfigError, match="two bundles"):
        cp.resolve(p, [G1, other])


def test_timing_measured_needs_both_ttfts(tmp_path):
    p = example_with(tmp_path, "timing: model", "timing: measured")
    with pytest.raises(cp.ConfigError) as err:
        cp.resolve(p)
    (issue,) = err.value.issues
    assert issue.path == "timing" and "readback_ttft_s" in issue.message
    p2 = tmp_path / "p2.yaml"
    p2.write_text(
        p.read_text()
        .replace("# readback_ttft: 11.85 s", "readback_ttft: 11.85 s")
        .replace("# recompute_ttft: 149.3 s", "recompute_ttft: 149.3 s")
    )
    r = cp.resolve(p2)
    assert r.timing == "measured" and r.base["recompute_ttft_s"] == pytest.approx(149.3)


def test_sensitivity_on_unused_input_is_an_error(tmp_path):
    p = example_with(tmp_path, "    context_tokens: [8192, 131072]", "    readback_ttft_s: [5, 20]")
    with pytest.raises(cp.ConfigError, match="readback_ttft_s"):
        cp.resolve(p)


def test_sensitivity_range_low_above_high(tmp_path):
    p = example_with(tmp_path, "per_gpu_read_gb_s: [2.0, 10.0]", "per_gpu_read_gb_s: [10.0, 2.0]")
    with pytest.raises(cp.ConfigError) as err:
        cp.resolve(p)
    assert err.value.issues[0].line == line_of(p, "per_gpu_read_gb_s: [10.0, 2.0]")


def test_model_config_error_names_json_file_and_key_line(tmp_path):
    p = write_params(tmp_path, EXAMPLE.read_text())
    cfg = tmp_path / "models" / "llama-3-70b.json"
    cfg.write_text(cfg.read_text().replace('"num_key_value_heads": 8', '"num_key_value_heads": 7'))
    with pytest.raises(cp.ConfigError) as err:
        cp.resolve(p)
    (issue,) = err.value.issues
    assert issue.file == str(cfg) and issue.path == "num_key_value_heads"
    assert issue.line == line_of(cfg, "num_key_value_heads")


def test_missing_model_config_file(tmp_path):
    p = example_with(tmp_path, "config: models/llama-3-70b.json", "config: models/nope.json")
    with pytest.raises(cp.ConfigError, match="nope.json"):
        cp.resolve(p)


def test_a_signed_figure_that_is_not_a_finite_number_is_not_a_measurement():
    """A hostile signer's verdicts.json: 10**400 (float() overflows), inf and NaN (json allows them as Infinity
    and NaN) and a string; none becomes a cost input, none crashes the reader."""
    import json
    verdicts = json.loads('''{"verdicts": [
        {"gate_id": "G1", "metric": "per_gpu_read_gb_s", "actual": 1''' + "0" * 400 + ''', "outcome": "PASS"},
        {"gate_id": "G2", "metric": "per_gpu_read_gb_s", "actual": Infinity, "outcome": "PASS"},
        {"gate_id": "G3", "metric": "per_gpu_read_gb_s", "actual": NaN, "outcome": "PASS"},
        {"gate_id": "G4", "metric": "per_gpu_read_gb_s", "actual": "5.2", "outcome": "PASS"}]}''')
    assert cp.extract_measured(verdicts, "KVG-20250101-cccccccc") == []


def test_extract_measured_from_verdicts():
    verdicts = {
        "report_id": "KVG-20250101-cccccccc",
        "verdicts": [
            {"gate_id": "G1", "metric": "per_gpu_read_gb_s", "actual": 5.4, "outcome": "PASS", "evidence": {}},
            {
                "gate_id": "G2",
                "metric": "ttft_speedup",
                "actual": 12.6,
                "outcome": "FAIL",
                "metrics": {"ttft_speedup": 12.6, "readback_ttft_p50_s": 11.85},
                "evidence": {"metrics": {"recompute_ttft_p50_s": 149.3}},
            },
            {"gate_id": "G1b", "metric": "per_gpu_read_gb_s", "actual": 9.9, "outcome": "ERROR", "evidence": {}},
            {"gate_id": "G3", "metric": "aggregate_read_gb_s", "actual": 11.0, "outcome": "PASS", "evidence": {}},
        ],
    }
    got = {(m.name, m.value, m.gate_id, m.outcome) for m in cp.extract_measured(verdicts, "KVG-20250101-cccccccc")}
    assert got == {
        ("per_gpu_read_gb_s", 5.4, "G1", "PASS"),
        ("readback_ttft_s", 11.85, "G2", "FAIL"),
        ("recompute_ttft_s", 149.3, "G2", "FAIL"),
    }


def test_a_serving_gates_write_amplification_feeds_the_wear_input():
    verdicts = {"verdicts": [
        {"gate_id": "G2", "metric": "ttft_speedup", "actual": 3.0, "outcome": "PASS",
         "evidence": {"endurance": {"write_amplification": 1.37, "write_bytes_per_mtok": 4.1e10}}},
        {"gate_id": "G2x", "metric": "ttft_speedup", "actual": 3.0, "outcome": "INVALID",
         "evidence": {"endurance": {"write_amplification": 9.0}}},
    ]}
    got = [(m.name, m.value, m.gate_id, m.metric) for m in cp.extract_measured(verdicts, "KVG-20250101-cccccccc")]
    assert got == [("device_write_amplification", 1.37, "G2", "write_amplification")]
