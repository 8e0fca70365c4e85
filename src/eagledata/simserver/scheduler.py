"""The KV / queue / latency model: per-DP-rank admission, FCFS queues, aborts and counters."""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any

from eagledata.errors import EagledataError
from eagledata.simserver.capacity import CapacityEngine
from eagledata.simserver.config import SimConfig
from eagledata.simserver.loop_rank import QUEUE_FULL
from eagledata.simserver.protocol import FinishReason, abort_reason
from eagledata.simserver.sglang_loop import LoopEngine

QUEUED, RUNNING, DONE, ABORTED = range(4)


class Item:
    """One sample in flight: reserved KV, timer, and the future its handler awaits."""

    __slots__ = (
        "abort_finish",
        "admit_fut",
        "admitted_at",
        "cached",
        "dp_rank",
        "duration",
        "finish",
        "fut",
        "generated",
        "held",
        "ignore_eos",
        "keep",
        "kv_dtype",
        "max_new",
        "output_ids",
        "prompt_len",
        "rank",
        "rejected",
        "reserve",
        "retractions",
        "rid",
        "state",
        "timer",
        "waiter",
    )

    def __init__(self, rid: str, prompt_len: int, out: list[int], finish: FinishReason) -> None:
        self.rid, self.prompt_len, self.output_ids, self.finish = rid, prompt_len, out, finish
        self.reserve = prompt_len + len(out)
        self.state = QUEUED
        self.kv_dtype = "bf16"
        self.cached = 0
        self.rank = 0
        self.keep = 0
        self.admitted_at = self.duration = 0.0
        self.abort_finish: FinishReason | None = None
        self.rejected = False
        """Refused with 503 after it was taken (a retracted request on a full queue)."""
        self.fut: asyncio.Future[None] | None = None
        self.admit_fut: asyncio.Future[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        # The capacity engine's view (simserver/capacity.py): tokens decoded so far, KV tokens
        # held while running, times retracted, the request's budget.
        self.generated = self.held = self.retractions = 0
        self.max_new = len(out)
        self.ignore_eos = False
        self.dp_rank = 0
        """The DP rank it was dispatched to (``requests.dispatch_rank``)."""
        self.waiter: tuple[int, asyncio.Future[None]] | None = None

    def result(self) -> tuple[list[int], FinishReason]:
        if self.abort_finish is None:
            return self.output_ids, self.finish
        return self.output_ids[: self.keep], self.abort_finish


def _wake(fut: asyncio.Future[None] | None) -> None:
    if fut is not None and not fut.done():
        fut.set_result(None)


class QueueFullError(EagledataError):
    """The waiting queue of a DP rank is at ``max_queued_requests``."""


@dataclass(slots=True, eq=False)
class Rank:
    index: int
    used: int = 0
    running: int = 0
    queue: deque[Item] = field(default_factory=deque)


@dataclass(slots=True)
class SimStats:
    """Counters behind ``/_sim/stats`` and ``/metrics``; ``rid_kv_dtype`` is capped."""

    outcomes: Counter[str] = field(default_factory=Counter)
    by_kv_dtype: Counter[str] = field(default_factory=Counter)
    rid_kv_dtype: dict[str, str] = field(default_factory=dict)
    requests: int = 0
    items: int = 0
    generated_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    aborted_items: int = 0
    max_in_flight: int = 0
    """The most items the server held at once, queued or running (what a client had in flight
    here, as the server saw it)."""
    abort_calls: list[str] = field(default_factory=list)
    """The rid of every ``/abort_request`` call, in flight or not, in order (capped)."""

    def as_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        return {k: dict(v) if isinstance(v, dict) else v for k, v in out.items()}


RID_LIMIT = 200_000


class Scheduler:
    """Admits items per DP rank while running < limit and used + reserve fits the pool (FCFS,
    head of line); the rest wait, up to ``max_queued_requests`` per rank. An admitted item
    finishes after latency_s + completion / decode speed, unless aborted first."""

    def __init__(self) -> None:
        self.ranks: list[Rank] = []
        self.live: dict[Item, None] = {}
        self.rid_counts: Counter[str] = Counter()
        self.prefix_seen: dict[bytes, None] = {}
        self.stats = SimStats()
        self._window = (0.0, 0)
        self._last_throughput = 0.0
        self.capacity = CapacityEngine(lambda item, config: self.finish(item, DONE, config))
        """SGLang's scheduler, step by step, when ``config.engine == "sglang"``."""
        self.loop = LoopEngine(
            lambda item, config: self.finish(item, DONE, config), self._reject_retracted
        )
        """The second model of it, when ``config.engine == "sglang-loop"``."""

    def engine(self, config: SimConfig) -> CapacityEngine | LoopEngine:
        """The step-by-step model ``config`` runs (``config.steps_engine``)."""
        return self.loop if config.engine == "sglang-loop" else self.capacity

    def engine_loads(self, config: SimConfig) -> list[dict[str, Any]]:
        """Per DP rank, the step model's numbers; empty before its first request."""
        engine = self.engine(config)
        return engine.loads(config) if engine.ranks else []

    def _reject_retracted(self, item: Item, config: SimConfig) -> None:
        """A retracted request the full queue refused: SGLang aborts it with 503."""
        item.rejected = True
        item.abort_finish = abort_reason(QUEUE_FULL, 503, None)
        self.stats.outcomes["queue_full_retracted"] += 1
        self.finish(item, ABORTED, config)

    def rank(self, index: int) -> Rank:
        while len(self.ranks) <= index:
            self.ranks.append(Rank(len(self.ranks)))
        return self.ranks[index]

    def seen_prefix(self, config: SimConfig, digest: bytes, prompt_len: int) -> int:
        """Cached tokens of a prompt: a repeat of a prompt the server took reuses all but its
        last token."""
        if config.disable_radix_cache or digest not in self.prefix_seen:
            return 0
        return prompt_len - 1

    def remember_prefix(self, digest: bytes) -> None:
        if len(self.prefix_seen) >= RID_LIMIT:
            self.prefix_seen.clear()
        self.prefix_seen[digest] = None

    def submit(self, items: list[Item], config: SimConfig) -> None:
        """Admit or queue every item of one HTTP request, or none (QueueFullError)."""
        now = asyncio.get_running_loop().time()
        if config.steps_engine:
            self._submit_to_engine(items, config)
            return
        for placed, item in enumerate(items):
            rank = self.rank(item.dp_rank)
            item.rank = rank.index
            if not rank.queue and self._fits(rank, item, config):
                self._admit(rank, item, config, now)
            elif config.max_queued_requests is not None and (
                len(rank.queue) >= config.max_queued_requests
            ):
                for other in items[:placed]:
                    self.finish(other, ABORTED, config)
                raise QueueFullError("The request queue is full.")
            else:
                rank.queue.append(item)
            self._take(item)

    def _take(self, item: Item) -> None:
        self.live[item] = None
        self.rid_counts[item.rid] += 1
        self.stats.prompt_tokens += item.prompt_len
        self.stats.cached_tokens += item.cached
        self.stats.max_in_flight = max(self.stats.max_in_flight, len(self.live))

    def _submit_to_engine(self, items: list[Item], config: SimConfig) -> None:
        engine = self.engine(config)
        for placed, item in enumerate(items):
            rank = engine.place(item, config)
            if engine.queue_full(rank, config):  # type: ignore[arg-type]
                for other in items[:placed]:
                    self.finish(other, ABORTED, config)
                raise QueueFullError("The request queue is full.")
            self._take(item)
            engine.enqueue(rank, item, config)  # type: ignore[arg-type]

    def _fits(self, rank: Rank, item: Item, config: SimConfig) -> bool:
        if rank.running >= config.running_limit_per_rank():
            return False
        return rank.running == 0 or rank.used + item.reserve <= config.max_total_num_tokens

    def _admit(self, rank: Rank, item: Item, config: SimConfig, now: float) -> None:
        rank.used += item.reserve
        rank.running += 1
        item.state = RUNNING
        item.admitted_at = now
        item.duration = config.latency_s
        if config.decode_tok_per_s is not None:
            speed = config.decode_tok_per_s * min(1.0, config.decode_batch / rank.running)
            item.duration += len(item.output_ids) / speed
        _wake(item.admit_fut)
        loop = asyncio.get_running_loop()
        item.timer = loop.call_later(item.duration, self.finish, item, DONE, config)

    def finish(self, item: Item, state: int, config: SimConfig) -> None:
        """End an item (DONE or ABORTED), free its KV, admit waiters, wake its handler."""
        if item.state not in (QUEUED, RUNNING):
            return
        if config.steps_engine:
            engine = self.engine(config)
            engine.release(item)
            self._end(item, state)
            engine.kick(engine.rank(item.rank, config), config)  # type: ignore[arg-type]
            return
        rank = self.rank(item.rank)
        if item.state == RUNNING:
            rank.used -= item.reserve
            rank.running -= 1
            if item.timer is not None:
                item.timer.cancel()
        else:
            rank.queue.remove(item)
        self._end(item, state)
        self.drain(rank, config)

    def _end(self, item: Item, state: int) -> None:
        item.state = state
        del self.live[item]
        self.rid_counts[item.rid] -= 1
        if self.rid_counts[item.rid] <= 0:
            del self.rid_counts[item.rid]
        if state == DONE:
            self._count_done(item)
        else:
            self.stats.aborted_items += 1
        _wake(item.fut)
        _wake(item.admit_fut)

    def drain(self, rank: Rank, config: SimConfig) -> None:
        now = asyncio.get_running_loop().time()
        while rank.queue and self._fits(rank, rank.queue[0], config):
            self._admit(rank, rank.queue.popleft(), config, now)

    def _count_done(self, item: Item) -> None:
        stats = self.stats
        stats.generated_tokens += len(item.output_ids)
        stats.by_kv_dtype[item.kv_dtype] += 1
        if len(stats.rid_kv_dtype) < RID_LIMIT:
            stats.rid_kv_dtype[item.rid] = item.kv_dtype
        now = asyncio.get_running_loop().time()
        start, tokens = self._window
        if now - start >= 2.0:
            self._last_throughput = tokens / (now - start)
            start, tokens = now, 0
        self._window = (start, tokens + len(item.output_ids))

    def gen_throughput(self) -> float:
        """Generated tokens per second over the last window of about two seconds."""
        for engine in (self.capacity, self.loop):
            if engine.ranks:
                return sum(rank.throughput for rank in engine.ranks)
        start, tokens = self._window
        elapsed = asyncio.get_running_loop().time() - start
        return tokens / elapsed if elapsed > 4.0 else self._last_throughput

    def abort(self, rid: str, abort_all: bool, config: SimConfig) -> int:
        """``/abort_request``: a no-op unless ``rid`` is in flight; then every rid starting
        with it ends with a 200 + abort answer keeping its partial output."""
        if abort_all:
            targets = list(self.live)
        elif rid in self.rid_counts:
            targets = [item for item in self.live if item.rid.startswith(rid)]
        else:
            return 0
        now = asyncio.get_running_loop().time()
        for item in targets:
            if item.state == RUNNING and config.steps_engine:
                item.keep = min(item.generated, max(0, len(item.output_ids) - 1))
                item.abort_finish = abort_reason(f"Abort request {item.rid}", None, None)
            elif item.state == RUNNING:
                done = (now - item.admitted_at) / item.duration if item.duration > 0 else 0.0
                item.keep = max(0, min(len(item.output_ids) - 1, int(len(item.output_ids) * done)))
                message = f"Abort request {item.rid}"
                item.abort_finish = abort_reason(message, None, None)
            else:
                item.abort_finish = {"type": "abort", "message": "Abort in waiting queue"}
            self.finish(item, ABORTED, config)
        return len(targets)

    def drop(self, items: Iterable[Item], config: SimConfig) -> None:
        """Free items whose answer will never be read (client gone, connection dropped)."""
        for item in items:
            self.finish(item, ABORTED, config)

    def load(self, config: SimConfig) -> list[dict[str, Any]]:
        if config.steps_engine:
            return [
                {
                    "dp_rank": r["dp_rank"],
                    "num_reqs": r["num_running_reqs"] + r["num_waiting_reqs"],
                    "num_waiting_reqs": r["num_waiting_reqs"],
                    "num_tokens": r["num_total_tokens"],  # used + queued seq lens (S9 L591-617)
                }
                for r in self.engine(config).loads(config)
            ]
        ranks = [self.rank(i) for i in range(config.dp_size)]
        return [
            {
                "dp_rank": r.index,
                "num_reqs": r.running + len(r.queue),
                "num_waiting_reqs": len(r.queue),
                "num_tokens": r.used,
            }
            for r in ranks
        ]
