"""g2-answer on kvgate's CPU reference engine with the real LMCache 0.5.6 (the issue's second engine): the shipped
gate PASSes with its hits proven (the engine's counters, O_DIRECT reads on the pool's own loop device), and with one
byte of a stored LMCache chunk file flipped between store and read-back it FAILs naming the prompt and the file: the
tokens may stay equal, the logprob bound catches it."""

import json
from pathlib import Path

import pytest
import yaml

from harness.config import load_config
from harness.gates.reevaluate import reevaluate_bundle
from harness.report.bundle import generate_keypair, load_private_key, verify_bundle
from harness.suite.runner import run_suite
from harness.workloads import WORKLOADS
from kvgate_cli import readme_run
from polling import wait_no_process

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
GATE = "G2-answer"


def _run(tmp_path, **params):
    """(verdict, result.json) of the shipped gate, run exactly as the README's table gives it when ``params`` is
    empty, else of a copy with ``params`` changed; the bundle verified and its verdict re-derived."""
    if not params:
        _, bundle, work = readme_run("g2-answer-cpu-reference.yaml", "localhost.yaml", tmp_path, timeout=900)
        pub = tmp_path / "home" / "dev-signing.pub"
    else:
        suite = yaml.safe_load((ROOT / "gates" / "g2-answer-cpu-reference.yaml").read_text())
        suite["gates"][0]["params"].update(params)
        (tmp_path / "gates.yaml").write_text(yaml.safe_dump(suite, sort_keys=False))
        work = tmp_path / "work"
        (tmp_path / "inventory.yaml").write_text(yaml.safe_dump({"nodes": [{
            "name": "cpu1", "transport": "local", "read_streams": 1, "work_dir": str(work)}]}))
        cfg = load_config(tmp_path / "inventory.yaml", tmp_path / "gates.yaml", WORKLOADS)
        key, pub = generate_keypair(tmp_path / "op")
        bundle = run_suite(cfg, tmp_path / "out", load_private_key(key),
                           progress=lambda m: print(m, flush=True)).bundle.path
    res = verify_bundle(bundle, pub)
    assert res.ok
    wait_no_process(str(work) + "/")
    again = reevaluate_bundle(bundle, res.statement["predicate"])
    assert again.same and again.checks[0].rederived, again.differences
    return (json.loads((bundle / "verdicts.json").read_text())["verdicts"][0],
            json.loads((bundle / "gates" / GATE / "result.json").read_text()))


def test_cpu_reference_answers_from_lmcache_equal_the_recomputed_ones(tmp_path):
    v, result = _run(tmp_path)
    m = result["metrics"]
    assert v["outcome"] == "PASS", (v["reason"], result)
    assert m["hit_rate"] >= 0.95 and m["readback_device_read_bytes"] > 0
    assert m["answer_prompts_compared"] == 3 and m["answer_max_abs_logprob_diff"] <= 0.001
    assert all(len(a["readback_tokens"].split()) == 8 for a in result["evidence"]["answers"])


def test_a_flipped_byte_in_an_lmcache_chunk_file_fails_naming_prompt_and_file(tmp_path):
    v, result = _run(tmp_path, corrupt={"byte_offset": "middle", "files": 1, "format": "raw", "item_bytes": 4})
    ev = result["evidence"]
    [flip] = ev["corruption"]
    assert flip["error"] is None and flip["file"].endswith(".data") and flip["before"] ^ flip["after"] == 0x40
    assert v["outcome"] == "FAIL", (v["reason"], result)
    bad = [a for a in ev["answers"] if a["problem"]]
    assert len(bad) == 1 and bad[0]["request_id"] in v["reason"] and flip["file"] in v["reason"]
    assert "checks no checksum" in v["reason"]
