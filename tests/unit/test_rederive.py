"""What `kvgate report` re-derives from a bundle's raw files (harness.gates.reevaluate), case by case: every
workload has a re-deriver (or is a named gap), bounds come from the bundle's config/gates.yaml, an empty raw file
is an ERROR, engine logs are re-scanned, pool-device bytes re-parsed from the run's probe steps, and result.json's
``degraded`` key is read back."""

import json

import pytest
import yaml

from harness.gates.reevaluate import read_result, reevaluate_bundle
from harness.workloads import WORKLOADS
from load_bundle import FALLBACK_LINE, load_run

# The workloads whose verdict `kvgate report` still takes from result.json: none (g3-shared-read's re-deriver came
# with the G3 physics work). A new workload without a re-deriver fails this test until it has one or is named
# here; the set only ever shrinks.
KNOWN_GAPS: set[str] = set()


def test_registry_every_workload_has_a_rederiver_but_the_named_gaps():
    """Each registered workload carries its own re-deriver, beside its run and evaluator."""
    missing = {name for name, wl in WORKLOADS.items() if wl.rederive is None}
    assert missing == KNOWN_GAPS, f"no re-deriver: {sorted(missing - KNOWN_GAPS)}; now re-derived, drop from " \
                                  f"KNOWN_GAPS: {sorted(KNOWN_GAPS - missing)}"
    # each its own: no two workloads judged again by one function written for another
    assert len({wl.rederive for wl in WORKLOADS.values()}) == len(WORKLOADS)


def _config(run, **params):
    path = run / "config" / "gates.yaml"
    g = yaml.safe_load(path.read_text())
    g["gates"][0]["params"].update(params)
    path.write_text(yaml.safe_dump(g, sort_keys=False))


def _result(run):
    return json.loads((run / "gates" / "L" / "result.json").read_text())


def test_an_honest_load_bundle_re_derives_the_same_verdict_from_its_raw_files(tmp_path):
    run, pred = load_run(tmp_path, {"min_read_fraction": 0})
    re = reevaluate_bundle(run, pred)
    assert re.same, re.differences
    assert re.checks[0].rederived and re.rederived_text == "1 of 1 gates re-derived from raw files"


def test_bounds_from_config_a_read_fraction_of_0_5_in_config_beats_the_0_in_the_evidence(tmp_path):
    """The run's evidence records min_read_fraction 0 (tier hits with 0 device bytes pass); the bundle's own
    config/gates.yaml says 0.5: the re-derived verdict is judged on the config's bound, INVALID."""
    run, pred = load_run(tmp_path, {"min_read_fraction": 0})
    assert pred["overall"] == "PASS" and _result(run)["evidence"]["min_read_fraction"] == 0
    _config(run, min_read_fraction=0.5)
    re = reevaluate_bundle(run, pred)
    assert re.checks[0].reevaluated["outcome"] == "INVALID"
    assert "read fraction" in re.checks[0].reevaluated["reason"] and "0.5" in re.checks[0].reevaluated["reason"]
    assert "L: outcome signed 'PASS', re-evaluated 'INVALID'" in re.differences


def test_bounds_from_config_the_slo_the_evidence_records_is_not_the_one_judged(tmp_path):
    run, pred = load_run(tmp_path, {"min_read_fraction": 0})
    res = _result(run)
    res["evidence"]["ttft_slo_s"] = 1e-9  # every point would miss it: knee 0
    (run / "gates" / "L" / "result.json").write_text(json.dumps(res))
    re = reevaluate_bundle(run, pred)
    assert re.same, re.differences  # judged on config's 1.0 s, as the run was


def test_empty_requests_file_is_an_error_not_the_signed_figures(tmp_path):
    run, pred = load_run(tmp_path, {"min_read_fraction": 0})
    first = _result(run)["evidence"]["points"][0]["requests_file"]
    (run / "gates" / "L" / first).write_text("")
    re = reevaluate_bundle(run, pred)
    again = re.checks[0].reevaluated
    assert again["outcome"] == "ERROR" and f"gates/L/{first}: a load point's requests is empty" in again["reason"]
    assert not re.same


def test_missing_raw_file_is_an_error(tmp_path):
    run, pred = load_run(tmp_path, {"min_read_fraction": 0})
    (run / "gates" / "L" / "engine-load.log").unlink()
    again = reevaluate_bundle(run, pred).checks[0].reevaluated
    assert again["outcome"] == "ERROR" and "gates/L/engine-load.log: no such file" in again["reason"]


def test_engine_log_rescanned_a_degraded_mode_line_the_evidence_omits_is_invalid(tmp_path):
    run, pred = load_run(tmp_path, {"min_read_fraction": 0})
    log = run / "gates" / "L" / "engine-load.log"
    log.write_text(log.read_text() + FALLBACK_LINE)
    assert not _result(run)["evidence"]["fallback_lines"]
    again = reevaluate_bundle(run, pred).checks[0].reevaluated
    assert again["outcome"] == "INVALID"
    assert "the engine fell back in the load phase (LMCache fell back to re-compute)" in again["reason"]


def test_device_bytes_reparsed_from_the_probe_steps_not_taken_as_recorded(tmp_path):
    """The evidence claims the pool's device read 1 GB at every point; the run's pool-device probe steps say it
    read nothing: the re-derived accounting is the steps', and at config's 0.5 the points are INVALID."""
    run, pred = load_run(tmp_path, {"min_read_fraction": 0})
    _config(run, min_read_fraction=0.5)
    res = _result(run)
    for pt in res["evidence"]["points"]:
        pt["accounting"]["device_read_bytes"] = 10 ** 9
    (run / "gates" / "L" / "result.json").write_text(json.dumps(res))
    again = WORKLOADS["g2-load"].rederive(run / "gates" / "L", res, _params(run), {"bundle_dir": run})
    assert {pt.accounting.device_read_bytes for pt in again.evidence.points} == {0}
    assert again.invalid_reason is not None and "read fraction" in again.invalid_reason
    # the probe steps of the gate removed: the bytes cannot be re-derived, an ERROR
    for d in (run / "steps").glob("*-g2-pool-blockstat"):
        (d / "stdout").unlink()
        break
    assert reevaluate_bundle(run, pred).checks[0].reevaluated["outcome"] == "ERROR"


def _params(run):
    from harness.config import load_config
    cfg = load_config(run / "config" / "inventory.yaml", run / "config" / "gates.yaml", WORKLOADS)
    return cfg.params["L"]


def test_degraded_key_a_result_with_a_degraded_answer_is_read_back(tmp_path):
    p = tmp_path / "result.json"
    p.write_text(json.dumps({"metrics": {"ttft_faulted_p50_s": 0.5}, "evidence": {}, "invalid_reason": None,
                             "error": None, "degraded": "3 of 8 requests re-computed: the tier failed"}))
    assert read_result(p, "gates/F/result.json")["degraded"] == "3 of 8 requests re-computed: the tier failed"
    p.write_text(json.dumps({"metrics": {}, "evidence": {}, "degraded": 3}))
    with pytest.raises(Exception, match="degraded: expected a string or null"):
        read_result(p, "gates/F/result.json")
