"""What serving costs the drives (harness/endurance.py) and the inventory's drive rating (pool_drive)."""

import math

import pytest

from harness.config.loading import load_inventory
from harness.endurance import DriveRating, combined, endurance
from harness.errors import ConfigError

DRIVE = DriveRating(capacity_bytes=3_840_000_000_000, rated_dwpd=1.0, warranty_years=5.0)


def test_figures_from_counted_bytes():
    # 2 GB written while serving 4M prompt tokens, storing 1.6 GB of KV, over 100 s
    e = endurance(2_000_000_000, 4_000_000, 1_600_000_000, 100.0, DRIVE)
    assert e.write_bytes_per_mtok == pytest.approx(5e8)
    assert e.write_amplification == pytest.approx(1.25)
    assert e.store_write_gb_s == pytest.approx(0.02)
    # 20 MB/s x 86,400 s = 1.728 TB a day: 0.45 drive writes a day of a 3.84 TB drive
    assert e.drive_writes_per_day == pytest.approx(1.728e12 / 3.84e12)
    # its rating: 3.84 TB x 1 DWPD x 365 x 5 = 7,008 TB, at 1.728 TB a day: 4,055.6 days
    assert DRIVE.rated_write_bytes == pytest.approx(7.008e15)
    assert e.days_to_rating == pytest.approx(7.008e15 / 1.728e12)
    assert e.unknown == ()


def test_unmeasured_inputs_are_unknown_never_guessed():
    e = endurance(None, 1000, 10, 1.0, DRIVE)
    assert (e.write_bytes_per_mtok, e.write_amplification, e.store_write_gb_s, e.days_to_rating) == (None,) * 4
    assert any("no device write counters" in u for u in e.unknown)
    e = endurance(1000, 0, None, None)
    assert e.write_bytes_per_mtok is None and e.write_amplification is None and e.store_write_gb_s is None
    assert len(e.unknown) == 4  # tokens, stored bytes, window, drive: each named
    # nothing written: a drive that never wears out, said as such
    assert endurance(0, 1000, 1000, 10.0, DRIVE).days_to_rating == math.inf


def test_combined_sums_and_a_missing_part_makes_the_whole_unknown():
    a = endurance(100, 1000, 50, 1.0)
    b = endurance(300, 3000, 150, 3.0)
    c = combined([a, b], DRIVE)
    assert (c.device_write_bytes, c.served_tokens, c.stored_kv_bytes, c.window_s) == (400, 4000, 200, 4.0)
    assert c.write_bytes_per_mtok == pytest.approx(1e5) and c.write_amplification == pytest.approx(2.0)
    partial = combined([a, endurance(None, 3000, 150, 3.0)])
    assert partial.device_write_bytes is None and partial.write_bytes_per_mtok is None
    assert combined([a, endurance(300, 3000, None, 3.0)]).write_amplification is None


def _inventory(tmp_path, drive: str):
    p = tmp_path / "inv.yaml"
    p.write_text("nodes:\n  - name: n1\n    transport: local\n    pool_drive:\n" + drive)
    return p


def test_inventory_declares_the_pool_drive(tmp_path):
    inv = load_inventory(_inventory(tmp_path, "      capacity: 3.84 TB\n      rated_dwpd: 1\n"))
    r = inv.nodes[0].pool_drive.rating()
    assert (r.capacity_bytes, r.rated_dwpd, r.warranty_years) == (3_840_000_000_000, 1.0, 5.0)


@pytest.mark.parametrize("drive, line, field", [
    ("      capacity: 3840\n      rated_dwpd: 1\n", 5, "capacity"),
    ("      capacity: 3.84 TB\n      rated_dwpd: 0\n", 6, "rated_dwpd"),
    ("      capacity: 3.84 TB\n      rated_dwpd: 1\n      warranty_years: -1\n", 7, "warranty_years"),
    ("      capacity: 3.84 TB\n      rated_dwpd: 1\n      dwpd: 3\n", 7, "dwpd"),
])
def test_a_bad_drive_names_file_line_and_field(tmp_path, drive, line, field):
    p = _inventory(tmp_path, drive)
    with pytest.raises(ConfigError) as err:
        load_inventory(p)
    assert f"inv.yaml:{line}:" in str(err.value) and f"pool_drive.{field}" in str(err.value)


def _rec(i, start, latency, tokens=1000, error=None):
    from harness.engines.client import RequestRecord
    return RequestRecord(request_id=f"r{i}", prompt_tokens=tokens, queue_s=0.0, ttft_s=0.1, itl_s=(), latency_s=latency,
                         e2e_s=latency, output_chunks=1, output_text="x", http_status=200 if error is None else 500,
                         error=error, started_unix_s=start)


def test_g2_ttft_prices_the_re_compute_phase_that_stores():
    from harness.workloads.kit.base import PoolSnapshot
    from harness.workloads.kit.g2 import G2Evidence, recompute_endurance
    recs = [_rec(0, 100.0, 2.0), _rec(1, 102.0, 3.0), _rec(2, 105.0, 1.0, error="boom")]
    ev = G2Evidence(recompute_device_write_bytes=3_000_000, pool_drive=DRIVE.to_dict(),
                    pool_after_populate=PoolSnapshot(node="n", dir="/p", bytes=2_000_000, files=2,
                                                     expected_kv_bytes=2_000_000))
    e = recompute_endurance(recs, ev)
    # 2,000 tokens served (the failed request stored nothing), 100.0 .. 106.0 s: a 6 s window
    assert e["served_tokens"] == 2000 and e["window_s"] == pytest.approx(6.0)
    assert e["write_bytes_per_mtok"] == pytest.approx(1.5e9) and e["write_amplification"] == pytest.approx(1.5)
    assert e["store_write_gb_s"] == pytest.approx(0.0005) and e["drive"]["rated_dwpd"] == 1.0
    assert e["days_to_rating"] == pytest.approx(7.008e15 / (0.5e6 * 86400))
    # a pool that already held chunks: only what this run added is what it stored
    ev2 = ev.model_copy(update={"pool_after_populate": ev.pool_after_populate.model_copy(update={"bytes_added": 1_000_000})})
    assert recompute_endurance(recs, ev2)["write_amplification"] == pytest.approx(3.0)
    # no device counters: said, never guessed
    assert recompute_endurance(recs, G2Evidence())["write_bytes_per_mtok"] is None


def test_g2_load_points_sum_over_every_point_and_trial():
    from harness.workloads.kit.load import points_endurance, token_accounting
    from types import SimpleNamespace
    a = token_accounting(1000, 4000.0, None, None, None, None, 2_000_000, 4.0)
    b = token_accounting(1000, 6000.0, None, None, None, None, 3_000_000, 6.0)
    assert a.device_write_bytes_per_mtok == pytest.approx(5e8)
    e = points_endurance([SimpleNamespace(accounting=a), SimpleNamespace(accounting=b),
                          SimpleNamespace(accounting=None)], DRIVE)
    assert (e["device_write_bytes"], e["served_tokens"], e["window_s"]) == (5_000_000, 10_000.0, 10.0)
    assert e["write_bytes_per_mtok"] == pytest.approx(5e8) and e["store_write_gb_s"] == pytest.approx(5e-4)
    assert e["write_amplification"] is None and any("stored KV" in u for u in e["unknown"])
    assert points_endurance([SimpleNamespace(accounting=None)], DRIVE) is None


def test_pd_handoff_prices_the_producer_stores():
    from harness.workloads.pd_handoff import PdPrompt, pd_endurance
    ps = [PdPrompt(request_id="a", prompt_tokens=4000, producer_write_bytes=5_000_000, pool_bytes_added=4_000_000,
                   prefill_ttft_s=0.5, store_wait_s=0.5),
          PdPrompt(request_id="b", prompt_tokens=4000, producer_write_bytes=3_000_000, pool_bytes_added=4_000_000,
                   prefill_ttft_s=0.7, store_wait_s=0.3)]
    e = pd_endurance(ps, None)
    assert e["write_bytes_per_mtok"] == pytest.approx(1e9) and e["write_amplification"] == pytest.approx(1.0)
    assert e["store_write_gb_s"] == pytest.approx(0.004) and e["days_to_rating"] is None
    # one prompt whose producer side was not counted: the whole is unknown, not the half that was
    ps.append(PdPrompt(request_id="c", prompt_tokens=4000))
    assert pd_endurance(ps, DRIVE)["write_bytes_per_mtok"] is None


def test_the_report_table_shows_each_priced_gate_and_what_was_not_exposed():
    from harness.report.render import endurance_rows
    e = endurance(2_000_000_000, 4_000_000, 1_600_000_000, 100.0, DRIVE).to_dict()
    smart = {"exposed": False, "note": "not exposed: the device reports no data units at all"}
    rows = endurance_rows([{"gate_id": "G2", "workload": "g2-ttft", "evidence": {"endurance": e}},
                           {"gate_id": "G1", "workload": "fio-read", "evidence": {}},
                           {"gate_id": "KV", "workload": "kv-read",
                            "evidence": {"endurance": {**endurance(10, None, 10, None).to_dict(), "smart": smart}}}])
    assert [r["gate"] for r in rows] == ["G2", "KV"]
    t = rows[0]["text"]
    assert (t["per_mtok"], t["wa"], t["gb_s"], t["drive"], t["days"]) == \
        ("0.500 GB", "1.25 x", "0.0200 GB/s", "3.84 TB, 1 DWPD", "4,056")
    assert rows[0]["days_to_rating"] == pytest.approx(4055.555, rel=1e-6)
    assert rows[1]["text"]["smart"].startswith("not exposed") and rows[1]["text"]["per_mtok"] == "—"


def test_kvgate_plan_says_what_a_storing_gate_prices_and_which_drive(tmp_path):
    from harness.suite.plan import endurance_lines
    from harness.workloads import WORKLOADS
    inv = load_inventory(_inventory(tmp_path, "      capacity: 3.84 TB\n      rated_dwpd: 1\n      warranty_years: 3\n"))
    lines = endurance_lines(WORKLOADS["g2-ttft"].ENDURANCE, inv.nodes)
    assert "re-compute phase" in lines[0] and "/sys/dev/block/MAJ:MIN/stat" in lines[0]
    assert lines[1] == "    drive: n1: 3.84 TB, 1 DWPD over 3 years (days to its rating at the measured rate)"
    assert "none declared" in endurance_lines(WORKLOADS["r3-cross-instance"].ENDURANCE, [])[1]
    # a workload that stores no KV says nothing
    assert endurance_lines(WORKLOADS["fio-read"].ENDURANCE, inv.nodes) == []
    stores = {n for n, w in WORKLOADS.items() if w.ENDURANCE}
    assert stores == {"g2-ttft", "g2-answer", "g2-tenancy", "g2-load", "g2-gain", "pd-handoff", "r3-cross-instance",
                      "kv-read"}
