"""One DP rank of the second SGLang scheduler model (``sglang_loop.py``): its scheduler's state
(``LoopRank``: the waiting queue, the running batch, the pool it holds, its statistics), the
bounds of ``new_token_ratio``, and the queue-full message it shares with ``scheduler.py`` (the
request states are ``streaming.py``'s).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from eagledata.simserver.config import SimConfig

Finish = Callable[[Any, SimConfig], None]


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
