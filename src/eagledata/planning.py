"""Glue for ``eagledata plan``: a workload measured from a dataset, and a live server's row.

The arithmetic lives in ``capacity``; this module only feeds it real inputs: the templated
prompt lengths of a dataset sample (with the run's own tokenizer and template), and, with
``--server``, the KV pool a running server reports instead of an estimate.
"""

from __future__ import annotations

import itertools
import math

from eagledata.capacity import (
    CLIENT_QUEUE_HEADROOM,
    CONCURRENT_REQUEST_TOKENS,
    MAX_RUNNING_HEADROOM,
    PlanRow,
    Workload,
    decode_tok_s,
)
from eagledata.config import AppConfig
from eagledata.dataset import ResolvedDataset, count_rows, iter_rows
from eagledata.errors import ConfigError, ItemError
from eagledata.profiles import ThroughputSection
from eagledata.prompts import to_messages
from eagledata.serverfacts import ServerFacts
from eagledata.tokenization import PromptTokenizer


def measure_workload(
    config: AppConfig,
    dataset: ResolvedDataset,
    *,
    sample_rows: int,
    mean_output_tokens: float | None,
) -> Workload:
    """Tokenize the first ``sample_rows`` prompts exactly as ``generate`` would."""
    tokenizer = PromptTokenizer(config.tokenizer)
    lengths: list[int] = []
    for row in itertools.islice(iter_rows(dataset.settings, config.run.limit), sample_rows):
        if row.data is None:
            continue
        try:
            lengths.append(len(tokenizer.encode(to_messages(row.data, dataset.settings))))
        except ItemError:
            continue  # bad rows never reach the server, so they do not load it either
    if not lengths:
        raise ConfigError(f"dataset {dataset.name}: no usable prompt in the first {sample_rows}")
    total_rows = count_rows(dataset.settings, config.run.limit)
    return Workload.from_prompt_lengths(
        lengths,
        max_new_tokens=config.generation.max_new_tokens,
        mean_output_tokens=mean_output_tokens,
        num_prompts=total_rows if total_rows is not None else len(lengths),
        samples_per_prompt=config.generation.samples_per_prompt,
    )


def live_row(url: str, facts: ServerFacts, workload: Workload) -> PlanRow:
    """A plan row from what a running server reports, with the same fit as the profiles."""
    fit = ThroughputSection()
    system = facts.system_kv_tokens or 0
    steady = math.floor(system / workload.tokens_per_running_request)
    server_cap = facts.max_running_requests
    running = steady if server_cap is None else min(steady, server_cap)
    rec_mrr = min(max(8, math.ceil(steady * MAX_RUNNING_HEADROOM / 8) * 8), fit.max_running_cap)
    tok_s = decode_tok_s(min(running, fit.max_running_fit), fit)

    def hours(rate: float) -> float | None:
        return workload.total_output_tokens / rate / 3600 if rate > 0 else None

    dtype = facts.kv_cache_dtype or "unknown"
    return PlanRow(
        profile=f"live {url}",
        kv_cache_dtype=dtype,
        plan_only=False,
        status="measured pool (from /server_info)",
        parallelism=f"TP{facts.tp_size or '?'}"
        + (f" DPA{facts.dp_size}" if facts.enable_dp_attention else ""),
        mem_fraction_static=facts.mem_fraction_static or 0.0,
        cell_bytes=0,
        kv_gib_per_rank=0.0,
        tokens_per_rank=facts.max_total_num_tokens or 0,
        system_tokens=system,
        starts=system > 0,
        concurrent_4k=system // CONCURRENT_REQUEST_TOKENS,
        steady_concurrency=steady,
        running=running,
        recommended_max_running_requests=rec_mrr,
        recommended_concurrency=math.ceil(min(steady, rec_mrr) * CLIENT_QUEUE_HEADROOM),
        profile_max_running_requests=server_cap,
        tok_s=tok_s,
        tok_s_low=tok_s * (1 - fit.band),
        tok_s_high=tok_s * (1 + fit.band),
        wall_clock_hours=hours(tok_s),
        wall_clock_hours_low=hours(tok_s * (1 + fit.band)),
        wall_clock_hours_high=hours(tok_s * (1 - fit.band)),
        notes=[],
    )
