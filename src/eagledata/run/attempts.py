"""One item's attempts: send it, retry with backoff, decide whether the item or its server failed.

The pipeline builds one ``ItemSender`` per session and hands ``send`` to the scheduler.

Once the session is stopped (``stopped``: the first Ctrl-C or SIGTERM) no new attempt starts:
an attempt in flight ends within its deadline (``request_timeout_s``), a wait (a backoff, an
admission, a server's recovery) ends at once, and an item without its answer is left undone
(``resume`` generates it), neither a record nor a failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable
from typing import Any

from eagledata.errors import ItemError, RetryableItemError, ServerUnavailableError
from eagledata.run.holding import HoldAndRelease
from eagledata.run.loadcontrol import LoadController
from eagledata.run.progress import Progress
from eagledata.run.records import ExaminedAnswer
from eagledata.run.scheduler import RetryPolicy
from eagledata.run.writer import FailureLog
from eagledata.rundir.records import failure_line
from eagledata.server.answers import QueueFullError, ServerDownError
from eagledata.server.client import SGLangClient, new_rid
from eagledata.server.responses import GenerateResult
from eagledata.source.workitem import WorkItem
from eagledata.tasks import unless_set

log = logging.getLogger(__name__)


class ItemSender:
    """Sends one work item at a time to the servers; a result is held (``guard``: the checks that
    release it, run/holding.py), a failure goes to the failure file."""

    def __init__(
        self,
        *,
        client: SGLangClient,
        guard: HoldAndRelease[ExaminedAnswer],
        failures: FailureLog,
        progress: Progress,
        policy: RetryPolicy,
        sampling_params: dict[str, Any],
        down_deadline_s: float,
        on_failure: Callable[[WorkItem], None],
        examine: Callable[[WorkItem, GenerateResult], ExaminedAnswer],
        load: LoadController | None = None,
        stopped: asyncio.Event | None = None,
    ) -> None:
        self.client = client
        self.guard = guard
        self.failures = failures
        self.progress = progress
        self.policy = policy
        self.sampling_params = sampling_params
        self.down_deadline_s = down_deadline_s
        self.on_failure = on_failure
        """Called with each item that ended in the failure file."""
        self.examine = examine
        """What the answer's record says of it, read as it arrives."""
        self.load = load
        """Under ``--concurrency auto``: the gate each attempt passes, and where it goes."""
        self.stopped = stopped if stopped is not None else asyncio.Event()
        """Set when the session stops: no new attempt, no more waiting."""

    async def _pause(self, seconds: float) -> None:
        """Sleep ``seconds``, or less if the session stops meanwhile."""
        if seconds <= 0 or self.stopped.is_set():
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self.stopped.wait()

    async def _attempt(self, item: WorkItem, params: dict[str, Any]) -> Any:
        """One request; under auto, admitted by the load controller and sent where it chose."""
        load = self.load
        if load is None or not load.auto:
            try:
                return await self.client.generate(item.input_ids, params, new_rid())
            except QueueFullError as exc:
                if load is not None and exc.server:
                    load.refused(exc.server)  # the telemetry's count of 503s, gated or not
                raise
        admitted, ticket = await unless_set(
            self.stopped, load.acquire(len(item.input_ids)), name=f"admit:{item.item_id}"
        )
        if not admitted or ticket is None or self.stopped.is_set():
            if ticket is not None:
                load.release(ticket)
            return None  # stopped while waiting for room: nothing was sent
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
        await self._pause(random.uniform(0.5, 4.0) * min(1.0, self.policy.base_s))

    async def send(self, item: WorkItem) -> None:
        client = self.client
        # sampling_seed makes each sample reproducible on servers started with
        # --enable-deterministic-inference; other servers ignore it. A dataset of a mix may
        # sample with settings of its own (``item.params``). A round after the first carries
        # its first seed (``GenerationSettings.sampling_params``): fresh samples, same prompts.
        own = item.params or self.sampling_params
        params = {**own, "sampling_seed": int(own.get("sampling_seed", 0)) + item.sample}
        attempts = 0
        first_failure: float | None = None
        while not self.stopped.is_set():
            try:
                result = await self._attempt(item, params)
            except QueueFullError as exc:
                await self._queue_full(exc, item)
                continue
            except ServerDownError as exc:
                log.warning("%s: %s; waiting for a server to answer /health", item.item_id, exc)
                await unless_set(
                    self.stopped,
                    client.wait_until_healthy(
                        self.down_deadline_s, self.guard.check_reconnected, self.progress.note
                    ),
                    name=f"recover:{item.item_id}",
                )
                continue
            except RetryableItemError as exc:
                if self.stopped.is_set():
                    return  # no new attempt after a stop: resume generates it
                attempts += 1
                first_failure = first_failure or time.monotonic()
                if attempts < self.policy.max_attempts:
                    delay = self.policy.delay(attempts)
                    log.info(
                        "%s: attempt %d failed (%s); again in %.1f s",
                        item.item_id,
                        attempts,
                        exc,
                        delay,
                    )
                    await self._pause(delay)
                    continue
                if await self._server_at_fault(exc, first_failure, item):
                    log.warning(
                        "%s: its server fails every request; not the item's fault", item.item_id
                    )
                    attempts -= 1  # not the item's attempt: try again once the server works
                    await self._pause(self.policy.delay(attempts))
                    continue
                self._fail(item, exc, attempts)
                return
            except ItemError as exc:
                self._fail(item, exc, attempts + 1)
                return
            if result is None:
                return  # stopped before it was sent
            # Read here, one answer at a time as it arrives, not when a check releases hundreds
            # at once: the gate must see the next answer end while they are read. On the event
            # loop, not in a worker thread: the reading holds the GIL either way, and handing
            # each answer to a thread cost a fast server's client ~1.5% (two at 0.05, A/B).
            answer = self.examine(item, result)
            self.guard.hold(answer, result.server, result.completed_at)
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
        log.warning(
            "%s failed after %d attempt(s) (%s): %s", item.item_id, attempts, exc.reason, exc
        )
        self.failures.write(
            failure_line(
                item_id=item.item_id,
                dataset=item.dataset,
                row_id=item.row_id,
                sample=item.sample,
                reason=exc.reason,
                message=str(exc),
                attempts=attempts,
                prompt_key=item.prompt_key,
            )
        )
        self.progress.advance()
        self.on_failure(item)
