"""The end of scripts/gpu-check.sh on a real bundle: ``kvgate verify`` and ``kvgate gpu-node summary`` read the
figures of every gate of gates/gpu-node.yaml from what ``kvgate run`` wrote. No GPU here, so the suite run is
that file's CPU stand-in: the same gate ids and workloads (fio-read, kv-read, g2-ttft), kv-read into CPU memory
and G2 on the CPU reference engine (real LMCache 0.5.6 on CPU), small; the node's nvidia-smi -q and H2D probe
are the captured H200 report and the handwritten H2D document (tests/fixtures/gpu/)."""

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from harness.rigs.gpunode import GATE_IDS

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
FIX = REPO / "tests" / "fixtures" / "gpu"
SMALL = {"hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 6, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 4096, "max_position_embeddings": 16384,
         "rms_norm_eps": 1.0e-5, "rope_theta": 500000.0, "torch_dtype": "float32"}


def kvgate(home: Path, *args) -> subprocess.CompletedProcess:
    env = {**os.environ, "KVGATE_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "harness", *map(str, args)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=1500)


def stand_in_suite(work: Path) -> tuple[dict, dict]:
    shipped = yaml.safe_load((REPO / "gates" / "gpu-node.yaml").read_text())
    kinds = {g["id"]: g["workload"] for g in shipped["gates"]}
    assert kinds == {GATE_IDS["fio"]: "fio-read", GATE_IDS["kv_read"]: "kv-read", GATE_IDS["g2"]: "g2-ttft"}
    inv = {"nodes": [{"name": "gpunode", "transport": "local", "work_dir": str(work), "read_streams": 2,
                      "targets": [{"name": "gpudisk", "kind": "file", "path": "kvgate-gpu-target.bin",
                                   "size": "64 MiB"}]}]}
    ref = {"value": "5.23 GB/s", "source": "R1"}
    gates = {"suite": {"name": "gpu-node-cpu-stand-in", "version": "1"}, "gates": [
        {"id": GATE_IDS["fio"], "title": "fio", "workload": "fio-read", "metric": "per_gpu_read_gb_s",
         "params": {"target": "gpudisk", "bs": "1 MiB", "iodepth": 4, "runtime_s": 2, "ramp_s": 0},
         "pass": ">= 1 MB/s", "reference": ref},
        {"id": GATE_IDS["kv_read"], "title": "kv-read", "workload": "kv-read", "metric": "connector_read_gb_s",
         "params": {"target": "gpudisk", "engine": "cpu-reference", "destination": "cpu", "model": "small",
                    "model_config_inline": SMALL, "kv_size": "16 MiB", "chunks_per_retrieve": 2,
                    "lmcache": {"max_local_cpu_size": 0.25}, "fio": {"iodepth": 4}},
         "pass": ">= 1 MB/s", "reference": ref},
        {"id": GATE_IDS["g2"], "title": "G2", "workload": "g2-ttft", "metric": "readback_speedup_p50",
         "params": {"engine": "cpu-reference", "prompt_tokens": [1536], "prompts_per_length": 2, "max_tokens": 2,
                    "seed": 7, "model_config_inline": SMALL},
         "pass": ">= 1 x", "reference": {"value": "12.6 x", "source": "vendor"}},
    ]}
    return inv, gates


@pytest.mark.skipif(shutil.which("fio") is None, reason="needs fio")
def test_summary_reads_every_gates_figures_from_a_verified_bundle(tmp_path):
    work = Path("/var/tmp") / f"kvgate-gpunode-test-{uuid.uuid4().hex[:8]}"
    work.mkdir()
    try:
        inv, gates = stand_in_suite(work)
        (tmp_path / "inv.yaml").write_text(yaml.safe_dump(inv))
        (tmp_path / "gates.yaml").write_text(yaml.safe_dump(gates, sort_keys=False))
        r = kvgate(tmp_path / "home", "run", "-i", tmp_path / "inv.yaml", "-g", tmp_path / "gates.yaml",
                   "--out", tmp_path / "out")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report_id = next((l.split(": ")[1] for l in r.stdout.splitlines() if l.startswith("report ID: ")), None)
    assert report_id, r.stdout[-3000:] + r.stderr[-3000:]
    bundle = tmp_path / "out" / report_id
    v = kvgate(tmp_path / "home", "verify", bundle, "--pubkey", tmp_path / "home" / "dev-signing.pub")
    assert v.returncode == 0, v.stdout + v.stderr
    # the run directory as the script leaves it: the probes' steps
    run_dir = tmp_path / "run"
    for step, fixture in (("nvidia-smi-q", "nvidia-smi-q-h200-550.90.12.txt"), ("h2d", "h2d-8xh100-handwritten.out")):
        (run_dir / "steps" / step).mkdir(parents=True)
        shutil.copy(FIX / fixture, run_dir / "steps" / step / "stdout")
        (run_dir / "steps" / step / "rc").write_text("0\n")
    s = kvgate(tmp_path / "home", "gpu-node", "summary", run_dir, "--bundle", bundle)
    assert s.returncode == 0, s.stderr
    verdicts = {x["gate_id"]: x for x in json.loads((bundle / "verdicts.json").read_text())["verdicts"]}
    figures = {f["name"].split(" ")[0]: f for f in json.loads((run_dir / "summary.json").read_text())["figures"]}
    for name, gate, metric in (("connector_read_gb_s", "kv_read", "connector_read_gb_s"),
                               ("connector_read_gb_s_mean", "kv_read", "connector_read_gb_s_mean"),
                               ("fio_read_gb_s", "kv_read", "fio_read_gb_s"),
                               ("connector_efficiency", "kv_read", "connector_efficiency"),
                               ("per_gpu_read_gb_s", "fio", "per_gpu_read_gb_s"),
                               ("ttft_recompute_p50_s", "g2", "ttft_recompute_p50_s"),
                               ("ttft_readback_p50_s", "g2", "ttft_readback_p50_s"),
                               ("readback_speedup_p50", "g2", "readback_speedup_p50")):
        v = verdicts[GATE_IDS[gate]]
        assert figures[name]["value"] == v["metrics"][metric] and figures[name]["value"] > 0, (name, v["reason"])
        assert figures[name]["source"].startswith(f"{GATE_IDS[gate]} {v['outcome']}")
    assert figures["h2d_of_pcie_ceiling"]["value"] == pytest.approx((1 << 30) / 0.0208 / 1e9 / 63.0154, rel=1e-3)
    assert f"overall: {json.loads((bundle / 'verdicts.json').read_text())['overall']}" in s.stdout
