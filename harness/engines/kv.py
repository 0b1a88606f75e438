"""KV cache bytes per token of a model, from its config.json: the one figure G2, R3 and the costing model use.

MHA/GQA: ``layers x kv_heads x head_dim x 2 (K and V) x dtype_bytes``; MLA (``kv_lora_rank`` set, DeepSeek
V2/V3): ``layers x (kv_lora_rank + qk_rope_head_dim) x dtype_bytes``, one compressed latent per token and
layer. The dtype is the KV cache dtype when given (e.g. vLLM ``kv_cache_dtype=fp8``), else the model's
``torch_dtype``; the names of both are in :data:`DTYPE_BYTES`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "float": 4,
    "fp32": 4,
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "int8": 1,
}
"""Bytes per element of the KV cache dtype names found in config.json (``torch_dtype``) and vLLM
``kv_cache_dtype`` values."""


@dataclass(frozen=True)
class ModelArch:
    """The KV-relevant shape of a transformer, read from its config.json."""

    name: str
    attention: str  # "gqa" (MHA is GQA with kv_heads == heads) or "mla"
    num_layers: int
    dtype: str
    dtype_bytes: int
    num_kv_heads: int | None = None
    head_dim: int | None = None
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None

    @property
    def kv_bytes_per_token(self) -> int:
        """KV cache bytes one token occupies over all layers: GQA/MHA ``L x H_kv x d x 2 x b``;
        MLA ``L x (r_kv + d_rope) x b``."""
        if self.attention == "mla":
            assert self.kv_lora_rank is not None and self.qk_rope_head_dim is not None
            return self.num_layers * (self.kv_lora_rank + self.qk_rope_head_dim) * self.dtype_bytes
        assert self.num_kv_heads is not None and self.head_dim is not None
        return self.num_layers * self.num_kv_heads * self.head_dim * 2 * self.dtype_bytes

    def formula(self) -> str:
        """The per-token arithmetic, spelled out for the report."""
        if self.attention == "mla":
            return (
                f"{self.num_layers} layers x ({self.kv_lora_rank} kv_lora_rank + {self.qk_rope_head_dim} "
                f"qk_rope_head_dim) x {self.dtype_bytes} B ({self.dtype}) = {self.kv_bytes_per_token:,} B"
            )
        return (
            f"{self.num_layers} layers x {self.num_kv_heads} KV heads x {self.head_dim} head dim x 2 (K,V) x "
            f"{self.dtype_bytes} B ({self.dtype}) = {self.kv_bytes_per_token:,} B"
        )


class ArchError(ValueError):
    """A config.json that does not describe a KV shape; ``field`` names the offending key."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def _positive_int(cfg: Mapping[str, Any], key: str) -> int:
    value = cfg.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ArchError(key, f"expected a positive integer, got {value!r}")
    return value


def arch_from_config(cfg: Mapping[str, Any], name: str = "model", kv_dtype: str | None = None) -> ModelArch:
    """Read the KV shape from a Hugging Face style config.json mapping.

    MLA is recognised by a non-null ``kv_lora_rank`` (DeepSeek-V2/V3 family). Otherwise GQA/MHA:
    ``num_key_value_heads`` (defaults to ``num_attention_heads``, i.e. MHA) and ``head_dim`` (defaults to
    ``hidden_size / num_attention_heads``). The dtype is ``kv_dtype`` when given, else ``torch_dtype``
    (or ``dtype``). Models whose config nests the text model (``text_config``) are read from that block.
    Raises :class:`ArchError` (a ValueError) naming the key.
    """
    if isinstance(cfg.get("text_config"), Mapping) and "num_hidden_layers" not in cfg:
        outer = {k: cfg[k] for k in ("torch_dtype", "dtype") if k in cfg}
        cfg = {**outer, **cfg["text_config"]}
    layers = _positive_int(cfg, "num_hidden_layers")
    dtype_key = "kv_dtype" if kv_dtype is not None else ("torch_dtype" if "torch_dtype" in cfg else "dtype")
    dtype = kv_dtype if kv_dtype is not None else cfg.get(dtype_key)
    if not isinstance(dtype, str) or dtype.lower() not in DTYPE_BYTES:
        raise ArchError(dtype_key, f"unknown KV dtype {dtype!r}; one of {', '.join(sorted(DTYPE_BYTES))}")
    dtype = dtype.lower()
    dbytes = DTYPE_BYTES[dtype]
    if cfg.get("kv_lora_rank") is not None:
        return ModelArch(
            name=name,
            attention="mla",
            num_layers=layers,
            dtype=dtype,
            dtype_bytes=dbytes,
            kv_lora_rank=_positive_int(cfg, "kv_lora_rank"),
            qk_rope_head_dim=_positive_int(cfg, "qk_rope_head_dim"),
        )
    heads = _positive_int(cfg, "num_attention_heads")
    kv_heads = _positive_int(cfg, "num_key_value_heads") if cfg.get("num_key_value_heads") is not None else heads
    if kv_heads > heads or heads % kv_heads:
        raise ArchError("num_key_value_heads", f"{kv_heads} does not divide num_attention_heads {heads}")
    if cfg.get("head_dim") is not None:
        head_dim = _positive_int(cfg, "head_dim")
    else:
        hidden = _positive_int(cfg, "hidden_size")
        if hidden % heads:
            raise ArchError("hidden_size", f"{hidden} is not a multiple of num_attention_heads {heads}")
        head_dim = hidden // heads
    return ModelArch(
        name=name,
        attention="gqa",
        num_layers=layers,
        dtype=dtype,
        dtype_bytes=dbytes,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
    )


def kv_bytes_per_token(config: Mapping[str, Any], kv_dtype: str | None = None) -> int:
    """KV bytes per token of the model a config.json describes; ``kv_dtype`` overrides its dtype.
    Raises :class:`ArchError` (a ValueError) naming the key that is missing or wrong."""
    return arch_from_config(config, kv_dtype=kv_dtype).kv_bytes_per_token
