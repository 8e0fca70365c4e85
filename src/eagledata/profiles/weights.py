"""What a model's weights take on one GPU, from its ``config.json`` alone (no checkpoint read).

Parameters are counted by kind, each with the bytes its checkpoint stores per parameter, and each
with how tensor parallelism treats it (``WeightPart.split``: divided over the TP ranks, or kept
whole on every GPU)::

    embedding, lm_head      vocab x hidden (lm_head absent when tied)           split (vocab)
    attention, MHA/GQA      hidden x (heads + 2 kv_heads) x head_dim + o_proj    split
                            (K/V of fewer heads than ranks: replicated, one head per rank)
    attention, MLA          q_a, kv_a (the latent's down-projections)            whole
                            q_b, kv_b, o_proj                                    split
    dense MLP               3 x hidden x intermediate                            split
    MoE experts             experts x 3 x hidden x moe_intermediate              split (EP or TP)
    shared experts          n_shared x 3 x hidden x moe_intermediate             split
    router                  hidden x experts                                     whole

Bytes per parameter follow the checkpoint's ``quantization_config``: fp8 block-quantized linear
layers 1 B; MXFP4 experts (GPT-OSS) 4.25 bits; 4-bit compressed-tensors experts (Kimi-K2.5, group
32, bf16 scales) 0.5625 B; everything else the model's dtype (bf16: 2 B). Norms, biases, the K/V
heads replicated when TP exceeds them, and a multimodal wrapper's vision tower are not counted.
The estimate for Kimi-K2.5 at TP8 is within a few percent of what the two reference runs
measured (``tests/test_models.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

GIB = 1 << 30


@dataclass(frozen=True)
class WeightPart:
    name: str
    params: int
    bytes_per_param: float
    split: bool
    """Divided over the TP ranks (else every GPU holds it whole)."""
    attention: bool = False
    """Attention or embedding: what DP attention divides over fewer ranks (``attn_tp``)."""

    @property
    def gib(self) -> float:
        return self.params * self.bytes_per_param / GIB


@dataclass(frozen=True)
class WeightEstimate:
    """A model's weights by part, and what one GPU holds of them at a TP size."""

    parts: tuple[WeightPart, ...]
    format: str
    """How the checkpoint stores them, for the plan (``bf16``, ``fp8``, ``MXFP4 experts``...)."""

    @property
    def total_gib(self) -> float:
        return sum(part.gib for part in self.parts)

    @property
    def params(self) -> int:
        return sum(part.params for part in self.parts)

    def replicated_gib(self) -> float:
        return sum(part.gib for part in self.parts if not part.split)

    def per_gpu_gib(self, tp_size: int, *, attn_tp_size: int | None = None) -> float:
        """GiB one GPU holds at ``tp_size``; under DP attention the attention and embedding
        weights are divided over ``attn_tp_size`` ranks only (replicated over the DP ranks)."""
        attn_tp = tp_size if attn_tp_size is None else attn_tp_size
        total = 0.0
        for part in self.parts:
            if not part.split:
                total += part.gib
            else:
                total += part.gib / (attn_tp if part.attention else tp_size)
        return total

    def dp_attention_extra_gib(self, tp_size: int, dp_size: int) -> float:
        """What DP attention at ``dp_size`` adds per GPU over plain TP at ``tp_size``."""
        return self.per_gpu_gib(tp_size, attn_tp_size=tp_size // dp_size) - self.per_gpu_gib(
            tp_size
        )


def estimate_weights(config: Mapping[str, Any]) -> WeightEstimate:
    """The weights a ``config.json`` describes (a multimodal wrapper's ``text_config``)."""
    text = config.get("text_config")
    cfg: Mapping[str, Any] = {**config, **text} if isinstance(text, Mapping) else config

    def num(key: str, default: int = 0) -> int:
        value = cfg.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else default

    hidden = num("hidden_size")
    layers = num("num_hidden_layers")
    heads = num("num_attention_heads")
    kv_heads = num("num_key_value_heads", heads) or heads
    head_dim = num("head_dim") or (hidden // heads if heads else 0)
    vocab = num("vocab_size")
    dense_bytes, expert_bytes, fmt = _bytes_per_param(cfg)
    embed_bytes = 2.0 if dense_bytes < 2 else dense_bytes  # embeddings stay in the model dtype

    parts: list[WeightPart] = [
        WeightPart("embedding", vocab * hidden, embed_bytes, split=True, attention=True)
    ]
    if not cfg.get("tie_word_embeddings", False):
        parts.append(WeightPart("lm_head", vocab * hidden, embed_bytes, split=True, attention=True))

    # attention
    if cfg.get("kv_lora_rank") is not None:
        q_lora = num("q_lora_rank")
        nope, rope, v_dim = num("qk_nope_head_dim"), num("qk_rope_head_dim"), num("v_head_dim")
        kv_lora = num("kv_lora_rank")
        q_head = nope + rope
        down = hidden * (kv_lora + rope) + (hidden * q_lora if q_lora else 0)
        up = (q_lora * heads * q_head if q_lora else hidden * heads * q_head) + kv_lora * heads * (
            nope + v_dim
        )
        up += heads * v_dim * hidden
        parts.append(WeightPart("attention (latent down-projections)", down * layers,
                                dense_bytes, split=False, attention=True))  # fmt: skip
        parts.append(WeightPart("attention", up * layers, dense_bytes, split=True, attention=True))
    else:
        qo = 2 * hidden * heads * head_dim
        kv = 2 * hidden * kv_heads * head_dim
        parts.append(WeightPart("attention", (qo + kv) * layers, dense_bytes, split=True,
                                attention=True))  # fmt: skip

    # MLP: dense layers, MoE layers
    experts = num("n_routed_experts") or num("num_experts") or num("num_local_experts")
    intermediate = num("intermediate_size")
    if experts:
        moe_inter = num("moe_intermediate_size") or intermediate
        dense_layers = _dense_layers(cfg, layers)
        moe_layers = layers - dense_layers
        shared = num("n_shared_experts")
        shared_inter = num("shared_expert_intermediate_size") or shared * moe_inter
        if dense_layers:
            parts.append(WeightPart("dense MLP", 3 * hidden * intermediate * dense_layers,
                                    dense_bytes, split=True))  # fmt: skip
        parts.append(WeightPart("routed experts", 3 * hidden * moe_inter * experts * moe_layers,
                                expert_bytes, split=True))  # fmt: skip
        if shared_inter:
            parts.append(WeightPart("shared experts", 3 * hidden * shared_inter * moe_layers,
                                    dense_bytes, split=True))  # fmt: skip
        parts.append(WeightPart("router", hidden * experts * moe_layers, 2.0, split=False))
    else:
        parts.append(WeightPart("MLP", 3 * hidden * intermediate * layers, dense_bytes,
                                split=True))  # fmt: skip
    return WeightEstimate(tuple(part for part in parts if part.params), fmt)


def _dense_layers(cfg: Mapping[str, Any], layers: int) -> int:
    """MoE models with dense layers: DeepSeek's first ``first_k_dense_replace``, Qwen's
    ``mlp_only_layers`` and every layer off its ``decoder_sparse_step``."""
    first = cfg.get("first_k_dense_replace")
    if isinstance(first, int):
        return min(first, layers)
    only = cfg.get("mlp_only_layers") or []
    step = cfg.get("decoder_sparse_step") or 1
    dense = {i for i in range(layers) if isinstance(step, int) and step > 1 and (i + 1) % step}
    dense |= {i for i in only if isinstance(i, int)}
    return len(dense)


def _bytes_per_param(cfg: Mapping[str, Any]) -> tuple[float, float, str]:
    """(bytes per dense parameter, bytes per routed-expert parameter, the format's name)."""
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    base = 4.0 if dtype in ("float32", "fp32") else 2.0
    quant = cfg.get("quantization_config")
    if not isinstance(quant, Mapping):
        return base, base, "bf16" if base == 2 else dtype
    method = str(quant.get("quant_method", "")).lower()
    if method == "fp8":
        return 1.0, 1.0, "fp8"
    if method == "mxfp4":
        return base, 4.25 / 8, "MXFP4 experts, the rest bf16"
    if method == "compressed-tensors":
        for group in (quant.get("config_groups") or {}).values():
            weights = group.get("weights") if isinstance(group, Mapping) else None
            if isinstance(weights, Mapping) and weights.get("num_bits") == 4:
                size = weights.get("group_size") or 128
                return base, 0.5 + 2 / size, f"int4 experts (group {size}), the rest bf16"
    return base, base, f"{method or 'unknown'} (counted at the model dtype)"
