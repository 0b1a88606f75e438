"""g2-answer's pure parts: the answer comparison and verdict (harness.workloads.g2_answer.evaluate_answer) with G2's
proofs from evaluate_g2, the corruption program's byte choice (harness/node/kv_flip.py) on a real safetensors
layout, and its output parser."""

import json
import struct
import subprocess
import sys
from types import SimpleNamespace

import pytest

from harness.engines.client import RequestRecord
from harness.gates.verdict import Outcome, judge
from harness.node import program_path
from harness.node.kv_flip import flip_target
from harness.units import parse_threshold
from harness.workloads.kit.base import PoolSnapshot
from harness.workloads.g2_answer import G2AnswerEvidence, evaluate_answer, parse_flip_output
from harness.workloads.kit.g2 import evaluate_g2

BOUND = 0.01


def rec(rid, tokens=("token_id:1", "token_id:2", "token_id:3"), lps=(-6.5, -6.4, -6.3), error=None):
    tops = tuple({t: lp, "token_id:99": lp - 0.5} for t, lp in zip(tokens, lps))
    return RequestRecord(request_id=rid, prompt_tokens=1026, queue_s=0.0, ttft_s=None if error else 0.1, itl_s=(),
                         latency_s=0.2, e2e_s=0.2, output_chunks=len(tokens), output_text="", http_status=200,
                         error=error, tokens=() if error else tuple(tokens),
                         token_logprobs=() if error else tuple(lps), top_logprobs=() if error else tops)


def proofs(recompute, readback, hits=2048.0, device_bytes=10_000_000):
    ev = G2AnswerEvidence(recompute_hit_tokens=0.0, pool_after_populate=PoolSnapshot(
        node="n", dir="/pool", bytes=8_000_000, files=8, expected_kv_bytes=8_000_000))
    return evaluate_g2(recompute, readback, hits, 2052.0, device_bytes, 0.95, 8_000_000, ev, min_read_fraction=0.5)


def verdict(result):
    gate = SimpleNamespace(id="G2A", title="t", metric="answer_mismatched_prompts", pass_=_pass(), stop_loss=None,
                           reference=None, informational=False)
    return judge(gate, result, "count")


def _pass():
    return parse_threshold("<= 0")


def answer(recompute, readback, corruption=None, **kw):
    return evaluate_answer(recompute, readback, proofs(recompute, readback, **kw), BOUND, corruption)


def test_equal_answers_with_hits_proven_pass():
    rc, rb = [rec("p0"), rec("p1")], [rec("p0"), rec("p1")]
    r = answer(rc, rb)
    assert r.failed_check is None and r.invalid_reason is None and r.error is None
    assert r.metrics["answer_mismatched_prompts"] == 0 and r.metrics["answer_prompts_compared"] == 2
    assert r.metrics["answer_max_abs_logprob_diff"] == 0.0
    assert [a.same_tokens for a in r.evidence.answers] == [True, True]
    assert verdict(r).outcome is Outcome.PASS
    assert any(c.name == "same answers" and c.ok for c in r.evidence.validity)


def test_one_token_differs_fails_naming_the_prompt_and_position():
    rb1 = rec("p1", tokens=("token_id:1", "token_id:7", "token_id:3"))
    r = answer([rec("p0"), rec("p1")], [rec("p0"), rb1])
    v = verdict(r)
    assert v.outcome is Outcome.FAIL
    assert "p1: tokens differ from position 1" in r.failed_check and "p0" not in r.failed_check
    assert r.metrics["answer_mismatched_prompts"] == 1
    assert r.evidence.answers[1].first_difference_at == 1


def test_a_logprob_beyond_the_bound_fails_though_the_tokens_agree():
    rb0 = rec("p0", lps=(-6.5, -6.4 + 3 * BOUND, -6.3))
    r = answer([rec("p0")], [rb0])
    assert verdict(r).outcome is Outcome.FAIL
    assert "p0: a logprob differs by 0.03" in r.failed_check
    assert r.metrics["answer_max_abs_logprob_diff"] == pytest.approx(3 * BOUND)


def test_a_difference_within_the_bound_passes():
    r = answer([rec("p0")], [rec("p0", lps=(-6.5, -6.4 + BOUND / 2, -6.3))])
    assert verdict(r).outcome is Outcome.PASS


def test_a_nan_logprob_from_the_tier_is_beyond_any_bound():
    r = answer([rec("p0")], [rec("p0", lps=(-6.5, float("nan"), -6.3))])
    assert verdict(r).outcome is Outcome.FAIL and "p0" in r.failed_check


def test_no_hits_proven_is_invalid_even_with_equal_answers():
    rc, rb = [rec("p0")], [rec("p0")]
    r = answer(rc, rb, hits=0.0)
    v = verdict(r)
    assert v.outcome is Outcome.INVALID and "hit rate" in v.reason
    r = answer(rc, rb, device_bytes=0)  # hits counted, but nothing read from the pool's device
    assert verdict(r).outcome is Outcome.INVALID and "device" in r.invalid_reason


def test_a_difference_without_hits_proven_is_invalid_not_blamed_on_the_tier():
    r = answer([rec("p0")], [rec("p0", tokens=("token_id:5", "token_id:2", "token_id:3"))], hits=0.0)
    v = verdict(r)
    assert v.outcome is Outcome.INVALID and "p0: tokens differ" in v.reason and "hit rate" in v.reason


def test_failed_requests_never_vanish():
    # a read-back that failed where its re-compute answered: the tier's answer is missing, a difference
    r = answer([rec("p0"), rec("p1")], [rec("p0"), rec("p1", error="HTTP 500: boom")])
    assert verdict(r).outcome is Outcome.FAIL and "p1: no answer from the tier: HTTP 500: boom" in r.failed_check
    # a re-compute that failed: no reference, an ERROR naming it, still listed
    r = answer([rec("p0"), rec("p1", error="timeout")], [rec("p0"), rec("p1")])
    assert verdict(r).outcome is Outcome.ERROR and "p1" in r.error
    assert [a.request_id for a in r.evidence.answers] == ["p0", "p1"]
    # a prompt only the read-back holds is kept too
    r = answer([rec("p0")], [rec("p0"), rec("p9")])
    assert "p9" in {a.request_id for a in r.evidence.answers} and verdict(r).outcome is not Outcome.PASS


def test_an_engine_without_logprobs_cannot_pass():
    bare = [RequestRecord("p0", 10, 0.0, 0.1, (), 0.2, 0.2, 1, "x", 200)]
    r = answer(bare, bare)
    assert verdict(r).outcome is Outcome.FAIL and "no logprobs" in r.failed_check


FLIP = {"file": "/pool/h/model.layers.0.self_attn.attn.safetensors", "tensor": "kv_cache", "offset_in_file": 1234,
        "before": 0x3c, "after": 0x7c}


def test_a_corruption_the_answers_show_fails_naming_prompt_file_and_missing_checksum():
    flips = parse_flip_output(json.dumps(FLIP) + "\n")
    r = answer([rec("p0"), rec("p1")], [rec("p0"), rec("p1", lps=(-6.5, -1.0, -6.3))], corruption=flips)
    v = verdict(r)
    assert v.outcome is Outcome.FAIL
    assert "p1" in v.reason and FLIP["file"] in v.reason and "byte 1234" in v.reason
    assert "checks no checksum" in v.reason


def test_a_corruption_no_answer_shows_is_invalid_not_detectable_never_pass():
    flips = parse_flip_output(json.dumps(FLIP))
    r = answer([rec("p0")], [rec("p0")], corruption=flips)
    v = verdict(r)
    assert v.outcome is Outcome.INVALID and v.reason.startswith("corruption not detectable") and FLIP["file"] in v.reason


def test_a_corruption_that_could_not_be_made_is_invalid():
    flips = parse_flip_output('{"file": null, "error": "no file matching *.safetensors under /pool"}\nnot json\n')
    assert len(flips) == 2 and flips[1].error.startswith("not JSON")
    r = answer([rec("p0")], [rec("p0")], corruption=flips)
    assert verdict(r).outcome is Outcome.INVALID and "no byte could be flipped" in r.invalid_reason
    r = answer([rec("p0")], [rec("p0")], corruption=[])
    assert verdict(r).outcome is Outcome.INVALID


def safetensors_bytes(n_elements=64):
    header = {"__metadata__": {"format": "pt"},
              "kv_cache": {"dtype": "BF16", "shape": [2, n_elements // 2], "data_offsets": [0, 2 * n_elements]}}
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    data = b"".join(struct.pack("<H", 0x3F80) for _ in range(n_elements))  # bf16 1.0
    return struct.pack("<Q", len(h)) + h + data, len(h)


def test_flip_target_middle_is_the_high_byte_of_the_middle_element_inside_the_data():
    raw, n = safetensors_bytes()
    header = json.loads(raw[8:8 + n])
    t = flip_target(header, n, "middle")
    assert t["offset_in_data"] == 65 and t["offset_in_file"] == 8 + n + 65  # element 32's high byte
    assert raw[t["offset_in_file"]] == 0x3F
    with pytest.raises(ValueError):
        flip_target(header, n, "128")  # past the data: never into the next file region
    with pytest.raises(ValueError):
        flip_target({"__metadata__": {}}, 2, "middle")


def test_kv_flip_program_flips_one_byte_of_data_and_reports_it(tmp_path):
    raw, n = safetensors_bytes()
    d = tmp_path / "pool" / "h"
    d.mkdir(parents=True)
    f = d / "model.layers.0.self_attn.attn.safetensors"
    f.write_bytes(raw)
    out = subprocess.run([sys.executable, str(program_path("kv_flip.py")), str(tmp_path / "pool")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    [r] = parse_flip_output(out.stdout)
    after = f.read_bytes()
    diff = [i for i in range(len(raw)) if raw[i] != after[i]]
    assert diff == [r.offset_in_file] and r.before == 0x3F and r.after == 0x7F and after[:8 + n] == raw[:8 + n]
    # bf16 1.0 became 2**128: struct 0x7F80 is inf's pattern only with the low byte 0x80 and exponent all ones
    empty = subprocess.run([sys.executable, str(program_path("kv_flip.py")), str(tmp_path / "none")],
                           capture_output=True, text=True, timeout=60)
    assert empty.returncode == 1 and parse_flip_output(empty.stdout)[0].error


def test_corrupt_is_refused_on_an_attached_engine_and_planned_between_stop_and_read_back(tmp_path):
    """kvgate never writes into an operator's pool: ``corrupt:`` with ``attach:`` is a config error; on a launched
    engine the flip is planned after the stop and before the page cache drop and the read-back."""
    import yaml
    from harness.config import load_config
    from harness.errors import ConfigError
    from harness.suite.plan import gate_plan
    from harness.workloads import WORKLOADS
    root = __import__("pathlib").Path(__file__).resolve().parents[2]
    suite = yaml.safe_load((root / "gates" / "g2-answer-vllm-cpu.yaml").read_text())
    suite["gates"][0]["params"]["corrupt"] = {"files": 1}
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(suite))
    (tmp_path / "i.yaml").write_text(yaml.safe_dump({"nodes": [{"name": "n1", "transport": "local", "work_dir": "/w",
                                                                 "engine_python": "/e/bin/python"}]}))
    cfg = load_config(tmp_path / "i.yaml", tmp_path / "g.yaml", WORKLOADS)
    steps = [s.description for s in gate_plan(cfg, cfg.suite.gates[0])]
    at = next(i for i, d in enumerate(steps) if d.startswith("corrupt:"))
    assert steps[at - 1].startswith("stop the engine") and steps[at + 1].startswith("sync and drop the page cache")
    suite["gates"][0]["params"].update(attach={"url": "http://127.0.0.1:8000", "restart": [{"node": "n1",
                                                                                           "run": "true"}]})
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(suite))
    with pytest.raises(ConfigError, match="corrupt"):
        load_config(tmp_path / "i.yaml", tmp_path / "g.yaml", WORKLOADS)


def test_answers_that_part_on_a_near_tie_are_compared_up_to_it_not_failed():
    """At a position where the two best tokens lie within the bound (a bf16 logit's last bit apart), greedy picks
    by a rounding: the prompt is counted as a near tie, compared up to there; a token outside that tie still FAILs."""
    def tied(rid, first, second):
        r = rec(rid, tokens=("token_id:1", first, "token_id:3"))
        tops = list(r.top_logprobs)
        tops[1] = {first: -6.400, second: -6.4 - BOUND / 2}
        return __import__("dataclasses").replace(r, top_logprobs=tuple(tops))
    rc, rb = tied("p0", "token_id:2", "token_id:8"), tied("p0", "token_id:8", "token_id:2")
    r = answer([rc], [rb])
    assert verdict(r).outcome is Outcome.PASS
    assert r.metrics["answer_near_tie_prompts"] == 1 and r.evidence.answers[0].near_tie
    assert r.evidence.answers[0].first_difference_at == 1
    far = tied("p0", "token_id:8", "token_id:2")
    far = __import__("dataclasses").replace(far, top_logprobs=(far.top_logprobs[0], {"token_id:8": -6.4,
                                                                                      "token_id:2": -7.0}, far.top_logprobs[2]))
    assert verdict(answer([rc], [far])).outcome is Outcome.FAIL


def test_kv_flip_takes_the_file_written_last_not_the_warm_up_prompt_stored_first(tmp_path):
    import os
    raw, _ = safetensors_bytes()
    old, new = tmp_path / "pool" / "aaa-warmup", tmp_path / "pool" / "zzz-measured"
    for i, d in enumerate((old, new)):
        d.mkdir(parents=True)
        (d / "l0.safetensors").write_bytes(raw)
        os.utime(d / "l0.safetensors", ns=(10**18 + i, 10**18 + i))
    out = subprocess.run([sys.executable, str(program_path("kv_flip.py")), str(tmp_path / "pool")],
                         capture_output=True, text=True, timeout=60)
    [r] = parse_flip_output(out.stdout)
    assert r.file == str(new / "l0.safetensors") and (old / "l0.safetensors").read_bytes() == raw


def test_kv_flip_raw_format_flips_the_high_byte_of_a_middle_float32_after_any_header(tmp_path):
    d = tmp_path / "pool"
    d.mkdir()
    header = b"META!!"  # a connector's small header of any length before the tensor bytes (LMCache's chunk metadata)
    (d / "chunk.data").write_bytes(header + struct.pack("<8f", *([0.5] * 8)))
    out = subprocess.run([sys.executable, str(program_path("kv_flip.py")), str(d), "--pattern", "*.data", "--format",
                          "raw", "--item-bytes", "4"], capture_output=True, text=True, timeout=60)
    [r] = parse_flip_output(out.stdout)
    assert r.offset_in_file == len(header) + 4 * 4 + 3  # element 4 of 8 (the second half's first): its exponent byte
    after = (d / "chunk.data").read_bytes()
    vals = struct.unpack("<8f", after[len(header):])
    assert after[:len(header)] == header and vals[4] == 0.5 * 2.0 ** 128 and vals[:4] + vals[5:] == (0.5,) * 7


def test_cpu_reference_engine_reports_logprobs_as_vllm_names_them():
    """The reference engine's logprobs (the second engine g2-answer runs on) parse with the client's own parser:
    the chosen token's log-probability, the top k by token id, the greedy choice first."""
    import torch
    from harness.engines.cpu_reference import logprobs_object, token_logprobs
    from harness.parsers.sse import chunk_logprobs
    logits = torch.tensor([0.0, 2.0, 1.0, -1.0])
    lp, top = token_logprobs(torch, logits, 1, 2)
    assert lp == pytest.approx(float(torch.log_softmax(logits, -1)[1])) and list(top) == ["token_id:1", "token_id:2"]
    event = {"choices": [{"text": " t1", "logprobs": logprobs_object(1, (lp, top), 0)}]}
    assert chunk_logprobs(event) == [("token_id:1", lp, top)]
    assert logprobs_object(1, None, 0) is None


def test_a_corruption_the_engine_did_not_serve_from_the_tier_is_invalid_saying_so():
    """A connector that checks its chunks would refuse the flipped one and re-compute: equal answers, no hits. That
    is INVALID saying the read-back is not from the tier, not 'not detectable' and never PASS."""
    flips = parse_flip_output(json.dumps(FLIP))
    r = answer([rec("p0")], [rec("p0")], corruption=flips, hits=0.0)
    v = verdict(r)
    assert v.outcome is Outcome.INVALID and "not proven from the tier" in v.reason and "hit rate" in v.reason
    assert not v.reason.startswith("corruption not detectable")
