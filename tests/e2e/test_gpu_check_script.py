"""scripts/gpu-check.sh as an operator runs it, on this machine (no GPU, no NVIDIA driver, a CPU torch): the dry
run names every step and files that kvgate accepts; the real run refuses with every reason and leaves each
step's files; the wheel bundle is built offline from this machine's local package index and installs kvgate on a
node with no index."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kvgate_cli import kvgate

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu-check.sh"
ENGINE_PY = sys.executable  # kvgate's venv: torch 2.13.0+cpu and LMCache 0.5.6 (scripts/setup.sh --test)
STEP_FILES = {"argv", "stdout", "stderr", "rc", "status"}
LOCAL_INDEX = Path("/opt/pypi/simple")
no_gpu_here = pytest.mark.skipif(shutil.which("nvidia-smi") is not None,
                                 reason="a GPU node: the refusal is for a node without one")


def script(*args, env=None, timeout=600):
    e = {k: v for k, v in os.environ.items() if k not in ("CUDA_DEVICE_ORDER",)}
    e.update(env or {})
    return subprocess.run(["bash", str(SCRIPT), *map(str, args)], cwd=ROOT, env=e, capture_output=True, text=True,
                          timeout=timeout)


def test_dry_run_prints_every_step_and_files_kvgate_accepts(tmp_path):
    run_dir = tmp_path / "run"
    r = script("--dry-run", "--run-dir", run_dir, "--python", ENGINE_PY, "--pool", tmp_path / "pool")
    assert r.returncode == 0, r.stdout + r.stderr
    steps = [line.split()[1] for line in r.stdout.splitlines() if line.startswith("  step ")]
    assert steps == ["host", "nvidia-smi-q", "pci-numa", "kvgate-venv", "kvgate-install", "lmcache-import",
                     "lmcache-install", "gpu-probe", "pairing", "pool", "inventory", "validate", "h2d", "run",
                     "verify", "summary"]
    run_line = next(line for line in r.stdout.splitlines() if line.startswith("  step run "))
    assert "run -i inventory/gpu-node.example.yaml -g gates/gpu-node.yaml" in run_line
    assert "(<= 330s)" in run_line  # the 480 s budget less what the steps before and after may take
    assert "gate file: gates/gpu-node.yaml" in r.stdout
    assert "OK: inventory/gpu-node.example.yaml: 1 node(s); gates/gpu-node.yaml: suite gpu-node v1, 3 gate(s)" \
        in r.stdout
    assert not run_dir.exists() and not (tmp_path / "pool").exists()  # nothing run, nothing made
    # the files it names, as kvgate itself reads them: valid, and a plan of every command sent
    for cmd in ("validate", "plan"):
        v = kvgate(cmd, "-i", "inventory/gpu-node.example.yaml", "-g", "gates/gpu-node.yaml")
        assert v.returncode == 0, v.stderr
    # kv-read retrieves into each GPU's memory; G2 serves through LMCache's connector
    assert '"destination": "gpu"' in v.stdout and "through LMCache into gpu memory" in v.stdout
    assert '"gpu": 1' in v.stdout and '"kv_connector":"LMCacheConnectorV1"' in v.stdout


def test_dry_run_with_wheels_installs_from_them_and_no_index(tmp_path):
    r = script("--dry-run", "--wheels", tmp_path / "w", "--python", ENGINE_PY)
    lines = {line.split()[1]: line for line in r.stdout.splitlines() if line.startswith("  step ")}
    assert f"--no-index --find-links {tmp_path}/w/kvgate kvgate" in lines["kvgate-install"]
    assert f"--no-index --find-links {tmp_path}/w/engine lmcache==0.5.6" in lines["lmcache-install"]


@pytest.mark.parametrize("args, words", [
    (["--budget-s", "8m"], "--budget-s expects whole seconds"),
    (["--pool"], "--pool needs a value"),
    (["--gpus", "2"], "unknown option --gpus"),
])
def test_bad_usage_is_exit_2_in_one_line(args, words):
    r = script(*args)
    assert r.returncode == 2 and words in r.stderr and r.stderr.count("\n") == 1


@no_gpu_here
def test_refused_on_this_node_with_every_reason_and_every_step_on_disk(tmp_path):
    run_dir = tmp_path / "run"
    r = script("--run-dir", run_dir, "--python", ENGINE_PY, "--pool", tmp_path / "pool")
    assert r.returncode == 3, r.stdout + r.stderr
    err = r.stderr
    assert "refused: this node cannot run kvgate's GPU gates:" in err
    assert "no NVIDIA GPU: nvidia-smi -q: nvidia-smi not found (rc 127)" in err
    assert "torch 2.13.0+cpu" in err and "is a CPU build (torch.version.cuda is None)" in err
    assert ("LMCache 0.5.6's CUDA ops (lmcache.cuda_ops) do not load: ImportError: libc10_cuda.so: cannot open "
            "shared object file") in err
    assert "a CUDA 13.x build of torch (LMCache 0.5.6's lmcache.cuda_ops link libcudart.so.13)" in err
    steps = run_dir / "steps"
    assert sorted(p.name for p in steps.iterdir()) == ["gpu-probe", "host", "lmcache-import", "nvidia-smi-q",
                                                       "pairing", "pci-numa"]
    for d in steps.iterdir():
        assert {p.name for p in d.iterdir()} == STEP_FILES, d
    assert (steps / "nvidia-smi-q" / "rc").read_text().strip() == "127"
    assert (steps / "nvidia-smi-q" / "argv").read_text().strip() == "nvidia-smi -q"
    assert (steps / "pairing" / "rc").read_text().strip() == "3"
    pairing = json.loads((run_dir / "pairing.json").read_text())
    assert pairing["ok"] is False and len(pairing["problems"]) == 3
    log = (run_dir / "steps.log").read_text()
    assert log.index("nvidia-smi-q") < log.index("gpu-probe") < log.index("pairing")
    # refused before anything is made: no pool, no inventory, no run
    assert not (tmp_path / "pool").exists() and not (run_dir / "inventory.yaml").exists()


@pytest.mark.slow
@no_gpu_here
@pytest.mark.skipif(not LOCAL_INDEX.is_dir(), reason="no local package index (/opt/pypi/simple) to build offline from")
def test_wheel_bundle_built_offline_installs_kvgate_on_a_node_without_an_index(tmp_path):
    # offline: pip reads no config, and its only index is a directory on this machine
    offline = {"PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": LOCAL_INDEX.as_uri(), "PIP_NO_CACHE_DIR": "1",
               "PIP_EXTRA_INDEX_URL": "", "PIP_FIND_LINKS": ""}
    wheels = tmp_path / "wheels"
    checkout_before = sorted(p.name for p in ROOT.iterdir())
    r = script("--build-wheels", wheels, "--python", ENGINE_PY, env=offline, timeout=1200)
    # LMCache is not in this machine's local index: said so, exit 1, the kvgate part complete
    assert r.returncode == 1, r.stdout + r.stderr
    assert ("LMCache is NOT in the bundle: pip download lmcache==0.5.6 failed: ERROR: No matching distribution "
            "found for lmcache==0.5.6") in r.stderr
    kv = sorted(p.name for p in (wheels / "kvgate").iterdir())
    assert any(n.startswith("kvgate-") and n.endswith("-py3-none-any.whl") for n in kv)
    for dep in ("pydantic-", "pyyaml-", "paramiko-", "cryptography-", "httpx-", "numpy-", "pandas-", "matplotlib-",
                "jinja2-"):
        assert any(n.lower().startswith(dep) for n in kv), dep
    manifest = (wheels / "MANIFEST.txt").read_text().splitlines()
    rows = [line.split() for line in manifest if not line.startswith("#")]
    assert sorted(Path(f).name for _, _, f in rows) == kv
    for sha, size, f in rows:
        assert len(sha) == 64 and int(size) == (wheels / f).stat().st_size
    total = sum(int(size) for _, size, _ in rows)
    assert 5e6 < total < 150e6, total  # what travels with the checkout for kvgate: tens of MB, not GBs
    assert sorted(p.name for p in ROOT.iterdir()) == checkout_before  # built from a copy: no build/, no egg-info
    # the node: no venv yet, no index; kvgate's venv made and filled from the bundle, then the pairing refuses
    venv = tmp_path / "kvgate-venv"
    n = script("--run-dir", tmp_path / "run", "--python", ENGINE_PY, "--wheels", wheels,
               env={**offline, "PIP_INDEX_URL": "http://127.0.0.1:9/simple", "KVGATE_VENV": str(venv)},
               timeout=1200)
    assert n.returncode == 3, n.stdout + n.stderr
    steps = tmp_path / "run" / "steps"
    assert (steps / "kvgate-venv" / "rc").read_text().strip() == "0"
    assert (steps / "kvgate-install" / "rc").read_text().strip() == "0", (steps / "kvgate-install" / "stderr").read_text()
    assert "--no-index" in (steps / "kvgate-install" / "argv").read_text()
    assert "refused: this node cannot run kvgate's GPU gates:" in n.stderr  # kvgate ran from that venv
    v = subprocess.run([str(venv / "bin" / "kvgate"), "--version"], capture_output=True, text=True, cwd=tmp_path)
    assert v.returncode == 0 and v.stdout.startswith("kvgate ")


def shim_node(tmp_path: Path) -> tuple[Path, Path]:
    """A stand-in for what cannot run here, said so: ``nvidia-smi`` printing the captured H200 report (its driver
    line raised to 580.65.06 / CUDA 13.0, so that it pairs with a CUDA 13 torch), and an engine interpreter that
    answers gpu_probe.py with the handwritten CUDA 13 probe (one H200) and H2D document and runs everything else
    (LMCache, kv_reader.py, vLLM's pre-flight) with this machine's real CPU torch. PATH gets the shim first."""
    fix = ROOT / "tests" / "fixtures" / "gpu"
    bin_dir = tmp_path / "shim"
    bin_dir.mkdir()
    smi = (fix / "nvidia-smi-q-h200-550.90.12.txt").read_text()
    smi = smi.replace("Driver Version                            : 550.90.12",
                      "Driver Version                            : 580.65.06")
    smi = smi.replace("CUDA Version                              : 12.4", "CUDA Version                              : 13.0")
    (bin_dir / "nvidia-smi.txt").write_text(smi)
    doc = json.loads((fix / "torch-probe-8xh100-cu130-handwritten.out").read_text().split(" ", 1)[1])
    doc["devices"] = [{"index": 0, "name": "NVIDIA H200", "capability": "9.0", "total_memory_bytes": 150754820096}]
    (bin_dir / "probe.out").write_text("kvgate-gpu-probe " + json.dumps(doc) + "\n")
    shutil.copy(fix / "h2d-8xh100-handwritten.out", bin_dir / "h2d.out")
    (bin_dir / "nvidia-smi").write_text(f'#!/bin/sh\n[ "$1" = -q ] && exec cat {bin_dir}/nvidia-smi.txt\nexit 6\n')
    (bin_dir / "engine-python").write_text(
        "#!/bin/sh\n"
        f'case "$1" in *gpu_probe.py) if [ "$2" = h2d ]; then exec cat {bin_dir}/h2d.out; fi; '
        f"exec cat {bin_dir}/probe.out;; esac\n"
        f'exec {ENGINE_PY} "$@"\n')
    for f in ("nvidia-smi", "engine-python"):
        (bin_dir / f).chmod(0o755)
    return bin_dir, bin_dir / "engine-python"


@pytest.mark.slow
@no_gpu_here
@pytest.mark.skipif(shutil.which("fio") is None, reason="needs fio")
def test_a_node_that_pairs_runs_every_step_to_a_verified_bundle_and_its_figures(tmp_path):
    """Past the pairing on this machine (the shim above stands in for the GPU): the pool, the inventory, the
    suite (same gate ids as gates/gpu-node.yaml, small), verify and the figures. fio is real; kv-read's reader
    refuses to read into cuda:0 on the CPU torch and vLLM's pre-flight finds no device, each an ERROR with its
    words, which the figures report as not measured."""
    bin_dir, engine = shim_node(tmp_path)
    suite = yaml.safe_load((ROOT / "gates" / "gpu-node.yaml").read_text())
    small = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
             "hidden_size": 256, "torch_dtype": "bfloat16"}
    g1, kv, g2 = suite["gates"]
    g1["params"].update(runtime_s=1, ramp_s=0)
    kv["params"].update(model="small", model_config_inline=small, kv_size="8 MiB", chunks_per_retrieve=2,
                        layout_timeout_s=300, read_timeout_s=300)
    g2["params"].update(prompt_tokens=[258])
    (tmp_path / "gates.yaml").write_text(yaml.safe_dump(suite, sort_keys=False))
    pool = Path("/var/tmp") / f"kvgate-gpucheck-test-{os.getpid()}"
    run_dir = tmp_path / "run"
    try:
        r = script("--run-dir", run_dir, "--python", engine, "--pool", pool, "--gates", tmp_path / "gates.yaml",
                   "--target-size", "64 MiB", "--budget-s", "420",
                   env={"PATH": f"{bin_dir}:{os.environ['PATH']}", "KVGATE_HOME": str(tmp_path / "home")},
                   timeout=900)
    finally:
        shutil.rmtree(pool, ignore_errors=True)
    out = r.stdout + r.stderr
    assert r.returncode == 3, out[-4000:]  # kvgate run's exit for a gate ERROR
    assert "pairing OK: driver 580.65.06 (CUDA 13.0), 1 GPU(s) (NVIDIA H200), torch 2.9.0+cu130" in r.stdout
    steps = sorted(p.name for p in (run_dir / "steps").iterdir())
    assert steps == sorted(["host", "nvidia-smi-q", "pci-numa", "lmcache-import", "gpu-probe", "pairing", "pool",
                            "inventory", "validate", "h2d", "run", "verify", "summary"])
    for d in (run_dir / "steps").iterdir():
        assert {p.name for p in d.iterdir()} == STEP_FILES, d
    inv = yaml.safe_load((run_dir / "inventory.yaml").read_text())
    assert inv["nodes"][0]["gpus"] == [{"index": 0, "model": "NVIDIA H200"}]  # no NUMA node for a bus not here
    assert inv["nodes"][0]["work_dir"] == str(pool) and inv["nodes"][0]["engine_python"] == str(engine)
    assert (run_dir / "steps" / "verify" / "rc").read_text().strip() == "0"
    assert (run_dir / "steps" / "verify" / "stdout").read_text().startswith("OK KVG-")
    figures = {f["name"].split(" ")[0]: f for f in json.loads((run_dir / "summary.json").read_text())["figures"]}
    assert figures["per_gpu_read_gb_s"]["value"] > 0  # fio, for real
    assert figures["connector_read_gb_s"]["value"] is None
    assert figures["connector_read_gb_s"]["source"].startswith("G1C-gpu ERROR")
    assert figures["readback_speedup_p50"]["value"] is None and figures["readback_speedup_p50"]["source"].startswith(
        "G2 ERROR")
    assert figures["h2d_of_pcie_ceiling"]["value"] == pytest.approx((1 << 30) / 0.0208 / 1e9 / 63.0154, rel=1e-3)
    assert figures["fio_read_gb_s"]["value"] is None  # the gate ended in ERROR: its fio figure is none
    notes = json.loads((run_dir / "summary.json").read_text())["gate_notes"]
    assert notes[0].startswith("G1C-gpu ERROR: ") and "sees no CUDA device" in notes[0]
    # no GPU here: vLLM's pre-flight finds no device (seen in the helper's worktree), or finds one in the CUDA
    # build's probe and the engine core dies at start (seen in a clean clone's CI run): an ERROR either way
    assert notes[1].startswith("G2 ERROR: ") and ("found no device" in notes[1] or "did not start" in notes[1])
    assert "not measured" in r.stdout and "gpu-check: " in r.stdout


def _run_dir(tmp_path: Path, smi_text: str, probe_doc: dict) -> Path:
    run_dir = tmp_path / "run"
    for step, text in (("nvidia-smi-q", smi_text), ("gpu-probe", "kvgate-gpu-probe " + json.dumps(probe_doc) + "\n")):
        (run_dir / "steps" / step).mkdir(parents=True)
        (run_dir / "steps" / step / "stdout").write_text(text)
        (run_dir / "steps" / step / "rc").write_text("0\n")
    return run_dir


def test_check_on_a_node_whose_engine_lacks_vllm_pairs_and_says_g2_will_error(tmp_path):
    fix = ROOT / "tests" / "fixtures" / "gpu"
    smi = (fix / "nvidia-smi-q-8xh100-565.57.01.txt").read_text().replace(
        "CUDA Version                              : 12.7", "CUDA Version                              : 13.0")
    doc = json.loads((fix / "torch-probe-8xh100-cu130-handwritten.out").read_text().split(" ", 1)[1])
    doc.update(vllm_version=None, vllm_error="PackageNotFoundError: No package metadata was found for vllm")
    r = kvgate("gpu-node", "check", _run_dir(tmp_path, smi, doc))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("pairing OK: driver 565.57.01 (CUDA 13.0), 8 GPU(s) (NVIDIA H100 80GB HBM3)")
    assert "vLLM does not import in /opt/engine/bin/python" in r.stderr and "G2 will be ERROR" in r.stderr
    assert json.loads((tmp_path / "run" / "pairing.json").read_text())["ok"] is True


def test_check_refuses_a_cuda_12_torch_with_exit_3_and_the_reasons(tmp_path):
    fix = ROOT / "tests" / "fixtures" / "gpu"
    doc = json.loads((fix / "torch-probe-h200-cu128-handwritten.out").read_text().split(" ", 1)[1])
    r = kvgate("gpu-node", "check", _run_dir(tmp_path, (fix / "nvidia-smi-q-h200-550.90.12.txt").read_text(), doc))
    assert r.returncode == 3 and r.stdout == ""
    assert r.stderr.startswith("refused: this node cannot run kvgate's GPU gates:\n  - torch 2.8.0+cu128 is built for")
    assert "the node needs:\n  - a CUDA 13.x build of torch, or LMCache built for CUDA 12" in r.stderr
