"""kv-read on this machine: real LMCache 0.5.6 (kvgate's .venv) lays the KV out in a real directory target, real
reader processes read it back cold, real fio reads the same chunk files, and the run ends in a signed bundle
that `kvgate report` re-evaluates from its raw files. A byte flipped in one chunk file turns the next run into
FAIL naming that chunk's key.

The fs run is made once per module: its PASS case asserts on it, and the flipped-byte case reads a copy of its
pool (manifest and LMCache's chunk files) with one byte flipped, which the next run takes as an intact earlier
layout and reads again, as it would the same directory."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
# A small GQA model: 4 layers x 8 KV heads x 128 x 2 (K,V) x 2 B (bf16) = 16 KiB of KV per token, 4 MiB chunks.
MODEL = {"num_hidden_layers": 4, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
         "hidden_size": 4096, "torch_dtype": "bfloat16"}


def _lmcache_here() -> bool:
    # installed is enough to decide the skip (importing torch and LMCache here would cost every collection
    # seconds); an installed but broken LMCache fails the runs below, as it should
    return all(importlib.util.find_spec(m) is not None for m in ("torch", "lmcache"))


needs_engine = pytest.mark.skipif(shutil.which("fio") is None or not _lmcache_here(),
                                  reason="needs fio, torch and lmcache (scripts/setup.sh --test installs them)")


def _var_tmp_dir() -> Path:
    # Under /var/tmp, not /tmp: the pool must sit on a block device whose read counters prove cold reads
    # (/tmp may be a tmpfs).
    d = Path("/var/tmp") / f"kvgate-kvread-test-{uuid.uuid4().hex[:8]}"
    d.mkdir(parents=True)
    return d


@pytest.fixture
def work_dir():
    d = _var_tmp_dir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


@dataclass(frozen=True)
class Run:
    tmp: Path
    work_dir: Path
    proc: subprocess.CompletedProcess
    verdict: dict
    result: dict
    bundle: Path


@pytest.fixture(scope="module")
def fs_run(tmp_path_factory):
    """One kv-read run through LMCache's fs backend, shared by the cases that assert on it or read its pool."""
    tmp, work = tmp_path_factory.mktemp("fs"), _var_tmp_dir()
    try:
        yield _run(tmp, work, "fs", {"max_local_cpu_size": 0.25}, "out")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run(tmp: Path, work: Path, backend: str, lmcache: dict, out: str, import_once: bool = False) -> Run:
    inv, gates = suite(tmp, work, backend, lmcache, import_once)
    proc = kvgate(tmp, "run", "-i", str(inv), "-g", str(gates), "--out", str(tmp / out))
    v, result, bundle = verdict(tmp / out)
    return Run(tmp, work, proc, v, result, bundle)


def suite(tmp_path: Path, work_dir: Path, backend: str, lmcache: dict, import_once: bool = False) -> tuple[Path, Path]:
    inv = {"nodes": [{"name": "localhost", "transport": "local", "work_dir": str(work_dir), "read_streams": 2,
                      "targets": [{"name": "pool", "kind": "directory", "path": str(work_dir / "tier")}]}]}
    gates = {"suite": {"name": "kv-read-it", "version": "1"}, "gates": [{
        "id": "G1C", "title": "kv-read on a local directory", "workload": "kv-read",
        "params": {"target": "pool", "engine": "cpu-reference", "backend": backend, "model": "small-gqa",
                   "model_config_inline": MODEL, "kv_size": "32 MiB", "chunks_per_retrieve": 2,
                   "lmcache": lmcache, "fio": {"iodepth": 4}, "import_once": import_once},
        "metric": "connector_read_gb_s", "pass": ">= 1 MB/s", "stop_loss": "< 0.1 MB/s", "timeout_s": 1200,
        "reference": {"value": "5.23 GB/s", "source": "R1"}}]}
    (tmp_path / "inv.yaml").write_text(yaml.safe_dump(inv))
    (tmp_path / "gates.yaml").write_text(yaml.safe_dump(gates, sort_keys=False))
    return tmp_path / "inv.yaml", tmp_path / "gates.yaml"


def kvgate(tmp_path: Path, *args: str, timeout: int = 1500) -> subprocess.CompletedProcess:
    env = {**os.environ, "KVGATE_HOME": str(tmp_path / "home")}
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


def verdict(out: Path) -> tuple[dict, dict, Path]:
    (tar,) = sorted(out.glob("KVG-*.tar.gz"))
    bundle = out / tar.name.removesuffix(".tar.gz")
    with tarfile.open(tar) as tf:
        member = next(m for m in tf.getmembers() if m.name.endswith("/verdicts.json"))
        v = json.load(tf.extractfile(member))["verdicts"][0]
    return v, json.loads((bundle / "gates" / "G1C" / "result.json").read_text()), bundle


@needs_engine
@pytest.mark.parametrize("backend,lmcache", [
    ("fs", {"max_local_cpu_size": 0.25}),
    ("local_disk", {"max_local_cpu_size": 0.25, "extra_config": {"disk_io_threads": 4, "use_odirect": True}}),
], ids=["fs", "local_disk"])
def test_kv_read_through_real_lmcache_on_a_directory_target(request, tmp_path, backend, lmcache):
    if backend == "fs":
        run = request.getfixturevalue("fs_run")
    else:
        work = _var_tmp_dir()
        request.addfinalizer(lambda: shutil.rmtree(work, ignore_errors=True))
        # local_disk's run with import_once: one interpreter lays out, drops the page cache and forks the readers
        run = _run(tmp_path, work, backend, lmcache, "out", import_once=True)
    v, result, bundle = run.verdict, run.result, run.bundle
    assert run.proc.returncode == 0 and v["outcome"] == "PASS", (v.get("reason"), run.proc.stderr[-3000:])
    ev = result["evidence"]
    rec = ev["nodes"]["localhost"]
    assert ev["backend"] == backend and ev["chunk_bytes"] == 256 * 16384
    assert [s["label"] for s in ev["streams"]] == ["stream0", "stream1"]
    assert all(s["read_gb_s"] > 0 and s["fio_read_gb_s"] > 0 for s in ev["streams"])
    assert rec["layout"]["chunks"] == 8 and rec["layout"]["reused"] is False
    assert rec["mismatch_count"] == 0 and rec["missing_count"] == 0
    assert rec["kv_bytes_read"] == 8 * 256 * 16384
    assert rec["device_read_bytes"] >= rec["kv_bytes_read"]  # cold: the device read every KV byte
    assert rec["page_cache_dropped"] is True
    steps = sorted(p.name.split("-", 1)[1] for p in (bundle / "steps").iterdir())
    if backend == "fs":  # a fresh interpreter per phase, the drop a step of its own
        assert rec["reader_start"] == "spawn" and {"localhost-kv-layout", "localhost-kv-drop-caches",
                                                   "localhost-kv-read"} <= set(steps)
    else:  # import_once: the three phases are one step, the readers forked from the layout's interpreter
        assert rec["reader_start"] == "fork" and "localhost-kv-layout-read" in steps
        assert not {"localhost-kv-layout", "localhost-kv-drop-caches", "localhost-kv-read"} & set(steps)
        assert rec["layout"]["engine_init_s"] is not None
    m = result["metrics"]
    assert m["connector_efficiency"] == pytest.approx(m["connector_read_gb_s"] / m["fio_read_gb_s"])
    pool = run.work_dir / "tier" / "kvgate-kv-read"
    suffix = ".data" if backend == "fs" else ".pt"
    assert len(list(pool.glob("*" + suffix))) == 8  # LMCache's own files, in its own naming
    # the bundle re-evaluates from its raw files to the same verdict (KVGATE_HOME of the run: its signing key)
    rep = kvgate(run.tmp, "report", str(bundle), "--out", str(tmp_path / "re"), timeout=300)
    assert rep.returncode == 0 and "verdicts: SAME as signed" in rep.stdout, rep.stdout + rep.stderr


@needs_engine
def test_a_flipped_byte_in_one_chunk_file_fails_the_gate_naming_the_chunk(fs_run, tmp_path, work_dir):
    assert fs_run.proc.returncode == 0 and fs_run.verdict["outcome"] == "PASS", \
        (fs_run.verdict.get("reason"), fs_run.proc.stderr[-3000:])
    # the PASS run's layout, copied (the shared run's pool stays as it was), one KV byte flipped in the copy
    shutil.copytree(fs_run.work_dir / "tier", work_dir / "tier")
    pool = work_dir / "tier" / "kvgate-kv-read"
    chunk = json.loads((pool / "kvgate-kv-manifest.json").read_text())["chunks"][5]
    with open(pool / chunk["file"], "r+b") as fh:  # one KV byte, past the 28-byte header
        fh.seek(4096)
        b = fh.read(1)
        fh.seek(4096)
        fh.write(bytes([b[0] ^ 0x01]))

    second = _run(tmp_path, work_dir, "fs", {"max_local_cpu_size": 0.25}, "two")
    v, result, bundle = second.verdict, second.result, second.bundle
    assert second.proc.returncode == 1 and v["outcome"] == "FAIL"
    assert f"chunk {chunk['key']} read back by localhost/" in v["reason"]
    assert result["evidence"]["nodes"]["localhost"]["layout"]["reused"] is True  # the same files, read again
    assert result["evidence"]["nodes"]["localhost"]["mismatch_count"] == 1
    # re-evaluated from the raw reader output, the bundle says the same (FAIL naming the same key)
    rep = kvgate(tmp_path, "report", str(bundle), "--out", str(tmp_path / "re"), timeout=300)
    assert "verdicts: SAME as signed" in rep.stdout, rep.stdout + rep.stderr
