"""``eagledata canary``: record a canary baseline from a server you trust, to share between runs
and servers (``generate --canary-baseline FILE``); or, with ``--against BASELINE``, score any
server against one and write the statistics of each check (calibration, docs/quality.md)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson

from eagledata.config import AppConfig
from eagledata.errors import BaselineChangedError, ServerUnavailableError
from eagledata.quality.canary import build_baseline
from eagledata.quality.canary_baseline import Baseline
from eagledata.quality.canary_prompts import canary_prompts
from eagledata.quality.canary_ranks import rank_shares, rank_verdicts
from eagledata.quality.canary_scorer import CanaryScorer
from eagledata.quality.canary_stats import compare, fired
from eagledata.server.client import SGLangClient
from eagledata.server.guard import KVGuard
from eagledata.server.serverfacts import ServerFacts
from eagledata.server.verdict import evaluate_kv_guard
from eagledata.simserver.demo import simulated_server
from eagledata.source.mix import Mix, resolve_mix
from eagledata.source.tokenization import LengthLimit, PromptTokenizer
from eagledata.tasks import run_until_done


def record_baseline(config: AppConfig, dataset_arg: str, out: Path) -> str:
    mix = resolve_mix([dataset_arg], config)
    with simulated_server(config) as live:
        return run_until_done(_record(live, dataset_arg, mix, out))


async def _record(config: AppConfig, dataset_arg: str, mix: Mix, out: Path) -> str:
    tokenizer = await asyncio.to_thread(PromptTokenizer, config.tokenizer)
    url = config.server.urls[0]
    client = _client(config, url, in_flight=config.canary.load_requests + 2)
    async with client:
        await _require_health(client, url)
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
        prompts = await asyncio.to_thread(canary_prompts, config, mix, tokenizer, limit)
        try:
            baseline = await build_baseline(
                CanaryScorer(
                    client, dp_ranks=guard.dp_ranks, vocab_rows=tokenizer.model_vocab_rows
                ),
                url,
                prompts,
                config.canary,
                model_path=facts.model_path,
                ledger=None,
                pool_tokens=facts.rank_kv_tokens,
            )
        except BaselineChangedError as error:
            raise BaselineChangedError(
                f"{error}: check the server, then record the baseline again"
            ) from None
    baseline.save(out)
    limits = ", ".join(f"{name} {value:.4g}" for name, value in baseline.thresholds.items())
    return (
        f"canary baseline of {url} ({facts.model_path}, {len(prompts)} references from "
        f"{dataset_arg}, {len(baseline.runs)} runs) written to {out}; thresholds: {limits}"
    )


def score_against(config: AppConfig, baseline_path: Path, checks: int, out: Path) -> str:
    """Score the server ``checks`` times against a baseline; write every check's statistics.

    A measurement, not a run: nothing is generated as data, so the KV guard's verdict is reported,
    not enforced (calibration scores a deliberately fp8 server).
    """
    baseline = Baseline.load(baseline_path)
    with simulated_server(config) as live:
        url = live.server.urls[0]
        body, stats = run_until_done(_score_against(live, baseline, checks))
    body["baseline"] = str(baseline_path)
    out.write_bytes(orjson.dumps(body, option=orjson.OPT_INDENT_2))
    limits = baseline.thresholds
    fires = sum(1 for entry in body["checks"] if entry["fired"] or entry["mismatch"])
    worst = {
        name: (min if name in ("mean_shift", "greedy_divergence") else max)(s[name] for s in stats)
        for name in limits
    }
    shown = ", ".join(f"{k} {v:.4g} (threshold {limits[k]:.4g})" for k, v in worst.items())
    return (
        f"{fires} of {checks} checks of {url} fired against {baseline_path}; worst: {shown}; "
        f"written to {out}"
    )


async def _score_against(
    config: AppConfig, baseline: Baseline, checks: int
) -> tuple[dict[str, Any], list[dict[str, float]]]:
    url = config.server.urls[0]
    tokenizer = await asyncio.to_thread(PromptTokenizer, config.tokenizer)
    client = _client(config, url, in_flight=4)
    async with client:
        await _require_health(client, url)
        info = ServerFacts.from_server_info(await client.server_info(url))
        verdict = evaluate_kv_guard(
            info,
            expected_model=config.server.expected_model,
            bf16_bytes_per_token=config.server.bf16_kv_bytes_per_token,
        )
        scorer = CanaryScorer(
            client, dp_ranks=lambda _: info.dp_ranks, vocab_rows=tokenizer.model_vocab_rows
        )
        reference, limits = baseline.reference, baseline.thresholds
        shares = rank_shares(baseline, info.dp_ranks)
        results: list[dict[str, Any]] = []
        stats_seen: list[dict[str, float]] = []
        for _ in range(checks):
            measured = await scorer.score(url, baseline.canary_set)
            stats = compare(measured.scoring, reference)
            stats_seen.append(stats)
            ranks = rank_verdicts(measured.scoring, shares, baseline)
            entry: dict[str, Any] = {
                "stats": stats,
                "fired": fired(stats, limits) + [f for v in ranks for f in v.fired],
                "mismatch": measured.mismatch,
                "cold": measured.cold,
                "seconds": measured.seconds,
            }
            if ranks:  # a DP server: each rank's share on its own (quality/canary_ranks.py)
                entry["ranks"] = [
                    {"rank": v.rank, "stats": v.stats, "thresholds": v.limits} for v in ranks
                ]
            results.append(entry)
    body: dict[str, Any] = {
        "server": url,
        "kv_guard": {"ok": verdict.ok, "problems": verdict.problems},
        "kv_cache_dtypes": verdict.kv_dtypes,
        "thresholds": limits,
        "null": baseline.null,
        "checks": results,
    }
    return body, stats_seen


def _client(config: AppConfig, url: str, *, in_flight: int) -> SGLangClient:
    """A client of the one server the canary command talks to, with the run's settings."""
    return SGLangClient(
        [url],
        in_flight=in_flight,
        connect_timeout_s=config.server.connect_timeout_s,
        request_timeout_s=config.server.request_timeout_s,
        api_key=SGLangClient.api_key_from_env(config.server.api_key_env),
        api_key_env=config.server.api_key_env,
    )


async def _require_health(client: SGLangClient, url: str) -> None:
    if not await client.health(url):
        raise ServerUnavailableError(f"cannot reach {url}; start it or fix --server")
