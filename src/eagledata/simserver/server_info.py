"""What the simulated server reports about itself: ``/server_info`` (and ``/get_server_info``)
and ``/v1/models`` bodies, in the shapes of the SGLang release it speaks."""

from __future__ import annotations

from typing import Any

from eagledata.simserver import shapes
from eagledata.simserver import speculative as spec_sim
from eagledata.simserver.config import SimConfig


def server_info(
    config: SimConfig,
    *,
    host: str,
    port: int,
    throughput: float,
    spec_tokens: int = 0,
    spec_verify_ct: int = 0,
) -> dict[str, Any]:
    """``/server_info``: flat ServerArgs keys, rank-0 scheduler info, internal_states, version,
    in the shapes of the release it speaks (``shapes``)."""
    pool = shapes.reported_pool(config)
    args: dict[str, Any] = {
        "model_path": config.model_path,
        "tokenizer_path": config.reported_tokenizer_path(),
        "served_model_name": config.served_name(),
        "dtype": config.dtype,
        "kv_cache_dtype": config.kv_cache_dtype,
        "quantization": config.quantization,
        "tp_size": config.tp_size,
        "pp_size": 1,
        "nnodes": 1,
        **shapes.parallel_args(config),
        "mem_fraction_static": config.mem_fraction_static,
        "max_total_tokens": None,
        "max_running_requests": config.max_running_requests,
        "max_queued_requests": config.max_queued_requests,
        "chunked_prefill_size": config.reported_chunked_prefill(),
        "context_length": config.context_length,
        "page_size": 1,
        "schedule_policy": "fcfs",
        "disable_radix_cache": config.disable_radix_cache,
        "enable_hierarchical_cache": config.enable_hierarchical_cache,
        "hicache_ratio": 2.0,
        "hicache_size": 0,
        "hicache_storage_backend": None,
        "enable_metrics": config.enable_metrics,
        "host": host,
        "port": port,
        "attention_backend": None,
        "skip_tokenizer_init": config.skip_tokenizer_init,
        "stream_interval": 1,
        "trust_remote_code": True,
        **spec_sim.server_args(config.speculative, with_draft_kv=shapes.at_least(config, "0.5.23")),
    }
    if not shapes.at_least(config, "0.5.23"):  # gone from 0.5.23's ServerArgs
        args |= {"cuda_graph_max_bs": 512, "stream_output": False}
    internal = {
        **args,
        "kv_cache_dtype": config.effective_kv_dtype(),
        "last_gen_throughput": throughput,
        "memory_usage": shapes.memory_usage(config),
        "effective_max_running_requests_per_dp": config.running_limit_per_rank(),
        **spec_sim.internal_state(
            config.speculative,
            requested_kv_dtype=config.kv_cache_dtype,
            tokens=spec_tokens,
            verify_ct=spec_verify_ct,
        ),
    }
    return {
        **args,
        "status": "ready",
        "max_total_num_tokens": pool,
        "max_req_input_len": config.max_req_input_len(),
        "internal_states": [
            internal if shapes.at_least(config, "0.5.23") else dict(internal, dp_rank=i)
            for i in range(config.dp_size)
        ],
        "version": config.version,
    }


def model_info(config: SimConfig) -> dict[str, Any]:
    info: dict[str, Any] = {
        "model_path": config.model_path,
        "tokenizer_path": config.reported_tokenizer_path(),
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "has_image_understanding": config.model_type == "kimi_k25",
        "has_audio_understanding": False,
        "model_type": config.model_type,
        "architectures": config.architectures,
    }
    if shapes.at_least(config, "0.5.23"):
        info |= {
            "served_model_name": config.served_name(),
            "load_format": "auto",
            "disaggregation_mode": "null",
            "reasoning_parser": None,
            "tool_call_parser": None,
        }
    return info
