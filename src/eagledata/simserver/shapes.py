"""How the SGLang release the simulated server speaks (``SimConfig.version``) shapes what it says.

The simulator's settings stay in one vocabulary (``dp_size`` DP ranks, ``enable_dp_attention``,
``dcp_size``, ``max_total_num_tokens`` the tokens one DP rank's scheduler holds, every DCP rank's
share counted); each release reports them its own way (``docs/sglang.md``, the release files in
``configs/sglang-releases/``):

* DP attention: 0.5.9 and 0.5.15.post1 say ``dp_size: N, enable_dp_attention: true``; 0.5.23
  says ``dp_size: 1, attn_dp_size: N, enable_dp_attention: true``
  (``ServerArgs.resolved_dict``);
* DCP token capacity (``max_total_num_tokens``, ``memory_usage.token_capacity``, ``/v1/loads``,
  ``sglang:max_total_num_tokens``): one DCP rank's rows in 0.5.15.post1, every rank's share in
  0.5.23; ``memory_usage.kvcache`` is one rank's GiB in both; 0.5.9 has no DCP;
* ``memory_usage``: 0.5.23 adds ``startup_available`` and ``token_capacity_swa`` and makes
  ``graph`` a dict per phase;
* the rank pin: ``data_parallel_rank`` (0.5.9), ``routed_dp_rank`` (0.5.15.post1, which drops the
  old name silently), either (0.5.23, the old name a deprecated alias);
* ``/v1/loads``: sections (``memory``, ``spec``, ``queues``) only when ``include`` names them
  (0.5.9 and 0.5.15.post1 send ``core`` alone without it; 0.5.23 everything); ``aggregate`` and
  ``dp_rank_count`` only in 0.5.9; an unknown section is a 400.
* ``meta_info``: ``total_retractions`` up to 0.5.15.post1, ``num_retractions`` and ``dp_rank`` in
  0.5.23.
"""

from __future__ import annotations

from typing import Any

from eagledata.profiles.releases import release_for, version_key
from eagledata.simserver.config import SimConfig

S23 = version_key("0.5.23")
LOAD_SECTIONS = frozenset({"core", "memory", "spec", "lora", "disagg", "queues", "all"})


def at_least(config: SimConfig, version: str) -> bool:
    return version_key(config.version) >= version_key(version)


def attn_dp_reported(config: SimConfig) -> bool:
    """0.5.23 reports DP attention's width as ``attn_dp_size`` (``dp_size`` then 1)."""
    return release_for(config.version)[0].flags.dp_attention == "attn-dp-size"


def reported_pool(config: SimConfig) -> int:
    """The ``max_total_num_tokens`` / ``token_capacity`` a DP rank reports: every DCP rank's
    share (0.5.23), or one DCP rank's rows (0.5.15.post1)."""
    pool = config.max_total_num_tokens
    if config.dcp_size > 1 and release_for(config.version)[0].server.dcp_capacity == "per-rank":
        return pool // config.dcp_size
    return pool


def rows_per_gpu(config: SimConfig) -> int:
    """The rows one GPU's KV pool holds (what ``memory_usage.kvcache`` measures)."""
    return config.max_total_num_tokens // config.dcp_size


def parallel_args(config: SimConfig) -> dict[str, Any]:
    """The ServerArgs keys of the DP and DCP layout, as this release reports them."""
    args: dict[str, Any] = {"dp_size": config.dp_size, "enable_dp_attention": False}
    if config.enable_dp_attention:
        args["enable_dp_attention"] = True
    if attn_dp_reported(config):
        attn = config.dp_size if config.enable_dp_attention else 1
        args |= {"dp_size": config.dp_size // attn, "attn_dp_size": attn}
    if release_for(config.version)[0].server.dcp_capacity != "none":
        args["dcp_size"] = config.dcp_size
    return args


def memory_usage(config: SimConfig) -> dict[str, Any]:
    """``internal_states[i].memory_usage`` (GiB; ``kvcache`` is one GPU's pool)."""
    kvcache = rows_per_gpu(config) * config.bytes_per_token() / 2**30
    weight = round(71.6 * 8 / config.tp_size, 2)
    if not at_least(config, "0.5.23"):
        return {
            "weight": weight,
            "kvcache": kvcache,
            "token_capacity": reported_pool(config),
            "graph": 2.1,
        }
    return {  # scheduler_components/memory_usage.py build_memory_usage
        "weight": weight,
        "kvcache": kvcache,
        "startup_available": 94.26,
        "token_capacity": reported_pool(config),
        "token_capacity_swa": None,
        # every phase is named, the speculative ones at 0 without a draft (a real 0.5.23 server)
        "graph": {
            "decode": 2.1,
            "prefill": 0.0,
            "draft_decode": 0.0,
            "draft_extend": 0.0,
            "draft_prefill": 0.0,
            "target_verify": 0.0,
        },
    }


def pinned_rank_keys(config: SimConfig) -> tuple[str, ...]:
    """The ``/generate`` fields that pin a DP rank here, preferred first; the others are dropped
    silently, as FastAPI drops keys ``GenerateReqInput`` does not have."""
    release, _ = release_for(config.version)
    if release.server.rank_pin == "data_parallel_rank":
        return ("data_parallel_rank",)
    if at_least(config, "0.5.23"):
        return ("routed_dp_rank", "data_parallel_rank")  # the old name a deprecated alias
    return ("routed_dp_rank",)


def retraction_meta(config: SimConfig, retractions: int, dp_rank: int) -> dict[str, Any]:
    if at_least(config, "0.5.23"):
        # a server of one DP rank answers null (recorded from a real 0.5.23 server)
        return {"num_retractions": retractions, "dp_rank": dp_rank if config.dp_size > 1 else None}
    return {"total_retractions": retractions}


def cached_details(config: SimConfig, cached: int) -> dict[str, int] | None:
    """``cached_tokens_details``: 0.5.23 says where a prefix hit came from, null on a miss."""
    if at_least(config, "0.5.23") and cached > 0:
        return {"device": cached, "host": 0}
    return None


def timing_meta(
    config: SimConfig, *, arrived_wall: float, now_wall: float, output_len: int
) -> dict[str, Any]:
    """The per-request timings and counters a 0.5.23 answer carries besides ``e2e_latency``
    (``managers/scheduler_components``; recorded from a real server). No client reads them;
    they are here so that the simulator's answers keep the real shape."""
    if not at_least(config, "0.5.23"):
        return {}
    elapsed = max(now_wall - arrived_wall, 0.0)
    return {
        "queue_time": 0.0,
        "first_token_latency": elapsed / max(output_len, 1),
        "decode_throughput": output_len / elapsed if elapsed > 0 else 0.0,
        "forward_entry_time": arrived_wall,
        "prefill_finished_time": arrived_wall,
        "request_received_ts": arrived_wall,
        "api_server_dispatch_finish_ts": arrived_wall,
        "request_finished_ts": now_wall,
        "storage_prefetch_wait": 0.0,
        "storage_staging_wait": 0.0,
        "reasoning_tokens": 0,
        "weight_versions": [{"start": 0, "end": output_len, "version": "default"}],
    }


def logprob_counts(config: SimConfig, meta: dict[str, Any]) -> dict[str, int]:
    """0.5.23 counts the output logprobs it returned beside them."""
    entries = meta.get("output_token_logprobs")
    if at_least(config, "0.5.23") and isinstance(entries, list):
        return {"output_token_logprobs_length": len(entries)}
    return {}


class BadSections(ValueError):
    """``/v1/loads?include=`` named a section the release does not know (a 400)."""


def load_sections(config: SimConfig, include: str | None) -> frozenset[str]:
    """The sections ``/v1/loads`` sends for ``include``."""
    if include is None:
        wanted = {"all"} if at_least(config, "0.5.23") else {"core"}
    else:
        wanted = {part.strip() for part in include.split(",") if part.strip()}
    unknown = wanted - LOAD_SECTIONS
    if unknown:
        raise BadSections(
            f"Invalid include sections: {sorted(unknown)}. Valid options: {sorted(LOAD_SECTIONS)}"
        )
    if "all" in wanted:
        return LOAD_SECTIONS
    return frozenset(wanted)
