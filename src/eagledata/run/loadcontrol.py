"""The live side of ``--concurrency auto``: read each server's load, gate and route requests.

``capacity/controller.py`` owns the numbers; this module feeds it. Every ``poll_interval_s`` it
reads each server's load through the client (its best signal, ``server/load_signals.py``;
behind an sglang-router, each worker's), updates that server's lanes (one per DP
rank when the server runs DP attention, each request pinned to its rank with the field the
server's release knows), and every
``telemetry_interval_s`` writes one ``telemetry.jsonl`` line per lane. Senders ``acquire`` a
ticket before each request: the first waiter goes to the lane with the most free projected KV,
once one has room, so a slow or small server gets less work and a fast or large one more.

The controller is also the client's gate under auto (``server/budget.py``): the canary's
requests and the probe of a failing server take tickets on the lane they are pinned to, ahead of
the run's own waiting requests, counted in flight and in the forecast at their exact length;
nothing they return teaches the answer-length model.

With a fixed ``--concurrency N`` nothing is gated here (the client's ``SlotGate`` bounds what
is in flight); the loop still samples for the telemetry and the progress bar.

One class, ``LoadController``: the lanes and the state the gate and the loop share, the gate
(tickets: ``acquire``, ``enter``, ``release``), the sampling loop, the telemetry lines and the
progress bar's fields. What the lanes are built from (``ServerPlan``, ``Waiter``, the
controller's settings) is ``load_lanes.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from eagledata.capacity.controller import (
    Lane,
    LaneSample,
    Ticket,
    fallback_concurrency,
    initial_queue_target,
)
from eagledata.capacity.drain import lanes_to_skip
from eagledata.capacity.forecast import new_draws
from eagledata.capacity.lengths import LengthModel
from eagledata.config import LoadSettings
from eagledata.run.load_lanes import ServerPlan, Waiter, controller_settings
from eagledata.run.telemetry import forecast_usage, lane_entry
from eagledata.rundir.lines import TelemetryLine
from eagledata.rundir.telemetry import TelemetryLog, lane_name
from eagledata.server.client import SGLangClient
from eagledata.server.load_signals import routes_named
from eagledata.server.loads import ServerLoad, in_logical_tokens, merge_workers
from eagledata.server.serverfacts import ServerFacts

_UNGATED = object()
"""The pass of a request the controller does not gate (a server it has no lane for)."""


class LoadController:
    """Lanes per server, their gate (auto) and their telemetry (always): the state the gate
    and the loop share, the tickets (``acquire``, ``enter``, ``release``), and the loop that
    samples the servers and writes the telemetry."""

    # --- the lanes ------------------------------------------------------------------------------

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
                lane.queue_target = initial_queue_target(chunk, mean, lane.max_running)
                lane.prefill_chunk = chunk

    # --- the gate -------------------------------------------------------------------------------

    async def acquire(self, prompt_tokens: int) -> Ticket:
        """Wait until some lane has room for this request; it is then counted in flight there."""
        self._prompt_sum += prompt_tokens
        self._prompt_count += 1
        fut: asyncio.Future[Ticket] = asyncio.get_running_loop().create_future()
        self._waiters.append(Waiter(prompt_tokens, new_draws(self._rng), fut))
        return await self._wait(fut)

    async def _wait(self, fut: asyncio.Future[Ticket]) -> Ticket:
        self._dispatch()
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release(fut.result())
            raise

    def lane_of(self, url: str, rank: int | None) -> Lane | None:
        lanes = self.lanes.get(url)
        if not lanes:
            return None
        if rank is not None:
            return next((lane for lane in lanes if lane.rank == rank), lanes[0])
        return lanes[0]

    async def enter(
        self,
        url: str,
        rank: int | None,
        prompt_tokens: int,
        max_new_tokens: int,
        *,
        background: bool = False,
    ) -> object:
        """A request that is not the run's own (the canary's, a probe's), pinned to one lane:
        a ticket there, at its exact length, ahead of the waiting run requests and behind the
        other canary requests that wait (``background``, the baseline's load: behind the
        check's own requests too). Under a fixed ``--concurrency`` this gate is not used.

        First come first served, not last: the baseline's load loops enter again the moment
        their answer is in, and entering ahead of every waiter, each went ahead of the probes
        already waiting; a short load request fits where a long probe does not, so the lane
        never emptied for the probe (the real 0.5.23 with a 4,096-token pool: 1,497 load
        requests and not one probe in 11 minutes)."""
        lane = self.lane_of(url, rank)
        if lane is None or not self.auto:
            return _UNGATED
        fut: asyncio.Future[Ticket] = asyncio.get_running_loop().create_future()
        projected = prompt_tokens + max_new_tokens
        # One that names no rank on a server with a lane per rank is no one lane's: SGLang
        # would send it round robin while rank 0's lane carried it whole (a rank served 2% of
        # a job while its lane carried the canary's). It goes where there is room, and is sent
        # pinned there (``rank_of``).
        spread = rank is None and len(self.lanes.get(url, ())) > 1
        waiter = Waiter(
            prompt_tokens,
            new_draws(self._rng),
            fut,
            lane=None if spread else lane,
            server=url if spread else None,
            projected=projected,
            background=background,
        )
        # Behind the waiters of its class and of every class before it: the check's own
        # requests, then the baseline's load, then the run's requests.
        ahead = 0
        for index, other in enumerate(self._waiters):
            if other.canary and (background or not other.background):
                ahead = index + 1
        self._waiters.insert(ahead, waiter)
        return await self._wait(fut)

    def rank_of(self, entry: object) -> int | None:
        """The DP rank a request ``enter`` let in is charged to (None: no lane per rank): one
        that named none is sent pinned there."""
        return entry.lane.rank if isinstance(entry, Ticket) else None

    def leave(self, entry: object) -> None:
        if isinstance(entry, Ticket):
            # The canary's answers teach nothing: their KV at the end is their projection.
            self.release(entry, answered=True, data=False)

    def _healthy(self, url: str) -> bool:
        endpoint = self.client.endpoint(url)
        return endpoint is None or endpoint.healthy

    def _refresh_curves(self, now: float) -> None:
        """Tell the length model which requests are still running and how far along (at most
        once per poll: ages move slowly), and give every ticket the current curve."""
        if now - self._ages_at < self.load.poll_interval_s:
            return
        self._ages_at = now
        tickets = [
            (lane, t) for lanes in self.lanes.values() for lane in lanes for t in lane.tickets
        ]
        self.lengths.set_running((t.prompt_tokens, lane.age(t, now)) for lane, t in tickets)
        for lanes in self.lanes.values():
            for lane in lanes:
                lane.lengths_learned = self.lengths.learned
        for _, ticket in tickets:
            ticket.lengths = self.lengths.curve(ticket.prompt_tokens)

    def _too_slow_for_the_tail(self) -> set[Lane]:
        """The lanes a run request may not start on now: once the last requests wait here,
        those where it would end after the job's end on the others (``capacity/drain.py``).
        Empty while the dataset has more to send, and on lanes of one speed."""
        to_come = self.still_to_come()
        if to_come is None:
            return set()
        healthy = [lane for url, on in self.lanes.items() if self._healthy(url) for lane in on]
        if len(healthy) < 2:
            return set()
        # Every waiter counted, the canary's few too: a tail counted long only lets more start.
        remaining = len(self._waiters) + to_come
        skips = lanes_to_skip([lane.speed() for lane in healthy], remaining)
        return {lane for lane, skip in zip(healthy, skips, strict=True) if skip}

    def _dispatch(self) -> None:
        now = time.monotonic()
        self._refresh_curves(now)
        if self._prompt_count != self._queue_targets_at:
            self._queue_targets()  # q* from the first prompts on, not from the first poll
        too_slow = self._too_slow_for_the_tail()
        while self._waiters:
            waiter = self._waiters[0]
            if waiter.fut.done():
                self._waiters.popleft()
                continue
            prompt = waiter.prompt_tokens
            if waiter.projected is not None:
                projected, lengths = waiter.projected, None
            else:
                # Projected now, not when it started waiting: the length model learns meanwhile.
                projected = prompt + min(self.max_new_tokens, self.lengths.estimate(prompt))
                lengths = self.lengths.curve(prompt)
            best: tuple[float, Ticket] | None = None
            for url, lanes in self.lanes.items():
                if waiter.server is not None and url != waiter.server:
                    continue
                if not self._healthy(url) and not waiter.canary:
                    continue
                for lane in lanes:
                    if waiter.lane is not None and lane is not waiter.lane:
                        continue
                    if not waiter.canary and lane in too_slow:
                        lane.held_by["tail"] = lane.held_by.get("tail", 0) + 1
                        continue
                    candidate = Ticket(lane, prompt, projected, now, lengths, draws=waiter.draws)
                    room = lane.room(candidate, now)
                    if room is not None and (best is None or room > best[0]):
                        best = (room, candidate)
            if best is None:
                if self.auto and self._held_by_queue(waiter):
                    # Only a fresh count of the server's queue can open it: sample soon.
                    self._answer_ended.set()
                return
            ticket = best[1]
            ticket.lane.tickets[ticket] = None
            self._waiters.popleft()
            waiter.fut.set_result(ticket)
            too_slow = self._too_slow_for_the_tail()  # in the tail: one fewer to share out

    def _held_by_queue(self, waiter: Waiter) -> bool:
        """Did a queue rule (not the KV forecast) hold this waiter on every lane it may use?"""
        if waiter.lane is not None:
            lanes = [waiter.lane]
        elif waiter.server is not None:
            lanes = self.lanes.get(waiter.server, [])
        else:
            lanes = [lane for lanes in self.lanes.values() for lane in lanes]
        return any(lane.last_hold in ("queue", "queue_cap") for lane in lanes)

    def refused(self, url: str) -> None:
        """A 503 from ``url`` under a fixed ``--concurrency`` (no ticket to release): counted
        for the telemetry's ``queue_full`` on the server's first lane (the request was pinned
        to no rank), and nothing learned from it, since nothing is gated here."""
        lane = self.lane_of(url, None)
        if lane is not None:
            lane.rejections += 1

    def release(
        self,
        ticket: Ticket,
        *,
        completion_tokens: int | None = None,
        retractions: int = 0,
        queue_full: bool = False,
        answered: bool = False,
        data: bool = True,
    ) -> None:
        """The request ended (a result, a failure, a 503): free its place, learn from it.
        ``answered`` without ``completion_tokens``: an answer of known length that teaches
        nothing (the canary's); ``data``: one of the run's own requests."""
        lane = ticket.lane
        if queue_full:
            lane.queue_full(time.monotonic(), lane.queued_at_most())
        lane.tickets.pop(ticket, None)
        now = time.monotonic()
        if completion_tokens is not None:
            self.lengths.add(ticket.prompt_tokens, completion_tokens)
            self._ages_at = -float("inf")  # a new answer: new curves for everyone in flight
            lane.learn_rate(completion_tokens, now - ticket.sent_at)
            lane.ended(ticket, now, ticket.prompt_tokens + completion_tokens, data=data)
        elif answered:
            lane.ended(ticket, now, ticket.projected, data=False)
        news = completion_tokens is not None or answered or queue_full
        if news and self._waiters and self.auto:
            self._answer_ended.set()  # sample now: the room it left, the queue it freed
        if retractions and not lane.counts_retractions():
            # A retraction reaches its response only when that request ends, often minutes
            # after the server's counter showed it: news only from a server without a counter.
            lane.target.back_off(now)
        self._dispatch()

    # --- the loop -------------------------------------------------------------------------------

    async def run(self) -> None:
        """Sample until cancelled (the pipeline's task group owns this task)."""
        last_telemetry = -float("inf")
        try:
            while True:
                now = time.monotonic()
                for url in list(self.lanes):
                    await self._sample(url, now)
                self._queue_targets()
                if now - last_telemetry >= self.load.telemetry_interval_s:
                    last_telemetry = now
                    self._write_telemetry()
                self._dispatch()
                await self._next_poll(now)
        finally:
            # The run's last counts (its 503s above all), not those of up to a period before.
            self._write_telemetry()

    async def _next_poll(self, polled_at: float) -> None:
        """Sleep until the next poll, or until an answer ends while requests wait: the server
        freed that answer's KV before it replied, but the last sample still counts it, so the
        gate would keep that room shut until the poll (under ``auto`` the server's own queue is
        nearly empty: 0.1 requests on average in the 1,500-prompt benchmark job, so nothing
        else fills it). Never more often than four times a poll."""
        poll = self.load.poll_interval_s
        # asyncio.timeout, never wait_for: 3.11's wait_for returns the wake-up and swallows the
        # run's cancel when an answer ends as the run ends, and this loop then never stopped.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(poll):
                await self._answer_ended.wait()
        self._answer_ended.clear()
        await asyncio.sleep(max(0.0, polled_at + poll / 4 - time.monotonic()))

    async def _read(self, url: str) -> ServerLoad | None:
        plan = self.plans[url]
        if plan.workers is None:
            load = await self.client.read_load(url)
            factor = plan.facts.capacity_factor if plan.facts is not None else 1
            return in_logical_tokens(load, factor or 1) if load is not None else None
        loads = [await self.client.read_load(worker) for worker in plan.workers]
        known = [load for load in loads if load is not None]
        return merge_workers(known) if len(known) == len(loads) else None

    async def _sample(self, url: str, now: float) -> None:
        asked = time.monotonic()
        counts = {id(lane): (len(lane.tickets), lane.ended_total) for lane in self.lanes[url]}
        load = await self._read(url)
        # The sample's time is when its answer came: a request sent while it was read has
        # most likely reached the server before it answered (and is in its counts).
        now = time.monotonic()
        lanes = self.lanes[url]
        if self.facts_of is not None:
            facts = self.facts_of(url)
            if facts is not None and facts is not self.plans[url].facts:
                self.plans[url] = replace(self.plans[url], facts=facts)
                self._read_facts(url, facts)
        if load is None:
            self._fall_back(url, lanes)
            return
        if len(lanes) == 1 and lanes[0].rank is None and len(load.ranks) > 1:
            load = merge_workers([load]) or load  # ranks we cannot pin: one lane
        by_rank = {rank.rank: rank for rank in load.ranks}
        # No per-rank signal (``/metrics`` without ``dp_rank`` labels: one series per gauge,
        # whichever rank's process wrote it last): the reading is some rank's, which one
        # unknown, so every lane reads it alike; handed to rank 0's lane alone it made that
        # lane another rank's and left the others without a sample.
        unlabelled = len(load.ranks) == 1 and any(lane.rank not in by_rank for lane in lanes)
        for lane in lanes:
            rank = load.ranks[0] if unlabelled else by_rank.get(lane.rank or 0)
            if rank is None:
                continue
            lane.fallback_limit = None
            share = len(lanes)
            total = load.retracted_total
            sample = LaneSample(
                time=now,
                load=rank,
                # The counter is summed over ranks: any increase is a retraction for each lane.
                retracted_total=total / share if total is not None else None,
                asked=asked,
                ours_at_ask=counts[id(lane)][0],
                ended_at_ask=counts[id(lane)][1],
            )
            if lane.observe(sample, now) and self.auto:
                self.note_once(
                    f"retract:{url}",
                    f"{url} retracted requests: target KV usage now {lane.target.value:.2f}",
                )
            name = lane_name(lane.server, lane.rank)
            self.latest[name] = self._entry(lane, load.source)

    def _fall_back(self, url: str, lanes: list[Lane]) -> None:
        """No load signal: the planner's number, said once per server."""
        if any(lane.sample is not None for lane in lanes):
            return  # a missed sample of a server that has answered before: keep the last one
        facts = self.plans[url].facts
        pool = (facts.system_kv_tokens if facts is not None else None) or 0
        mean_prompt = self._prompt_sum / self._prompt_count if self._prompt_count else 1000.0
        if pool:
            limit = fallback_concurrency(
                pool,
                mean_prompt_tokens=mean_prompt,
                mean_output_tokens=self.lengths.prior,
            )
        else:
            limit = 64
        per_lane = max(1, limit // len(lanes))
        for lane in lanes:
            lane.fallback_limit = per_lane
        if self.auto and url not in self._fallback_said:
            self._fallback_said.add(url)
            self.note(
                f"{url} reports no load ({routes_named()} all missing): "
                f"--concurrency auto keeps {per_lane * len(lanes)} in flight there, the "
                "planner's number; launch it with --enable-metrics for the live controller"
            )

    def note_once(self, key: str, message: str) -> None:
        if key not in self._fallback_said:
            self._fallback_said.add(key)
            self.note(message)

    # --- what it shows --------------------------------------------------------------------------

    def _in_flight(self, lane: Lane) -> int:
        if self.auto:
            return lane.in_flight
        endpoint = self.client.endpoint(lane.server)
        return 0 if endpoint is None else endpoint.in_flight

    def _entry(self, lane: Lane, source: str) -> TelemetryLine:
        return lane_entry(
            lane,
            source=source,
            in_flight=self._in_flight(lane),
            fixed=self.fixed,
        )

    def _write_telemetry(self) -> None:
        for lanes in self.lanes.values():
            for lane in lanes:
                entry = self.latest.get(lane_name(lane.server, lane.rank))
                if entry is None:
                    entry = self._entry(lane, "none")
                entry = entry.model_copy(
                    update={
                        "time": time.time(),
                        "in_flight": self._in_flight(lane),
                        "held_by": dict(lane.held_by),
                        "queue_full": lane.rejections,  # a 503 since the sample counts too
                        "forecast_usage": forecast_usage(lane) if self.auto else None,
                    }
                )
                lane.held_by.clear()
                if self.telemetry is not None:
                    with contextlib.suppress(OSError):
                        self.telemetry.append(entry)

    def bar_fields(self) -> dict[str, str]:
        """KV usage, running and queued, summed over lanes, for the progress bar."""
        entries = list(self.latest.values())
        if not entries:
            return {}
        usages = [e.token_usage for e in entries if e.token_usage is not None]
        running = sum(e.num_running_reqs or 0 for e in entries)
        queued = sum(e.num_queue_reqs or 0 for e in entries)
        fields = {"running": str(running), "queued": str(queued)}
        if usages:
            fields = {"kv": f"{100 * sum(usages) / len(usages):.0f}%", **fields}
        return fields
