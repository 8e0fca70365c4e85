"""SGLang's scheduler as a capacity engine (``SimConfig(engine="sglang")``).

One engine per simulated server; each DP rank runs its own loop, as each SGLang scheduler process
does. What is modelled, and where a reader checks it against SGLang 0.5.9 (S9; line numbers from
the 0.5.9 wheel's ``sglang/srt/``; the rules summarized in ``docs/sglang.md``):

* **The loop** (``managers/scheduler.py`` ``event_loop_normal`` / ``get_next_batch_to_run``):
  every iteration either runs one prefill batch of newly admitted requests, or, when nothing can
  be admitted, one decode step of the running batch. A prefill stalls decoding for its duration
  (no mixed chunking, SGLang's default).
* **Admission** (``managers/schedule_policy.py`` ``PrefillAdder``, L54-55, L437-447, L566-583,
  L640-643): the waiting queue is served first come first served, head of line. A request is
  admitted while ``available - sum(min(max_new - generated, CLIP) x new_token_ratio over the
  running batch)`` covers its ``prompt + generated + min(max_new - generated, CLIP)``; each
  admitted request then takes its own full reserve out of that budget. ``CLIP`` is
  ``SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION`` (4096); ``ignore_eos`` requests reserve at ratio 1.
  One prefill batch holds at most ``chunked_prefill_size`` input tokens (a longer prompt goes
  alone), and the running batch at most ``effective_max_running_requests_per_dp``.
* **new_token_ratio** (``scheduler.py`` L811-823, ``environ.py`` L225-229): starts at
  ``min(0.7 x schedule_conservativeness, 1)`` (x 0.3 under DP attention, ``server_args.py``
  L2115), decays linearly per retraction-free decode step to ``init x 0.14`` over 600 steps, and
  is reset to ``init`` when the rank goes idle.
* **Retraction** (``scheduler.py`` ``update_running_batch`` L2205-2260 ->
  ``schedule_batch.py`` ``check_decode_mem`` / ``retract_decode`` L1847-1905): before a decode
  step the pool must hold one new token per running request. If it cannot, requests are sorted
  by (output length, -input length) and popped from the end (the fewest generated tokens first,
  the longest prompt breaking ties) until the rest have room for ``SGLANG_RETRACT_DECODE_STEPS``
  (20) more steps, keeping at least one. A retracted request frees its KV (not kept in the radix
  tree), keeps its ``output_ids``, goes to the back of the waiting queue, and pays a prefill of
  prompt + output when it is admitted again. The ratio then jumps to
  ``min(1, (sum decoded + 20 n) / (sum max_new + 1))`` over the requests left.
* **The KV pool** (``max_total_num_tokens`` per rank): a running request holds prompt +
  generated tokens, one more per decode step; finished requests free theirs at once (SGLang may
  keep them as evictable radix-cache entries, which admission counts as free, so the two agree).
* **Step time**: a decode step of N running requests lasts ``0.077 + 0.00018 N`` seconds (the
  reference fit, ``docs/capacity.md`` "The step-time fit": tok/s = N / (0.077 + 0.00018 N)); prefill
  batch ``0.077 + input tokens / prefill_tok_per_s`` (the prefill speed is an assumption). Both
  are multiplied by ``time_scale`` so tests and benchmarks run in seconds.
* **Signals**: ``token_usage`` = used / pool (live), ``gen_throughput`` over the last
  ``decode_log_interval`` (40) decode steps (per wall-clock second: a time-scaled server looks
  like a faster one), ``num_retracted_reqs`` retractions since the last
  such log window, and the cumulative ``num_retracted_requests_total`` counter (0.5.7+).
* **The queue cap** (``scheduler.py`` L1726-1770): with ``--max-queued-requests N`` a request
  arriving when the rank's waiting queue already holds N is refused with HTTP 503 "The request
  queue is full." (``QueueFullError`` in ``scheduler.py``).

Simplifications, each on the safe side of the arithmetic: a prefill emits the first token
(as SGLang's does) and the prompt is prefilled in one batch even when longer than a chunk; page
size 1; no speculative decoding; no prefix sharing in the pool.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from eagledata.simserver.config import SimConfig
from eagledata.simserver.streaming import (
    QUEUED_STATE,
    RUNNING_STATE,
    until_generated,
    wake_waiter,
)

Finish = Callable[[Any, SimConfig], None]
"""Called with an item whose last token was decoded, once the step that decoded it is over."""


def ratio_bounds(config: SimConfig) -> tuple[float, float, float]:
    """(init, min, decay per step) of ``new_token_ratio``."""
    conservativeness = config.schedule_conservativeness
    if config.enable_dp_attention:
        conservativeness *= 0.3
    init = min(config.init_new_token_ratio * conservativeness, 1.0)
    floor = init * config.min_new_token_ratio_factor
    return init, floor, (init - floor) / config.new_token_ratio_decay_steps


@dataclass(eq=False)
class EngineRank:
    """One DP rank's scheduler: its waiting queue, running batch, pool and counters."""

    index: int
    ratio: float
    queue: deque[Any] = field(default_factory=deque)
    running: dict[Any, None] = field(default_factory=dict)
    used: int = 0
    timer: asyncio.TimerHandle | None = None
    in_tick: bool = False
    """True while an iteration runs: a finish it causes must not start a second loop."""
    completing: list[Any] = field(default_factory=list)
    decode_steps: int = 0
    retracted_total: int = 0
    retracted_input_tokens: int = 0
    retracted_output_tokens: int = 0
    retracted_window: int = 0
    throughput: float = 0.0
    window_tokens: int = 0
    window_start: float = 0.0
    usage_area: float = 0.0
    """Integral of token_usage over modelled time, for the mean KV usage a benchmark reports."""
    running_area: float = 0.0
    """Integral of the running batch's size over modelled time."""
    sim_time: float = 0.0
    """Modelled seconds: iterations at their modelled length, idle gaps at wall time / scale
    (so Python's own overhead never counts as server time)."""
    idle_since: float | None = None
    due: float | None = None
    """Wall time the next iteration is due: iterations are timed from this anchor, so Python's
    own overhead does not accumulate into a slower modelled clock."""
    decoded_tokens: int = 0
    prefill_batches: int = 0
    prefill_seconds: float = 0.0
    """Modelled time spent in prefill batches (decoding stalls meanwhile)."""


class CapacityEngine:
    """The per-rank loops; ``Scheduler`` delegates to it when ``config.engine == "sglang"``."""

    def __init__(self, on_done: Finish) -> None:
        self.ranks: list[EngineRank] = []
        self._on_done = on_done

    def rank(self, index: int, config: SimConfig) -> EngineRank:
        while len(self.ranks) <= index:
            self.ranks.append(EngineRank(len(self.ranks), ratio_bounds(config)[0]))
        return self.ranks[index]

    # --- requests in and out ----------------------------------------------------------------

    def place(self, item: Any, config: SimConfig) -> EngineRank:
        """The rank an item goes to, chosen when its request arrived (``requests.dispatch_rank``:
        its pin, else round robin), which is also the rank whose radix cache it hit."""
        return self.rank(item.dp_rank, config)

    def queue_full(self, rank: EngineRank, config: SimConfig) -> bool:
        cap = config.max_queued_requests
        return cap is not None and len(rank.queue) + 1 > cap

    def enqueue(self, rank: EngineRank, item: Any, config: SimConfig) -> None:
        item.rank = rank.index
        rank.queue.append(item)
        self.kick(rank, config)

    def release(self, item: Any) -> None:
        """Take an item out (finished, aborted, client gone); frees its KV. Idempotent."""
        if item.rank >= len(self.ranks):
            return
        rank = self.ranks[item.rank]
        if item in rank.running:
            del rank.running[item]
            rank.used -= item.held
        elif item in rank.queue:
            rank.queue.remove(item)
        item.held = 0
        self._wake_waiter(item, force=True)

    def kick(self, rank: EngineRank, config: SimConfig) -> None:
        """Start the rank's loop if it is idle (new work, new settings)."""
        if rank.timer is None and not rank.in_tick and (rank.queue or rank.running):
            loop = asyncio.get_running_loop()
            if rank.idle_since is not None:
                rank.sim_time += (loop.time() - rank.idle_since) / config.time_scale
                rank.idle_since = None
            rank.timer = loop.call_soon(self._tick, rank, config)  # type: ignore[assignment]

    def kick_all(self, config: SimConfig) -> None:
        for rank in self.ranks:
            self.kick(rank, config)

    # --- one iteration of the scheduler loop ------------------------------------------------

    def _tick(self, rank: EngineRank, config: SimConfig) -> None:
        rank.timer = None
        rank.in_tick = True
        try:
            self._iterate(rank, config)
        finally:
            rank.in_tick = False

    def _iterate(self, rank: EngineRank, config: SimConfig) -> None:
        loop = asyncio.get_running_loop()
        done, rank.completing = rank.completing, []
        for item in done:
            self._on_done(item, config)
        for item in list(rank.running):
            self._wake_waiter(item)
        if not rank.queue and not rank.running:
            rank.ratio = ratio_bounds(config)[0]  # idle: SGLang re-inits the ratio
            rank.due = None
            rank.idle_since = loop.time()
            return
        seconds = self._prefill(rank, config, loop.time())
        if seconds is None:
            seconds = self._decode(rank, config, loop.time()) if rank.running else 0.0
        if seconds == 0.0 and not rank.running:
            rank.idle_since, rank.due = loop.time(), None
            return  # the head of the queue cannot be admitted into an empty pool: wait for work
        rank.usage_area += rank.used / config.max_total_num_tokens * seconds
        rank.running_area += len(rank.running) * seconds
        rank.sim_time += seconds
        start = loop.time() if rank.due is None else max(rank.due, loop.time() - 0.05)
        rank.due = start + seconds * config.time_scale
        rank.timer = loop.call_at(rank.due, self._tick, rank, config)

    def _prefill(self, rank: EngineRank, config: SimConfig, now: float) -> float | None:
        """Admit what the rule allows into one prefill batch; its duration, None if none."""
        if not rank.queue:
            return None
        limit = config.running_limit_per_rank()
        clip = config.clip_max_new_tokens_estimation
        pool = config.max_total_num_tokens
        rem = pool - rank.used
        for item in rank.running:
            share = 1.0 if item.ignore_eos else rank.ratio
            rem -= min(item.max_new - item.generated, clip) * share
        chunk = config.chunked_prefill_size
        batch: list[Any] = []
        input_tokens = 0
        while rank.queue and len(rank.running) + len(batch) < limit:
            item = rank.queue[0]
            kv = item.prompt_len + item.generated
            need = kv + min(item.max_new - item.generated, clip)
            alone = not rank.running and not batch and kv + 1 <= pool
            if need > rem and not alone:
                break
            extend = kv - (item.cached if item.generated == 0 else 0)
            if chunk > 0 and batch and input_tokens + extend > chunk:
                break
            rank.queue.popleft()
            batch.append(item)
            rem -= need
            input_tokens += extend
        if not batch:
            return None
        for item in batch:
            item.state = RUNNING_STATE
            item.admitted_at = now
            item.held = item.prompt_len + item.generated
            rank.used += item.held
            rank.running[item] = None
            if item.admit_fut is not None and not item.admit_fut.done():
                item.admit_fut.set_result(None)
            self._advance(rank, item, 1)
        seconds = config.step_base_s + input_tokens / config.prefill_tok_per_s
        rank.prefill_batches += 1
        rank.prefill_seconds += seconds
        return seconds

    def _decode(self, rank: EngineRank, config: SimConfig, now: float) -> float:
        steps = config.steps_per_tick
        pool = config.max_total_num_tokens
        _, floor, decay = ratio_bounds(config)
        if pool - rank.used < len(rank.running) * steps:
            self._retract(rank, config)
        else:
            rank.ratio = max(rank.ratio - decay * steps, floor)
        count = len(rank.running)
        tokens = 0
        for item in list(rank.running):
            tokens += self._advance(rank, item, steps)
        rank.decode_steps += steps
        rank.decoded_tokens += tokens
        rank.window_tokens += tokens
        seconds = steps * (config.step_base_s + config.step_per_request_s * count)
        if rank.decode_steps % config.decode_log_interval < steps:  # a logged step: refresh gauges
            elapsed = now - rank.window_start
            if elapsed > 0:
                rank.throughput = rank.window_tokens / elapsed
            rank.window_tokens, rank.window_start = 0, now
            rank.retracted_window = 0
        return seconds

    def _advance(self, rank: EngineRank, item: Any, steps: int) -> int:
        """Decode up to ``steps`` tokens of one running request; finish it at its last token."""
        grow = max(0, min(steps, len(item.output_ids) - item.generated))
        item.generated += grow
        item.held += grow
        rank.used += grow
        if item.generated >= len(item.output_ids):
            del rank.running[item]
            rank.used -= item.held
            item.held = 0
            rank.completing.append(item)
        return int(grow)

    def _retract(self, rank: EngineRank, config: SimConfig) -> None:
        order = sorted(rank.running, key=lambda r: (r.generated, -r.prompt_len), reverse=True)
        pool = config.max_total_num_tokens
        steps = config.retract_decode_steps
        first = True
        while len(order) > 1 and (first or pool - rank.used < len(order) * steps):
            first = False
            item = order.pop()
            del rank.running[item]
            rank.used -= item.held
            rank.retracted_input_tokens += item.prompt_len
            rank.retracted_output_tokens += item.generated
            item.held = 0
            item.retractions += 1
            item.state = QUEUED_STATE
            rank.queue.append(item)
            rank.retracted_total += 1
            rank.retracted_window += 1
        decoded = sum(item.generated for item in order)
        budget = sum(item.max_new for item in order)
        rank.ratio = min(1.0, (decoded + steps * len(order)) / (budget + 1))

    _wake_waiter = staticmethod(wake_waiter)

    async def until_generated(self, item: Any, mark: int) -> None:
        """Streaming: wait until ``mark`` tokens of ``item`` are decoded (or it ends)."""
        await until_generated(item, mark)

    # --- what the server reports ---------------------------------------------------------------

    def loads(self, config: SimConfig) -> list[dict[str, Any]]:
        """Per DP rank, the numbers ``/v1/loads``, ``/metrics`` and ``/get_load`` report."""
        out = []
        pool = config.max_total_num_tokens
        for index in range(config.dp_size):
            rank = self.rank(index, config)
            waiting_tokens = sum(item.prompt_len + item.generated for item in rank.queue)
            out.append(
                {
                    "dp_rank": index,
                    "num_running_reqs": len(rank.running),
                    "num_waiting_reqs": len(rank.queue),
                    "num_used_tokens": rank.used,
                    "max_total_num_tokens": pool,
                    "token_usage": rank.used / pool,
                    "gen_throughput": rank.throughput,
                    "new_token_ratio": rank.ratio,
                    "num_retracted_reqs": rank.retracted_window,
                    "retracted_total": rank.retracted_total,
                    "retracted_input_tokens": rank.retracted_input_tokens,
                    "retracted_output_tokens": rank.retracted_output_tokens,
                    "retracted_waiting": sum(1 for item in rank.queue if item.retractions),
                    "num_total_tokens": rank.used + waiting_tokens,
                    "usage_area": rank.usage_area,
                    "running_area": rank.running_area,
                    "sim_time": rank.sim_time,
                    "decoded_tokens": rank.decoded_tokens,
                    "prefill_batches": rank.prefill_batches,
                    "prefill_seconds": rank.prefill_seconds,
                }
            )
        return out
