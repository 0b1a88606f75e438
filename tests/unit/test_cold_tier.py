"""The serving gates' tier is the pool's device, never the node's memory: the loop pool's and the cold regime's
parsers on captured output, the accounting by level, the proof a gate may not lower, the in-force log line."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from harness.config import load_config
from harness.config.loading import MIN_READ_FRACTION
from harness.engines import load_profile
from harness.engines.load import LoadPoint
from harness.engines.profiles import EngineProfile
from harness.errors import ConfigError
from harness.parsers.poolloop import EvictWindow, cold_window_issue, evict_window, mark_argv, parse_evict_log, \
    parse_loop_pool, parse_mark_made
from harness.workloads import WORKLOADS
from harness.workloads.kit.engine import LogMark
from harness.workloads.kit.load import G2LoadEvidence, PointTrial, evaluate_load, point_invalid, token_accounting
from harness.workloads.kit.phases import EngineLog, first_fallback

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "pooldev"


def test_the_loop_pool_line_names_the_device_its_numbers_and_direct_io():
    # captured from the make command on this machine (losetup 2.38, ext4)
    pool = parse_loop_pool("kvgate-pool-loop /dev/loop0 7:0 1\n")
    assert (pool.device, pool.maj_min, pool.direct_io) == ("/dev/loop0", "7:0", True)
    assert parse_loop_pool("mke2fs noise\nkvgate-pool-loop /dev/loop12 7:12 0\n").direct_io is False
    for bad in ("", "kvgate-pool-loop /dev/sda 8:0 1", "kvgate-pool-loop /dev/loop0 1"):
        with pytest.raises(ValueError):
            parse_loop_pool(bad)


def test_the_evictors_log_of_a_real_vllm_gain_run_sums_its_evictions_and_dropped_pages():
    # the evictor's log beside vllm serve + ExampleConnector (2 trials of gates/g2-gain-vllm-cpu.yaml)
    s = parse_evict_log((FIX / "pool-evict-vllm-example-connector.jsonl").read_text())
    assert s.ended and s.errors == 0
    assert s.evictions == 316 and s.files == 36
    assert s.dropped_bytes > 100e6  # pages that would have served the read-backs from RAM
    # killed before its summary (or a torn last line): not ended, the rest still counted
    torn = "\n".join((FIX / "pool-evict-vllm-example-connector.jsonl").read_text().splitlines()[:10]) + '\n{"type": "ev'
    t = parse_evict_log(torn)
    assert not t.ended and t.evictions == 9


def test_a_read_before_its_store_was_dropped_is_the_breach_of_the_point_whose_mark_follows_it():
    # the real evictor's log (harness/node/pool_evict.py, held by SIGSTOP while a store landed and was read back,
    # then a store read after its eviction): the breach is the first point's, none is the second's
    text = (FIX / "pool-evict-breach.jsonl").read_text()
    first = evict_window(text, "x2-t1", made_unix_s=1796458320.270797)
    assert (first.breaches, first.pending_at_mark, first.error) == (1, 1, None)
    assert first.first_breach.endswith("/abc/model.layers.0.safetensors")
    assert first.lag_s == pytest.approx(0.00083, abs=1e-4)
    assert evict_window(text, "x4-t1").breaches == 0 and evict_window(text, "x4-t1").lag_s is None
    assert evict_window(text, "x8-t1") is None  # not logged (yet): no answer, not "no breach"
    assert evict_window(text.split('{"type": "mark", "t": 1796458320')[0], "x2-t1") is None
    s = parse_evict_log(text)
    assert s.ended and s.breaches == 1 and s.stores == 4  # two stores, each dropped at once and once more
    assert "1 read(s) of pool files came before the evictor had dropped their store (first: " \
           "model.layers.0.safetensors; it logged the point's mark 0.0 s after" in cold_window_issue(first)
    assert cold_window_issue(evict_window(text, "x4-t1")) is None and cold_window_issue(None) is None
    argv = mark_argv("/pool", "x2-t1")
    assert argv[-1] == "/pool/.kvgate-mark-x2-t1" and parse_mark_made("1796458320.270797250\n") == 1796458320.270797250
    with pytest.raises(ValueError):
        parse_mark_made("sh: 1: cannot create /pool/.kvgate-mark-x: Read-only file system\n")


def _fig(**kw) -> LoadPoint:
    base = dict(requests=4, ok=4, failed=0, duration_s=2.0, ttft_p50_s=0.1, ttft_p90_s=0.1, ttft_p95_s=0.1,
                ttft_p99_s=0.1, tpot_p50_s=0.01, e2e_p50_s=0.2, e2e_p99_s=0.3, request_rate_rps=2.0,
                output_token_rate_tps=8.0, goodput_rps=2.0, client_lag_p99_s=0.0)
    return LoadPoint(**{**base, **kw})


def test_a_breach_makes_the_point_invalid_and_justifies_setting_its_attempt_aside_a_window_without_one_does_not():
    acc = token_accounting(10_000, 10_000.0, 0.0, 8_000.0, 2048, 2048 * 600, 0, 2.0)  # read fraction 0.075
    behind = EvictWindow(name="x2-t1", made_unix_s=10.0, seen_unix_s=18.0, breaches=12,
                         first_breach="/p/a/model.layers.0.safetensors")
    kept = EvictWindow(name="x2-t1-a1", made_unix_s=30.0, seen_unix_s=30.01)
    why = point_invalid(_fig(), acc, 0.25, 0.5, True, cold=behind)
    assert why.startswith("the cold regime fell behind: 12 read(s)") and "8.0 s after" in why
    assert "read fraction 0.0750" in point_invalid(_fig(), acc, 0.25, 0.5, True, cold=kept)
    # the proof switched off (min_read_fraction 0, or a profile whose reads are not the device's): no claim made
    assert point_invalid(_fig(), acc, 0.25, 0.0, True, cold=behind) is None

    def pt(attempt: int, cold: EvictWindow | None) -> PointTrial:
        return PointTrial(label="x2", load=1.0, load_kind="trace", trial=1, attempt=attempt, seed=1, requests=4,
                          requests_file=f"r-{attempt}.jsonl", figures=_fig(), cold=cold)

    def judge(spoiled, points):
        ev = G2LoadEvidence(max_client_lag_p99_s=0.25, repeat_spoiled=1, spoiled=spoiled)
        return evaluate_load(points, "closed", 1.0, evidence=ev).invalid_reason

    assert judge([pt(0, behind)], [pt(1, kept)]) is None
    # set aside with a window that shows no breach (or none at all), on time: set aside without cause
    assert "set aside without cause" in judge([pt(0, kept)], [pt(1, kept)])
    assert "set aside without cause" in judge([pt(0, None)], [pt(1, None)])


def test_accounting_splits_the_tiers_hits_into_ram_and_device_and_prices_writes_per_million_tokens():
    acc = token_accounting(10_000, 10_000.0, 0.0, 8_000.0, 6144, 6144 * 2_000, 50_000_000, 2.0, ram_delta=6_000.0)
    assert acc.ram_hit_tokens == 6_000 and acc.device_hit_tokens == 2_000
    assert acc.device_hit_share_of_tier == pytest.approx(0.25)
    assert acc.read_fraction == pytest.approx(0.25)
    assert acc.device_write_bytes_per_mtok == pytest.approx(5e9)
    fig = LoadPoint(requests=4, ok=4, failed=0, duration_s=2.0, ttft_p50_s=0.1, ttft_p90_s=0.1, ttft_p95_s=0.1,
                    ttft_p99_s=0.1, tpot_p50_s=0.01, e2e_p50_s=0.2, e2e_p99_s=0.3, request_rate_rps=2.0,
                    output_token_rate_tps=8.0, goodput_rps=2.0, client_lag_p99_s=0.0)
    why = point_invalid(fig, acc, 0.25, 0.5, True)
    assert why is not None and "read fraction 0.2500 is below 0.5" in why and "RAM level served 6000" in why


def gates_of(path: Path) -> list[dict]:
    return (yaml.safe_load(path.read_text()) or {}).get("gates", [])


@pytest.mark.parametrize("path", sorted((ROOT / "gates").glob("*.yaml")), ids=lambda p: p.name)
def test_no_shipped_gate_lowers_the_device_proof_unless_it_only_informs(path):
    for g in gates_of(path):
        mrf = (g.get("params") or {}).get("min_read_fraction")
        assert mrf is None or mrf >= MIN_READ_FRACTION or g.get("informational"), (path.name, g["id"], mrf)


def write_gate(tmp_path: Path, params: dict, informational: bool = False) -> tuple[Path, Path]:
    """The shipped cpu-reference gain gate with ``params`` changed, and a local inventory."""
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump({"nodes": [{"name": "n1", "transport": "local", "read_streams": 1,
                                              "work_dir": str(tmp_path / "w")}]}))
    suite = yaml.safe_load((ROOT / "gates" / "g2-gain-cpu-reference.yaml").read_text())
    gate = suite["gates"][0]
    gate["params"].update(params)
    if informational:
        gate["informational"] = True
    gates = tmp_path / "gates.yaml"
    gates.write_text(yaml.safe_dump(suite, sort_keys=False))
    return inv, gates


def test_a_gate_lowering_min_read_fraction_is_refused_with_file_line_and_field(tmp_path):
    inv, gates = write_gate(tmp_path, {"min_read_fraction": 0})
    with pytest.raises(ConfigError) as e:
        load_config(inv, gates, WORKLOADS)
    msg = str(e.value)
    assert f"{gates}:" in msg and "gates[0].params.min_read_fraction" in msg and "below 0.5" in msg
    inv, gates = write_gate(tmp_path, {"min_read_fraction": 0}, informational=True)
    load_config(inv, gates, WORKLOADS)  # an informational gate reports, never decides: allowed
    inv, gates = write_gate(tmp_path, {"pool_device": {"kind": "loop", "size": "1 MiB"}})
    with pytest.raises(ConfigError, match="below 64 MiB"):
        load_config(inv, gates, WORKLOADS)


def log(text: str | None) -> EngineLog:
    return EngineLog(since=LogMark(1, ""), end=LogMark(1, text))


def test_a_cold_regime_whose_in_force_line_is_missing_makes_the_gate_invalid_naming_it():
    prof = load_profile("cpu-reference-odirect")
    assert prof.cold_regime == "odirect" and prof.in_force_log
    on = "LMCache INFO: Initialized FSConnector with base paths [...], use O_DIRECT: True (fs_connector.py)\n"
    off = "LMCache WARNING: Cannot use O_DIRECT if save_chunk_meta enabled.\n" \
          "LMCache INFO: Initialized FSConnector ..., use O_DIRECT: False\n"
    assert first_fallback({"e": log(on)}, prof.fallback_patterns, lambda n: "tier", prof.in_force_log)[0] is None
    why, found = first_fallback({"e": log(off)}, prof.fallback_patterns, lambda n: "tier", prof.in_force_log)
    assert why is not None and "O_DIRECT" in why
    why, _ = first_fallback({"e": log("LMCache INFO: use O_DIRECT: False\n")}, prof.fallback_patterns,
                            lambda n: "tier", prof.in_force_log)
    assert why is not None and "use O_DIRECT: True" in why and "not in force" in why
    why, _ = first_fallback({"e": log(None)}, (), lambda n: "tier", prof.in_force_log)  # no log: not proven
    assert why is not None


def test_an_odirect_profile_must_name_the_log_line_that_proves_it():
    data = load_profile("cpu-reference-odirect").model_dump(by_alias=True, exclude_unset=True)
    data["in_force_log"] = []
    with pytest.raises(ValueError, match="in_force_log"):
        EngineProfile.model_validate(data)


@pytest.mark.parametrize("name", ["vllm-cpu-disk", "vllm-cpu-tiered"])
def test_the_page_cache_connectors_declare_the_evicting_cold_regime(name):
    assert load_profile(name).cold_regime == "evict"


def test_hit_efficiency_is_the_cache_served_share_over_the_traces_ideal_per_trial():
    from harness.workloads.kit.load import PointTrial, TraceInfo, hit_efficiency_per_trial
    trace = TraceInfo(path="t.jsonl", format="mooncake", block_tokens=256, tokens_per_block=256, time_scale=1.0,
                      requests=12, duration_s=2.0, sha256="0" * 64, unbounded_hit_rate=0.8)

    def pt(trial: int, memory: float, tier: float | None) -> PointTrial:
        acc = token_accounting(1000, 1000.0, memory, tier, 6144, None, None, 1.0)
        return PointTrial(label="trace", load=1.0, load_kind="trace", trial=trial, seed=1, requests=12,
                          requests_file=f"r{trial}.jsonl", accounting=acc)
    # trial 1: the tier served 0.6 of 0.8 offered (0.75); trial 2: memory and tier together all of it
    assert hit_efficiency_per_trial([pt(1, 0.0, 600.0), pt(2, 200.0, 600.0)], trace) == [
        pytest.approx(0.75), pytest.approx(1.0)]
    assert hit_efficiency_per_trial([pt(1, 0.0, None)], trace) == []  # tier hits not counted: no figure
    assert hit_efficiency_per_trial([pt(1, 0.0, 600.0)], None) == []
