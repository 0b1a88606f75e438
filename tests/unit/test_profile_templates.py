"""Engine profiles build structured argv values (JSON) as data: a value such as a pool directory with a quote in
it lands in the engine's configuration as that one string, never as configuration of its own."""

import json

import pytest

from harness.engines import list_profiles, load_profile
from harness.errors import ConfigError
from harness.workloads.kit.engine import engine_values

HOSTILE = '/pool/a","kv_role":"kv_producer","x":{"y":"}\\ {pool_dir} \n'


def _values(prof, pool_dir: str = HOSTILE):
    return engine_values(prof, python="python3", host="127.0.0.1", port=8000, model="m", served_model_name="m",
                         seed=0, run_dir="/r", pool_dir=pool_dir, max_model_len=8192,
                         extra={"lmcache_config": "/r/l.yaml"})


def _json_args(argv):
    """Every argv element that is JSON text, parsed (a profile's structured values)."""
    out = []
    for a in argv:
        if a[:1] in "{[":
            out.append(json.loads(a))  # a JSON value that no longer parses was injected into
    return out


def test_a_hostile_pool_dir_stays_one_string_in_vllm_cpu_disks_kv_transfer_config():
    prof = load_profile("vllm-cpu-disk")
    argv = prof.render_argv(_values(prof))
    kvt = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert kvt == {"kv_connector": "ExampleConnector", "kv_role": "kv_both",
                   "kv_connector_extra_config": {"shared_storage_path": HOSTILE}}


@pytest.mark.parametrize("name", list_profiles())
def test_every_shipped_profile_keeps_every_value_out_of_its_structure(name):
    prof = load_profile(name)
    plain = prof.render_argv(_values(prof, "/pool/plain"))
    hostile = prof.render_argv(_values(prof))
    assert len(hostile) == len(plain)  # no value adds or removes an argument
    for a, b in zip(_json_args(plain), _json_args(hostile)):
        def shape(x):
            return {k: shape(v) for k, v in x.items()} if isinstance(x, dict) else (
                [shape(v) for v in x] if isinstance(x, list) else type(x).__name__)
        assert shape(a) == shape(b)  # same keys, same nesting: the value only filled a string
    env = prof.render_env(_values(prof))
    assert set(env) == set(prof.render_env(_values(prof, "/pool/plain")))


def test_a_placeholder_inside_json_text_is_refused_with_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\ndescription: x\nengine: vllm\nhit_metrics:\n  hit_tokens: [a]\n  query_tokens: [b]\n"
                   "argv: [vllm, serve, --kv-transfer-config,\n"
                   "       '{{\"kv_connector\":\"X\",\"path\":\"{pool_dir}\"}}']\n")
    with pytest.raises(ConfigError) as e:
        load_profile(bad)
    msg = str(e.value)
    assert "bad.yaml:8: argv[3]: placeholder inside JSON text" in msg and "{json: ...}" in msg, msg
    bad.write_text("name: bad\ndescription: x\nengine: vllm\nhit_metrics:\n  hit_tokens: [a]\n  query_tokens: [b]\n"
                   "argv: [vllm]\nenv:\n  CFG: '{{\"dir\": \"{pool_dir}\"}}'\n")
    with pytest.raises(ConfigError, match=r"bad.yaml:9: env.CFG: .*placeholder inside JSON"):
        load_profile(bad)


def test_a_json_argument_is_data_whose_strings_are_filled(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("name: good\ndescription: x\nengine: vllm\nhit_metrics:\n  hit_tokens: [a]\n  query_tokens: [b]\n"
                    "argv: [vllm, --cfg, {json: {a: '{pool_dir}', n: 3, l: ['{model}', true], lit: '{{x}}'}}]\n")
    prof = load_profile(good)
    argv = prof.render_argv({"pool_dir": '/p"q', "model": "m"})
    assert argv[:2] == ["vllm", "--cfg"]
    assert json.loads(argv[2]) == {"a": '/p"q', "n": 3, "l": ["m", True], "lit": "{x}"}
    with pytest.raises(ValueError, match=r"no value for placeholder \{model\}"):
        prof.render_argv({"pool_dir": "/p"})
