"""The lanes of ``--concurrency auto`` and what they are built from: one ``Lane`` per server (per
DP rank under DP attention) with the controller's settings, each server's facts before its
first load sample (``ServerPlan``), the length model, and the requests waiting for a ticket
(``Waiter``). ``LaneSet`` holds that state; the gate (``load_gate.py``) and the sampling loop
(``loadcontrol.py``) build on it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from eagledata.capacity.controller import Lane, Ticket, initial_queue_target
from eagledata.capacity.controller_settings import ControllerSettings
from eagledata.capacity.forecast import Floats
from eagledata.capacity.lengths import LengthModel
from eagledata.config import LoadSettings
from eagledata.rundir.lines import TelemetryLine
from eagledata.rundir.telemetry import TelemetryLog
from eagledata.server.client import SGLangClient
from eagledata.server.serverfacts import ServerFacts


@dataclass(eq=False, slots=True)
class Waiter:
    """A request waiting for a ticket."""

    prompt_tokens: int
    draws: Floats
    fut: asyncio.Future[Ticket]
    lane: Lane | None = None
    """Pinned to this lane (a canary request), else any lane with room."""
    server: str | None = None
    """A canary request that names no DP rank on a server with a lane per rank: any lane of
    this server, and it is then sent pinned to that lane's rank (``LoadGate.rank_of``)."""
    projected: int | None = None
    """Its exact KV at its end, when known (a canary request); else the length model's."""
    background: bool = False
    """The canary baseline's load (``CanaryScorer.score_under_load``): behind the check's own
    requests, ahead of the run's."""

    @property
    def canary(self) -> bool:
        """Not one of the run's own requests (those may take any lane of any server)."""
        return self.lane is not None or self.server is not None


@dataclass(frozen=True, slots=True)
class ServerPlan:
    """What the controller knows of a server before its first load sample."""

    url: str
    facts: ServerFacts | None
    workers: list[str] | None
    """The workers behind a router at ``url``; None for a plain server."""


def controller_settings(load: LoadSettings) -> ControllerSettings:
    return ControllerSettings(
        target_usage=load.target_usage,
        min_usage=load.min_usage,
        max_usage=load.max_usage,
        freeze_s=load.freeze_s,
        # A ceiling holds for five freezes a step: long enough for the creep not to re-probe a
        # retraction it learned of, short enough to follow a workload that changes.
        ceiling_hold_s=5 * load.freeze_s,
        creep_every_s=load.creep_every_s,
        length_quantile=load.length_quantile,
        overflow_quantile=load.overflow_quantile,
        backoff_gap_s=2 * load.poll_interval_s,
    )


class LaneSet:
    """The lanes per server and the state the gate and the loop share."""

    def __init__(
        self,
        client: SGLangClient,
        load: LoadSettings,
        *,
        fixed: int | None,
        max_new_tokens: int,
        telemetry: TelemetryLog | None,
        note: Callable[[str], None],
        facts_of: Callable[[str], ServerFacts | None] | None = None,
    ) -> None:
        self.client = client
        self.facts_of = facts_of
        """A server's latest facts (the KV guard's, read again after a reconnect): its queue
        cap and prefill chunk may change when it restarts."""
        self.load = load
        self.fixed = fixed
        self.max_new_tokens = max_new_tokens
        self.telemetry = telemetry
        self.note = note
        self.settings = controller_settings(load)
        prior = min(max_new_tokens, load.expected_output_tokens or max_new_tokens)
        self.lengths = LengthModel(
            prior=prior,
            quantile=load.length_quantile,
            min_samples=self.settings.min_samples,
            cap=max_new_tokens,
        )
        self._ages_at = -float("inf")
        self.lanes: dict[str, list[Lane]] = {}
        self.plans: dict[str, ServerPlan] = {}
        self._waiters: deque[Waiter] = deque()
        # A waiter's futures are drawn once: were they drawn again at every try, a request
        # held at the edge would wait for a lucky draw and get in on it.
        self._rng = np.random.default_rng(0)
        self._fallback_said: set[str] = set()
        self._answer_ended = asyncio.Event()
        """Set when an answer ends while requests wait for room: sample now, not at the poll."""
        self._prompt_sum = 0
        self._prompt_count = 0
        self._queue_targets_at = 0
        self.still_to_come: Callable[[], int | None] = lambda: None
        """The run's requests not yet waiting at the gate, once the dataset has no more (None
        before): the session's scheduler's ``unstarted``."""
        self.latest: dict[str, TelemetryLine] = {}
        """The last telemetry entry per lane key, for the progress bar."""

    @property
    def auto(self) -> bool:
        return self.fixed is None

    def add_server(self, plan: ServerPlan) -> None:
        facts = plan.facts
        ranks: list[int | None] = [None]
        if plan.workers is None and facts is not None and facts.attention_dp:
            ranks = list(range(facts.dp_ranks))  # 0.5.23: attn_dp_size, with dp_size 1
        pool = None if facts is None else facts.rank_kv_tokens
        if plan.workers is not None:
            pool = None  # the router's workers' pools, summed, come with the first sample
        queue = initial_queue_target(self.settings.chunked_prefill_size, 0.0)
        self.lanes[plan.url] = [
            Lane(
                server=plan.url,
                rank=rank,
                settings=self.settings,
                pool_tokens=pool,
                max_running=None if facts is None else facts.max_running_requests,
                usage_target=self.settings.target_usage,
                queue_target=queue,
                prefill_chunk=self.settings.chunked_prefill_size,
                decode_rate=self.settings.default_decode_rate,
            )
            for rank in ranks
        ]
        self.plans[plan.url] = plan
        self._read_facts(plan.url, facts)

    def _read_facts(self, url: str, facts: ServerFacts | None) -> None:
        """The server's own queue cap, per DP rank (each rank's scheduler keeps its own queue).
        Behind a router, the workers' caps do not add up to one queue: none is kept."""
        if self.plans[url].workers is not None or facts is None:
            return
        for lane in self.lanes[url]:
            lane.queue_limit = facts.max_queued_requests

    def _queue_targets(self) -> None:
        """``q*`` from the prompts seen so far and the server's own prefill chunk: enough to
        fill one prefill batch."""
        if not self._prompt_count:
            return
        self._queue_targets_at = self._prompt_count
        mean = self._prompt_sum / self._prompt_count
        for url, lanes in self.lanes.items():
            facts = self.plans[url].facts
            chunk = (facts.chunked_prefill_size if facts is not None else None) or 0
            if chunk <= 0:
                chunk = self.settings.chunked_prefill_size
            for lane in lanes:
                lane.queue_target = initial_queue_target(chunk, mean)
                lane.prefill_chunk = chunk
