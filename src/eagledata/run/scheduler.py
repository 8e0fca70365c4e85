"""Step 4: a bounded queue, an in-flight limit and one task group.

Two levels of backpressure: the producer blocks when the queue is full (memory stays flat however
large the dataset), and at most ``concurrency`` items are being handled at once. Items are handled
in completion order: one slow request never holds back the others.

``stop()`` is the first Ctrl-C: take no new work, let in-flight items finish. Cancelling the task
that awaits ``run()`` is the second: in-flight items are abandoned (their owners abort them).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Capped exponential backoff with full jitter (AWS architecture blog's recommendation)."""

    max_attempts: int = 5
    base_s: float = 1.0
    cap_s: float = 60.0

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        ceiling = min(self.cap_s, self.base_s * (2 ** max(0, attempt - 1)))
        return (rng or random).uniform(0, ceiling)


@dataclass(slots=True)
class SchedulerStats:
    started_at: float = field(default_factory=time.monotonic)
    in_flight: int = 0


class Scheduler(Generic[T]):
    def __init__(self, concurrency: int, queue_size: int | None = None) -> None:
        self.concurrency = concurrency
        self.stats = SchedulerStats()
        self._queue: asyncio.Queue[T | None] = asyncio.Queue(queue_size or 2 * concurrency)
        self._stopping = False
        self._source_done = False
        self._unstarted = 0
        """Items in the queue, not yet taken by a worker."""
        self.stopped = asyncio.Event()
        """Set by ``stop()``: what a handler waits on to cut its own waits short."""

    @property
    def stopping(self) -> bool:
        return self._stopping

    def unstarted(self) -> int | None:
        """Items the source has yielded that no worker has taken yet, once the source has
        yielded its last (None before: more may come). ``--concurrency auto`` shares out the
        job's tail by it (``capacity/drain.py``)."""
        return self._unstarted if self._source_done else None

    def stop(self) -> None:
        """Take no new work; items already being handled finish. Queued items stay undone."""
        self._stopping = True
        self.stopped.set()
        while not self._queue.empty():
            self._queue.get_nowait()
        self._unstarted = 0
        for _ in range(self.concurrency):
            try:
                self._queue.put_nowait(None)
            except asyncio.QueueFull:
                break

    async def run(self, source: AsyncIterator[T], handle: Callable[[T], Awaitable[None]]) -> None:
        self._source_done = False  # a pass of its own (the results given back, run again)
        async with asyncio.TaskGroup() as group:
            group.create_task(self._produce(source))
            for _ in range(self.concurrency):
                group.create_task(self._work(handle))

    async def _produce(self, source: AsyncIterator[T]) -> None:
        async for item in source:
            if self._stopping:
                return
            await self._queue.put(item)
            self._unstarted += 1
        self._source_done = True
        # Only on a clean end: after an error or a cancel the workers are being cancelled too,
        # and a put into a full queue nobody reads would hang the task group for ever.
        if not self._stopping:
            for _ in range(self.concurrency):
                await self._queue.put(None)

    async def _work(self, handle: Callable[[T], Awaitable[None]]) -> None:
        while not self._stopping:
            item = await self._queue.get()
            if item is None:
                return
            self._unstarted = max(0, self._unstarted - 1)
            self.stats.in_flight += 1
            try:
                await handle(item)
            finally:
                self.stats.in_flight -= 1
