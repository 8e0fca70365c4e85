"""The gate of ``--concurrency auto``: senders ``acquire`` a ticket before each request, and the
first waiter goes to the lane with the most free projected KV once one has room; the canary's
requests and a failing server's probe ``enter`` pinned to their lane, ahead of the run's own
(the canary baseline's load behind the check's own requests), first come first served within
each class; ``release`` frees the place and teaches the length model. The loop that samples the
servers is ``loadcontrol.py``.
"""

from __future__ import annotations

import asyncio
import time

from eagledata.capacity.controller import Lane, Ticket
from eagledata.capacity.drain import lanes_to_skip
from eagledata.capacity.forecast import new_draws
from eagledata.run.load_lanes import LaneSet, Waiter

_UNGATED = object()
"""The pass of a request the controller does not gate (a server it has no lane for)."""


class LoadGate(LaneSet):
    """Tickets for requests, per lane, by room in the KV forecast (``LaneSet``: the state)."""

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
