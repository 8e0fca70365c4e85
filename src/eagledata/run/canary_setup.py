"""Starting the canary of a run: its baseline (the run's own, a shared file, or recorded now),
then a first check of every server before any production request (quality/canary.py).

``resume`` always compares with the baseline stored in the run directory (``canary/baseline.json``),
recorded when the run began: a restarted or replaced server that computes something else is
refused before it produces a single record.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable
from typing import Any

from eagledata.config import AppConfig
from eagledata.errors import BaselineChangedError, ConfigError
from eagledata.quality.canary import CanaryMonitor, LineLog, build_baseline
from eagledata.quality.canary_baseline import Baseline
from eagledata.quality.canary_scorer import CanaryScorer
from eagledata.run.holding import HoldAndRelease
from eagledata.rundir.manifest import RunDir
from eagledata.server.client import SGLangClient
from eagledata.server.guard import KVGuard

BASELINE_FILE = "canary/baseline.json"


async def load_or_record_baseline(
    run_dir: RunDir,
    config: AppConfig,
    scorer: CanaryScorer,
    url: str,
    model_path: str | None,
    prompts: Callable[[], list[list[int]]],
    ledger: LineLog,
    note: Callable[[str], None],
    pool_tokens: int | None = None,
) -> Baseline:
    stored = run_dir.path / BASELINE_FILE
    if stored.is_file():
        return Baseline.load(stored)
    shared = config.canary.baseline
    if shared is not None:
        baseline = Baseline.load(shared)
        if model_path and baseline.model_path and baseline.model_path != model_path:
            raise ConfigError(
                f"canary baseline {shared} was recorded on {baseline.model_path}, this server "
                f"serves {model_path}; record one for this model with 'eagledata canary'"
            )
        stored.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shared, stored)
        return baseline
    chosen = await asyncio.to_thread(prompts)
    if not chosen:
        raise ConfigError(
            "the canary found no usable prompt in the dataset (all rows bad or too long); "
            "fix the dataset or run with --no-canary"
        )
    note(f"canary: recording the baseline on {url} ({len(chosen)} references)")
    try:
        baseline = await build_baseline(
            scorer,
            url,
            chosen,
            config.canary,
            model_path=model_path,
            ledger=ledger,
            pool_tokens=pool_tokens,
        )
    except BaselineChangedError as error:
        raise BaselineChangedError(
            f"{error} and nothing was generated: check the server, then 'eagledata resume "
            "RUN_DIR' records a new baseline"
        ) from None
    baseline.save(stored)
    return baseline


async def start_canary(
    run_dir: RunDir,
    config: AppConfig,
    client: SGLangClient,
    kv_guard: KVGuard,
    holder: HoldAndRelease[Any],
    prompts: Callable[[], list[list[int]]],
    ledger: LineLog,
    note: Callable[[str], None],
    vocab_rows: int | None = None,
) -> CanaryMonitor:
    """The run's canary, checked once on every reachable server (trigger ``start``).
    ``vocab_rows``: the model's vocabulary by its config (``CanaryScorer``)."""
    healthy = [endpoint.url for endpoint in client.endpoints if endpoint.healthy]
    scorer = CanaryScorer(client, dp_ranks=kv_guard.dp_ranks, vocab_rows=vocab_rows)
    facts = kv_guard.facts.get(healthy[0]) if healthy else None
    baseline = await load_or_record_baseline(
        run_dir,
        config,
        scorer,
        # behind a router, one worker: a reference's warm-up and scoring must meet one cache
        kv_guard.targets(healthy[0])[0],
        facts.model_path if facts else None,
        prompts,
        ledger,
        note,
        facts.rank_kv_tokens if facts else None,
    )
    monitor = CanaryMonitor(
        scorer,
        baseline,
        period_s=config.canary.period_s,
        max_held=config.server.guard_max_held,
        ledger=ledger,
        facts_key=kv_guard.facts_key,
        targets=kv_guard.targets,
    )
    for url in healthy:
        await holder.run_check(monitor, url, "start")
    return monitor
