"""Capacity planner: KV tokens, concurrency, throughput and wall clock per launch profile.

The arithmetic is SGLang's own pool sizing (``docs/capacity.md``)::

    cell_bytes       = (kv_lora_rank + qk_rope_head_dim) * layers * dtype_bytes        # MLA
                     = kv_heads_per_rank * (head_dim + v_head_dim) * layers * dtype_bytes  # MHA
    kv_gib_per_rank  = post_free - dpa_extra[dp] - pre_free * (1 - mem_fraction) - mm_reservation
    tokens_per_rank  = floor(kv_gib_per_rank * 2**30 / cell_bytes)
    system_tokens    = tokens_per_rank * attention_dp * dcp       # plain TP replicates the cache
    steady_running   = system_tokens / (mean_prompt + mean_output / 2 + slack)
    tok_per_s        = N / (0.077 + 0.00018 * N),  N = min(steady, max_running, 150)  (+-25%)

MLA caches one latent per token on every TP rank, so plain TP does not divide the cache; DP
attention multiplies it by dp (each rank holds its own requests, at the price of replicated
attention weights) and decode context parallelism by dcp (each rank holds 1/dcp of every request).

The fit reproduces both reference runs (bf16 TP8 at 0.85: 116k tokens, 43 running, ~500 tok/s;
fp8 at 0.90: 376k, 139 running, ~1,360 tok/s). It is an empirical two-point fit: above ~150
running requests MoE compute and PCIe communication flatten it, so the planner never evaluates it
beyond ``max_running_fit``, which is also how DCP's 8x capacity turns into a compute cap rather
than 8x speed.

Reference preset (as module constants, and as data in every ``configs/profiles/kimi-k25-*.toml``):
Kimi-K2.5 (MLA 512 + 64, 61 layers: 70,272 B per token in bf16) on 8x RTX PRO 6000 Blackwell
96 GB, ``pre_free`` 94.26 GiB and ``post_free`` 21.73 GiB per GPU, fitted to the two runs.

The live controller (``--concurrency auto``) is ``capacity/controller.py``. **Extension point, a
new load signal:** one field of ``server/loads.py``'s ``RankLoad`` (and the parser line that fills
it). Each lane's ``LaneSample`` carries its rank's ``RankLoad`` whole (``sample.load``), so the
controller reads the new field there with nothing copied on the way, and ``run/telemetry.py``
writes every field to ``telemetry.jsonl`` from one place (``load_fields``).
"""

from __future__ import annotations

from eagledata.capacity.memory import (
    GIB,
    RTX_PRO_6000_X8_KIMI_K25,
    Deployment,
    kv_gib_per_rank,
    kv_tokens_per_rank,
)
from eagledata.capacity.plan_row import PlanRow
from eagledata.capacity.plan_table import render_plan_table
from eagledata.capacity.planner import (
    CLIENT_QUEUE_HEADROOM,
    CONCURRENT_REQUEST_TOKENS,
    MAX_RUNNING_HEADROOM,
    plan_deployment,
    plan_profile,
    plan_profiles,
)
from eagledata.capacity.stepfit import decode_tok_s
from eagledata.capacity.workload import REFERENCE_WORKLOAD, Workload
from eagledata.profiles.kv import (
    KIMI_K25,
    KIMI_K25_BF16_BYTES_PER_TOKEN,
    KV_DTYPE_BYTES,
    KVModel,
    kv_dtype_bytes,
)

__all__ = [
    "CLIENT_QUEUE_HEADROOM",
    "CONCURRENT_REQUEST_TOKENS",
    "GIB",
    "KIMI_K25",
    "KIMI_K25_BF16_BYTES_PER_TOKEN",
    "KV_DTYPE_BYTES",
    "MAX_RUNNING_HEADROOM",
    "REFERENCE_WORKLOAD",
    "RTX_PRO_6000_X8_KIMI_K25",
    "Deployment",
    "KVModel",
    "PlanRow",
    "Workload",
    "decode_tok_s",
    "kv_dtype_bytes",
    "kv_gib_per_rank",
    "kv_tokens_per_rank",
    "plan_deployment",
    "plan_profile",
    "plan_profiles",
    "render_plan_table",
]
