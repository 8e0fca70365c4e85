"""A lane's ``telemetry.jsonl`` line, built from what ``--concurrency auto`` knows of it.

The file itself (its rotation, its reading) is ``rundir/telemetry.py``; this module turns a
controller's lane (``capacity/controller.py``) into one line of it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from eagledata.rundir.lines import TelemetryLine

if TYPE_CHECKING:  # only its type
    from eagledata.capacity.controller import Lane


def lane_entry(
    lane: Lane,
    *,
    source: str,
    running: int | None,
    waiting: int | None,
    in_flight: int,
    fixed: int | None,
) -> TelemetryLine:
    """One lane's telemetry line (``fixed``: the ``--concurrency`` cap, None under auto, whose
    target and ceiling it then shows; the writer adds the forecast)."""
    auto = fixed is None
    sample = lane.sample
    ceiling = lane.target.ceiling
    usage = sample.token_usage if sample is not None else None
    if usage is None and sample is not None and sample.used_tokens and lane.pool_tokens:
        usage = sample.used_tokens / lane.pool_tokens
    return TelemetryLine(
        time=time.time(),
        server=lane.server,
        rank=lane.rank,
        source=source,
        token_usage=None if usage is None else round(usage, 4),
        num_running_reqs=running,
        num_queue_reqs=waiting,
        gen_throughput=None if sample is None else sample.gen_throughput,
        num_retracted_reqs=lane.target.retractions,
        in_flight=in_flight,
        target=fixed if fixed is not None else lane.sustainable_running(),
        target_usage=round(lane.target.value, 3) if auto else None,
        usage_ceiling=round(ceiling, 3) if auto and ceiling is not None else None,
        # Filled when the line is written (``forecast_usage``), not at every poll's sample: a
        # forecast is 256 sampled futures, and the progress bar does not show it.
        forecast_usage=None,
        queue_full=lane.rejections,
        # The server queue the gate never reaches (its max_queued_requests, or one a 503 taught).
        queue_cap=lane.queue_cap() if auto else None,
        held_by=dict(lane.held_by),
        spec_accept_length=None if sample is None else sample.spec_accept_length,
    )


def forecast_usage(lane: Lane) -> float | None:
    """The peak share of the pool the controller forecasts for what is in flight now."""
    if not lane.pool_tokens or lane.fallback_limit is not None:
        return None
    return round(lane.peak(time.monotonic()) / lane.pool_tokens, 4)
