"""G2 attached to an engine kvgate did not start: vLLM's CPU build (`vllm serve`, from the engine environment
scripts/setup.sh makes), started by the tests under their own small supervisor script — the tests' stand-in for
systemd or Kubernetes — with vLLM's ExampleConnector storing KV on an ext4 filesystem on a loop device of its
own (so the pool's device reads are the pool's alone), and GPU prefix caching ON, as deployments run it: the
session's ``vllm_attached`` engine (tests/integration/vllm_engines.py), which other tests that need only a running
vLLM use too (a vLLM start is the dearest thing here, so it is started once and restarted once, by the last case).

kvgate is given only the URL, the restart command and the pool's path. Four cases, in this order on one
engine: an unreachable URL (ERROR), a restart command that fails (ERROR with its output), a "restart" that restarts
nothing so the engine's own memory serves the hits (INVALID: the device did not read the KV), and a real
restart (PASS, hits from the tier, the device read the KV). Every run's prompts are new to the engine (kvgate's
per-run seed for an attached engine) and its pool figures are what the run added, so what other tests sent it
before is none of these runs' business."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from harness.gates.verdict import Outcome
from harness.transport.local import free_port
from suite_run import run_one_gate
from vllm_engines import PROMPT_TOKENS, SERVED_MODEL_NAME, model_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def engine(vllm_attached):
    """The session's attached vllm serve (tests/integration/conftest.py), answering (a test before may have
    restarted it): what an operator would tell kvgate."""
    return vllm_attached.ready()


def _profile(tmp_path: Path, **changes) -> str:
    """The shipped vllm-attach profile with the connector's pool file pattern (ExampleConnector's)."""
    prof = yaml.safe_load((ROOT / "workloads" / "engines" / "vllm-attach.yaml").read_text())
    prof.update(pool_files="*.safetensors", kv_block_tokens=128, **changes)
    path = tmp_path / f"{prof['name']}.yaml"
    path.write_text(yaml.safe_dump(prof, sort_keys=False))
    return str(path)


def _run(tmp_path: Path, engine: dict | None, url: str, restart: str, profile: str, **extra):
    params = {"engine": profile, "served_model_name": SERVED_MODEL_NAME, "model_config_inline": model_config(),
              "tokenizer": str(engine.tokenizer) if engine else None, "prompt_tokens": [PROMPT_TOKENS],
              "prompts_per_length": 2, "max_tokens": 2, "seed": 13, "populate_timeout_s": 300,
              "pool_path": str(engine.pool) if engine else str(tmp_path),
              "attach": {"url": url, "connect_timeout_s": 5, "ready_timeout_s": 1200,
                         "restart": [{"node": "cpu1", "run": restart, "timeout_s": 300}], **extra}}
    if params["tokenizer"] is None:
        params.pop("tokenizer")
    return run_one_gate(tmp_path, "g2-attach-test", {
        "id": "G2", "title": "attached", "workload": "g2-ttft", "params": params,
        "metric": "readback_speedup_p50", "pass": ">= 1.5 x", "stop_loss": "< 1 x"})


def test_an_unreachable_engine_url_is_an_error(tmp_path):
    port = free_port("127.0.0.1")  # nothing listens there
    v, result, _ = _run(tmp_path, None, f"http://127.0.0.1:{port}", "true", _profile(tmp_path))
    assert v.outcome is Outcome.ERROR, (v.reason, result)
    assert f"127.0.0.1:{port}/health did not answer 200" in v.reason and "ConnectError" in v.reason


def test_a_failing_restart_command_is_an_error_with_its_output(tmp_path, engine):
    pid = engine.pid()
    cmd = "echo 'Error from server (NotFound): deployments.apps \"vllm\" not found' >&2; exit 1"
    v, result, out = _run(tmp_path, engine, engine.url, cmd, _profile(tmp_path))
    assert v.outcome is Outcome.ERROR, (v.reason, result)
    assert "restart command 1 on cpu1" in v.reason and 'deployments.apps "vllm" not found' in v.reason
    ev = result["evidence"]
    assert ev["cold_procedure"][0]["rc"] == 1 and ev["pool_after_populate"]["bytes_added"] > 0
    step = next((out.run_dir / "steps").glob("*g2-attach-restart-0*"))  # the command as a step on disk
    assert "exit 1" in (step / "argv.json").read_text() and "not found" in (step / "stderr").read_text()
    assert engine.pid() == pid  # kvgate never touched the engine it did not start


def test_a_restart_that_keeps_the_engines_memory_is_invalid(tmp_path, engine):
    """`true` restarts nothing: vLLM's own prefix cache serves the read-back. A profile that counts those
    hits (vLLM's local prefix-cache counters) sees a perfect hit rate; the pool's device read ~nothing."""
    prof = _profile(tmp_path, name="vllm-any-prefix-hits",
                    hit_metrics={"hit_tokens": ["vllm:prefix_cache_hits_total"],
                                 "query_tokens": ["vllm:prefix_cache_queries_total"]})
    pid = engine.pid()
    v, result, _ = _run(tmp_path, engine, engine.url, "true", prof)
    assert v.outcome is Outcome.INVALID, (v.reason, result)
    m, ev = result["metrics"], result["evidence"]
    assert m["hit_rate"] >= 0.95 and m["readback_read_fraction"] < 0.5, m
    assert "not the tier" in v.reason and ev["engine_restarted"] in (False, None)
    assert ev["page_cache_dropped"] is True and engine.pid() == pid


def test_a_real_restart_by_command_reads_back_from_the_tier_and_passes(tmp_path, engine):
    pid = engine.pid()
    v, result, out = _run(tmp_path, engine, engine.url, f"bash {engine.ctl} restart", _profile(tmp_path),
                          log={"node": "cpu1", "run": f"cat {engine.log}"})
    assert v.outcome is Outcome.PASS, (v.reason, result)
    m, ev = result["metrics"], result["evidence"]
    assert m["hit_rate"] >= 0.95 and m["readback_read_fraction"] >= 0.5, m
    assert ev["attached"] and ev["recompute_hit_tokens"] == 0 and ev["fallback_lines"] == []
    assert ev["pool_after_populate"]["bytes_added"] >= ev["expected_kv_bytes"]
    assert ev["cold_procedure"][0]["rc"] == 0 and engine.pid() != pid
    assert any(out.run_dir.glob("steps/*g2-attach-log*"))
