"""The batch steps of the second SGLang scheduler model (``sglang_loop.py``): functions of a rank
and the settings (the state is the rank's), each written from SGLang's own function of the same
job: admission into a prefill batch (``get_new_batch_prefill`` / ``PrefillAdder``, chunking
included), one decode forward (``update_running_batch``), a finished request's KV going back
(``release_kv_cache``), retraction (``retract_decode``) and the waiting queue's cap
(``max_queued_requests``). The module docstring of ``sglang_loop.py`` says what each reproduces.
"""

from __future__ import annotations

from typing import Any

from eagledata.simserver.config import SimConfig
from eagledata.simserver.loop_rank import LoopRank, ratio_bounds
from eagledata.simserver.streaming import QUEUED_STATE, RUNNING_STATE


def _cached_part(item: Any) -> int:
    """The radix cache's hit, on a first admission only (a retracted request's KV was not
    inserted in the tree)."""
    return int(item.cached) if item.generated == 0 and item.retractions == 0 else 0


def _extend(item: Any) -> int:
    """Tokens a waiting request prefills: its prompt (less the radix cache's hit) and, after a
    retraction, its output so far."""
    return int(item.prompt_len + item.generated) - _cached_part(item)


def queue_full(rank: LoopRank, config: SimConfig) -> bool:
    """``_abort_on_queued_limit``: ``len(waiting_queue) + 1 > max_queued_requests``."""
    cap = config.max_queued_requests
    return cap is not None and len(rank.waiting) + 1 > cap


def prefill(rank: LoopRank, config: SimConfig) -> float | None:
    if not rank.running and config.version_tuple() >= (0, 5, 23):
        # 0.5.23's get_new_batch_prefill: "An empty batch has no request left to leave, and
        # only a leaving request clears the flag elsewhere, so admission would stay shut."
        # Without it (0.5.9, 0.5.15.post1) a rank whose last running request left while
        # the flag was up idles, its queue waiting, until something else clears it.
        rank.batch_is_full = False
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
            finish(rank, item)
    seconds = settings.slowdown * (
        settings.prefill_base_s + extend_tokens / settings.prefill_tok_per_s
    )
    rank.prefill_batches += 1
    rank.prefill_seconds += seconds
    return seconds


def decode(rank: LoopRank, config: SimConfig, now: float) -> float | None:
    if rank.finished_unfiltered:  # filter_batch: a smaller batch may admit again
        rank.finished_unfiltered = False
        rank.batch_is_full = False
    if not rank.running:
        return None  # it emptied: no forward this iteration
    _, floor, decay = ratio_bounds(config)
    if config.max_total_num_tokens - rank.used < len(rank.running):
        retract(rank, config)
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
            finish(rank, item)
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


def finish(rank: LoopRank, item: Any) -> None:
    """``release_kv_cache``: its KV becomes evictable (free for admission and usage)."""
    rank.used -= item.held
    item.held = 0
    rank.completing.append(item)


def retract(rank: LoopRank, config: SimConfig) -> None:
    """``retract_decode``: the fewest output tokens (then the longest prompt) go first."""
    order = sorted(rank.running, key=lambda item: (item.generated, -item.prompt_len), reverse=True)
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
        if queue_full(rank, config):  # _add_request_to_queue -> 503
            rank.retracted_rejected += 1
            rank.rejecting.append(item)
        else:
            rank.waiting.append(item)
    decoded = sum(item.generated for item in order)
    budget = sum(item.max_new for item in order)
    steps = config.retract_decode_steps
    rank.ratio = min(1.0, (decoded + steps * len(order)) / (budget + 1))
