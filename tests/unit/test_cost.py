"""Costing model arithmetic, checked against hand-computed numbers."""

import math

import numpy as np
import pytest

from harness.cost import model as cost
from harness.engines import kv
from harness.report.render import to_csv_bytes

LLAMA3_70B = {
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "hidden_size": 8192,
    "torch_dtype": "bfloat16",
}
DEEPSEEK_V3 = {
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "hidden_size": 7168,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
    "torch_dtype": "bfloat16",
}

# A point small enough to compute by hand: 1 GB of KV per session, 10 s re-compute, 1 s read-back on one GPU,
# $1 per GPU-second, so a hit saves 9 GPU-s = $9; 10 sessions/day kept 3 days = 30 GB = 0.03 TB at
# $1000/TB-month = $30/month; 10 x 30 x 0.5 = 150 revisits/month.
HAND = {
    "kv_bytes_per_token": 1e6,
    "context_tokens": 1000.0,
    "gpus_per_instance": 1.0,
    "prefill_tokens_per_s_per_gpu": 100.0,
    "per_gpu_read_gb_s": 1.0,
    "readback_fixed_s": 0.0,
    "decode_tokens_per_session": 0.0,
    "decode_tokens_per_s_per_gpu": 1.0,
    "gpu_usd_per_hour": 3600.0,
    "storage_usd_per_tb_month": 1000.0,
    "sessions_per_day": 10.0,
    "revisit_rate": 0.5,
    "hit_rate": 0.5,
    "retention_days": 3.0,
    "capacity_overhead_ratio": 0.0,
}


def test_gqa_llama3_70b_kv_bytes_per_token_and_128k_session():
    arch = kv.arch_from_config(LLAMA3_70B, name="llama-3-70b")
    assert arch.attention == "gqa"
    assert (arch.num_layers, arch.num_kv_heads, arch.head_dim, arch.dtype_bytes) == (80, 8, 128, 2)
    assert arch.kv_bytes_per_token == 327_680
    out = cost.evaluate({**HAND, "kv_bytes_per_token": arch.kv_bytes_per_token, "context_tokens": 131_072})
    assert out["kv_bytes_per_session"] == 42_949_672_960  # 40 GiB, "about 40 GB"


def test_mla_deepseek_v3_caches_latent_plus_rope_key_only():
    arch = kv.arch_from_config(DEEPSEEK_V3)
    assert arch.attention == "mla"
    assert arch.kv_bytes_per_token == 61 * (512 + 64) * 2 == 70_272
    assert "kv_lora_rank" in arch.formula()


def test_mha_defaults_kv_heads_to_heads_and_head_dim_to_hidden_over_heads():
    arch = kv.arch_from_config(
        {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64, "torch_dtype": "float32"}
    )
    assert (arch.num_kv_heads, arch.head_dim) == (4, 16)
    assert arch.kv_bytes_per_token == 2 * 4 * 16 * 2 * 4


def test_kv_dtype_override_and_explicit_head_dim():
    cfg = {**LLAMA3_70B, "head_dim": 256}
    assert kv.arch_from_config(cfg, kv_dtype="fp8").kv_bytes_per_token == 80 * 8 * 256 * 2 * 1


@pytest.mark.parametrize(
    "patch, field",
    [
        ({"num_hidden_layers": 0}, "num_hidden_layers"),
        ({"num_hidden_layers": "80"}, "num_hidden_layers"),
        ({"torch_dtype": "bfloat17"}, "torch_dtype"),
        ({"num_key_value_heads": 7}, "num_key_value_heads"),
        ({"hidden_size": 8193}, "hidden_size"),
    ],
)
def test_bad_config_names_the_field(patch, field):
    with pytest.raises(kv.ArchError) as err:
        kv.arch_from_config({**LLAMA3_70B, **patch})
    assert err.value.field == field


def test_mla_without_rope_dim_is_an_error():
    cfg = dict(DEEPSEEK_V3)
    del cfg["qk_rope_head_dim"]
    with pytest.raises(kv.ArchError, match="qk_rope_head_dim"):
        kv.arch_from_config(cfg)


def test_hand_computed_session_and_fleet_numbers():
    out = {k: float(v) for k, v in cost.evaluate(HAND).items()}
    assert out["kv_bytes_per_session"] == 1e9
    assert out["recompute_s"] == pytest.approx(10.0)
    assert out["readback_s"] == pytest.approx(1.0)
    assert out["readback_speedup"] == pytest.approx(10.0)
    assert out["recompute_usd"] == pytest.approx(10.0)
    assert out["readback_usd"] == pytest.approx(1.0)
    assert out["saved_usd_per_hit"] == pytest.approx(9.0)
    assert out["capacity_tb"] == pytest.approx(0.03)
    assert out["storage_usd_per_month"] == pytest.approx(30.0)
    assert out["revisits_per_month"] == pytest.approx(150.0)
    assert out["hits_per_month"] == pytest.approx(75.0)
    assert out["gpu_hours_saved_per_month"] == pytest.approx(75 * 9 / 3600)
    assert out["net_usd_per_month"] == pytest.approx(75 * 9 - 30)
    # work without tier: 1.5 visits x 10 GPU-s = 15; with: 10 + 0.5 x (0.5 x 1 + 0.5 x 10) = 12.75
    assert out["throughput_gain"] == pytest.approx(15 / 12.75 - 1)


def test_break_even_hit_rate_gives_zero_net_saving():
    be = float(cost.evaluate(HAND)["break_even_hit_rate"])
    assert be == pytest.approx(30 / (150 * 9))  # = 1/45
    at_be = cost.evaluate({**HAND, "hit_rate": be})
    assert float(at_be["net_usd_per_month"]) == pytest.approx(0.0, abs=1e-9)
    assert float(cost.evaluate({**HAND, "hit_rate": be * 0.9})["net_usd_per_month"]) < 0
    assert float(cost.evaluate({**HAND, "hit_rate": be * 1.1})["net_usd_per_month"]) > 0


def test_multi_gpu_instance_reads_shards_in_parallel_and_waits_on_all_gpus():
    out = cost.evaluate({**HAND, "gpus_per_instance": 4.0})
    assert float(out["readback_s"]) == pytest.approx(0.25)
    assert float(out["readback_gpu_s"]) == pytest.approx(1.0)
    assert float(out["recompute_s"]) == pytest.approx(2.5)
    assert float(out["recompute_gpu_s"]) == pytest.approx(10.0)


def test_fixed_readback_overhead_and_capacity_overhead():
    out = cost.evaluate({**HAND, "readback_fixed_s": 0.5, "capacity_overhead_ratio": 0.2})
    assert float(out["readback_s"]) == pytest.approx(1.5)
    assert float(out["capacity_tb"]) == pytest.approx(0.036)


def test_measured_timing_uses_ttfts_not_formulas():
    out = cost.evaluate({**HAND, "readback_ttft_s": 11.85, "recompute_ttft_s": 149.31}, timing="measured")
    assert float(out["readback_speedup"]) == pytest.approx(12.6, rel=1e-3)
    assert float(out["saved_gpu_s_per_hit"]) == pytest.approx(149.31 - 11.85)
    with pytest.raises(KeyError, match="readback_ttft_s"):
        cost.evaluate(HAND, timing="measured")


def test_no_saving_per_hit_means_no_break_even():
    out = cost.evaluate({**HAND, "per_gpu_read_gb_s": 0.1})  # read-back 10 s == re-compute 10 s
    assert math.isinf(float(out["break_even_hit_rate"]))
    assert float(out["net_usd_per_month"]) == pytest.approx(-30.0)


def test_vectorized_sweep_equals_point_by_point():
    rng = np.random.default_rng(7)
    n = 50
    arrays = {k: np.full(n, v) for k, v in HAND.items()}
    arrays["hit_rate"] = rng.uniform(0, 1, n)
    arrays["per_gpu_read_gb_s"] = rng.uniform(0.5, 20, n)
    arrays["context_tokens"] = rng.uniform(100, 200_000, n)
    vec = cost.evaluate(arrays)
    for i in range(n):
        point = cost.evaluate({k: v[i] for k, v in arrays.items()})
        for name in cost.OUTPUTS:
            assert float(vec[name][i]) == pytest.approx(float(point[name]), rel=1e-12), name


def test_grid_broadcasting_shape():
    out = cost.sweep(HAND, {"hit_rate": np.linspace(0, 1, 11)[None, :], "gpu_usd_per_hour": np.array([[1.0], [2.0]])})
    assert out["net_usd_per_month"].shape == (2, 11)


def test_tornado_orders_by_swing_and_reports_low_high():
    ranges = {"hit_rate": (0.0, 1.0), "storage_usd_per_tb_month": (500.0, 1500.0), "decode_tokens_per_session": (0, 10)}
    t = cost.tornado(HAND, ranges)
    assert list(t["input"]) == ["hit_rate", "storage_usd_per_tb_month", "decode_tokens_per_session"]
    hit = t.iloc[0]
    assert hit["metric_at_low"] == pytest.approx(-30.0)  # no hits, storage still paid
    assert hit["metric_at_high"] == pytest.approx(150 * 9 - 30)
    assert hit["metric_at_base"] == pytest.approx(75 * 9 - 30)
    assert t.iloc[2]["swing"] == 0.0


def test_default_ranges_clip_rates():
    r = cost.default_ranges({"hit_rate": 0.9, "sessions_per_day": 100.0}, ["hit_rate", "sessions_per_day"], 0.5)
    assert r["hit_rate"] == (0.45, 1.0)
    assert r["sessions_per_day"] == (50.0, 150.0)


def test_break_even_curve_rises_with_storage_price_and_falls_with_gpu_price():
    curve = cost.break_even_curve(HAND, np.array([500.0, 1000.0, 2000.0]), [1800.0, 3600.0])
    cheap_gpu = curve[curve.gpu_usd_per_hour == 1800.0].break_even_hit_rate.to_numpy()
    dear_gpu = curve[curve.gpu_usd_per_hour == 3600.0].break_even_hit_rate.to_numpy()
    assert dear_gpu[1] == pytest.approx(1 / 45)
    assert np.all(np.diff(dear_gpu) > 0)
    assert np.allclose(cheap_gpu, 2 * dear_gpu)


def test_csv_bytes_are_stable_and_plain():
    t = cost.tornado(HAND, {"hit_rate": (0.0, 1.0)})
    a, b = to_csv_bytes(t, "%.10g"), to_csv_bytes(cost.tornado(dict(HAND), {"hit_rate": (0.0, 1.0)}), "%.10g")
    assert a == b
    assert b"\r" not in a
    assert a.splitlines()[0].startswith(b"input,base_value")


def test_drive_wear_is_priced_per_million_tokens_and_comes_off_the_net_saving():
    # 10 sessions a day of 1,000 tokens at 1 MB of KV each: 1 GB per session, 300 GB a month stored once each;
    # at a write amplification of 1.5, 450 GB written; at $20 per TB written, $9 a month, $0.03 per million tokens
    plain = cost.evaluate(HAND)
    worn = cost.evaluate({**HAND, "device_write_amplification": 1.5, "drive_usd_per_tb_written": 20.0})
    assert float(worn["device_written_tb_per_month"]) == pytest.approx(0.45)
    assert float(worn["wear_usd_per_month"]) == pytest.approx(9.0)
    assert float(worn["wear_usd_per_mtok"]) == pytest.approx(1e6 * 1e6 * 1.5 / 1e12 * 20.0)
    assert float(worn["net_usd_per_month"]) == pytest.approx(float(plain["net_usd_per_month"]) - 9.0)
    assert float(worn["break_even_hit_rate"]) > float(plain["break_even_hit_rate"])
    # left out, wear is not priced: the model's figures are what they were
    assert float(plain["wear_usd_per_month"]) == 0.0 and float(plain["device_written_tb_per_month"]) == pytest.approx(0.3)
