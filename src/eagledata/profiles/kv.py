"""Per-token KV-cache size of a model: SGLang's cell size for MLA and MHA attention."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from eagledata.errors import ConfigError
from eagledata.profiles.sections import ModelSection

KV_DTYPE_BYTES: dict[str, float] = {
    "bf16": 2,
    "bfloat16": 2,
    "fp16": 2,
    "float16": 2,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "mxfp8": 1,
    "fp4_e2m1": 0.5,  # payload only; SGLang's fp4 pools add scale buffers
    "nvfp4": 0.5,
    "fp4_mx_block16": 0.5,
}


def kv_dtype_bytes(kv_cache_dtype: str) -> float:
    """Bytes per KV element for a ``--kv-cache-dtype`` value; ``auto`` has no fixed answer."""
    try:
        return KV_DTYPE_BYTES[kv_cache_dtype]
    except KeyError:
        known = ", ".join(sorted(KV_DTYPE_BYTES))
        raise ConfigError(
            f"kv-cache-dtype: {kv_cache_dtype!r} has no fixed size (known: {known}); "
            "pass bf16 explicitly"
        ) from None


@dataclass(frozen=True)
class KVModel:
    """The per-token KV-cache shape of a model."""

    name: str
    attention: Literal["mla", "mha"]
    num_layers: int
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    num_kv_heads: int = 0
    head_dim: int = 0
    v_head_dim: int = 0

    @classmethod
    def from_config(cls, config: Mapping[str, Any], *, name: str = "") -> KVModel:
        """Read a HF ``config.json`` dict; multimodal wrappers (Kimi-K2.5) nest it in
        ``text_config``."""
        text = config.get("text_config")
        cfg: Mapping[str, Any] = {**config, **text} if isinstance(text, Mapping) else config
        label = name or str(cfg.get("_name_or_path") or cfg.get("model_type") or "model")

        def need(key: str) -> int:
            value = cfg.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"config.json: {key}: missing or not an integer ({label})")
            return value

        layers = need("num_hidden_layers")
        if cfg.get("kv_lora_rank") is not None:
            return cls(
                name=label,
                attention="mla",
                num_layers=layers,
                kv_lora_rank=need("kv_lora_rank"),
                qk_rope_head_dim=need("qk_rope_head_dim"),
            )
        heads = need("num_attention_heads")
        kv_heads = cfg.get("num_key_value_heads") or heads
        head_dim = cfg.get("head_dim") or need("hidden_size") // heads
        return cls(
            name=label,
            attention="mha",
            num_layers=layers,
            num_kv_heads=int(kv_heads),
            head_dim=int(head_dim),
            v_head_dim=int(cfg.get("v_head_dim") or head_dim),
        )

    @classmethod
    def from_section(cls, section: ModelSection, *, base_dir: str = "") -> KVModel:
        """The shape a profile's ``[model]`` table describes (or its ``config_json``)."""
        if section.config_json is not None:
            path = Path(base_dir) / section.config_json
            try:
                config = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as error:
                raise ConfigError(f"model.config_json: cannot read {path}: {error}") from None
            return cls.from_config(config, name=section.name)
        if section.attention == "mla":
            return cls(
                name=section.name,
                attention="mla",
                num_layers=section.num_hidden_layers or 0,
                kv_lora_rank=section.kv_lora_rank or 0,
                qk_rope_head_dim=section.qk_rope_head_dim or 0,
            )
        head_dim = section.head_dim or 0
        return cls(
            name=section.name,
            attention="mha",
            num_layers=section.num_hidden_layers or 0,
            num_kv_heads=section.num_key_value_heads or 0,
            head_dim=head_dim,
            v_head_dim=section.v_head_dim or head_dim,
        )

    def cell_bytes(self, kv_cache_dtype: str, *, attn_tp_size: int = 1) -> int:
        """Bytes one token occupies in one rank's KV pool (SGLang ``_compute_cell_size``).

        The MLA latent is never split across ranks; MHA keeps ``kv_heads / attn_tp`` heads.
        """
        dtype_bytes = kv_dtype_bytes(kv_cache_dtype)
        if self.attention == "mla":
            elements = (self.kv_lora_rank + self.qk_rope_head_dim) * self.num_layers
        else:
            heads = max(1, self.num_kv_heads // max(1, attn_tp_size))
            elements = heads * (self.head_dim + self.v_head_dim) * self.num_layers
        return math.ceil(elements * dtype_bytes)

    @property
    def bf16_bytes_per_token(self) -> int:
        return self.cell_bytes("bf16")


KIMI_K25 = KVModel(
    name="moonshotai/Kimi-K2.5",
    attention="mla",
    num_layers=61,
    kv_lora_rank=512,
    qk_rope_head_dim=64,
)
"""Kimi-K2.5 text backbone (DeepSeek-V3 MLA): 70,272 B per token in bf16, on every TP rank."""

KIMI_K25_BF16_BYTES_PER_TOKEN = 70_272
