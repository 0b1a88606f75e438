"""g2-tenancy: the pure evaluator (a salt-blind tier FAILs, named; a tier that hits nothing cannot pass; an isolating
tier PASSes; failed requests are never dropped), and scripted runs through the workload on a tier that keys stored
prompts by the tenant's salt and one that does not (tests/doubles.py EngineServer)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import yaml

from harness.config import load_config
from harness.engines.client import RequestRecord
from harness.errors import ConfigError
from harness.gates.verdict import Outcome, evaluate
from harness.suite.plan import gate_plan, plan_mismatch
from harness.workloads import WORKLOADS
from harness.workloads.kit.base import PoolSnapshot
from harness.workloads.g2_tenancy import (PHASES, TenancyEvidence, TenancyPhase, evaluate_tenancy, salted,
                                          split_fresh)
from harness.engines.prompts import make_prompts
from doubles import EngineServer, engine_node, gate_context

ROOT = Path(__file__).resolve().parents[2]
# the scripted pool's two chunk files: tenant A's two 512-token prompts and the warm-up's, 16 KiB of KV a token
POOL_FILE_BYTES = 14 * 10 ** 6
KV = 2 * 1024 * 16384  # tenant A's two prompts of 1024 stored tokens, 16 KiB of KV a token


def rec(rid: str, ttft: float | None = 0.1, error: str | None = None) -> RequestRecord:
    return RequestRecord(request_id=rid, prompt_tokens=1026, queue_s=0.0, ttft_s=None if error else ttft, itl_s=(),
                         latency_s=None if error else ttft, e2e_s=None, output_chunks=0 if error else 2,
                         output_text="" if error else " t1 t2", http_status=None if error else 200, error=error)


def records(ttft: dict[str, float] | None = None, fail: tuple[str, str] | None = None) -> dict[str, list]:
    """Two answered requests a phase (TTFT by phase), one of them failed where ``fail`` = (phase, id) says."""
    ttft = ttft or {}
    out = {}
    for label, _ in PHASES:
        out[label] = [rec(f"{label}-{i}", ttft.get(label, 0.1),
                          "HTTP 500: engine core died" if fail == (label, f"{label}-{i}") else None) for i in range(2)]
    return out


def evidence(b_hit: float = 0, c_hit: float = 2048, c_read: int | None = KV, b_read: int | None = 0,
             store_hit: float = 0, pool_bytes: int = KV) -> TenancyEvidence:
    hits = {"store-a": store_hit, "cross-b": b_hit, "fresh-b": 0, "control-a": c_hit}
    reads = {"cross-b": b_read, "control-a": c_read}
    return TenancyEvidence(
        tenant_key="cache_salt", salts={"A": "kvgate-tenant-a-1", "B": "kvgate-tenant-b-1"}, tenant_a_kv_bytes=KV,
        kv_bytes_per_token=16384, pool_device="/dev/loop7", pool_device_maj_min="7:7",
        pool_after_populate=PoolSnapshot(node="n1", dir="/pool", bytes=pool_bytes, files=8, expected_kv_bytes=KV),
        phases=[TenancyPhase(phase=label, tenant=t, salt=f"s-{t}", hit_tokens=hits[label], query_tokens=2048,
                             device_read_bytes=reads.get(label)) for label, t in PHASES])


def judged(result):
    cfg = shipped_config()
    return evaluate(cfg.suite.gates[0], result, "count")


def shipped_config(tmp_path: Path | None = None):
    inv = ROOT / "inventory" / "localhost-vllm-cpu.yaml"
    return load_config(inv, ROOT / "gates" / "g2-tenancy-vllm-cpu.yaml", WORKLOADS)


def run_eval(ev: TenancyEvidence, recs=None, fallback=None):
    return evaluate_tenancy(recs or records(), ev, fallback=fallback, counters=True, device_reads=True,
                            min_hit_rate=0.95, min_read_fraction=0.5)


# ------------------------------------------------------------------------------------------ the evaluator


def test_a_tier_that_isolates_tenants_passes():
    res = run_eval(evidence())
    v = judged(res)
    assert v.outcome is Outcome.PASS, v.reason
    assert res.metrics["cross_tenant_hit_tokens"] == 0 and res.metrics["control_hit_rate"] == 1.0
    assert res.metrics["control_read_fraction"] == 1.0
    assert all(c.ok for c in res.evidence.validity), res.evidence.validity


def test_a_salt_blind_tier_fails_naming_the_connector_keys():
    res = run_eval(evidence(b_hit=2048, b_read=KV))
    v = judged(res)
    assert v.outcome is Outcome.FAIL
    assert "the connector's storage keys ignore cache_salt" in v.reason
    assert "tenant B (cache_salt 'kvgate-tenant-b-1') hit 2048 of 2048 prompt tokens" in v.reason
    assert res.metrics["cross_tenant_hit_rate"] == 1.0 and res.metrics["cross_tenant_device_read_bytes"] == KV
    assert next(c for c in res.evidence.validity if c.name == "isolated").ok is False


def test_one_leaked_token_is_a_fail():
    assert judged(run_eval(evidence(b_hit=128))).outcome is Outcome.FAIL


def test_a_tier_that_hits_nothing_cannot_pass():
    # nothing hits, not even tenant A's own prompts: isolation is unproven, INVALID
    res = run_eval(evidence(c_hit=0, c_read=0))
    v = judged(res)
    assert v.outcome is Outcome.INVALID
    assert v.reason.startswith("positive control:") and "0 of 2048 looked-up tokens hit" in v.reason


def test_a_control_served_from_memory_is_invalid():
    # the control hits, but the pool's device read nothing: the KV came from the engine's memory or a cache
    v = judged(run_eval(evidence(c_read=0)))
    assert v.outcome is Outcome.INVALID and v.reason.startswith("cold:"), v.reason


def test_prompts_that_were_not_new_are_invalid():
    v = judged(run_eval(evidence(store_hit=1024)))
    assert v.outcome is Outcome.INVALID and v.reason.startswith("new prompts:"), v.reason


def test_a_pool_that_stored_nothing_is_invalid():
    v = judged(run_eval(evidence(pool_bytes=0)))
    assert v.outcome is Outcome.INVALID and v.reason.startswith("populated:"), v.reason


def test_a_fall_back_in_the_engine_log_is_invalid():
    v = judged(run_eval(evidence(), fallback="the engine fell back in the tenancy phase (x): the tier was not used"))
    assert v.outcome is Outcome.INVALID and "fell back" in v.reason


def test_a_failed_request_is_an_error_naming_it():
    recs = records(fail=("cross-b", "cross-b-1"))
    res = run_eval(evidence(), recs)
    v = judged(res)
    assert v.outcome is Outcome.ERROR
    assert "1 of 8 requests failed (cross-b/cross-b-1); first: HTTP 500: engine core died" in v.reason
    assert res.evidence.failed_requests == 1
    assert next(p for p in res.evidence.phases if p.phase == "cross-b").failed == 1


def test_a_failed_request_is_named_beside_a_leak():
    recs = records(fail=("control-a", "control-a-0"))
    v = judged(run_eval(evidence(b_hit=2048), recs))
    assert v.outcome is Outcome.FAIL
    assert "ignore cache_salt" in v.reason and "(also: 1 of 8 requests failed (control-a/control-a-0)" in v.reason


def test_the_timing_probe_is_reported_not_judged():
    # tenant B's requests for A's prompts 5x faster than its fresh ones: a side channel, reported; still PASS on hits
    res = run_eval(evidence(), records({"cross-b": 0.02, "fresh-b": 0.1}))
    assert res.metrics["timing_probe_ratio"] == pytest.approx(0.2)
    assert judged(res).outcome is Outcome.PASS


def test_prompts_split_into_tenant_a_and_fresh_per_length_and_salted():
    prompts = make_prompts(0, [300, 400], 4, 1000)  # 2 a length, doubled
    mine, fresh = split_fresh(prompts, 2, 2)
    assert [p.request_id for p in mine] == ["s0-n300-i0", "s0-n300-i1", "s0-n400-i0", "s0-n400-i1"]
    assert [p.request_id for p in fresh] == ["s0-n300-i2", "s0-n300-i3", "s0-n400-i2", "s0-n400-i3"]
    b = salted(mine, "cache_salt", "salt-b", "b")
    assert b[0].payload("m")["cache_salt"] == "salt-b" and b[0].prompt == mine[0].prompt
    assert b[0].request_id == "s0-n300-i0-b"


# ------------------------------------------------------------------------------------------ validation


def tenancy_config(tmp_path: Path, tenant_key: bool = True, hit_metrics: bool = True, **params):
    """The g2-tenancy gate on the cpu-reference engine (token-id prompts) with a tenant key declared, one local node."""
    prof = yaml.safe_load((ROOT / "workloads" / "engines" / "cpu-reference.yaml").read_text())
    if tenant_key:
        prof["tenant_key"] = {"field": "cache_salt"}
    if not hit_metrics:
        del prof["hit_metrics"]
    (tmp_path / "cpu-reference-salted.yaml").write_text(yaml.safe_dump(prof))
    gate = {"id": "T", "title": "tenancy", "workload": "g2-tenancy", "metric": "cross_tenant_hit_tokens",
            "pass": "<= 0 count",
            "params": {"engine": str(tmp_path / "cpu-reference-salted.yaml"), "prompt_tokens": [512],
                       "prompts_per_length": 2, "python": "/engine/bin/python", "port": 18000,
                       "populate_timeout_s": 1, **params}}
    (tmp_path / "g.yaml").write_text(yaml.safe_dump({"suite": {"name": "t", "version": "1"}, "gates": [gate]}))
    (tmp_path / "i.yaml").write_text(yaml.safe_dump({"nodes": [{"name": "n1", "transport": "local",
                                                                "work_dir": "/w"}]}))
    return load_config(tmp_path / "i.yaml", tmp_path / "g.yaml", WORKLOADS)


def test_a_profile_without_a_tenant_key_is_refused_at_validation(tmp_path):
    with pytest.raises(ConfigError) as exc:
        tenancy_config(tmp_path, tenant_key=False)
    assert "no tenant_key" in str(exc.value) and "g.yaml" in str(exc.value)


def test_a_profile_without_hit_counters_is_refused_at_validation(tmp_path):
    with pytest.raises(ConfigError) as exc:
        tenancy_config(tmp_path, hit_metrics=False)
    assert "no hit_metrics" in str(exc.value)


def test_attach_is_refused(tmp_path):
    with pytest.raises(ConfigError) as exc:
        tenancy_config(tmp_path, attach={"url": "http://127.0.0.1:1", "restart": []}, pool_path="/p")
    assert "attach" in str(exc.value)


def test_the_shipped_vllm_gate_validates_and_its_profile_declares_cache_salt():
    cfg = shipped_config()
    assert cfg.params["G2-tenancy"].engine == "vllm-cpu-disk"


# ------------------------------------------------------------------------------------------ scripted runs


def scripted_run(tmp_path: Path, salt_field: str | None, **params):
    cfg = tenancy_config(tmp_path, **params)
    engine = EngineServer(salt_field=salt_field)
    node = engine_node("n1", engine=engine, pool=(POOL_FILE_BYTES,) * 2)
    ctx = gate_context(tmp_path / "run", cfg, "T", transports={"n1": node}, http=httpx.MockTransport(engine))
    return cfg, node, ctx, WORKLOADS["g2-tenancy"]().run(ctx)


def test_a_scripted_salt_blind_tier_fails_and_an_isolating_one_passes(tmp_path):
    for salt_field, outcome in ((None, Outcome.FAIL), ("cache_salt", Outcome.PASS)):
        d = tmp_path / str(salt_field)
        d.mkdir()
        cfg, node, ctx, res = scripted_run(d, salt_field)
        v = evaluate(cfg.suite.gates[0], res, "count")
        assert v.outcome is outcome, (v.reason, res.error)
        ev = res.evidence
        assert [p.phase for p in ev.phases] == ["store-a", "cross-b", "fresh-b", "control-a"]
        assert res.metrics["control_hit_rate"] == 1.0 and ev.salts["A"] != ev.salts["B"]
        # every phase's requests were sent with its tenant's salt, and kept on disk
        for label, tenant in PHASES:
            lines = (ctx.gate_dir / f"requests-{label}.jsonl").read_text().splitlines()
            assert len(lines) == 2 and all(json.loads(x)["error"] is None for x in lines)
        # what storing tenant A's prompts cost the drive: the device's writes from store-a's probe to cross-b's
        # (the scripted device writes nothing), the prompt tokens store-a served, the KV the pool held
        e = ev.endurance
        assert e["device_write_bytes"] == ev.store_device_write_bytes == 0 and e["served_tokens"] == 2 * 512
        assert e["stored_kv_bytes"] == ev.pool_after_populate.bytes
        if outcome is Outcome.FAIL:
            assert "the connector's storage keys ignore cache_salt" in v.reason
            assert res.metrics["cross_tenant_hit_tokens"] == 1024


def test_a_scripted_run_sends_exactly_the_planned_commands_with_restarts(tmp_path):
    cfg, node, ctx, res = scripted_run(tmp_path, "cache_salt", restart_between=True)
    assert res.error is None, res.error
    planned = [s for s in gate_plan(cfg, cfg.suite.gates[0]) if s.node == "n1"]
    assert plan_mismatch(planned, node.commands) is None, plan_mismatch(planned, node.commands)
    # one engine start a tenant switch: store-a, cross-b (fresh-b too), control-a
    assert sum(1 for argv in node.commands if any(a.endswith("/cpu_reference.py") for a in argv)) == 3
    # kvgate report re-scans each start's log (engine-store-a.log, engine-cross-b.log, engine-control-a.log)
    recorded = json.loads(json.dumps(res.as_dict(), default=str))
    for label in ("store-a", "cross-b", "control-a"):
        (ctx.gate_dir / f"engine-{label}.log").write_text("INFO engine ready\n")
    again = WORKLOADS["g2-tenancy"].rederive(ctx.gate_dir, recorded, cfg.params["T"], {"bundle_dir": tmp_path / "run"})
    assert (again.metrics, again.invalid_reason) == (res.metrics, None)
    (ctx.gate_dir / "engine-control-a.log").write_text("System will operate in degraded mode (recompute)\n")
    again = WORKLOADS["g2-tenancy"].rederive(ctx.gate_dir, recorded, cfg.params["T"], {"bundle_dir": tmp_path / "run"})
    assert again.invalid_reason.startswith("no fall-back: the engine fell back in the control-a phase")


def test_kvgate_report_re_derives_the_run_from_its_raw_files(tmp_path):
    for salt_field in (None, "cache_salt"):
        d = tmp_path / str(salt_field)
        d.mkdir()
        cfg, node, ctx, res = scripted_run(d, salt_field)
        (ctx.gate_dir / "engine-tenancy.log").write_text("INFO engine ready\n")  # the scripted node prints none
        recorded = json.loads(json.dumps(res.as_dict(), default=str))
        again = WORKLOADS["g2-tenancy"].rederive(ctx.gate_dir, recorded, cfg.params["T"], {"bundle_dir": d / "run"})
        assert (again.metrics, again.failed_check, again.invalid_reason, again.error) == \
            (res.metrics, res.failed_check, res.invalid_reason, res.error)
        assert again.metrics["control_device_read_bytes"] > 0  # re-parsed from the run's probe steps
    # the isolating run's log re-scanned: a fall-back line the run's summary does not show is found again
    (ctx.gate_dir / "engine-tenancy.log").write_text("System will operate in degraded mode (recompute)\n")
    again = WORKLOADS["g2-tenancy"].rederive(ctx.gate_dir, recorded, cfg.params["T"], {"bundle_dir": d / "run"})
    assert again.invalid_reason.startswith("no fall-back: the engine fell back in the tenancy phase")
    # a phase's raw records gone: the re-derivation cannot stand on the recorded figures
    (ctx.gate_dir / "requests-cross-b.jsonl").unlink()
    with pytest.raises(Exception, match="requests-cross-b.jsonl"):
        WORKLOADS["g2-tenancy"].rederive(ctx.gate_dir, recorded, cfg.params["T"], {"bundle_dir": d / "run"})
