"""Deployment memory math: the KV pool one rank gets from what its GPU has free."""

from __future__ import annotations

import math
from dataclasses import dataclass

from eagledata.errors import ConfigError
from eagledata.profiles.profile import HardwareSection, Profile

GIB = 1 << 30

RTX_PRO_6000_X8_KIMI_K25 = HardwareSection(
    gpu="RTX PRO 6000 Blackwell 96 GB (PCIe Gen5, no NVLink)",
    num_gpus=8,
    pre_free_gib=94.26,
    post_free_gib=21.73,
    mm_reservation_gib=0.0,
    dp_attention_extra_gib={2: 3.1, 4: 5.6, 8: 10.5},
)
"""Per-GPU memory of Kimi-K2.5 INT4 at TP8 on 8x RTX PRO 6000, fitted to the two reference runs
(bf16 @0.85 -> 116,000 tokens; fp8 @0.90 -> 376,029): free before weights 94.26 GiB, after
21.73 GiB. DP attention replicates attention + embedding weights: +3.1/5.6/10.5 GiB at dp 2/4/8
(arithmetic, unmeasured)."""


@dataclass(frozen=True)
class Deployment:
    """The server settings the planner needs, as read from a profile's ``[sglang_args]``."""

    kv_cache_dtype: str
    mem_fraction_static: float
    tp_size: int = 1
    attn_dp_size: int = 1
    dcp_size: int = 1
    max_running_requests: int | None = None
    context_length: int | None = None
    cuda_graph_max_bs: int | None = None

    @classmethod
    def from_profile(cls, profile: Profile) -> Deployment:
        return cls(
            kv_cache_dtype=profile.kv_cache_dtype,
            mem_fraction_static=profile.mem_fraction_static,
            tp_size=profile.tp_size,
            attn_dp_size=profile.dp_size if profile.enable_dp_attention else 1,
            dcp_size=profile.dcp_size,
            max_running_requests=profile.max_running_requests,
            context_length=profile.context_length,
            cuda_graph_max_bs=profile.cuda_graph_max_bs,
        )

    @property
    def attn_tp_size(self) -> int:
        return max(1, self.tp_size // self.attn_dp_size)

    @property
    def parallelism(self) -> str:
        text = f"TP{self.tp_size}"
        if self.attn_dp_size > 1:
            text += f" DPA{self.attn_dp_size}"
        if self.dcp_size > 1:
            text += f" DCP{self.dcp_size}"
        return text


def kv_gib_per_rank(hardware: HardwareSection, deployment: Deployment) -> float:
    """GiB of KV pool one rank gets (may be <= 0: SGLang then refuses to start)."""
    post = hardware.post_free_gib
    if deployment.attn_dp_size > 1:
        try:
            post -= hardware.dp_attention_extra_gib[deployment.attn_dp_size]
        except KeyError:
            raise ConfigError(
                f"hardware.dp_attention_extra_gib: no entry for dp {deployment.attn_dp_size}"
            ) from None
    headroom = hardware.pre_free_gib * (1.0 - deployment.mem_fraction_static)
    return post - headroom - hardware.mm_reservation_gib


def kv_tokens_per_rank(hardware: HardwareSection, deployment: Deployment, cell_bytes: int) -> int:
    """``max_total_num_tokens`` of one rank, as SGLang computes it."""
    gib = kv_gib_per_rank(hardware, deployment)
    return max(0, math.floor(gib * GIB / cell_bytes))
