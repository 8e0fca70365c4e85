"""One item's attempts: send it, retry with backoff, decide whether the item or its server failed.

The pipeline builds one ``ItemSender`` per session and hands ``send`` to the scheduler.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from typing import Any

from eagledata.errors import ItemError, RetryableItemError, ServerUnavailableError
from eagledata.run.holding import HoldAndRelease
from eagledata.run.loadcontrol import LoadController
from eagledata.run.progress import Progress
from eagledata.run.scheduler import RetryPolicy
from eagledata.run.writer import FailureLog
from eagledata.rundir.records import failure_entry
from eagledata.server.answers import QueueFullError, ServerDownError
from eagledata.server.client import SGLangClient, new_rid
from eagledata.source.workplan import WorkItem


class ItemSender:
    """Sends one work item at a time to the servers; a result is held (``guard``: the checks that
    release it, run/holding.py), a failure goes to the failure file."""

    def __init__(
        self,
        *,
        client: SGLangClient,
        guard: HoldAndRelease[tuple[WorkItem, Any]],
        failures: FailureLog,
        progress: Progress,
        policy: RetryPolicy,
        sampling_params: dict[str, Any],
        down_deadline_s: float,
        dataset_name: str,
        on_failure: Callable[[], None],
        load: LoadController | None = None,
    ) -> None:
        self.client = client
        self.guard = guard
        self.failures = failures
        self.progress = progress
        self.policy = policy
        self.sampling_params = sampling_params
        self.down_deadline_s = down_deadline_s
        self.dataset_name = dataset_name
        self.on_failure = on_failure
        self.load = load
        """Under ``--concurrency auto``: the gate each attempt passes, and where it goes."""

    async def _attempt(self, item: WorkItem, params: dict[str, Any]) -> Any:
        """One request; under auto, admitted by the load controller and sent where it chose."""
        load = self.load
        if load is None or not load.auto:
            return await self.client.generate(item.input_ids, params, new_rid())
        ticket = await load.acquire(len(item.input_ids))
        try:
            result = await self.client.generate(
                item.input_ids,
                params,
                new_rid(),
                url=ticket.lane.server,
                dp_rank=ticket.lane.rank,
                admitted=True,
            )
        except QueueFullError:
            load.release(ticket, queue_full=True)
            raise
        except BaseException:
            load.release(ticket)
            raise
        load.release(
            ticket, completion_tokens=result.completion_tokens, retractions=result.retractions
        )
        return result

    async def _queue_full(self, exc: QueueFullError, item: WorkItem) -> None:
        """A 503 is the server's backpressure, not the item's fault: wait 0.5-4 s (scaled by the
        backoff base) and try again without spending an attempt, unless the server has served
        nothing for ``down_deadline_s`` (then it is down, whatever it answers)."""
        endpoint = self.client.endpoint(exc.server) if exc.server else None
        if endpoint is not None and time.monotonic() - endpoint.last_ok > self.down_deadline_s:
            raise ServerUnavailableError(
                f"{endpoint.url} has failed every request for {self.down_deadline_s:g}s "
                f"(last: {exc}); the run is saved: fix the server and run 'eagledata resume "
                "RUN_DIR'"
            )
        await asyncio.sleep(random.uniform(0.5, 4.0) * min(1.0, self.policy.base_s))

    async def send(self, item: WorkItem) -> None:
        client = self.client
        # sampling_seed makes each sample reproducible on servers started with
        # --enable-deterministic-inference; other servers ignore it.
        params = {**self.sampling_params, "sampling_seed": item.sample}
        attempts = 0
        first_failure: float | None = None
        while True:
            try:
                result = await self._attempt(item, params)
            except QueueFullError as exc:
                await self._queue_full(exc, item)
                continue
            except ServerDownError:
                await client.wait_until_healthy(
                    self.down_deadline_s, self.guard.check_reconnected, self.progress.note
                )
                continue
            except RetryableItemError as exc:
                attempts += 1
                first_failure = first_failure or time.monotonic()
                if attempts < self.policy.max_attempts:
                    await asyncio.sleep(self.policy.delay(attempts))
                    continue
                if await self._server_at_fault(exc, first_failure, item):
                    attempts -= 1  # not the item's attempt: try again once the server works
                    await asyncio.sleep(self.policy.delay(attempts))
                    continue
                self._fail(item, exc, attempts)
                return
            except ItemError as exc:
                self._fail(item, exc, attempts + 1)
                return
            self.guard.hold((item, result), result.server, result.completed_at)
            return

    async def _server_at_fault(
        self, exc: RetryableItemError, first_failure: float, item: WorkItem
    ) -> bool:
        """At the attempt cap: did this item fail, or is its server failing every request?

        An item goes to the failure file (for good: resume does not retry it) only when its
        server works: it has served another request since the item first failed, or it serves a
        one-token probe now. A server that does neither is down whatever its ``/health`` says
        (an sglang-router whose workers are gone or restarting answers 500/503 to everything and
        200 to ``/health``): it is marked down, so its work goes to the other servers or waits
        for it, and past ``server.down_deadline_s`` without one success the run stops, resumable.
        """
        client = self.client
        endpoint = client.endpoint(exc.server) if exc.server else None
        if endpoint is None or endpoint.last_ok > first_failure:
            return False
        if await client.probe(endpoint, item.input_ids[:1]):
            return False
        deadline = self.down_deadline_s
        if time.monotonic() - endpoint.last_ok > deadline:
            raise ServerUnavailableError(
                f"{endpoint.url} has failed every request for {deadline:g}s (last: {exc}); "
                "the run is saved: fix the server and run 'eagledata resume RUN_DIR'"
            )
        endpoint.healthy = False
        return True

    def _fail(self, item: WorkItem, exc: ItemError, attempts: int) -> None:
        self.failures.write(
            failure_entry(
                item_id=item.item_id,
                dataset=self.dataset_name,
                row_id=item.row_id,
                sample=item.sample,
                reason=exc.reason,
                message=str(exc),
                attempts=attempts,
            )
        )
        self.on_failure()
        self.progress.advance()
