"""Engines: profiles (how to launch an engine), LMCache YAML, KV bytes per token, prompts, the streaming TTFT
client, and kvgate's own CPU reference engine (``cpu_reference.py``, a program kvgate puts on nodes and runs
there). Pure except the client's HTTP; the engine process itself is run by harness.workloads.kit.engine."""

from __future__ import annotations

from .cpu_reference import DEFAULT_MODEL_CONFIG as DEFAULT_CPU_REF_MODEL
from .kv import DTYPE_BYTES, ArchError, ModelArch, arch_from_config, kv_bytes_per_token
from .lmcache import (LMCACHE_EXTRA_KEYS, LMCACHE_KEYS, LMCacheSettings, check_lmcache_config, check_lmcache_file,
                      check_remote_url, lmcache_config, render_template, write_lmcache_yaml)
from .profiles import (EngineProfile, HitMetrics, kv_transfer_config, list_profiles, load_profile, shell_line,
                       vllm_serve_argv)

__all__ = ["ArchError", "DEFAULT_CPU_REF_MODEL", "DTYPE_BYTES", "EngineProfile", "HitMetrics", "LMCACHE_EXTRA_KEYS",
           "LMCACHE_KEYS", "LMCacheSettings", "ModelArch", "arch_from_config", "check_lmcache_config",
           "check_lmcache_file", "check_remote_url", "kv_bytes_per_token", "kv_transfer_config", "list_profiles", "load_profile",
           "lmcache_config", "render_template", "shell_line", "vllm_serve_argv", "write_lmcache_yaml"]
