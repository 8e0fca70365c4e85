"""Per-token KV-cache size of a model: SGLang's cell size for MLA, MHA/GQA and sliding-window
hybrids."""

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


HYBRID_SWA_ARCHITECTURES = frozenset(
    {
        "GptOssForCausalLM",
        "GraniteSWAForCausalLM",
        "GraniteMoeSWAForCausalLM",
        "Gemma4ForCausalLM",
        "Gemma4ForConditionalGeneration",
        "BeamForCausalLM",
        "LagunaForCausalLM",
        "MellumForCausalLM",
        "Step3p5ForCausalLM",
        "Llama4ForConditionalGeneration",
    }
)
"""Architectures SGLang 0.5.23 serves with two KV pools, one for its full-attention layers and one
for its sliding-window layers (``configs/model_config.py``, ``is_hybrid_swa_model``; all but
Llama 4 say which layer is which in ``layer_types``). Any other model keeps every layer in one
pool, sliding window or not (``--disable-hybrid-swa-memory`` does so for these too)."""

SWA_FULL_TOKENS_RATIO = 0.8
"""SGLang's default ``--swa-full-tokens-ratio``: the sliding-window pool holds this many tokens
per token of the full pool."""

AttentionKind = Literal["mla", "mha"]


@dataclass(frozen=True)
class KVModel:
    """The per-token KV-cache shape of a model, as SGLang lays out its pool.

    * MLA (DeepSeek-V3, Kimi): one latent of ``kv_lora_rank + qk_rope_head_dim`` per layer,
      kept whole on every attention-TP rank.
    * MHA/GQA/MQA: K and V of ``num_kv_heads`` heads per layer; attention TP splits the heads
      (a rank keeps at least one: heads are replicated when TP exceeds them).
    * Hybrid sliding window (GPT-OSS): ``num_layers`` full-attention layers in the full pool,
      ``swa_layers`` sliding-window layers in a second pool holding ``swa_full_tokens_ratio``
      tokens per full-pool token; one "token" of the pool is a token of the full pool.
    """

    name: str
    attention: AttentionKind
    num_layers: int
    """Layers in the (full) pool: every layer, or a hybrid's full-attention layers."""
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    num_kv_heads: int = 0
    num_attention_heads: int = 0
    """Query heads (fewer KV heads than these: GQA)."""
    head_dim: int = 0
    v_head_dim: int = 0
    swa_layers: int = 0
    """A hybrid's sliding-window layers (their own pool); 0 for one pool."""
    swa_kv_heads: int = 0
    swa_head_dim: int = 0
    swa_v_head_dim: int = 0
    sliding_window: int | None = None

    @classmethod
    def from_config(cls, config: Mapping[str, Any], *, name: str = "") -> KVModel:
        """Read a HF ``config.json`` dict as SGLang's ``ModelConfig`` does; multimodal wrappers
        (Kimi-K2.5) nest the language model's in ``text_config``."""
        text = config.get("text_config")
        cfg: Mapping[str, Any] = {**config, **text} if isinstance(text, Mapping) else config
        label = name or str(cfg.get("_name_or_path") or cfg.get("model_type") or "model")

        def need(key: str) -> int:
            value = cfg.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"config.json: {key}: missing or not an integer ({label})")
            return value

        def optional(key: str) -> int | None:
            value = cfg.get(key)
            return value if isinstance(value, int) and not isinstance(value, bool) else None

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
        kv_heads = optional("num_key_value_heads") or heads
        if cfg.get("multi_query") is True:
            kv_heads = 1
        head_dim = optional("head_dim") or need("hidden_size") // heads
        v_head_dim = optional("v_head_dim") or head_dim
        full, swa = layers, 0
        architectures = config.get("architectures") or []
        if any(arch in HYBRID_SWA_ARCHITECTURES for arch in architectures):
            full, swa = _hybrid_layers(cfg, architectures, layers)
        swa_head_dim = optional("swa_head_dim") or head_dim
        return cls(
            name=label,
            attention="mha",
            num_layers=full,
            num_kv_heads=kv_heads,
            num_attention_heads=heads,
            head_dim=head_dim,
            v_head_dim=v_head_dim,
            swa_layers=swa,
            swa_kv_heads=(optional("swa_num_key_value_heads") or kv_heads) if swa else 0,
            swa_head_dim=swa_head_dim if swa else 0,
            swa_v_head_dim=(optional("swa_v_head_dim") or swa_head_dim) if swa else 0,
            sliding_window=optional("sliding_window") if swa else None,
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

    @property
    def hybrid(self) -> bool:
        """Two pools: full-attention layers and sliding-window layers."""
        return self.swa_layers > 0

    @property
    def kind(self) -> str:
        """What the plan calls its attention: ``MLA``, ``MHA``, ``GQA`` or ``MQA``, and
        ``+ sliding window`` for a hybrid."""
        if self.attention == "mla":
            base = "MLA"
        elif self.num_kv_heads == 1:
            base = "MQA"
        else:
            base = "GQA" if 0 < self.num_kv_heads < self.num_attention_heads else "MHA"
        if self.hybrid:
            window = f" {self.sliding_window}" if self.sliding_window else ""
            layers = f"{self.num_layers} full, {self.swa_layers} sliding-window layers"
            return f"{base} + sliding window{window} ({layers})"
        return base

    def heads_per_rank(self, attn_tp_size: int = 1, dcp_size: int = 1, *, swa: bool = False) -> int:
        """KV heads one rank keeps (SGLang ``ModelConfig.get_num_kv_heads``): DCP ranks hold the
        same heads, so heads split over ``attn_tp // dcp`` groups; at least one per rank."""
        heads = self.swa_kv_heads if swa else self.num_kv_heads
        if swa:  # get_swa_num_kv_heads: no DCP term
            return max(1, heads // max(1, attn_tp_size))
        return max(1, heads // max(1, max(1, attn_tp_size) // max(1, dcp_size)))

    def cell_size(
        self,
        kv_cache_dtype: str,
        *,
        attn_tp_size: int = 1,
        dcp_size: int = 1,
        swa_full_tokens_ratio: float = SWA_FULL_TOKENS_RATIO,
    ) -> float:
        """Bytes one token of the pool costs on one rank, as SGLang's pool configurator sizes it
        (``model_executor/pool_configurator.py``: ``DefaultPoolConfigurator._compute_cell_size``,
        ``HybridSWAPoolConfigurator._recompute_cell_size``); the pool holds
        ``floor(available bytes / cell_size)`` tokens. A fraction only for a hybrid."""
        dtype_bytes = kv_dtype_bytes(kv_cache_dtype)
        if self.attention == "mla":
            return (self.kv_lora_rank + self.qk_rope_head_dim) * self.num_layers * dtype_bytes
        full = (
            self.heads_per_rank(attn_tp_size, dcp_size)
            * (self.head_dim + self.v_head_dim)
            * self.num_layers
            * dtype_bytes
        )
        if not self.hybrid:
            return full
        swa = (
            self.heads_per_rank(attn_tp_size, swa=True)
            * (self.swa_head_dim + self.swa_v_head_dim)
            * self.swa_layers
            * dtype_bytes
        )
        return full + swa_full_tokens_ratio * swa

    def cell_bytes(self, kv_cache_dtype: str, *, attn_tp_size: int = 1, dcp_size: int = 1) -> int:
        """``cell_size`` rounded up to whole bytes (exact but for a hybrid's fraction)."""
        return math.ceil(
            self.cell_size(kv_cache_dtype, attn_tp_size=attn_tp_size, dcp_size=dcp_size)
        )

    @property
    def bf16_bytes_per_token(self) -> int:
        return self.cell_bytes("bf16")

    @property
    def guard_bytes_per_token(self) -> int | None:
        """What the KV guard compares a server's measured bytes per token with: the bf16 cell
        at attention TP 1 (the guard splits an MHA cell by the server's own TP); None for a
        hybrid, whose two pools' bytes the server reports together over the full pool's
        tokens, at a ratio set at launch."""
        return None if self.hybrid else self.bf16_bytes_per_token


def _hybrid_layers(cfg: Mapping[str, Any], architectures: Any, layers: int) -> tuple[int, int]:
    """(full, sliding-window) layer counts (SGLang ``get_hybrid_layer_ids``)."""
    if "Llama4ForConditionalGeneration" in architectures:
        full = sum(1 for i in range(layers) if (i + 1) % 4 == 0)
        return full, layers - full
    layer_types = cfg.get("layer_types")
    if not isinstance(layer_types, list):
        raise ConfigError(
            "config.json: layer_types: missing; a sliding-window hybrid says which layer is which"
        )
    kinds = layer_types[:layers]
    return kinds.count("full_attention"), kinds.count("sliding_attention")


KIMI_K25 = KVModel(
    name="moonshotai/Kimi-K2.5",
    attention="mla",
    num_layers=61,
    kv_lora_rank=512,
    qk_rope_head_dim=64,
)
"""Kimi-K2.5 text backbone (DeepSeek-V3 MLA): 70,272 B per token in bf16, on every TP rank."""

KIMI_K25_BF16_BYTES_PER_TOKEN = 70_272
