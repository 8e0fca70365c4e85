"""``/metrics``: Prometheus text in SGLang's metric names."""

from __future__ import annotations

from eagledata.simserver.speculative import metrics_lines
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


def render_metrics(state: SimState) -> str:
    """Prometheus text in SGLang's names: scheduler gauges per DP rank, tokenizer counters."""
    config, scheduler = state.config, state.scheduler
    stats, pool = scheduler.stats, config.max_total_num_tokens
    hit_rate = stats.cached_tokens / stats.prompt_tokens if stats.prompt_tokens else 0.0
    throughput = scheduler.gen_throughput() / config.dp_size
    name = f'model_name="{config.served_name()}"'
    rows = []
    for load in scheduler.load(config):
        dp = f',dp_rank="{load["dp_rank"]}"' if config.dp_size > 1 else ""
        labels = f'{name},engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"{dp}'
        running = load["num_reqs"] - load["num_waiting_reqs"]
        used = load["num_tokens"]
        waiting = load["num_waiting_reqs"]
        values = (running, waiting, used, used / pool, throughput, hit_rate, pool, 0)
        rows.append((labels, values))
    lines = []
    for index, (metric, help_text) in enumerate(GAUGES):
        lines += [f"# HELP sglang:{metric} {help_text}", f"# TYPE sglang:{metric} gauge"]
        lines += [f"sglang:{metric}{{{labels}}} {float(v[index])}" for labels, v in rows]
    accept = state.spec_tally.accept_length
    lines += metrics_lines(config.speculative, [labels for labels, _ in rows], accept)
    for metric, attr in COUNTERS:
        lines += [f"# HELP sglang:{metric} {metric}.", f"# TYPE sglang:{metric} counter"]
        lines.append(f"sglang:{metric}{{{name}}} {float(getattr(stats, attr))}")
    return "\n".join(lines) + "\n"
