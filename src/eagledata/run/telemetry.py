"""A lane's ``telemetry.jsonl`` line, built from what ``--concurrency auto`` knows of it.

The file itself (its rotation, its reading) is ``rundir/telemetry.py``; this module turns a
controller's lane (``capacity/controller.py``) into one line of it. The server's signals reach
the line from one place, ``load_fields``: every ``RankLoad`` field under its ``telemetry_key``
(``server/loads.py``: a new signal is a field there, and nothing here changes).
"""

from __future__ import annotations

import time
from dataclasses import fields
from typing import TYPE_CHECKING, Any

from eagledata.rundir.lines import TelemetryLine
from eagledata.server.loads import RankLoad, telemetry_key

if TYPE_CHECKING:  # only its type
    from eagledata.capacity.controller import Lane


def load_fields(load: RankLoad | None) -> dict[str, Any]:
    """The telemetry keys and values of a rank's signals: each ``RankLoad`` field its
    ``telemetry_key`` names (None for all of them before the first sample)."""
    values: dict[str, Any] = {}
    for load_field in fields(RankLoad):
        key = telemetry_key(load_field)
        if key is not None:
            values[key] = None if load is None else getattr(load, load_field.name)
    return values


def lane_entry(lane: Lane, *, source: str, in_flight: int, fixed: int | None) -> TelemetryLine:
    """One lane's telemetry line (``fixed``: the ``--concurrency`` cap, None under auto, whose
    target and ceiling it then shows; the writer adds the forecast)."""
    auto = fixed is None
    load = None if lane.sample is None else lane.sample.load
    ceiling = lane.target.ceiling
    signals = load_fields(load)
    usage = load.token_usage if load is not None else None
    if usage is None and load is not None and load.used_tokens and lane.pool_tokens:
        usage = load.used_tokens / lane.pool_tokens
    signals["token_usage"] = None if usage is None else round(usage, 4)
    return TelemetryLine(
        time=time.time(),
        server=lane.server,
        rank=lane.rank,
        source=source,
        num_retracted_reqs=lane.target.retractions,
        num_retracted_requests_total=None if lane.sample is None else lane.sample.retracted_total,
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
        **signals,
    )


def forecast_usage(lane: Lane) -> float | None:
    """The peak share of the pool the controller forecasts for what is in flight now."""
    if not lane.pool_tokens or lane.fallback_limit is not None:
        return None
    return round(lane.peak(time.monotonic()) / lane.pool_tokens, 4)
