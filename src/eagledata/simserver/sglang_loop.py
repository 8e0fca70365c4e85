"""A second, independent model of SGLang's scheduler (``SimConfig(engine="sglang-loop")``).

``capacity.py`` (``engine="sglang"``) is the model ``--concurrency auto`` was tuned on. This one
is written again from SGLang 0.5.9's own source (the wheel's ``managers/scheduler.py``,
``schedule_policy.py`` and ``schedule_batch.py``; 0.5.23 keeps the same loop), function by
function, so that a controller that only works on the first model shows it here. Where the two
differ, this one follows the source:

* **The loop** (``Scheduler.event_loop_normal`` -> ``get_next_batch_to_run``): every iteration
  first merges the last prefill batch into the running batch, then tries a new prefill batch
  (``get_new_batch_prefill``); only when none forms does it decode (``update_running_batch``,
  then one forward). A prefill stalls decoding for its length. An iteration with no batch at all
  is idle, and ``self_check_during_idle`` resets ``new_token_ratio`` to its initial value.
* **batch_is_full**: once admission stops for lack of tokens (``AddReqResult.NO_TOKEN``) or at
  ``max_running_requests``, no prefill is tried again until the running batch shrinks (a request
  finished and was filtered out, or was retracted), however far the ratio decays meanwhile.
  A finished request is filtered out in the ``update_running_batch`` of the next decode, which
  comes after that iteration's prefill attempt: the freed room is tried one iteration later.
* **Admission** (``PrefillAdder.add_one_req``): the waiting queue in order (``fcfs``);
  ``rem_total_tokens`` is the free and evictable pool minus, per running request,
  ``min(max_new - output, CLIP) x new_token_ratio``, minus, per request already in this batch,
  its extend tokens plus ``min(max_new, CLIP)``. A request is refused (NO_TOKEN) when its extend
  tokens plus ``min(max_new - output, CLIP)`` reach ``rem_total_tokens`` (``>=``). A batch holds
  at most ``max_prefill_tokens`` (16,384) extend tokens past its first request, and
  ``chunked_prefill_size``: the request that does not fit the chunk is cut
  (``new_chunked_req``) and continued first in the next prefill (``add_chunked_req``).
  ``CLIP`` is ``SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION`` (4096). The radix cache is on (the
  default), so ``ignore_eos`` requests take this same path.
* **new_token_ratio**: ``min(0.7 x schedule_conservativeness, 1)`` (conservativeness x 0.3 under
  DP attention), minus ``(init - init x 0.14) / 600`` per decode step without retraction.
* **Retraction** (``check_decode_mem`` / ``retract_decode``): a decode step needs one free slot
  per running request (page size 1). If the pool lacks them, requests sorted by (output length,
  -prompt length) are popped from the end, at least one and then until the rest fit, keeping
  one. A retracted request frees its KV (not inserted in the radix tree), keeps its output, and
  goes back through ``_add_request_to_queue``: on a queue at ``max_queued_requests`` it is
  **aborted with 503** (``_abort_on_queued_limit`` applies to it too). When admitted again its
  prompt and output are prefilled anew. The ratio becomes ``min(1, (sum output + 20 n) /
  (sum max_new + 1))`` over the requests left.
* **The queue cap**: a request arriving at a rank whose waiting queue holds
  ``max_queued_requests`` is refused with 503 "The request queue is full.".
* **KV**: a request holds its prompt and its output but the last token (whose KV the next
  decode step writes); a finished request's KV goes to the radix tree, evictable, which
  admission counts as free and ``token_usage`` does not count.

The step time is a fit of its own (``SGLangLoopSettings``): a decode step costs a base, a
per-request term and a per-context-token term (attention reads every token in the batch); a
prefill a base plus its extend tokens at a prefill speed. Time runs ``time_scale`` x modelled
time, as in the first model; the statistics (``loads``) have the same names.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from eagledata.simserver.config import SimConfig

Finish = Callable[[Any, SimConfig], None]

RUNNING_STATE = 1  # scheduler.RUNNING (not imported: scheduler imports this module)
QUEUED_STATE = 0
QUEUE_FULL = "The request queue is full."


def ratio_bounds(config: SimConfig) -> tuple[float, float, float]:
    """(init, min, decay per step) of ``new_token_ratio`` (``Scheduler.__init__``)."""
    conservativeness = config.schedule_conservativeness
    if config.enable_dp_attention:
        conservativeness *= 0.3
    init = min(config.init_new_token_ratio * conservativeness, 1.0)
    floor = min(init * config.min_new_token_ratio_factor, 1.0)
    return init, floor, (init - floor) / config.new_token_ratio_decay_steps


@dataclass(eq=False)
class LoopRank:
    """One DP rank's scheduler process."""

    index: int
    ratio: float
    waiting: list[Any] = field(default_factory=list)
    running: list[Any] = field(default_factory=list)
    last_prefill: list[Any] = field(default_factory=list)
    """The batch the last iteration prefilled: merged into ``running`` by the next one."""
    chunked: Any = None
    """The request whose prompt is being prefilled chunk by chunk (``chunked_req``)."""
    chunked_done: int = 0
    """Extend tokens of ``chunked`` prefilled so far."""
    batch_is_full: bool = False
    finished_unfiltered: bool = False
    """A request finished in the last decode step: the next ``update_running_batch`` filters it
    out, and the shrunk batch clears ``batch_is_full``."""
    used: int = 0
    timer: asyncio.TimerHandle | None = None
    in_tick: bool = False
    completing: list[Any] = field(default_factory=list)
    rejecting: list[Any] = field(default_factory=list)
    """Retracted requests a full queue refused: answered 503 after the iteration."""
    due: float | None = None
    idle_since: float | None = None
    # --- statistics, in the first model's names (capacity.EngineRank) ---
    decode_steps: int = 0
    retracted_total: int = 0
    retracted_input_tokens: int = 0
    retracted_output_tokens: int = 0
    retracted_window: int = 0
    retracted_rejected: int = 0
    """Retracted requests aborted with 503 because the waiting queue was full."""
    throughput: float = 0.0
    window_tokens: int = 0
    window_start: float = 0.0
    usage_area: float = 0.0
    running_area: float = 0.0
    sim_time: float = 0.0
    decoded_tokens: int = 0
    prefill_batches: int = 0
    prefill_seconds: float = 0.0
    fill_time: float = 0.0
    fill_usage_area: float = 0.0
    """``sim_time`` and ``usage_area`` when a request was last admitted for the first time:
    the pool's mean usage while work was left to fill it (a benchmark's "while work remains")."""


def _cached_part(item: Any) -> int:
    """The radix cache's hit, on a first admission only (a retracted request's KV was not
    inserted in the tree)."""
    return int(item.cached) if item.generated == 0 and item.retractions == 0 else 0


def _extend(item: Any) -> int:
    """Tokens a waiting request prefills: its prompt (less the radix cache's hit) and, after a
    retraction, its output so far."""
    return int(item.prompt_len + item.generated) - _cached_part(item)


class LoopEngine:
    """The per-rank loops; ``Scheduler`` delegates to it when ``config.engine ==
    "sglang-loop"``. ``on_done`` ends an item that finished; ``on_reject`` one that a full
    queue refused after a retraction (HTTP 503)."""

    def __init__(self, on_done: Finish, on_reject: Finish) -> None:
        self.ranks: list[LoopRank] = []
        self._on_done = on_done
        self._on_reject = on_reject

    def rank(self, index: int, config: SimConfig) -> LoopRank:
        while len(self.ranks) <= index:
            self.ranks.append(LoopRank(len(self.ranks), ratio_bounds(config)[0]))
        return self.ranks[index]

    # --- requests in and out ------------------------------------------------------------------

    def place(self, item: Any, config: SimConfig) -> LoopRank:
        return self.rank(item.dp_rank, config)

    def queue_full(self, rank: LoopRank, config: SimConfig) -> bool:
        """``_abort_on_queued_limit``: ``len(waiting_queue) + 1 > max_queued_requests``."""
        cap = config.max_queued_requests
        return cap is not None and len(rank.waiting) + 1 > cap

    def enqueue(self, rank: LoopRank, item: Any, config: SimConfig) -> None:
        item.rank = rank.index
        item.held = 0
        rank.waiting.append(item)
        self.kick(rank, config)

    def release(self, item: Any) -> None:
        """Take an item out (finished, aborted, client gone); frees its KV. Idempotent."""
        if item.rank >= len(self.ranks):
            return
        rank = self.ranks[item.rank]
        for batch in (rank.running, rank.last_prefill, rank.waiting):
            if item in batch:
                batch.remove(item)
                if batch is rank.running:
                    rank.finished_unfiltered = True
        if rank.chunked is item:
            rank.chunked = None
        rank.used -= item.held
        item.held = 0
        self._wake_waiter(item, force=True)

    def kick(self, rank: LoopRank, config: SimConfig) -> None:
        busy = (
            rank.waiting
            or rank.running
            or rank.last_prefill
            or rank.chunked is not None
            or rank.completing
            or rank.rejecting
        )
        if rank.timer is None and not rank.in_tick and busy:
            loop = asyncio.get_running_loop()
            if rank.idle_since is not None:
                rank.sim_time += (loop.time() - rank.idle_since) / config.time_scale
                rank.idle_since = None
            rank.timer = loop.call_soon(self._tick, rank, config)  # type: ignore[assignment]

    def kick_all(self, config: SimConfig) -> None:
        for rank in self.ranks:
            self.kick(rank, config)

    # --- one iteration of event_loop_normal -------------------------------------------------------

    def _tick(self, rank: LoopRank, config: SimConfig) -> None:
        rank.timer = None
        rank.in_tick = True
        try:
            self._iterate(rank, config)
        finally:
            rank.in_tick = False

    def _iterate(self, rank: LoopRank, config: SimConfig) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        done, rank.completing = rank.completing, []
        for item in done:
            self._on_done(item, config)
        rejected, rank.rejecting = rank.rejecting, []
        for item in rejected:
            self._on_reject(item, config)
        for item in rank.running:
            self._wake_waiter(item)
        self._merge_prefilled(rank)
        seconds = self._prefill(rank, config)
        if seconds is None and (rank.running or rank.finished_unfiltered):
            seconds = self._decode(rank, config, now)
        if seconds is None:
            # No batch: self_check_during_idle re-inits the ratio. The loop spins on while a
            # prefill may form (the batch that just emptied no longer blocks it), else it
            # waits for work.
            rank.ratio = ratio_bounds(config)[0]
            rank.due = None
            if (rank.waiting and not rank.batch_is_full) or rank.chunked is not None:
                rank.timer = loop.call_soon(self._tick, rank, config)  # type: ignore[assignment]
            else:
                rank.idle_since = loop.time()
            return
        pool = config.max_total_num_tokens
        rank.usage_area += rank.used / pool * seconds
        rank.running_area += len(rank.running) * seconds
        rank.sim_time += seconds
        start = now if rank.due is None else max(rank.due, now - 0.05)
        rank.due = start + seconds * config.time_scale
        rank.timer = loop.call_at(rank.due, self._tick, rank, config)

    def _merge_prefilled(self, rank: LoopRank) -> None:
        """The last prefill batch joins the running batch; one that finished in its prefill
        (a one-token answer, ``max_new_tokens`` 0) shrank it, which clears ``batch_is_full``."""
        if not rank.last_prefill:
            return
        batch, rank.last_prefill = rank.last_prefill, []
        kept = [item for item in batch if item.state == RUNNING_STATE and item.held > 0]
        if len(kept) < len(batch):
            rank.batch_is_full = False
        rank.running.extend(kept)

    # --- get_new_batch_prefill ---------------------------------------------------------------

    def _prefill(self, rank: LoopRank, config: SimConfig) -> float | None:
        if (rank.batch_is_full or not rank.waiting) and rank.chunked is None:
            return None
        settings = config.sglang_loop
        clip = config.clip_max_new_tokens_estimation
        free = config.max_total_num_tokens - rank.used
        total_offset = sum(
            min(item.max_new - item.generated, clip) * rank.ratio for item in rank.running
        )
        current_offset = 0
        rem_input = settings.max_prefill_tokens
        chunk = config.chunked_prefill_size if config.chunked_prefill_size > 0 else None
        limit = config.running_limit_per_rank()
        can_run: list[tuple[Any, int, bool]] = []
        """(request, extend tokens it prefills now, whether its prompt is done after)."""

        def update(extend: int, reserve: int) -> None:
            nonlocal total_offset, current_offset, rem_input, chunk
            total_offset += extend + reserve
            current_offset += extend
            rem_input -= extend
            if chunk is not None:
                chunk -= extend

        if rank.chunked is not None:  # add_chunked_req
            item = rank.chunked
            left = _extend(item) - rank.chunked_done
            room = min(chunk, int(free - total_offset)) if chunk is not None else left
            if room <= 0:
                room = chunk if chunk is not None else left
            take = min(left, room)
            whole = take >= left
            can_run.append((item, take, whole))
            update(take, min(item.max_new, clip) if whole else 0)
        for item in rank.waiting:
            if len(can_run) >= limit - len(rank.running):
                rank.batch_is_full = True
                break
            extend = _extend(item)
            total = extend + min(max(item.max_new - item.generated, 0), clip)
            if total >= free - total_offset:
                rank.batch_is_full = True  # NO_TOKEN
                break
            if extend >= rem_input and can_run:
                break  # OTHER: past max_prefill_tokens
            if chunk is None or extend <= chunk:
                can_run.append((item, extend, True))
                update(extend, min(item.max_new, clip))
            else:
                if chunk <= 0:
                    break
                can_run.append((item, chunk, False))
                update(chunk, 0)
            if free - total_offset <= 0 or free - current_offset <= 0:
                rank.batch_is_full = True
                break
            if rem_input <= 0 or (chunk is not None and chunk <= 0):
                break
        if not can_run:
            return None
        extend_tokens = 0
        continuing, rank.chunked = rank.chunked, None
        batch_items = {id(item) for item, _, _ in can_run}
        rank.waiting = [item for item in rank.waiting if id(item) not in batch_items]
        for item, take, whole in can_run:
            extend_tokens += take
            if item is continuing:
                rank.chunked_done += take
            else:  # its first piece: the cached prefix is locked (no longer evictable) too
                hit = _cached_part(item)
                item.held += hit
                rank.used += hit
                rank.chunked_done = take
                if item.retractions == 0 and item.generated == 0:
                    rank.fill_time, rank.fill_usage_area = rank.sim_time, rank.usage_area
                item.state = RUNNING_STATE
                if item.admit_fut is not None and not item.admit_fut.done():
                    item.admit_fut.set_result(None)
            item.held += take
            rank.used += take
            if not whole:
                rank.chunked = item
                continue
            rank.last_prefill.append(item)
            # The prefill's last position samples the next token (none for max_new_tokens 0).
            if item.generated < len(item.output_ids):
                item.generated += 1
                rank.decoded_tokens += 1
                rank.window_tokens += 1
            if item.generated >= len(item.output_ids):
                self._finish(rank, item)
        seconds = settings.slowdown * (
            settings.prefill_base_s + extend_tokens / settings.prefill_tok_per_s
        )
        rank.prefill_batches += 1
        rank.prefill_seconds += seconds
        return seconds

    # --- update_running_batch, then one decode forward ------------------------------------------

    def _decode(self, rank: LoopRank, config: SimConfig, now: float) -> float | None:
        if rank.finished_unfiltered:  # filter_batch: a smaller batch may admit again
            rank.finished_unfiltered = False
            rank.batch_is_full = False
        if not rank.running:
            return None  # it emptied: no forward this iteration
        _, floor, decay = ratio_bounds(config)
        if config.max_total_num_tokens - rank.used < len(rank.running):
            self._retract(rank, config)
            rank.batch_is_full = False
        else:
            rank.ratio = max(rank.ratio - decay, floor)
        settings = config.sglang_loop
        count = len(rank.running)
        context: int = sum(item.prompt_len + item.generated for item in rank.running)
        tokens = 0
        for item in list(rank.running):
            item.held += 1  # the KV of its last token, written by this forward
            rank.used += 1
            item.generated += 1
            tokens += 1
            if item.generated >= len(item.output_ids):
                rank.running.remove(item)
                self._finish(rank, item)
                rank.finished_unfiltered = True
        rank.decode_steps += 1
        rank.decoded_tokens += tokens
        rank.window_tokens += tokens
        if rank.decode_steps % config.decode_log_interval == 0:  # a logged batch: gauges
            elapsed = now - rank.window_start
            if elapsed > 0:
                rank.throughput = rank.window_tokens / elapsed
            rank.window_tokens, rank.window_start = 0, now
            rank.retracted_window = 0
        return settings.slowdown * (
            settings.decode_base_s
            + settings.decode_per_request_s * count
            + settings.decode_per_context_token_s * context
        )

    def _finish(self, rank: LoopRank, item: Any) -> None:
        """``release_kv_cache``: its KV becomes evictable (free for admission and usage)."""
        rank.used -= item.held
        item.held = 0
        rank.completing.append(item)

    def _retract(self, rank: LoopRank, config: SimConfig) -> None:
        """``retract_decode``: the fewest output tokens (then the longest prompt) go first."""
        order = sorted(
            rank.running, key=lambda item: (item.generated, -item.prompt_len), reverse=True
        )
        pool = config.max_total_num_tokens
        first = True
        while first or pool - rank.used < len(order):
            if len(order) == 1:
                break
            first = False
            item = order.pop()
            rank.running.remove(item)
            rank.used -= item.held
            item.held = 0
            item.retractions += 1
            item.state = QUEUED_STATE
            rank.retracted_total += 1
            rank.retracted_window += 1
            rank.retracted_input_tokens += item.prompt_len
            rank.retracted_output_tokens += item.generated
            if self.queue_full(rank, config):  # _add_request_to_queue -> 503
                rank.retracted_rejected += 1
                rank.rejecting.append(item)
            else:
                rank.waiting.append(item)
        decoded = sum(item.generated for item in order)
        budget = sum(item.max_new for item in order)
        steps = config.retract_decode_steps
        rank.ratio = min(1.0, (decoded + steps * len(order)) / (budget + 1))

    # --- streaming ----------------------------------------------------------------------------

    @staticmethod
    def _wake_waiter(item: Any, force: bool = False) -> None:
        waiter = item.waiter
        if waiter is not None and (force or item.generated >= waiter[0]):
            item.waiter = None
            if not waiter[1].done():
                waiter[1].set_result(None)

    async def until_generated(self, item: Any, mark: int) -> None:
        if item.generated >= mark or item.state not in (QUEUED_STATE, RUNNING_STATE):
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        item.waiter = (mark, fut)
        await fut

    # --- what the server reports ---------------------------------------------------------------

    def loads(self, config: SimConfig) -> list[dict[str, Any]]:
        """Per DP rank, what ``/v1/loads``, ``/metrics`` and ``/get_load`` report."""
        out = []
        pool = config.max_total_num_tokens
        for index in range(config.dp_size):
            rank = self.rank(index, config)
            running = len(rank.running) + len(rank.last_prefill)
            waiting_tokens = sum(item.prompt_len + item.generated for item in rank.waiting)
            out.append(
                {
                    "dp_rank": index,
                    "num_running_reqs": running,
                    "num_waiting_reqs": len(rank.waiting),
                    "num_used_tokens": rank.used,
                    "max_total_num_tokens": pool,
                    "token_usage": rank.used / pool,
                    "gen_throughput": rank.throughput,
                    "new_token_ratio": rank.ratio,
                    "num_retracted_reqs": rank.retracted_window,
                    "retracted_total": rank.retracted_total,
                    "retracted_input_tokens": rank.retracted_input_tokens,
                    "retracted_output_tokens": rank.retracted_output_tokens,
                    "retracted_waiting": sum(1 for item in rank.waiting if item.retractions),
                    "retracted_rejected": rank.retracted_rejected,
                    "num_total_tokens": rank.used + waiting_tokens,
                    "usage_area": rank.usage_area,
                    "running_area": rank.running_area,
                    "sim_time": rank.sim_time,
                    "decoded_tokens": rank.decoded_tokens,
                    "prefill_batches": rank.prefill_batches,
                    "prefill_seconds": rank.prefill_seconds,
                    "fill_time": rank.fill_time,
                    "fill_usage_area": rank.fill_usage_area,
                }
            )
        return out
