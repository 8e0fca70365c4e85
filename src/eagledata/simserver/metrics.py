"""``/metrics`` and ``/v1/loads``: Prometheus text and JSON in SGLang's own names."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime
from typing import Any

from eagledata.simserver import shapes
from eagledata.simserver.speculative import loads_section, metrics_lines
from eagledata.simserver.state import SimState

GAUGES = (
    ("num_running_reqs", "The number of running requests."),
    ("num_queue_reqs", "The number of requests in the waiting queue."),
    ("num_used_tokens", "The number of used tokens."),
    ("token_usage", "The token usage."),
    ("gen_throughput", "The generation throughput (token/s)."),
    ("cache_hit_rate", "The prefix cache hit rate."),
    ("max_total_num_tokens", "Maximum total number of tokens in the KV cache pool."),
    ("num_retracted_reqs", "The number of retracted requests."),
)
COUNTERS = (
    ("prompt_tokens_total", "prompt_tokens"),
    ("generation_tokens_total", "generated_tokens"),
    ("cached_tokens_total", "cached_tokens"),
    ("num_requests_total", "items"),
    ("num_aborted_requests_total", "aborted_items"),
)

COUNTER_LABELS_0523 = {
    "prompt_tokens_total": ',engine_type="unified",is_streaming="false"',
    "generation_tokens_total": ',engine_type="unified",is_streaming="false"',
    "num_requests_total": ',engine_type="unified",is_streaming="false"',
    "cached_tokens_total": ',engine_type="unified",cache_source="device"',
    "num_aborted_requests_total": ',engine_type="unified"',
}
"""The labels 0.5.23's tokenizer-side counters carry besides ``model_name`` (recorded)."""


ENGINE_GAUGES = (("new_token_ratio", "The new token ratio.", (0, 5, 6)),)
ENGINE_COUNTERS = (
    ("num_retracted_requests_total", "retracted_total"),
    ("num_retracted_input_tokens_total", "retracted_input_tokens"),
    ("num_retracted_output_tokens_total", "retracted_output_tokens"),
)
"""Cumulative retraction counters per DP rank (0.5.7+)."""


def rank_views(state: SimState) -> list[dict[str, Any]]:
    """One dict per DP rank in SGLang's field names, whichever model the server runs; the pool
    as the release reports it (``shapes.reported_pool``: under DCP, one rank's rows in
    0.5.15.post1), used tokens and usage counting every DCP rank's share."""
    views = _rank_views(state)
    reported = shapes.reported_pool(state.config)
    for view in views:
        view["max_total_num_tokens"] = reported
    return views


def _rank_views(state: SimState) -> list[dict[str, Any]]:
    config, scheduler = state.config, state.scheduler
    if config.steps_engine:
        return scheduler.engine(config).loads(config)
    pool = config.max_total_num_tokens
    throughput = scheduler.gen_throughput() / config.dp_size
    views = []
    for load in scheduler.load(config):
        used = load["num_tokens"]
        views.append(
            {
                "dp_rank": load["dp_rank"],
                "num_running_reqs": load["num_reqs"] - load["num_waiting_reqs"],
                "num_waiting_reqs": load["num_waiting_reqs"],
                "num_used_tokens": used,
                "max_total_num_tokens": pool,
                "token_usage": used / pool,
                "gen_throughput": throughput,
                "new_token_ratio": None,
                "num_retracted_reqs": 0,
                "retracted_total": 0,
                "retracted_input_tokens": 0,
                "retracted_output_tokens": 0,
                "retracted_waiting": 0,
                "num_total_tokens": used,
            }
        )
    return views


def render_metrics(state: SimState) -> str:
    """Prometheus text in SGLang's names: scheduler gauges per DP rank, tokenizer counters."""
    config, scheduler = state.config, state.scheduler
    stats = scheduler.stats
    hit_rate = stats.cached_tokens / stats.prompt_tokens if stats.prompt_tokens else 0.0
    name = f'model_name="{config.served_name()}"'
    version = config.version_tuple()
    new_labels = shapes.at_least(config, "0.5.23")
    rows = []
    views = rank_views(state)
    if not config.metrics_dp_labels:
        # One series per gauge ("mostrecent" over the ranks' processes): one rank's numbers.
        state.metrics_scrapes += 1
        views = [views[state.metrics_scrapes % len(views)]]
    for view in views:
        labelled = config.dp_size > 1 and config.metrics_dp_labels
        dp = f',dp_rank="{view["dp_rank"]}"' if labelled else ""
        labels = f'{name},engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"{dp}'
        values = (
            view["num_running_reqs"],
            view["num_waiting_reqs"],
            view["num_used_tokens"],
            view["token_usage"],
            view["gen_throughput"],
            hit_rate,
            view["max_total_num_tokens"],
            view["num_retracted_reqs"],
        )
        rows.append((labels, values))
    lines = []
    for index, (metric, help_text) in enumerate(GAUGES):
        lines += [f"# HELP sglang:{metric} {help_text}", f"# TYPE sglang:{metric} gauge"]
        # 0.5.23 labels the retracted-requests gauge with the scheduler's pid too
        pid = f',pid="{os.getpid()}"' if metric == "num_retracted_reqs" and new_labels else ""
        lines += [f"sglang:{metric}{{{labels}{pid}}} {float(v[index])}" for labels, v in rows]
    accept = state.spec_tally.accept_length
    if config.speculative is None and new_labels:
        # 0.5.23 registers the speculative gauges on every server: 0 without a draft
        lines += _spec_zero_lines(rows)
    else:
        lines += metrics_lines(config.speculative, [labels for labels, _ in rows], accept)
    if config.steps_engine:
        for metric, help_text, since in ENGINE_GAUGES:
            if version >= since:
                lines += [f"# HELP sglang:{metric} {help_text}", f"# TYPE sglang:{metric} gauge"]
                lines += [
                    f"sglang:{metric}{{{labels}}} {float(view[metric])}"
                    for (labels, _), view in zip(rows, views, strict=True)
                ]
    if version >= (0, 5, 7):
        for metric, key in ENGINE_COUNTERS:
            lines += [f"# HELP sglang:{metric} {metric}.", f"# TYPE sglang:{metric} counter"]
            lines += [
                f"sglang:{metric}{{{labels}}} {float(view[key])}"
                for (labels, _), view in zip(rows, views, strict=True)
            ]
    for metric, attr in COUNTERS:
        lines += [f"# HELP sglang:{metric} {metric}.", f"# TYPE sglang:{metric} counter"]
        labels = name + (COUNTER_LABELS_0523.get(metric, "") if new_labels else "")
        lines.append(f"sglang:{metric}{{{labels}}} {float(getattr(stats, attr))}")
    return "\n".join(lines) + "\n"


def _spec_zero_lines(rows: list[tuple[str, Any]]) -> list[str]:
    lines: list[str] = []
    for metric in ("spec_accept_length", "spec_accept_rate"):
        lines += [f"# HELP sglang:{metric} {metric}.", f"# TYPE sglang:{metric} gauge"]
        lines += [f"sglang:{metric}{{{labels}}} 0.0" for labels, _ in rows]
    return lines


def render_loads(
    state: SimState, dp_rank: str | None = None, include: str | None = None
) -> dict[str, Any]:
    """``/v1/loads``: ``loads`` per DP rank, the sections ``include`` names (``shapes``; an
    unknown one raises ``shapes.BadSections``, a 400); 0.5.9 adds ``dp_rank_count`` and
    ``aggregate`` (S9 ``managers/io_struct.py`` L1807-1935), later releases build each entry from
    a per-rank snapshot (S23 ``managers/load_snapshot.py``). ``gen_throughput`` reads 0 without
    ``--enable-metrics``, as in SGLang (``load_publisher.py`` L209-212)."""
    config = state.config
    sections = shapes.load_sections(config, include)
    loads = []
    for view in rank_views(state):
        if dp_rank is not None and str(view["dp_rank"]) != dp_rank:
            continue
        running, waiting = view["num_running_reqs"], view["num_waiting_reqs"]
        entry: dict[str, Any] = {
            "dp_rank": view["dp_rank"],
            "num_running_reqs": running,
            "num_waiting_reqs": waiting,
            "num_used_tokens": view["num_used_tokens"],
            "num_total_tokens": view["num_total_tokens"],
            "max_total_num_tokens": view["max_total_num_tokens"],
            "token_usage": view["token_usage"],
            "gen_throughput": view["gen_throughput"] if config.enable_metrics else 0.0,
            "cache_hit_rate": 0.0,
            "utilization": 0.0,
            "max_running_requests": config.running_limit_per_rank(),
        }
        snapshot = shapes.at_least(config, "0.5.23")  # managers/load_snapshot.py LoadSnapshot
        if snapshot:
            entry |= {
                "timestamp": time.time(),
                "num_waiting_uncached_tokens": 0,
                "num_active_tokens": view["num_total_tokens"],
                "num_prealloc_ready_tokens": 0,
                "total_prefill_uncached_tokens": 0,
                "total_prefill_busy_us": 0,
                "decode_moments": None,
            }
        if "memory" in sections:
            entry["memory"] = {"token_capacity": view["max_total_num_tokens"]}
            if snapshot:
                usage = shapes.memory_usage(config)
                entry["memory"] |= {
                    "weight_gb": usage["weight"],
                    "kv_cache_gb": usage["kvcache"],
                    "graph_gb": sum(usage["graph"].values()),
                }
        if "queues" in sections:
            entry["queues"] = {
                "waiting": waiting,
                "grammar": 0,
                "paused": 0,
                "retracted": view["retracted_waiting"],
            }
            if snapshot:
                entry["queues"]["prealloc_ready"] = 0
        if snapshot and "disagg" in sections:
            entry["disaggregation"] = {
                "mode": "null",
                "prefill_bootstrap_queue_reqs": 0,
                "prefill_inflight_queue_reqs": 0,
                "decode_prealloc_queue_reqs": 0,
                "decode_transfer_queue_reqs": 0,
                "decode_retracted_queue_reqs": 0,
                "kv_transfer_speed_gb_s": 0.0,
                "kv_transfer_latency_ms": 0.0,
            }
        if "spec" in sections:
            entry |= loads_section(config.speculative, state.spec_tally.accept_length)
        loads.append(entry)
    document: dict[str, Any] = {"timestamp": time.time(), "version": config.version}
    if shapes.at_least(config, "0.5.23"):  # entrypoints/v1_loads.py
        document = {
            "timestamp": datetime.now(UTC).isoformat(),
            "version": config.version,
            "accelerator": None,
            "num_accelerators": max(1, config.tp_size // config.dp_size),
        }
    if shapes.at_least(config, "0.5.15"):
        return document | {"loads": loads}
    count = max(1, len(loads))
    return document | {
        "dp_rank_count": config.dp_size,
        "loads": [
            dict(x, num_total_reqs=x["num_running_reqs"] + x["num_waiting_reqs"]) for x in loads
        ],
        "aggregate": {
            "total_running_reqs": sum(x["num_running_reqs"] for x in loads),
            "total_waiting_reqs": sum(x["num_waiting_reqs"] for x in loads),
            "total_reqs": sum(x["num_running_reqs"] + x["num_waiting_reqs"] for x in loads),
            "avg_token_usage": sum(x["token_usage"] for x in loads) / count,
            "avg_throughput": sum(x["gen_throughput"] for x in loads) / count,
            "avg_utilization": 0.0,
        },
    }
