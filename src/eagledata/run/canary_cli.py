"""``eagledata canary``: record a canary baseline from a server you trust, to share between runs
and servers (``generate --canary-baseline FILE``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from eagledata.config import AppConfig
from eagledata.errors import ServerUnavailableError
from eagledata.quality.canary import CanaryScorer, build_baseline
from eagledata.run.canary_setup import canary_prompts
from eagledata.run.dataset import ResolvedDataset, resolve_dataset
from eagledata.run.pipeline import simulated_server
from eagledata.run.tokenization import LengthLimit, PromptTokenizer
from eagledata.server.client import SGLangClient
from eagledata.server.guard import KVGuard


def record_baseline(config: AppConfig, dataset_arg: str, out: Path) -> str:
    dataset = resolve_dataset(dataset_arg, config.datasets)
    with simulated_server(config) as live:
        return asyncio.run(_record(live, dataset_arg, dataset, out))


async def _record(config: AppConfig, dataset_arg: str, dataset: ResolvedDataset, out: Path) -> str:
    tokenizer = await asyncio.to_thread(PromptTokenizer, config.tokenizer)
    url = config.server.urls[0]
    client = SGLangClient(
        [url],
        in_flight=config.canary.load_requests + 2,
        connect_timeout_s=config.server.connect_timeout_s,
        request_timeout_s=config.server.request_timeout_s,
        api_key=SGLangClient.api_key_from_env(config.server.api_key_env),
        api_key_env=config.server.api_key_env,
    )
    async with client:
        if not await client.health(url):
            raise ServerUnavailableError(f"cannot reach {url}; start it or fix --server")
        guard = KVGuard(
            client,
            expected_model=config.server.expected_model,
            bf16_bytes_per_token=config.server.bf16_kv_bytes_per_token,
        )
        facts = await guard.check(url)  # a baseline only from a server the bf16 guard passes
        limit = LengthLimit.combine(
            configured_cap=config.generation.max_prompt_tokens,
            max_req_input_len=facts.max_req_input_len,
            context_length=facts.context_length,
            max_new_tokens=config.canary.reference_tokens,
        )
        prompts = await asyncio.to_thread(canary_prompts, config, dataset, tokenizer, limit)
        baseline = await build_baseline(
            CanaryScorer(client),
            url,
            prompts,
            config.canary,
            model_path=facts.model_path,
            ledger=None,
        )
    baseline.save(out)
    limits = ", ".join(f"{name} {value:.4g}" for name, value in baseline.thresholds.items())
    return (
        f"canary baseline of {url} ({facts.model_path}, {len(prompts)} references from "
        f"{dataset_arg}, {len(baseline.runs)} runs) written to {out}; thresholds: {limits}"
    )
