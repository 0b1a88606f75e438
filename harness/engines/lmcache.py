"""LMCache YAML for a pinned LMCache version: filled from a profile's templates, strictly checked, written."""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml
from pydantic import BaseModel, ConfigDict

from ..config.yamlload import load_yaml
from ..errors import ConfigError, ConfigIssue


def render_template(template: str, values: dict[str, Any], where: str) -> str:
    """Fill ``{placeholders}`` in a profile template; a missing value is an error, not an empty string."""
    fields = [f for _, f, _, _ in string.Formatter().parse(template) if f]
    missing = [f for f in fields if f not in values]
    if missing:
        raise ValueError(f"{where}: no value for placeholder {{{missing[0]}}} in {template!r}")
    return template.format_map({f: ("" if values[f] is None else values[f]) for f in fields})


class LMCacheSettings(BaseModel):
    """The LMCache YAML kvgate writes for a profile; keys are LMCache's (checked per pinned version)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: str
    config: dict[str, Any]


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
        "save_chunk_meta": (bool,),                  # remote connectors: 28-byte header per chunk (default on;
                                                     # the fs connector's O_DIRECT needs it off)
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
