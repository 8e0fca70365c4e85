"""Glue for ``eagledata plan``: a workload measured from a dataset, and a live server's row.

The arithmetic lives in ``capacity``; this module only feeds it real inputs: the templated
prompt lengths of a dataset sample (with the run's own tokenizer and template), and, with
``--server``, the KV pool a running server reports instead of an estimate.
"""

from __future__ import annotations

import itertools

from eagledata.capacity import PlanRow, Workload
from eagledata.capacity.planner import plan_from_pool
from eagledata.config import AppConfig
from eagledata.errors import ConfigError, ItemError
from eagledata.run.dataset import ResolvedDataset, count_rows, iter_rows
from eagledata.run.prompts import to_messages
from eagledata.run.tokenization import PromptTokenizer
from eagledata.server.serverfacts import ServerFacts


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
    """A plan row from the pool a running server reports, with the same fit as the profiles."""
    return plan_from_pool(
        label=f"live {url}",
        kv_cache_dtype=facts.kv_cache_dtype or "unknown",
        parallelism=f"TP{facts.tp_size or '?'}"
        + (f" DPA{facts.dp_size}" if facts.enable_dp_attention else ""),
        mem_fraction_static=facts.mem_fraction_static or 0.0,
        workload=workload,
        tokens_per_rank=facts.max_total_num_tokens or 0,
        system_tokens=facts.system_kv_tokens or 0,
        max_running_requests=facts.max_running_requests,
        context_length=facts.context_length,
        status="measured pool (from /server_info)",
    )
