"""Optional: every vLLM command line kvgate generates is accepted by vLLM's own argument parser.

Runs only where vllm is installed (CPU build is enough: ``VLLM_TARGET_DEVICE=cpu``); skipped otherwise.
"""

import os

import pytest

from harness.engines import list_profiles, load_profile, vllm_serve_argv

pytestmark = [pytest.mark.integration, pytest.mark.slow]

VALUES = {"python": "python3", "host": "127.0.0.1", "port": 8000, "model": "meta-llama/Llama-3.1-70B",
          "served_model_name": "g2", "seed": 0, "run_dir": "/r", "pool_dir": "/pool", "lmcache_config": "/r/l.yaml",
          "model_config": "/r/c.json", "tensor_parallel_size": 8, "max_model_len": 131072, "cpu_cache_gb": 4,
          "disk_cache_gb": 64}


def _vllm_parser():
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    pytest.importorskip("vllm", reason="vllm is not installed (optional group)")
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        from vllm.utils import FlexibleArgumentParser
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    return make_arg_parser(FlexibleArgumentParser())


def _as_parser_args(argv):
    assert argv[:2] == ["vllm", "serve"]
    return ["--model", argv[2], *argv[3:]]


@pytest.mark.parametrize("name", [n for n in list_profiles() if load_profile(n).engine in ("vllm", "dynamo-vllm")])
def test_profile_argv_accepted_by_vllm(name):
    parser = _vllm_parser()
    argv = load_profile(name).render_argv(VALUES)
    args = parser.parse_args(_as_parser_args(argv))
    assert args.model == VALUES["model"] and args.tensor_parallel_size == 8
    assert args.enable_prefix_caching is False
    assert args.kv_transfer_config is not None


def test_generated_argv_accepted_by_vllm():
    parser = _vllm_parser()
    args = parser.parse_args(_as_parser_args(vllm_serve_argv("m", "127.0.0.1", 8000, max_model_len=8192,
                                                             gpu_memory_utilization=0.9)))
    assert args.max_model_len == 8192 and args.gpu_memory_utilization == 0.9
