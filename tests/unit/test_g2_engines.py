"""G2 pure helpers: metrics text, /sys/block stat, KV bytes per token, LMCache strict check, vLLM argv,
engine profiles, prompt generation and the G2 verdict rules."""

import json
from pathlib import Path

import pytest
import yaml

from harness.engines import (LMCacheSettings, check_lmcache_config, kv_bytes_per_token, list_profiles, load_profile,
                             vllm_serve_argv, write_lmcache_yaml)
from harness.parsers.blockdev import BlockStat, parse_block_stat
from harness.parsers.prometheus import counter_delta, metric_total, parse_prometheus
from harness.errors import ConfigError
from harness.engines.client import RequestRecord
from harness.workloads.kit.engine import engine_values
from harness.workloads.kit.g2 import evaluate_g2, make_prompts


# ------------------------------------------------------------------------------------------- metrics

def _pd_role(name: str) -> str:
    """The KV role a shipped profile's name promises: the two sides of pd-handoff, else both."""
    return {"producer": "kv_producer", "consumer": "kv_consumer"}.get(name.rsplit("-", 1)[-1], "kv_both")


def test_vllm_metrics_sum_over_engines_and_ignore_created_series(fixtures):
    samples = parse_prometheus((fixtures / "g2" / "vllm_style_metrics_prometheus_client.txt").read_text())
    assert metric_total(samples, ["vllm:external_prefix_cache_hits_total"]) == 31744 + 32768
    assert metric_total(samples, ["vllm:external_prefix_cache_queries_total"]) == 65536
    labels = {s.labels for s in samples if s.name == "vllm:external_prefix_cache_hits_total"}
    assert (("engine", "0"), ("model_name", "Qwen/Qwen3-480B")) in labels
    # the first name present wins; an absent metric is None, not 0
    assert metric_total(samples, ["lmcache:num_hit_tokens_total", "vllm:prompt_tokens_total"]) == 65536
    assert metric_total(samples, ["nope_total"]) is None


def test_cpu_reference_metrics_captured_from_the_server(fixtures):
    samples = parse_prometheus((fixtures / "g2" / "cpu_reference_metrics.txt").read_text())
    hit = metric_total(samples, ["kvgate_cpu_ref_external_hit_tokens_total"])
    query = metric_total(samples, ["kvgate_cpu_ref_external_query_tokens_total"])
    read = metric_total(samples, ["kvgate_cpu_ref_external_read_bytes_total"])
    assert (hit, query) == (300, 600)
    # the engine's bytes per token: 6 layers x 2 kv heads x 64 x 2 x 4 B
    assert read == hit * 6 * 2 * 64 * 2 * 4


def test_bad_metrics_line_names_the_line():
    with pytest.raises(ValueError, match="metrics line 2"):
        parse_prometheus("# HELP x y\nthis is not a sample line at all\n")


def test_block_stat_parser_on_captured_sysfs(fixtures):
    st = parse_block_stat((fixtures / "g2" / "sys_block_vda_stat.txt").read_text())
    fields = (fixtures / "g2" / "sys_block_vda_stat.txt").read_text().split()
    assert st.read_ios == int(fields[0]) and st.read_sectors == int(fields[2])
    assert st.read_bytes == int(fields[2]) * 512
    assert BlockStat(1, 8, 0, 0).read_bytes == 4096
    with pytest.raises(ValueError):
        parse_block_stat("cat: /sys/class/block/nvme9n1/stat: No such file or directory")


# ---------------------------------------------------------------------------------------- KV geometry

def test_kv_bytes_per_token_llama3_70b_gqa():
    cfg = {"num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8, "hidden_size": 8192,
           "torch_dtype": "bfloat16"}
    assert kv_bytes_per_token(cfg) == 327_680
    assert kv_bytes_per_token(cfg, "fp8") == 163_840


def test_kv_bytes_per_token_mha_head_dim_from_hidden_size():
    # Llama-2-7B: MHA, 32 layers x 32 heads x 128 x 2 x 2 B
    cfg = {"num_hidden_layers": 32, "num_attention_heads": 32, "hidden_size": 4096, "torch_dtype": "float16"}
    assert kv_bytes_per_token(cfg) == 524_288


def test_kv_bytes_per_token_mla_deepseek_v3():
    cfg = {"num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128, "hidden_size": 7168,
           "kv_lora_rank": 512, "qk_rope_head_dim": 64, "torch_dtype": "bfloat16"}
    assert kv_bytes_per_token(cfg) == 61 * 576 * 2  # 70,272 B: one latent, no separate K and V


def test_kv_bytes_per_token_errors_name_the_missing_field():
    with pytest.raises(ValueError, match="num_hidden_layers"):
        kv_bytes_per_token({"hidden_size": 10})
    with pytest.raises(ValueError, match="unknown KV dtype"):
        kv_bytes_per_token({"num_hidden_layers": 1, "num_attention_heads": 1, "hidden_size": 8}, "int3")


# -------------------------------------------------------------------------------------------- LMCache

GOOD = {"chunk_size": 256, "local_cpu": True, "max_local_cpu_size": 5, "local_disk": "file:///nvme/kv",
        "max_local_disk_size": 100.0, "remote_url": "fs://localhost:0/mnt/kvpool", "remote_serde": "naive",
        "extra_config": {"use_odirect": True, "disk_io_threads": 8, "fs_connector_use_odirect": True}}


def test_lmcache_good_config_passes():
    assert check_lmcache_config(GOOD, "0.5.6") == []


@pytest.mark.parametrize("patch,path,msg", [
    ({"chunk_sise": 256}, ("chunk_sise",), "unknown LMCache 0.5.6 key"),
    ({"chunk_size": "256"}, ("chunk_size",), "expected int"),
    ({"local_cpu": "yes"}, ("local_cpu",), "expected bool"),
    ({"max_local_cpu_size": True}, ("max_local_cpu_size",), "expected int or float"),
    ({"max_local_disk_size": -1}, ("max_local_disk_size",), "must be >= 0"),
    ({"remote_url": "fs:///mnt/kvpool"}, ("remote_url",), "requires host and port"),
    ({"remote_url": "fs://localhost:0relative"}, ("remote_url",), "port is not a number"),
    ({"remote_serde": "pickle"}, ("remote_serde",), "expected one of"),
    ({"extra_config": {"use_odirect": "true"}}, ("extra_config", "use_odirect"), "expected bool"),
    ({"extra_config": {"disk_io_threads": 0}}, ("extra_config", "disk_io_threads"), "must be >= 1"),
    ({"extra_config": {"disk_io_thread": 4}}, ("extra_config", "disk_io_thread"), "unknown"),
    ({"max_local_disk_size": 0}, ("max_local_disk_size",), "nothing is kept"),
])
def test_lmcache_strict_check_rejects_what_lmcache_would_silently_accept(patch, path, msg):
    issues = check_lmcache_config({**GOOD, **patch}, "0.5.6")
    assert any(p == path and msg in m for p, m in issues), issues


def test_lmcache_unknown_version_is_refused():
    assert "no key table for LMCache 9.9" in check_lmcache_config(GOOD, "9.9")[0][1]


def test_lmcache_yaml_written_and_reloadable(tmp_path):
    s = LMCacheSettings(version="0.5.6", config={"chunk_size": 256, "remote_url": "fs://localhost:0{pool_dir}"})
    cfg = write_lmcache_yaml(s, {"pool_dir": "/mnt/pool/run-1"}, tmp_path / "lmcache.yaml")
    assert yaml.safe_load((tmp_path / "lmcache.yaml").read_text()) == cfg
    assert cfg["remote_url"] == "fs://localhost:0/mnt/pool/run-1"
    with pytest.raises(ConfigError, match="remote_url"):
        write_lmcache_yaml(s, {"pool_dir": "relative"}, tmp_path / "bad.yaml")


def test_kvgate_key_table_agrees_with_installed_lmcache_loader(tmp_path):
    """Where LMCache 0.5.6 is installed: every key kvgate accepts is one LMCache defines, and LMCache's own
    loader reads kvgate's YAML back with the same values."""
    lmc_config = pytest.importorskip("lmcache.v1.config")
    from importlib.metadata import version
    if version("lmcache") != "0.5.6":
        pytest.skip(f"installed lmcache is {version('lmcache')}, the key table is for 0.5.6")
    from harness.engines import LMCACHE_KEYS
    assert set(LMCACHE_KEYS["0.5.6"]) <= set(lmc_config._CONFIG_DEFINITIONS)
    s = LMCacheSettings(version="0.5.6", config=GOOD)
    write_lmcache_yaml(s, {}, tmp_path / "lmcache.yaml")
    loaded = lmc_config.LMCacheEngineConfig.from_file(str(tmp_path / "lmcache.yaml"))
    for k, v in GOOD.items():
        if k != "local_disk":
            assert getattr(loaded, k) == v, k


# ------------------------------------------------------------------------------------- vLLM, profiles

def test_vllm_argv_turns_gpu_prefix_caching_off_and_sets_the_lmcache_connector():
    argv = vllm_serve_argv("meta-llama/Llama-3.1-70B", "0.0.0.0", 8000, tensor_parallel_size=8, max_model_len=131072)
    assert argv[:3] == ["vllm", "serve", "meta-llama/Llama-3.1-70B"]
    assert "--no-enable-prefix-caching" in argv
    kv = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert kv == {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}
    assert argv[argv.index("--tensor-parallel-size") + 1] == "8"


def test_every_shipped_profile_loads_and_renders():
    names = list_profiles()
    assert {"cpu-reference", "vllm-lmcache", "dynamo-kvbm", "sglang-hicache"} <= set(names)
    for n in names:
        p = load_profile(n)
        values = engine_values(p, python="python3", host="127.0.0.1", port=8000, model="m", served_model_name="m",
                               seed=0, run_dir="/r", pool_dir="/pool", max_model_len=8192,
                               extra={"lmcache_config": "/r/l.yaml", "tensor_parallel_size": 8})
        argv = p.render_argv(values)
        if p.program:  # a program kvgate ships to the node runs from the run directory, not from kvgate
            assert argv[:2] == ["python3", f"/r/{p.program}"] and "harness" not in " ".join(argv)
        assert all("{" not in a or a.startswith("{\"") for a in argv), argv
        env = p.render_env(values)
        if not p.launches:  # an attach profile: kvgate never launches it
            assert argv == [] and p.engine in ("vllm", "openai")
            continue
        if p.engine in ("vllm", "dynamo-vllm"):
            # every vLLM profile has its tier connector but g2-gain's arm without the tier
            assert ("--kv-transfer-config" in argv) != (p.name == "vllm-cpu-no-tier"), p.name
            if p.name != "vllm-cpu-no-tier":
                kv = json.loads(argv[argv.index("--kv-transfer-config") + 1])
                # both roles on one instance, but for the two sides of pd-handoff's prefill/decode hand-off
                assert kv["kv_role"] == _pd_role(p.name)
            # prefix caching is set explicitly: off where G2's hits must come from the tier, on only in the profiles
            # whose engine memory is one of the levels accounted: g2-load's CI ladder (vllm-cpu-prefix) and the
            # capacity curve (vllm-cpu-tiered, its memory bounded by g2-gain's engine_cache_tokens)
            on = "--enable-prefix-caching" in argv
            assert on != ("--no-enable-prefix-caching" in argv)
            assert not on or p.name in ("vllm-cpu-prefix", "vllm-cpu-tiered")
            assert (p.capabilities.engine_cache_flag is not None) == (p.name == "vllm-cpu-tiered"), p.name
        if p.name == "dynamo-kvbm":
            assert env["DYN_KVBM_DISK_CACHE_DIR"] == "/pool" and env["DYN_KVBM_DISK_CACHE_GB"] == "64"
        if p.lmcache is not None:
            assert p.lmcache.version == "0.5.6" and env["LMCACHE_CONFIG_FILE"] == "/r/l.yaml"


def test_profile_errors_name_file_line_and_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\ndescription: x\nengine: vllm\nargv: [vllm]\nhit_metrics:\n  hit_tokens: [a]\n"
                   "  query_tokens: [b]\nlmcache:\n  version: '0.5.6'\n  config:\n    chunk_size: 256\n"
                   "    max_local_cpu_sise: 5\n")
    with pytest.raises(ConfigError) as e:
        load_profile(bad)
    assert "bad.yaml:12: lmcache.config.max_local_cpu_sise: unknown LMCache 0.5.6 key" in str(e.value)
    with pytest.raises(ValueError, match=r"no value for placeholder \{python\}"):
        load_profile("vllm-lmcache").render_argv({})
    with pytest.raises(ConfigError, match="no engine profile 'nope'"):
        load_profile("nope")


# ------------------------------------------------------------------------------------ G2 rules, prompts

def test_prompts_are_deterministic_new_per_seed_and_of_the_asked_length():
    a = make_prompts(7, [100, 300], 2, 4096)
    assert [r.prompt_tokens for r in a] == [100, 100, 300, 300]
    assert [len(r.prompt) for r in a] == [100, 100, 300, 300]
    assert a == make_prompts(7, [100, 300], 2, 4096)
    assert a[0].prompt != a[1].prompt
    assert make_prompts(8, [100], 1, 4096)[0].prompt != a[0].prompt
    assert all(10 <= t < 4096 for r in a for t in r.prompt)


def rec(rid, ttft, error=None):
    return RequestRecord(rid, 100, 0.0, ttft, (), ttft, ttft, 1 if ttft else 0, "x", 200, error)


def test_g2_metrics_and_valid_readback():
    r = evaluate_g2([rec("a", 10.0), rec("b", 12.0)], [rec("a", 1.0), rec("b", 1.2)], 200, 200, 4096, 0.95, 4096)
    assert r.invalid_reason is None and r.error is None
    assert r.metrics["ttft_recompute_p50_s"] == pytest.approx(11.0)
    assert r.metrics["ttft_readback_p50_s"] == pytest.approx(1.1)
    assert r.metrics["readback_speedup_p50"] == pytest.approx(10.0)
    assert r.metrics["hit_rate"] == 1.0


@pytest.mark.parametrize("hit,query,read,why", [
    (180, 200, 4096, "hit rate 0.900 is below 0.95"),
    (None, None, 4096, "no hit counters"),
    (200, 200, 0, "no bytes were read from the pool's device"),
    (200, 200, None, "could not be measured"),
])
def test_g2_readback_without_proof_is_invalid(hit, query, read, why):
    r = evaluate_g2([rec("a", 10.0)], [rec("a", 1.0)], hit, query, read, 0.95, 4096)
    assert why in r.invalid_reason
    # the evaluator's validity list says which proof failed: the report shows it, and guesses nothing
    failed = [c.name for c in r.evidence.validity if not c.ok]
    assert failed == (["hits"] if read else ["cold"])


def test_g2_validity_states_each_proof_with_its_figure_and_unit():
    r = evaluate_g2([rec("a", 10.0)], [rec("a", 1.0)], 190, 200, 2 << 20, 0.95, 4096)
    checks = {c.name: c for c in r.evidence.validity}
    assert r.invalid_reason is None and all(c.ok for c in checks.values())
    assert list(checks) == ["hits", "cold", "no fall-back", "new prompts"]
    assert (checks["hits"].value, checks["hits"].unit) == (0.95, "ratio") and "190 of 200" in checks["hits"].how
    assert (checks["cold"].value, checks["cold"].unit) == (2 << 20, "B")
    assert checks["cold"].figure_text() == "bytes the pool device read during read-back: 2.0 MiB (2097152 bytes)"


def test_g2_failed_requests_are_an_error_not_a_faster_p50():
    r = evaluate_g2([rec("a", 10.0)], [rec("a", None, "HTTP 500: boom")], 200, 200, 4096, 0.95, 4096)
    assert r.error.startswith("1 of 2 requests failed") and "HTTP 500" in r.error
    assert "ttft_readback_p50_s" not in r.metrics


def test_a_model_config_without_a_kv_shape_is_a_config_error_at_its_line(tmp_path):
    from harness.config import load_config
    from harness.errors import ConfigError
    from harness.workloads import WORKLOADS

    root = Path(__file__).resolve().parents[2]
    suite = yaml.safe_load((root / "gates" / "g2-cpu-reference.yaml").read_text())
    suite["gates"][0]["params"]["model_config_inline"]["num_attention_heads"] = 0
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(suite, sort_keys=False))
    (tmp_path / "i.yaml").write_text("nodes:\n  - {name: n1, transport: local}\n")
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path / "i.yaml", tmp_path / "g.yaml", WORKLOADS)
    [issue] = err.value.issues
    assert issue.path == "gates[0].params.model_config_inline.num_attention_heads"
    assert "positive integer" in issue.message and issue.line


def test_engine_interpreter_gate_param_then_node_engine_env_then_default():
    import sys
    from harness.workloads.kit.engine import engine_python
    assert engine_python("/gate/python", "ssh", "/node/venv/bin/python") == "/gate/python"
    assert engine_python(None, "ssh", "/node/venv/bin/python") == "/node/venv/bin/python"
    assert engine_python(None, "local", "/node/venv/bin/python") == "/node/venv/bin/python"
    assert engine_python(None, "local", None) == sys.executable
    assert engine_python(None, "ssh", None) == "python3"


def test_rig_inventory_names_the_engine_environment(tmp_path):
    import yaml
    from harness.rigs.netns import STORAGE_NODE, RigSpec, render_inventory
    spec = RigSpec(prefix="kvgu-", state_dir=tmp_path, node_count=2, engine_python="/opt/engine/bin/python")
    inv = tmp_path / "inventory.yaml"
    inv.write_text(render_inventory(spec, {n: 2200 + i for i, n in enumerate(spec.node_names() + [STORAGE_NODE])}))
    nodes = yaml.safe_load(inv.read_text())["nodes"]
    assert [n.get("engine_python") for n in nodes if n["name"] in ("n1", "n2")] == ["/opt/engine/bin/python"] * 2


def test_profile_fallback_patterns_and_pool_files_are_checked_with_file_and_line(tmp_path):
    base = "name: bad\ndescription: x\nengine: vllm\nargv: [vllm]\nhit_metrics:\n  hit_tokens: [a]\n  query_tokens: [b]\n"
    bad = tmp_path / "bad.yaml"
    bad.write_text(base + "fallback_patterns: ['(unclosed']\n")
    with pytest.raises(ConfigError, match=r"bad.yaml:8: fallback_patterns: .*not a valid regular expression"):
        load_profile(bad)
    bad.write_text(base + "pool_files: 'a/*.data'\n")
    with pytest.raises(ConfigError, match=r"bad.yaml:8: pool_files: .*no '/'"):
        load_profile(bad)


def test_vllm_cpu_disk_profile_is_vllms_reference_connector_on_the_pool():
    prof = load_profile("vllm-cpu-disk")
    assert "not LMCache" in prof.description and prof.lmcache is None
    argv = prof.render_argv({"python": "/e/bin/python", "model": "/m", "host": "127.0.0.1", "port": 8123,
                             "served_model_name": "g2", "tensor_parallel_size": 1, "max_model_len": 4200,
                             "seed": 3, "pool_dir": "/pool/run-x"})
    assert argv[:5] == ["/e/bin/python", "-m", "vllm.entrypoints.cli.main", "serve", "/m"]
    kvt = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert kvt == {"kv_connector": "ExampleConnector", "kv_role": "kv_both",
                   "kv_connector_extra_config": {"shared_storage_path": "/pool/run-x"}}
    assert "--no-enable-prefix-caching" in argv
    assert prof.hit_metrics.hit_tokens == ["vllm:external_prefix_cache_hits_total"]
    assert prof.pool_files == "*.safetensors" and prof.kv_block_tokens == 128


def test_stored_tokens_and_random_model_dir_are_pure():
    from harness.workloads.kit.engine import random_model_dir, stored_kv_tokens
    assert stored_kv_tokens(4097, 128) == 4096 and stored_kv_tokens(127, 128) == 0
    assert stored_kv_tokens(4097, None) == 4097
    a = random_model_dir("/w", {"hidden_size": 256}, 0, "bfloat16")
    assert a.startswith("/w/kvgate-models/") and a == random_model_dir("/w", {"hidden_size": 256}, 0, "bfloat16")
    assert a != random_model_dir("/w", {"hidden_size": 256}, 1, "bfloat16")
    assert a != random_model_dir("/w", {"hidden_size": 256}, 0, "float32")


def test_an_engine_that_fell_back_is_invalid_whatever_its_figures():
    from harness.parsers.engine_log import scan_fallbacks
    from harness.workloads.kit.engine import fallback_reason
    from harness.workloads.kit.g2 import evaluate_g2
    from harness.engines.client import RequestRecord

    def rec(i, ttft):
        return RequestRecord(request_id=f"r{i}", prompt_tokens=100, queue_s=0, ttft_s=ttft, itl_s=(), latency_s=ttft,
                             e2e_s=ttft, output_chunks=1, output_text="x", http_status=200, error=None,
                             started_unix_s=0)
    found = scan_fallbacks("x\nLMCache ERROR: ... System will operate in degraded mode (recompute).\n")
    reason = fallback_reason(found, "read-back")
    assert "read-back phase" in reason and "line 2:" in reason and "degraded mode (recompute)" in reason
    # figures that would PASS (hits, device bytes, a speed-up) do not count once the log says it fell back
    res = evaluate_g2([rec(0, 1.0)], [rec(1, 0.1)], 100, 100, 4096, 0.95, 100, fallback=reason)
    assert res.invalid_reason == reason and res.metrics["readback_speedup_p50"] > 1
    assert evaluate_g2([rec(0, 1.0)], [rec(1, 0.1)], 100, 100, 4096, 0.95, 100).invalid_reason is None


def test_cpu_reference_engine_memory_longest_prefix_and_lru_eviction():
    from harness.engines.cpu_reference import PrefixKVCache, common_prefix_len
    c = PrefixKVCache(10)
    assert c.match([1, 2, 3]) == (0, None)
    assert c.put([1, 2, 3, 4], "k1", "v1") == 0
    assert c.put([5, 6, 7, 8], "k2", "v2") == 0
    n, kv = c.match([1, 2, 9])
    assert n == 2 and kv == ("k1", "v1")  # partial common prefix is reusable KV
    # [1,2,3,4] was just used: inserting 4 more tokens evicts [5,6,7,8], the least recently used
    assert c.put([9, 9, 9, 9], "k3", "v3") == 4
    assert c.match([5, 6])[0] == 0 and c.match([1, 2, 3, 4, 5])[0] == 4
    assert c.tokens == 8
    assert c.put(list(range(11)), "big", "big") == 0 and c.tokens == 8  # larger than the cache: not kept
    assert common_prefix_len((1, 2, 3), [1, 2, 4]) == 2
