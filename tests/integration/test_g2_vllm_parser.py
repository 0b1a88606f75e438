"""Optional group: every vLLM command line kvgate generates is accepted by vLLM's own ``vllm serve`` parser,
and broken ones are rejected by it.

Runs where vllm is installed; a CPU-only machine is enough with ``VLLM_TARGET_DEVICE=cpu`` (vLLM cannot
serve there, but its CLI parser runs). The parser is built the way ``vllm``'s own CLI main builds it
(top-level parser, the ``serve`` subcommand's ``subparser_init``), and after parsing the subcommand's own
``validate`` runs, so this is what ``vllm serve ...`` on a GPU node would accept or refuse at argument time.
"""

import json
import os

import pytest

from harness.engines import list_profiles, load_profile, vllm_serve_argv
from harness.workloads.kit.g2 import G2Params, launch_values

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# the profiles kvgate launches vLLM with (an attach profile, such as vllm-attach, has no argv to check)
VLLM_PROFILES = [n for n in list_profiles() if load_profile(n).engine in ("vllm", "dynamo-vllm")
                 and load_profile(n).launches]


class VllmRejected(Exception):
    pass


@pytest.fixture(scope="module")
def vllm_serve():
    """parse(argv) -> argparse.Namespace for a full ``["vllm", "serve", ...]`` argv, using vLLM's parser."""
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    pytest.importorskip("vllm", reason="vllm is not installed (optional group; see docs/g2.md for the install)")
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm")
    sub = parser.add_subparsers(required=False, dest="subparser")
    cmd = ServeSubcommand()
    cmd.subparser_init(sub)

    def parse(argv):
        # `{python} -m vllm.entrypoints.cli.main serve ...` is `vllm serve ...` run by a named interpreter
        if argv[1:3] == ["-m", "vllm.entrypoints.cli.main"]:
            argv = ["vllm"] + argv[3:]
        assert argv[0] == "vllm", argv
        try:
            args = parser.parse_args(argv[1:])
            cmd.validate(args)
        except SystemExit as exc:  # argparse's way of saying "rejected" (it printed why on stderr)
            raise VllmRejected(f"vllm rejected {argv[1:]} (exit {exc.code})") from None
        return args

    return parse


def _values(**over):
    p = G2Params(engine="vllm-lmcache", model="meta-llama/Llama-3.1-70B", prompt_tokens=[8192, 32768],
                 engine_values={"tensor_parallel_size": "8", **over})
    return launch_values(p, load_profile(p.engine), "/var/tmp/kvgate", "g2-vllm", 8000, "abcd1234")


def _pd_role(name: str) -> str:
    """The KV role a shipped profile's name promises: the two sides of pd-handoff, else both."""
    return {"producer": "kv_producer", "consumer": "kv_consumer"}.get(name.rsplit("-", 1)[-1], "kv_both")


def test_there_are_vllm_profiles():
    assert "vllm-lmcache" in VLLM_PROFILES and "dynamo-kvbm" in VLLM_PROFILES


@pytest.mark.parametrize("name", VLLM_PROFILES)
def test_profile_argv_accepted_by_vllm(vllm_serve, name):
    prof = load_profile(name)
    argv = prof.render_argv(_values())
    args = vllm_serve(argv)
    assert args.subparser == "serve" and args.model_tag == "meta-llama/Llama-3.1-70B"
    assert args.tensor_parallel_size == 8 and args.port == 8000 and args.host == "127.0.0.1"
    assert args.max_model_len == 32768 + 2 + 16
    # off where G2's hits must come from the connector's tier; on only in the profiles whose engine memory is one
    # of the levels accounted: g2-load's CI ladder (vllm-cpu-prefix) and the capacity curve (vllm-cpu-tiered)
    assert args.enable_prefix_caching is (name in ("vllm-cpu-prefix", "vllm-cpu-tiered"))
    # vLLM turned the JSON into its own KVTransferConfig (pydantic-validated field names and kv_role)
    kvt = args.kv_transfer_config
    if name == "vllm-cpu-no-tier":  # g2-gain's arm without the tier: no connector at all
        assert "--kv-transfer-config" not in argv and kvt is None
        return
    want = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert type(kvt).__name__ == "KVTransferConfig"
    assert kvt.kv_connector == want["kv_connector"] and kvt.kv_role == want["kv_role"]
    # both roles on one instance, but for the two sides of pd-handoff's prefill/decode hand-off
    assert kvt.kv_role == _pd_role(name)
    assert kvt.kv_connector_module_path == want.get("kv_connector_module_path")


@pytest.mark.parametrize("kw", [
    {},
    {"max_model_len": 131072, "gpu_memory_utilization": 0.9, "served_model_name": "g2", "tensor_parallel_size": 4},
    {"kv_connector": "DynamoConnector", "kv_connector_module_path": "kvbm.vllm_integration.connector"},
    {"kv_connector": None, "prefix_caching": True},
])
def test_generated_argv_accepted_by_vllm(vllm_serve, kw):
    argv = vllm_serve_argv("Qwen/Qwen3-0.6B", "127.0.0.1", 8011, **kw)
    args = vllm_serve(argv)
    assert args.model_tag == "Qwen/Qwen3-0.6B" and args.port == 8011
    assert args.enable_prefix_caching is bool(kw.get("prefix_caching", False))
    assert args.tensor_parallel_size == kw.get("tensor_parallel_size", 1)
    if "max_model_len" in kw:
        assert args.max_model_len == 131072 and args.gpu_memory_utilization == 0.9
        assert args.served_model_name == ["g2"]
    if kw.get("kv_connector", "LMCacheConnectorV1"):
        assert args.kv_transfer_config.kv_connector == kw.get("kv_connector", "LMCacheConnectorV1")
    else:
        assert args.kv_transfer_config is None


def _broken(argv, flag, value):
    out = list(argv)
    out[out.index(flag) + 1] = value
    return out


@pytest.mark.parametrize("breakage", ["kv_role", "kv_key", "json", "tp", "flag"])
def test_broken_argv_rejected_by_vllm(vllm_serve, breakage):
    """The check has teeth: each of these is one edit away from a profile's argv, and vLLM refuses it."""
    good = load_profile("vllm-lmcache").render_argv(_values())
    vllm_serve(good)  # the unbroken line passes
    bad = {
        "kv_role": _broken(good, "--kv-transfer-config", '{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_all"}'),
        "kv_key": _broken(good, "--kv-transfer-config", '{"kv_conector":"LMCacheConnectorV1","kv_role":"kv_both"}'),
        "json": _broken(good, "--kv-transfer-config", '{"kv_connector":"LMCacheConnectorV1",'),
        "tp": _broken(good, "--tensor-parallel-size", "eight"),
        "flag": good + ["--enable-kv-tier-magic"],
    }[breakage]
    with pytest.raises(VllmRejected):
        vllm_serve(bad)
