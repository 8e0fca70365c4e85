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

This module runs the loop (``LoopEngine``: requests in and out, one iteration, streaming, the
load it reports); a rank's state is ``loop_rank.py``, the batch steps ``loop_batches.py``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from eagledata.simserver import loop_batches
from eagledata.simserver.config import SimConfig
from eagledata.simserver.loop_rank import Finish, LoopRank, ratio_bounds
from eagledata.simserver.streaming import RUNNING_STATE, until_generated, wake_waiter


class LoopEngine:
    """The per-rank loops; ``Scheduler`` delegates to it when ``config.engine ==
    "sglang-loop"``. ``on_done`` ends an item that finished; ``on_reject`` one that a full
    queue refused after a retraction (HTTP 503)."""

    def queue_full(self, rank: LoopRank, config: SimConfig) -> bool:
        """``_abort_on_queued_limit``, as the scheduler asks every engine (``loop_batches``)."""
        return loop_batches.queue_full(rank, config)

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
        seconds = loop_batches.prefill(rank, config)
        if seconds is None and (rank.running or rank.finished_unfiltered):
            seconds = loop_batches.decode(rank, config, now)
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

    # --- streaming ----------------------------------------------------------------------------

    _wake_waiter = staticmethod(wake_waiter)

    async def until_generated(self, item: Any, mark: int) -> None:
        """Streaming: wait until ``mark`` tokens of ``item`` are decoded (or it ends)."""
        await until_generated(item, mark)

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
