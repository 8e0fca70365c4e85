"""The live state of one simulated server, and the operations the runner performs on it."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from aiohttp import web

from eagledata.simserver.answers import AnswerLedger
from eagledata.simserver.config import SimConfig
from eagledata.simserver.model import ModelSpec, resolve_model
from eagledata.simserver.prefix_cache import PrefixCache
from eagledata.simserver.scheduler import RUNNING, Scheduler
from eagledata.simserver.speculative import SpecTally


@dataclass
class SimState:
    config: SimConfig
    model: ModelSpec
    scheduler: Scheduler = field(default_factory=Scheduler)
    started: float = 0.0
    host: str = "127.0.0.1"
    port: int = 0
    attempts: dict[bytes, int] = field(default_factory=dict)
    answers: AnswerLedger = field(default_factory=AnswerLedger)
    """Each answer's drawn shape and whether it was produced degraded (ground truth)."""
    prefix_caches: dict[int, PrefixCache] = field(default_factory=dict)
    """One radix cache per DP rank: each of SGLang's DP schedulers has a tree of its own."""
    dp_round_robin: int = 0
    """The rank the next unpinned request goes to (``next_dp_rank``)."""
    dispatched: Counter[tuple[str, int]] = field(default_factory=Counter)
    """``/generate`` requests per (``pinned`` or ``round robin``, DP rank)."""
    metrics_scrapes: int = 0
    """``/metrics`` reads, for the rank an unlabelled scrape shows (``metrics_dp_labels``)."""
    noise_rng: np.random.Generator = field(default_factory=np.random.default_rng)
    """Batch noise is not reproducible on a real server either: seeded from the OS."""
    spec_tally: SpecTally = field(default_factory=SpecTally)
    generations: int = 0
    """Requests for at least one new token taken so far (``degrade_after_generations``)."""

    def prefix_cache(self, rank: int) -> PrefixCache:
        return self.prefix_caches.setdefault(rank, PrefixCache())

    def next_dp_rank(self) -> int:
        """The DP controller's ``--load-balance-method round_robin`` (the default)."""
        rank = self.dp_round_robin % self.config.dp_size
        self.dp_round_robin = rank + 1
        return rank


STATE = web.AppKey("sim_state", SimState)


def apply_control(state: SimState, changes: dict[str, Any]) -> dict[str, Any]:
    """Validate and install new settings; raises ValidationError or EagledataError."""
    config = SimConfig.model_validate({**state.config.model_dump(), **changes})
    state.model = resolve_model(config)
    state.config = config
    for rank in state.scheduler.ranks:
        state.scheduler.drain(rank, config)
    if config.steps_engine:
        state.scheduler.engine(config).kick_all(config)
    return config.model_dump()


def stats_snapshot(state: SimState) -> dict[str, Any]:
    scheduler = state.scheduler
    running = sum(1 for item in scheduler.live if item.state == RUNNING)
    return {
        **scheduler.stats.as_dict(),
        "in_flight": len(scheduler.live),
        "running": running,
        "queued": len(scheduler.live) - running,
        "load": scheduler.load(state.config),
        "engine": scheduler.engine_loads(state.config),
        "kv_cache_dtype": state.config.kv_cache_dtype,
        "effective_kv_dtype": state.config.effective_kv_dtype(),
        "answers": state.answers.as_dict(),
        "dispatched": {
            how: [state.dispatched[(how, rank)] for rank in range(state.config.dp_size)]
            for how in ("pinned", "round robin")
        },
    }
