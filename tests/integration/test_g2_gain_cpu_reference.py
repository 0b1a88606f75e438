"""The tier's worth on the cpu-reference engine with the real LMCache 0.5.6, end to end as a user runs it: `kvgate
trace synth` writes a session trace, `kvgate run` of gates/g2-gain-cpu-reference.yaml replays it on two engines
(with LMCache, and with --no-kv-tier) interleaved over 3 trials, into a signed bundle that verifies: PASS with both
arms proven (the tier served the returning sessions' context; without it nothing came from a tier). The same gate
with an engine memory that holds the whole working set (engine_cache_tokens) is INVALID: the tier arm was served
from engine memory, not from the tier. The capacity curve (gates/g2-gain-capacity-cpu-reference.yaml): a
working-set sweep from half the engine memory to 4x it, engine memory serving the reuse below the knee and
LMCache's RAM level past it, its requirement PASS and the curve drawn in the signed report. Attach mode: two
engines the test starts outside kvgate (one with LMCache, one with --no-kv-tier), given to the gate as two URLs,
PASS with both arms proven and both engines left running."""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from harness.transport.local import free_port
from kvgate_cli import kvgate, signed_run
from polling import wait_no_process, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("gain")
    home, trace = d / "home", d / "trace.jsonl"
    synth = kvgate("trace", "synth", "--out", trace, "--sessions", "4", "--turns", "3", "--system-prompts", "1",
                   "--system-prompt-tokens", "1024", "--user-tokens", "256", "--output-tokens", "4", "--rate-rps",
                   "4", "--think-time-s", "0.5", "--block-tokens", "256", "--seed", "1", home=home)
    assert synth.returncode == 0, synth.stderr
    assert kvgate("keygen", "--out", d / "op", home=home).returncode == 0
    inv = d / "inventory.yaml"
    inv.write_text(yaml.safe_dump({"nodes": [{"name": "cpu1", "transport": "local", "read_streams": 1,
                                              "work_dir": str(d / "work")}]}))
    return d, home, trace, inv


def run_gate(setup, name: str, **params):
    d, home, trace, inv = setup
    suite = yaml.safe_load((ROOT / "gates" / "g2-gain-cpu-reference.yaml").read_text())
    suite["gates"][0]["params"]["load"]["path"] = str(trace)
    suite["gates"][0]["params"].update(params)
    gates = d / f"{name}.yaml"
    gates.write_text(yaml.safe_dump(suite, sort_keys=False))
    r, bundle = signed_run(inv, gates, d / name, d / "op.key", home, timeout=900)
    result = json.loads((bundle / "gates" / "G2-gain" / "result.json").read_text())
    v = json.loads((bundle / "verdicts.json").read_text())["verdicts"][0]
    wait_no_process(str(d / "work") + "/")
    return r, bundle, result, v


def test_the_tier_arm_passes_with_both_arms_proven_and_the_bundle_verifies(setup):
    r, bundle, result, v = run_gate(setup, "pass")
    assert r.returncode == 0 and v["outcome"] == "PASS", (v["reason"], result["invalid_reason"], result["error"])
    assert "95 % CI" in v["reason"] and "3 trials" in v["reason"]
    m, ev = result["metrics"], result["evidence"]
    assert {c["name"]: c["ok"] for c in ev["validity"]} == {
        "tier arm valid": True, "no_tier arm valid": True, "tier served the reuse": True,
        "recomputed without the tier": True}
    for fig in ("throughput_gain", "ttft_p50_ratio", "ttft_p95_ratio"):
        assert m[f"{fig}_ci_low"] <= m[fig] <= m[f"{fig}_ci_high"] and m[f"{fig}_ci_trials"] == 3, fig
    assert m["ttft_p50_ratio"] < 1  # the tier arm's median TTFT is below the one that recomputes
    tier, none = ev["proofs"]["tier"], ev["proofs"]["no_tier"]
    # every session's later turns found their context (at least the 1024-token system prompt) in the tier
    assert tier["tier_hit_tokens"] >= 3 * 8 * 1024 and tier["memory_hit_tokens"] == 0
    assert none["tier_hit_tokens"] == 0 and none["recomputed_tokens"] == none["prompt_tokens"]
    assert [p["first"] for p in ev["pairs"]] == ["tier", "no_tier", "tier"]
    d, home = setup[0], setup[1]
    vr = kvgate("verify", f"{bundle}.tar.gz", "--pubkey", d / "op.pub", home=home)
    assert vr.returncode == 0 and vr.stdout.startswith("OK "), vr.stdout + vr.stderr


def test_a_tier_arm_whose_engine_memory_holds_the_working_set_is_invalid_not_pass(setup):
    # 32k tokens of engine memory hold the whole trace's working set (6144 tokens): the returning sessions find
    # their context in the engine, and the tier serves nothing
    r, _, result, v = run_gate(setup, "fits", engine_cache_tokens=32768, trials=1)
    assert v["outcome"] == "INVALID" and r.returncode != 0, v
    assert result["invalid_reason"].startswith("tier served the reuse"), result["invalid_reason"]
    assert result["evidence"]["proofs"]["tier"]["memory_hit_tokens"] > 0


def test_the_capacity_curve_hands_the_reuse_from_engine_memory_to_lmcache_at_the_knee(setup):
    d, home, _, inv = setup
    r, bundle = signed_run(inv, ROOT / "gates" / "g2-gain-capacity-cpu-reference.yaml", d / "capacity", d / "op.key",
                           home, timeout=600)
    result = json.loads((bundle / "gates" / "G2-capacity" / "result.json").read_text())
    v = json.loads((bundle / "verdicts.json").read_text())["verdicts"][0]
    wait_no_process(str(d / "work") + "/")
    assert r.returncode == 0 and v["outcome"] == "PASS", (v["reason"], result["invalid_reason"], result["error"])
    ev = result["evidence"]
    assert {c["name"]: c["ok"] for c in ev["validity"]} == {
        "tier arm valid": True, "levels counted": True, "engine memory held the smallest working set": True}
    cap = ev["capacity"]
    curve = {c["label"]: c["figures"] for c in cap["curve"]}
    assert [(c["label"], c["sessions"]) for c in cap["curve"]] == [("x0.5", 1), ("x1", 2), ("x2", 4), ("x4", 8)]
    # up to engine memory (1024 tokens: two sessions of 512) the engine's own prefix cache serves every
    # returning context; past it, round-robin over 4 and 8 sessions, it serves none and LMCache's RAM level all
    for x in ("x0.5", "x1"):
        assert curve[x]["memory_hit_rate"] == 1.0 and curve[x]["ram_hit_rate"] == 0, (x, curve[x])
    for x in ("x2", "x4"):
        assert curve[x]["memory_hit_rate"] == 0 and curve[x]["ram_hit_rate"] == 1.0, (x, curve[x])
        assert curve[x]["recomputed_rate"] == 0 and curve[x]["goodput_rps"] > 0
    assert cap["knee_x"] == 2 and result["metrics"]["capacity_hit_rate"] == 1.0
    # the fs:// pool never evicts and cpu-reference does not count tier evictions: no "tier full" point claimed
    assert cap["tier_exhausted_x"] is None and not cap["tier_evictions_counted"]
    (svg,) = (bundle / "charts").glob("*capacity-curve.svg")
    assert "knee 2x" in svg.read_text()


@pytest.fixture
def attached_pair(setup):
    """An operator's two cpu-reference engines (the same model and seed), started by the test as a deployment
    would start them, outside kvgate: one with LMCache on an fs:// pool of its own, one with --no-kv-tier. Stopped
    by their process groups when the test ends."""
    d = setup[0] / "operator"  # the operator's side: not the run's output directory
    d.mkdir()
    suite = yaml.safe_load((ROOT / "gates" / "g2-gain-cpu-reference.yaml").read_text())
    model = d / "model-config.json"
    model.write_text(json.dumps({"model_type": "llama", **suite["gates"][0]["params"]["model_config_inline"]}))
    prof = yaml.safe_load((ROOT / "workloads" / "engines" / "cpu-reference.yaml").read_text())
    pool = d / "pool"
    pool.mkdir()
    lm = d / "lmcache.yaml"
    lm.write_text(yaml.safe_dump({**prof["lmcache"]["config"], "remote_url": f"fs://localhost:0{pool}"}))
    program = d / "cpu_reference.py"  # the engine's program on its own, as kvgate stages it on a node
    shutil.copy(ROOT / "harness" / "engines" / "cpu_reference.py", program)
    procs, urls = {}, {}
    try:
        for arm, extra in (("tier", []), ("no_tier", ["--no-kv-tier"])):
            port = free_port()
            (d / arm).mkdir()
            env = {**os.environ, "PYTHONHASHSEED": "0", "PROMETHEUS_MULTIPROC_DIR": str(d / arm),
                   "LMCACHE_CONFIG_FILE": str(lm)}
            with open(d / f"{arm}.log", "wb") as log:
                procs[arm] = subprocess.Popen(
                    [sys.executable, str(program), "--port", str(port),
                     "--model-config", str(model), "--lmcache-config", str(lm), "--seed", "7", *extra],
                    stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            urls[arm] = f"http://127.0.0.1:{port}"
        for arm, url in urls.items():
            wait_until(lambda u=url, p=procs[arm]: _healthy(u) or p.poll() is not None, 300, f"the {arm} engine")
            assert procs[arm].poll() is None, (d / f"{arm}.log").read_text()[-3000:]
        yield d, urls, pool, d / "tier.log", d / "no_tier.log"
    finally:
        for p in procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=60)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_an_attached_pair_of_engines_someone_else_runs_passes_with_both_arms_proven(setup, attached_pair):
    d, urls, pool, tier_log, plain_log = attached_pair
    prof = yaml.safe_load((ROOT / "workloads" / "engines" / "cpu-reference.yaml").read_text())
    for launch_only in ("argv", "program", "env", "preflight", "lmcache"):
        prof.pop(launch_only)
    prof["name"] = "cpu-reference-attached"
    profile = d / "cpu-reference-attached.yaml"
    profile.write_text(yaml.safe_dump(prof, sort_keys=False))
    r, bundle, result, v = run_gate(
        setup, "attached", engine=str(profile), trials=2, pool_path=str(pool),
        attach={"url": urls["tier"], "log": {"node": "cpu1", "run": f"cat {tier_log}"}},
        no_tier_attach={"url": urls["no_tier"], "log": {"node": "cpu1", "run": f"cat {plain_log}"}})
    assert r.returncode == 0 and v["outcome"] == "PASS", (v["reason"], result["invalid_reason"], result["error"])
    ev = result["evidence"]
    assert {a: ev["arms"][a]["base_url"] for a in ("tier", "no_tier")} == urls
    assert ev["arms"]["tier"]["attached"] and ev["arms"]["no_tier"]["attached"]
    assert {c["name"]: c["ok"] for c in ev["validity"]} == {
        "tier arm valid": True, "no_tier arm valid": True, "tier served the reuse": True,
        "recomputed without the tier": True}
    tier, none = ev["proofs"]["tier"], ev["proofs"]["no_tier"]
    assert tier["tier_hit_tokens"] >= 2 * 8 * 1024 and none["tier_hit_tokens"] == 0
    assert none["recomputed_tokens"] == none["prompt_tokens"]
    # kvgate started and stopped nothing: both engines still serve after the run
    assert _healthy(urls["tier"]) and _healthy(urls["no_tier"])
