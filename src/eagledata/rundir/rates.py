"""The one definition of a run's output rate, for the summary line, ``status``, ``status
--json`` and the report alike.

**Output tokens per second of active time**: the output tokens of the run's records over the
wall-clock time during which at least one of them was in flight, each record spanning from when
its request was sent (its completion time minus SGLang's ``e2e_latency``) to when it completed.
Time before the first request (start-up, the canary's baseline), between sessions, and while
nothing was in flight does not count; time spent on checks while requests were in flight does.
A run with less than ``MIN_RATED_S`` of active time is too short to rate: one answer's start-up
would dominate the figure. The recent rate is the same quotient over the last ``window_s``: the
records that completed in it, over the active time inside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MIN_RATED_S = 10.0
TOO_SHORT = "too short to rate"


def active_seconds(
    starts: Sequence[float], ends: Sequence[float], lo: float = -np.inf, hi: float = np.inf
) -> float:
    """The length of the union of the intervals ``[starts[i], ends[i]]`` clipped to [lo, hi]."""
    begin = np.maximum(np.asarray(starts, dtype=np.float64), lo)
    end = np.minimum(np.asarray(ends, dtype=np.float64), hi)
    keep = end > begin
    begin, end = begin[keep], end[keep]
    if not begin.size:
        return 0.0
    order = np.argsort(begin, kind="stable")
    begin, end = begin[order], end[order]
    reach = np.maximum.accumulate(end)  # how far the intervals so far cover
    # an interval starts a new block when it begins after everything before it ended
    new_block = np.empty(begin.size, dtype=bool)
    new_block[0] = True
    new_block[1:] = begin[1:] > reach[:-1]
    first = np.flatnonzero(new_block)
    last = np.append(first[1:] - 1, begin.size - 1)
    return float((reach[last] - begin[first]).sum())


@dataclass(frozen=True)
class Rate:
    """Output tokens and records over active seconds."""

    tokens: int
    records: int
    active_s: float

    @property
    def rated(self) -> bool:
        return self.active_s >= MIN_RATED_S

    @property
    def tok_s(self) -> float | None:
        return self.tokens / self.active_s if self.rated else None

    @property
    def records_per_s(self) -> float | None:
        return self.records / self.active_s if self.rated else None

    def text(self) -> str:
        """``1,234.5 output tok/s over 1h02m of active time``, or why there is no figure."""
        if self.tok_s is None:
            active = f"{self.active_s:,.1f} s of active time"
            return f"{TOO_SHORT} ({active}; rates need {MIN_RATED_S:g} s)"
        return f"{self.tok_s:,.1f} output tok/s over {duration(self.active_s)} of active time"


def run_rates(
    starts: Sequence[float],
    ends: Sequence[float],
    tokens: Sequence[int],
    *,
    now: float,
    window_s: float,
) -> tuple[Rate, Rate]:
    """The whole run's rate, and the last ``window_s``'s."""
    ends_array = np.asarray(ends, dtype=np.float64)
    tokens_array = np.asarray(tokens, dtype=np.int64)
    overall = Rate(int(tokens_array.sum()), int(ends_array.size), active_seconds(starts, ends))
    horizon = now - window_s
    recent_mask = ends_array >= horizon
    recent = Rate(
        int(tokens_array[recent_mask].sum()),
        int(recent_mask.sum()),
        active_seconds(starts, ends, lo=horizon, hi=now),
    )
    return overall, recent


def duration(seconds: float) -> str:
    """``42.0 s``, ``12m05s``, ``3h07m``."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    hours, rest = divmod(int(seconds), 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"
