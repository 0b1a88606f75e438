"""The tier's worth on the cpu-reference engine with the real LMCache 0.5.6, end to end as a user runs it: `kvgate run`
of gates/g2-gain-cpu-reference.yaml as shipped (its session trace a shape declared in it) replays it on two engines
(with LMCache on a cold tier, and with --no-kv-tier) interleaved over 9 trials (the trace's first 6 requests each),
into a signed bundle that verifies: PASS on the interval for the median with both arms proven (the tier served the
returning sessions' context, every hit a read of its own loop device; without it nothing came from a tier; the arms
differ by --no-kv-tier only). The same gate with an engine memory that holds the whole working set is INVALID, and so
are an LMCache RAM level that holds it and O_DIRECT asked for but not in force. The capacity curve
(gates/g2-gain-capacity-cpu-reference.yaml): a working-set sweep from half the engine memory to 4x it, engine memory,
then LMCache's RAM level, then the pool's device serving the reuse, its requirement PASS and the curve drawn in the
signed report. Attach mode: two engines the test starts outside kvgate (one with LMCache, one with --no-kv-tier),
given to the gate as two URLs, 2 trials of an informational gate (reported, never decided: 2 trials give no
interval) with both arms proven and both engines left running."""

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
from kvgate_cli import kvgate, readme_run, signed_run
from polling import wait_no_process, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("gain")
    home = d / "home"
    assert kvgate("keygen", "--out", d / "op", home=home).returncode == 0
    inv = d / "inventory.yaml"
    inv.write_text(yaml.safe_dump({"nodes": [{"name": "cpu1", "transport": "local", "read_streams": 1,
                                              "work_dir": str(d / "work")}]}))
    return d, home, inv


def run_gate(setup, name: str, gate: dict | None = None, **params):
    """The shipped gate (its sessions shape declared in it) as it is, or a copy with ``params`` (and the gate's
    own fields ``gate``) changed."""
    d, home, inv = setup
    if not (params or gate):   # exactly as the README's table runs it, signed with the development key
        r, bundle, work = readme_run("g2-gain-cpu-reference.yaml", "localhost.yaml", d / name, timeout=900, home=home)
        return (r, bundle, json.loads((bundle / "gates" / "G2-gain" / "result.json").read_text()),
                json.loads((bundle / "verdicts.json").read_text())["verdicts"][0])
    gates = ROOT / "gates" / "g2-gain-cpu-reference.yaml"
    if params or gate:
        suite = yaml.safe_load(gates.read_text())
        suite["gates"][0]["params"].update(params)
        for k in [k for k, v in params.items() if v is None]:  # None: the parameter taken out
            suite["gates"][0]["params"].pop(k)
        suite["gates"][0].update(gate or {})
        gates = d / f"{name}.yaml"
        gates.write_text(yaml.safe_dump(suite, sort_keys=False))
    r, bundle = signed_run(inv, gates, d / name, d / "op.key", home, timeout=900)
    result = json.loads((bundle / "gates" / "G2-gain" / "result.json").read_text())
    v = json.loads((bundle / "verdicts.json").read_text())["verdicts"][0]
    wait_no_process(str(d / "work") + "/")
    return r, bundle, result, v


def cold_tier_proven(bundle: Path, arm: dict, regime: str) -> None:
    """The tier arm's hits were reads of a pool device of its own: a loop device kvgate made, the cold regime in
    force, every point's read fraction >= 0.5, and the report's first line for the gate says where they came from."""
    pool = arm["pool"]
    assert pool["kind"] == "loop" and pool["loop"]["device"].startswith("/dev/loop"), pool
    assert pool["cold_regime"] == regime
    fractions = [pt["accounting"]["read_fraction"] for pt in arm["points"]]
    assert fractions and all(f is not None and f >= 0.5 for f in fractions), fractions
    assert arm["pool_device_maj_min"] == pool["loop"]["maj_min"]
    assert "Where the tier's" in (bundle / "report.md").read_text()


def test_the_tier_arm_passes_with_both_arms_proven_and_the_bundle_verifies(setup):
    r, bundle, result, v = run_gate(setup, "pass")
    assert r.returncode == 0 and v["outcome"] == "PASS", (v["reason"], result["invalid_reason"], result["error"])
    assert "95 % CI" in v["reason"] and "9 trials" in v["reason"]
    m, ev, ivs = result["metrics"], result["evidence"], result["intervals"]
    # every proof checked (the device-read proof inside "tier arm valid": every point's read fraction >= 0.5)
    assert {c["name"]: (c["ok"], c["checked"]) for c in ev["validity"]} == {
        "tier arm valid": (True, True), "no_tier arm valid": (True, True), "arms equal but the tier switch": (True, True),
        "tier served the reuse": (True, True), "recomputed without the tier": (True, True)}
    assert "unproven" not in v["reason"]
    assert ev["arm_difference"]["no_tier_only_argv"] == ["--no-kv-tier"]
    for fig in ("throughput_gain", "ttft_p50_ratio", "ttft_p95_ratio"):  # typed intervals, no _ci_ metrics
        iv = ivs[fig]
        assert iv["ci_low"] <= m[fig] == iv["median"] <= iv["ci_high"] and iv["trials"] == iv["asked"] == 9, fig
        assert iv["method"] == "binomial order statistics" and f"{fig}_ci_low" not in m
        assert iv["coverage"] == pytest.approx(0.9609375)  # order statistics 2 and 8: one trial each side may stray
    assert m["ttft_p50_ratio"] < 1  # the tier arm's median TTFT is below the one that recomputes
    tier, none = ev["proofs"]["tier"], ev["proofs"]["no_tier"]
    # sessions 2-4 found the 1024-token system prompt, the two resumed sessions their context, in the tier
    assert tier["tier_hit_tokens"] >= 6 * 5 * 1024 and tier["memory_hit_tokens"] == 0
    assert tier["tier_served_share"] >= 0.5 and tier["reusable_tokens"] > 0
    assert none["tier_hit_tokens"] == 0 and none["recomputed_tokens"] == none["prompt_tokens"]
    assert [p["first"] for p in ev["pairs"]] == (["tier", "no_tier"] * 5)[:9]  # the arm that goes first alternates
    cold_tier_proven(bundle, ev["arms"]["tier"], "odirect")
    d, home = setup[0], setup[1]
    vr = kvgate("verify", f"{bundle}.tar.gz", "--pubkey", home / "dev-signing.pub", home=home)
    assert vr.returncode == 0 and vr.stdout.startswith("OK "), vr.stdout + vr.stderr
    # re-derived offline from both arms' requests, counters, pool-device probe steps and engine logs: the same
    rep = kvgate("report", bundle, "--pubkey", home / "dev-signing.pub", "--out", d / "re-pass", home=home)
    assert rep.returncode == 0 and "verdicts: SAME as signed (overall PASS); 1 of 1 gates re-derived from raw " \
        "files" in rep.stdout, rep.stdout + rep.stderr


def test_a_tier_arm_whose_engine_memory_holds_the_working_set_is_invalid_not_pass(setup):
    # 32k tokens of engine memory hold the whole trace's working set (6144 tokens): the returning sessions find
    # their context in the engine, and the tier serves nothing
    r, _, result, v = run_gate(setup, "fits", {"informational": True}, engine_cache_tokens=32768, trials=1)
    assert v["outcome"] == "INVALID" and r.returncode != 0, v
    assert result["invalid_reason"].startswith("tier served the reuse"), result["invalid_reason"]
    assert result["evidence"]["proofs"]["tier"]["memory_hit_tokens"] > 0


def test_an_lmcache_ram_level_that_holds_the_working_set_is_invalid_naming_the_ram_level(setup):
    # LMCache's CPU level as large as the default profile's (0.5 GB, the whole trace's KV): the tier arm's hits are
    # served from the node's memory, and the device proof says so instead of crediting them to the tier
    r, _, result, v = run_gate(setup, "ram", {"informational": True}, trials=1,
                               lmcache_overrides={"local_cpu": True, "max_local_cpu_size": 0.5})
    assert v["outcome"] == "INVALID" and r.returncode != 0, v
    why = result["invalid_reason"]
    assert "read fraction" in why and "below 0.5" in why and "RAM level served" in why, why


def test_o_direct_requested_but_not_in_force_is_invalid_naming_the_fall_back(setup):
    # save_chunk_meta on: LMCache 0.5.6 turns O_DIRECT off with a warning and reads through the page cache
    r, _, result, v = run_gate(setup, "buffered", {"informational": True}, trials=1, lmcache_overrides={
        "extra_config": {"fs_connector_use_odirect": True, "save_chunk_meta": True}})
    assert v["outcome"] == "INVALID" and r.returncode != 0, v
    assert "Cannot use O_DIRECT" in result["invalid_reason"], result["invalid_reason"]


def test_the_capacity_curve_hands_the_reuse_from_engine_memory_to_ram_and_then_to_the_device(setup):
    d, home, inv = setup
    # exactly as the README's table runs it
    r, bundle, work = readme_run("g2-gain-capacity-cpu-reference.yaml", "localhost.yaml", d / "capacity",
                                 timeout=600, home=home)
    result = json.loads((bundle / "gates" / "G2-capacity" / "result.json").read_text())
    v = json.loads((bundle / "verdicts.json").read_text())["verdicts"][0]
    assert r.returncode == 0 and v["outcome"] == "PASS", (v["reason"], result["invalid_reason"], result["error"])
    ev = result["evidence"]
    assert {c["name"]: c["ok"] for c in ev["validity"]} == {
        "tier arm valid": True, "levels counted": True, "engine memory held the smallest working set": True}
    cap = ev["capacity"]
    curve = {c["label"]: c["figures"] for c in cap["curve"]}
    assert [(c["label"], c["sessions"]) for c in cap["curve"]] == [("x0.5", 1), ("x1", 2), ("x2", 4), ("x4", 8)]
    # three levels: up to engine memory (1024 tokens: two sessions of 512) the engine's own prefix cache serves
    # every returning context; at 2x (4 sessions) LMCache's RAM level (0.012 GB) does; at 4x it holds too little
    # for round-robin over 8 sessions and the pool's device serves every returning context, read with O_DIRECT
    for x in ("x0.5", "x1"):
        assert curve[x]["memory_hit_rate"] == 1.0 and curve[x]["ram_hit_rate"] == 0, (x, curve[x])
    assert curve["x2"]["memory_hit_rate"] == 0 and curve["x2"]["ram_hit_rate"] == 1.0, curve["x2"]
    assert curve["x4"]["memory_hit_rate"] == 0 and curve["x4"]["ram_hit_rate"] == 0, curve["x4"]
    assert curve["x4"]["tier_hit_rate"] == 1.0, curve["x4"]
    for x in ("x2", "x4"):
        assert curve[x]["recomputed_rate"] == 0 and curve[x]["goodput_rps"] > 0
    x4 = [p for p in cap["points"] if p["label"] == "x4"]
    assert x4 and all(p["device_read_bytes"] >= 0.5 * p["tier_hit_tokens"] * 6144 > 0 for p in x4), x4
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
    # the operator's engines keep LMCache's RAM level (the default profile's): this informational gate shows the
    # attach mechanics and turns the device proof off (allowed for an informational gate only), which it reports
    r, bundle, result, v = run_gate(
        setup, "attached", {"informational": True}, engine=str(profile), trials=2, pool_path=str(pool),
        pool_device=None, min_read_fraction=0,
        attach={"url": urls["tier"], "log": {"node": "cpu1", "run": f"cat {tier_log}"}},
        no_tier_attach={"url": urls["no_tier"], "log": {"node": "cpu1", "run": f"cat {plain_log}"}})
    assert r.returncode == 0 and v["outcome"] == "INFO", (v["reason"], result["invalid_reason"], result["error"])
    assert "(2 trials, no interval)" in v["reason"]
    ev = result["evidence"]
    assert {a: ev["arms"][a]["base_url"] for a in ("tier", "no_tier")} == urls
    assert ev["arms"]["tier"]["attached"] and ev["arms"]["no_tier"]["attached"]
    assert {c["name"]: c["ok"] for c in ev["validity"]} == {
        "tier arm valid": True, "no_tier arm valid": True, "tier arm: tier hits read from the pool": True,
        "tier served the reuse": True, "recomputed without the tier": True}
    tier, none = ev["proofs"]["tier"], ev["proofs"]["no_tier"]
    assert tier["tier_hit_tokens"] >= 2 * 5 * 1024 and none["tier_hit_tokens"] == 0
    assert none["recomputed_tokens"] == none["prompt_tokens"]
    # kvgate started and stopped nothing: both engines still serve after the run
    assert _healthy(urls["tier"]) and _healthy(urls["no_tier"])
