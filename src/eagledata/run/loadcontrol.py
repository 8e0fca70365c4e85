"""The live side of ``--concurrency auto``: read each server's load, gate and route requests.

``capacity/controller.py`` owns the numbers; this module feeds it. Every ``poll_interval_s`` it
reads each server's load through the client (``/v1/loads``, else ``/metrics``, else
``/get_load``; behind an sglang-router, each worker's), updates that server's lanes (one per DP
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

Three modules, one class: ``load_lanes.py`` (the lanes and the state the others share),
``load_gate.py`` (the tickets: ``acquire``, ``enter``, ``release``) and this one (the sampling
loop, the telemetry lines and the progress bar's fields: ``LoadController``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import replace

from eagledata.capacity.controller import Lane, LaneSample, fallback_concurrency
from eagledata.run.load_gate import LoadGate
from eagledata.run.telemetry import forecast_usage, lane_entry
from eagledata.rundir.lines import TelemetryLine
from eagledata.rundir.telemetry import lane_name
from eagledata.server.loads import ServerLoad, in_logical_tokens, merge_workers


class LoadController(LoadGate):
    """Lanes per server, their gate (auto) and their telemetry (always): the loop that samples
    the servers and writes the telemetry, over the gate (``load_gate.py``) and the lanes
    (``load_lanes.py``)."""

    # --- the loop -------------------------------------------------------------------------------

    async def run(self) -> None:
        """Sample until cancelled (the pipeline's task group owns this task)."""
        last_telemetry = -float("inf")
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
                f"{url} reports no load (/v1/loads, /metrics and /get_load all missing): "
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
