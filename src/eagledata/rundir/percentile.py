"""The one percentile every summary of a run uses: ``status``, the report (its charts and its
tables) and ``export``'s summary say the same p50 and p90 for the same answers.

Nearest rank: the p-th percentile of n values is the ``ceil(p * n)``-th smallest (the first for
p = 0). It is always a length that occurred, an integer, and needs no interpolation rule; the
median of an even count is the lower middle value.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def percentile(values: Iterable[int], fraction: float) -> int | None:
    """Nearest-rank ``fraction`` percentile (0 <= fraction <= 1) of ``values``; None if empty."""
    ordered = sorted(values)
    return percentile_of_sorted(ordered, fraction)


def percentile_of_sorted(ordered: list[int], fraction: float) -> int | None:
    """``percentile`` of a list already in ascending order (no copy)."""
    if not ordered:
        return None
    rank = max(1, math.ceil(fraction * len(ordered) - 1e-9))
    return int(ordered[min(rank, len(ordered)) - 1])
