"""Engine profiles (data in ``workloads/engines/*.yaml``) and the pure helpers G2 needs around them.

A profile says how to launch an engine on a node (argv and environment templates), where its health
and metrics endpoints are, which metrics prove hits from the KV tier, and which LMCache version its
LMCache YAML was written for. Everything here is pure: building argv, writing and checking LMCache
YAML, parsing Prometheus text and ``/sys/block/DEV/stat``, KV bytes per token from a ``config.json``.
"""

from __future__ import annotations

import json
import re
import shlex
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

import yaml
from pydantic import BaseModel, ConfigDict, Field

from ..errors import ConfigError, ConfigIssue

PROFILE_DIR = Path(__file__).resolve().parents[2] / "workloads" / "engines"


# ------------------------------------------------------------------------------------------ profiles


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HitMetrics(_Strict):
    """Prometheus counters whose deltas over the read-back phase give the hit rate and bytes read."""

    hit_tokens: list[str]
    query_tokens: list[str]
    read_bytes: list[str] = Field(default_factory=list)


class LMCacheSettings(_Strict):
    """The LMCache YAML kvgate writes for a profile; keys are LMCache's (checked per pinned version)."""

    version: str
    config: dict[str, Any]


class EngineProfile(_Strict):
    name: str
    description: str
    engine: Literal["vllm", "dynamo-vllm", "sglang", "cpu-reference"]
    engine_version: str | None = None
    argv: list[str]
    env: dict[str, str] = Field(default_factory=dict)
    health_path: str = "/health"
    metrics_path: str = "/metrics"
    completions_path: str = "/v1/completions"
    ready_timeout_s: float = Field(default=600.0, gt=0)
    hit_metrics: HitMetrics
    lmcache: LMCacheSettings | None = None
    can_run_here: bool = False
    tokenizer: str | None = None  # local tokenizer.json (or its directory): G2 then sends text prompts
    notes: str = ""

    def render_argv(self, values: dict[str, Any]) -> list[str]:
        """The launch argv with ``{placeholders}`` filled; a missing value is an error, not ''."""
        return [render_template(a, values, f"{self.name}: argv") for a in self.argv]

    def render_env(self, values: dict[str, Any]) -> dict[str, str]:
        return {k: render_template(v, values, f"{self.name}: env.{k}") for k, v in self.env.items()}


def render_template(template: str, values: dict[str, Any], where: str) -> str:
    fields = [f for _, f, _, _ in string.Formatter().parse(template) if f]
    missing = [f for f in fields if f not in values]
    if missing:
        raise ValueError(f"{where}: no value for placeholder {{{missing[0]}}} in {template!r}")
    return template.format_map({f: ("" if values[f] is None else values[f]) for f in fields})


class _SamplePaths(dict):
    def __contains__(self, key):
        return True

    def __missing__(self, key):
        return "/kvgate-sample"


def list_profiles(directory: Path = PROFILE_DIR) -> list[str]:
    return sorted(p.stem for p in directory.glob("*.yaml"))


def load_profile(name_or_path: str | Path, directory: Path = PROFILE_DIR) -> EngineProfile:
    """Load and validate a profile by name (``workloads/engines/<name>.yaml``) or path; ConfigError names
    the file, line and field; the profile's LMCache block is checked against its pinned LMCache version."""
    from ..yamlload import load_yaml, validate

    p = Path(name_or_path)
    if not p.suffix:
        p = directory / f"{name_or_path}.yaml"
    if not p.exists() and not p.is_symlink():  # a symlink loop is reported by load_yaml, as such
        raise ConfigError(ConfigIssue(str(p), None, "", f"no engine profile {str(name_or_path)!r} "
                                      f"(known: {', '.join(list_profiles(directory)) or 'none'})"))
    data, index = load_yaml(p)
    prof = validate(EngineProfile, data, index)
    if prof.lmcache is not None:
        # Placeholders are filled at run time; check the keys and types with a sample path in each.
        issues = check_lmcache_config(lmcache_config(prof.lmcache, _SamplePaths()), prof.lmcache.version)
        if issues:
            raise ConfigError([index.issue(("lmcache", "config") + tuple(path), msg) for path, msg in issues])
    return prof


# ----------------------------------------------------------------------------------------- LMCache

# Key -> accepted Python types, for the LMCache version a profile pins. Read from LMCache 0.5.6's
# lmcache/v1/config.py (_CONFIG_DEFINITIONS) for the keys kvgate uses; LMCache itself only warns on
# unknown keys and turns values it cannot convert into None, so kvgate refuses both before launch.
_NUM = (int, float)
LMCACHE_KEYS: dict[str, dict[str, tuple[type, ...]]] = {
    "0.5.6": {
        "chunk_size": (int,),
        "local_cpu": (bool,),
        "max_local_cpu_size": _NUM,
        "reserve_local_cpu_size": _NUM,
        "local_disk": (str, type(None)),
        "max_local_disk_size": _NUM,
        "remote_url": (str, type(None)),
        "remote_serde": (str, type(None)),
        "remote_storage_plugins": (list, type(None)),
        "save_unfull_chunk": (bool,),
        "use_layerwise": (bool,),
        "save_decode_cache": (bool,),
        "enable_async_loading": (bool,),
        "blocking_timeout_secs": (int,),
        "cache_policy": (str,),
        "numa_mode": (str, type(None)),
        "pre_caching_hash_algorithm": (str,),
        "enable_blending": (bool,),
        "extra_config": (dict, type(None)),
    },
}

# extra_config keys read by LMCache 0.5.6's local disk backend and fs connector.
LMCACHE_EXTRA_KEYS: dict[str, dict[str, tuple[type, ...]]] = {
    "0.5.6": {
        "use_odirect": (bool,),                      # local_disk backend
        "disk_io_threads": (int,),                   # local_disk backend
        "fs_connector_use_odirect": (bool,),         # fs:// remote connector
        "fs_connector_read_ahead_size": (int,),
        "fs_connector_relative_tmp_dir": (str,),
        "fs_base_path": (str,),
        "force_store_wait": (bool,),
    },
}

_REMOTE_SERDE = {"naive", "cachegen"}


def _type_ok(value: Any, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool) and bool not in types:
        return False  # YAML true is not a number of GB
    return isinstance(value, types)


def _type_names(types: tuple[type, ...]) -> str:
    return " or ".join("null" if t is type(None) else t.__name__ for t in types)


def check_lmcache_config(config: Any, version: str) -> list[tuple[tuple, str]]:
    """Strict check of an LMCache YAML mapping for a pinned version: unknown keys, wrong types, values
    LMCache would mis-read. Returns (path, message) pairs; empty means the config is accepted."""
    if version not in LMCACHE_KEYS:
        return [((), f"kvgate has no key table for LMCache {version} (known: {', '.join(LMCACHE_KEYS)})")]
    if not isinstance(config, dict):
        return [((), "LMCache config must be a mapping")]
    keys, extra_keys = LMCACHE_KEYS[version], LMCACHE_EXTRA_KEYS[version]
    issues: list[tuple[tuple, str]] = []
    for k, v in config.items():
        if k not in keys:
            issues.append(((k,), f"unknown LMCache {version} key (LMCache would only warn and ignore it)"))
            continue
        if not _type_ok(v, keys[k]):
            issues.append(((k,), f"expected {_type_names(keys[k])}, got {type(v).__name__} {v!r}"))
            continue
        if k == "chunk_size" and v <= 0:
            issues.append(((k,), f"must be > 0, got {v}"))
        if k in ("max_local_cpu_size", "max_local_disk_size") and v < 0:
            issues.append(((k,), f"must be >= 0 (GiB), got {v}"))
        if k == "remote_serde" and v is not None and v not in _REMOTE_SERDE:
            issues.append(((k,), f"expected one of {sorted(_REMOTE_SERDE)}, got {v!r}"))
        if k == "remote_url" and v is not None:
            msg = check_remote_url(v)
            if msg:
                issues.append(((k,), msg))
        if k == "extra_config" and v is not None:
            for ek, ev in v.items():
                if ek not in extra_keys and not str(ek).startswith("remote_storage_plugin."):
                    issues.append(((k, ek), f"unknown LMCache {version} extra_config key"))
                elif ek in extra_keys and not _type_ok(ev, extra_keys[ek]):
                    issues.append(((k, ek), f"expected {_type_names(extra_keys[ek])}, got {type(ev).__name__} {ev!r}"))
                elif ek == "disk_io_threads" and ev < 1:
                    issues.append(((k, ek), f"must be >= 1, got {ev}"))
    if config.get("local_disk") and not config.get("max_local_disk_size"):
        issues.append((("max_local_disk_size",), "local_disk is set but max_local_disk_size is 0: nothing is kept"))
    return issues


def check_remote_url(url: str) -> str | None:
    """LMCache 0.5.6 parses remote URLs as ``scheme://host:port/path`` and asserts host and port."""
    u = urlparse(url)
    if not u.scheme:
        return f"remote_url {url!r} has no scheme (expected e.g. fs://localhost:0/abs/pool)"
    try:
        port = u.port
    except ValueError:
        return f"remote_url {url!r}: port is not a number"
    if not u.hostname or port is None:
        return (f"remote_url {url!r}: LMCache requires host and port (scheme://host:port/path); "
                f"for a file pool write fs://localhost:0{u.path or '/abs/pool'}")
    if u.scheme == "fs" and not u.path.startswith("/"):
        return f"remote_url {url!r}: the fs:// pool path must be absolute"
    return None


def lmcache_config(settings: LMCacheSettings, values: dict[str, Any]) -> dict[str, Any]:
    """The profile's LMCache mapping with string ``{placeholders}`` filled (e.g. ``{pool_dir}``)."""
    def fill(v, where):
        if isinstance(v, str):
            return render_template(v, values, where)
        if isinstance(v, dict):
            return {k: fill(x, f"{where}.{k}") for k, x in v.items()}
        if isinstance(v, list):
            return [fill(x, where) for x in v]
        return v
    return {k: fill(v, f"lmcache.{k}") for k, v in settings.config.items()}


def check_lmcache_file(path: str | Path, version: str) -> dict[str, Any]:
    """Load an LMCache YAML file as an engine is given it and check it for ``version``; every problem
    (unreadable, not YAML, an alias bomb, unknown keys, wrong types) is a ConfigError naming FILE:LINE."""
    from ..yamlload import load_yaml

    data, index = load_yaml(path)
    issues = check_lmcache_config(data, version)
    if issues:
        raise ConfigError([index.issue(tuple(p), m) for p, m in issues])
    return data


def write_lmcache_yaml(settings: LMCacheSettings, values: dict[str, Any], path: Path) -> dict[str, Any]:
    """Fill, strictly check and write the LMCache YAML; raises ConfigError listing every problem."""
    cfg = lmcache_config(settings, values)
    issues = check_lmcache_config(cfg, settings.version)
    if issues:
        raise ConfigError([ConfigIssue(str(path), None, ".".join(map(str, p)), m) for p, m in issues])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# written by kvgate for LMCache {settings.version}\n" + yaml.safe_dump(cfg, sort_keys=True))
    return cfg


# --------------------------------------------------------------------------------------------- vLLM


def kv_transfer_config(connector: str = "LMCacheConnectorV1", role: str = "kv_both",
                       module_path: str | None = None) -> str:
    d: dict[str, Any] = {"kv_connector": connector, "kv_role": role}
    if module_path:
        d["kv_connector_module_path"] = module_path
    return json.dumps(d, separators=(",", ":"))


def vllm_serve_argv(model: str, host: str, port: int, *, kv_connector: str | None = "LMCacheConnectorV1",
                    kv_connector_module_path: str | None = None, max_model_len: int | None = None,
                    tensor_parallel_size: int = 1, gpu_memory_utilization: float | None = None,
                    prefix_caching: bool = False, served_model_name: str | None = None,
                    extra: list[str] | None = None) -> list[str]:
    """``vllm serve`` argv for G2: GPU prefix caching off (so hits come from the connector's tier)."""
    argv = ["vllm", "serve", model, "--host", host, "--port", str(port),
            "--tensor-parallel-size", str(tensor_parallel_size)]
    if max_model_len:
        argv += ["--max-model-len", str(max_model_len)]
    if gpu_memory_utilization is not None:
        argv += ["--gpu-memory-utilization", str(gpu_memory_utilization)]
    argv.append("--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching")
    if served_model_name:
        argv += ["--served-model-name", served_model_name]
    if kv_connector:
        argv += ["--kv-transfer-config", kv_transfer_config(kv_connector, module_path=kv_connector_module_path)]
    return argv + list(extra or [])


# ------------------------------------------------------------------------------------ parsers (pure)

_PROM_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\d+)?$')
_PROM_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float


def parse_prometheus(text: str) -> list[Sample]:
    """Samples of a Prometheus text exposition (comments skipped). Raises ValueError naming the line."""
    out = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _PROM_LINE.match(line)
        if not m:
            raise ValueError(f"metrics line {n}: not a Prometheus sample: {line[:200]!r}")
        labels = tuple(sorted((k, v.encode().decode("unicode_escape")) for k, v in _PROM_LABEL.findall(m.group(3) or "")))
        out.append(Sample(m.group(1), labels, float(m.group(4))))
    return out


def metric_total(samples: list[Sample], names: list[str]) -> float | None:
    """Sum over all label sets of the first name present (None when none is exposed)."""
    for name in names:
        vals = [s.value for s in samples if s.name == name]
        if vals:
            return sum(vals)
    return None


@dataclass(frozen=True)
class BlockStat:
    """``/sys/block/DEV/stat`` (Documentation/block/stat.rst); sectors are 512 bytes whatever the device."""

    read_ios: int
    read_sectors: int
    write_ios: int
    write_sectors: int

    @property
    def read_bytes(self) -> int:
        return self.read_sectors * 512

    @property
    def write_bytes(self) -> int:
        return self.write_sectors * 512


def parse_block_stat(text: str) -> BlockStat:
    f = text.split()
    if len(f) < 11 or not all(x.isdigit() for x in f):
        raise ValueError(f"not a /sys/block/DEV/stat line: {text.strip()[:200]!r}")
    return BlockStat(int(f[0]), int(f[2]), int(f[4]), int(f[6]))


# -------------------------------------------------------------------------------------- KV geometry

_DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2,
                "float8_e4m3fn": 1, "float8_e5m2": 1, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


def kv_bytes_per_token(config: dict[str, Any], kv_dtype: str | None = None) -> int:
    """KV cache bytes per token from a HF ``config.json``.

    MHA/GQA: layers x kv_heads x head_dim x 2 (K and V) x dtype bytes.
    MLA (DeepSeek-V2/V3 style, ``kv_lora_rank`` set): layers x (kv_lora_rank + qk_rope_head_dim) x dtype
    bytes, one compressed latent per token and layer, no separate K and V.
    ``kv_dtype`` overrides the model dtype (e.g. an fp8 KV cache).
    """
    if "text_config" in config and "num_hidden_layers" not in config:
        config = {**config["text_config"], **{k: v for k, v in config.items() if k == "torch_dtype"}}
    dtype = kv_dtype or config.get("torch_dtype") or config.get("dtype") or "bfloat16"
    if dtype not in _DTYPE_BYTES:
        raise ValueError(f"unknown KV dtype {dtype!r} (known: {', '.join(sorted(_DTYPE_BYTES))})")
    nbytes = _DTYPE_BYTES[dtype]
    try:
        layers = int(config["num_hidden_layers"])
        if config.get("kv_lora_rank"):
            return layers * (int(config["kv_lora_rank"]) + int(config.get("qk_rope_head_dim", 0))) * nbytes
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    except KeyError as exc:
        raise ValueError(f"config.json lacks {exc.args[0]!r}, needed for KV bytes per token") from None
    return layers * kv_heads * head_dim * 2 * nbytes


def shell_line(argv: list[str], env: dict[str, str] | None = None) -> str:
    """A copy-pasteable command line for logs and plans."""
    pre = " ".join(f"{k}={shlex.quote(v)}" for k, v in (env or {}).items())
    return (pre + " " if pre else "") + shlex.join(argv)
from .cpu_reference import DEFAULT_MODEL_CONFIG as DEFAULT_CPU_REF_MODEL  # noqa: E402  (stdlib-only module)
