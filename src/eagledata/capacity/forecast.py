"""The KV peak of the requests in flight, over sampled futures (``--concurrency auto``'s gate).

What the gate must know is not the KV the requests hold at some instant ahead but the **highest**
KV they will hold before they end: each grows one token per decode step until it ends, and the
pool overflows (SGLang retracts) the first time their sum passes it. A bound per instant (a mean
plus a margin at each of several horizons) bounds none of the paths between them: a run of steps
in which nobody happens to end is what overflows a pool, and it is the rule, not the exception,
over thousands of steps (measured: such a forecast said 0.94 of the pool when the pool overflowed
60 modelled seconds later, with nothing admitted in between).

So the forecast samples futures. In each, every request's remaining length is drawn from its
bucket's answer-length survival curve given the tokens it has generated (``SurvivalCurve``,
Kaplan-Meier over ended and running answers); with no curve yet it runs to its projection (the
pessimistic prior). A request at ``h`` tokens now with ``r`` to go holds ``h + t`` tokens at ``t``
steps ahead while ``t <= r``; the sum of them grows between two ends and drops at each, so the
path's peak is at one of the ends: ``max_j sum over {i: r_i >= r_j} (h_i + r_j)``. The gate
admits a request while a high quantile of that peak, over the sampled futures, stays within its
budget.

The draws are common random numbers: each request keeps its own uniforms for its life, so two
decisions a poll apart see the same futures, only moved on by what happened (no flapping), and
a test is deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from eagledata.capacity.lengths import GRID, SurvivalCurve

FUTURES = 256
"""Sampled futures per decision (each request keeps this many uniforms): the 90th percentile of
256 draws is within ~2 points of the true one."""
FLIGHT_FUTURES = 6144
"""Flights x futures one decision draws at most: past 24 requests in flight the futures are
fewer (64 at least). The peak of many requests spreads less (a sum of many lengths), so fewer
futures place its 90th percentile as well, and a decision costs the same at 300 requests in
flight as at 24 (a client beside a fast server decides dozens of times a second)."""


def futures_for(flights: int) -> int:
    return max(64, min(FUTURES, FLIGHT_FUTURES // max(1, flights)))


Floats = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class Flight:
    """One request as the forecast sees it."""

    held: int
    """Tokens it holds now (prompt + generated)."""
    age: int
    """Tokens it has generated."""
    end: int
    """Its projected answer length, used while there is no curve."""
    curve: SurvivalCurve | None
    draws: Floats
    """Its ``FUTURES`` uniforms in (0, 1)."""


def remaining(flights: Sequence[Flight], futures: int = FUTURES) -> Floats:
    """Tokens each flight still generates, in each of the first ``futures`` futures (futures x
    flights). The flights of one curve (one prompt-length bucket) are drawn together: one
    search for all of them."""
    left = np.empty((futures, len(flights)))
    by_curve: dict[int, tuple[SurvivalCurve, list[int]]] = {}
    for column, flight in enumerate(flights):
        if flight.curve is None:
            end, age = flight.end, flight.age
            if age >= end:  # past its projection: another quarter of its age (as the curve does)
                end = max(age + 16, age * 5 // 4)
            left[:, column] = end - age
        else:
            by_curve.setdefault(id(flight.curve), (flight.curve, []))[1].append(column)
    for curve, columns in by_curve.values():
        ages = np.asarray([flights[column].age for column in columns], dtype=np.float64)
        draws = np.stack([flights[column].draws[:futures] for column in columns])
        left[:, columns] = curve_remaining_many(curve, ages, draws).T
    return left


def curve_remaining_many(curve: SurvivalCurve, ages: Floats, draws: Floats) -> Floats:
    """Inverse-CDF draws of the remaining lengths (flights x futures) of requests at ``ages``:
    an answer ends at the first length ``t > age`` where ``S(t) <= u S(age)``, or at ``cap``
    (``max_new_tokens``) if none does."""
    cap = float(curve.cap)
    arrays = curve.arrays
    times, surviving, first_at_most, ends_at = (
        arrays.times,
        arrays.surviving,
        arrays.first_at_most,
        arrays.ends_at,
    )
    after = np.searchsorted(times, ages, side="right")  # the first length past each age
    alive_now = np.where(after > 0, surviving[np.maximum(after - 1, 0)], 1.0)
    # ``surviving`` falls with ``times``, so the lengths where it is at most a threshold are a
    # suffix. Below ``after`` it is above every threshold (u < 1), so the first of them is past
    # the age. The threshold is read on a grid of GRID steps, rounded down: never a shorter
    # answer than the exact search gives, at most one step of S longer.
    thresholds = (draws * alive_now[:, None] * GRID).astype(np.intp)
    first = first_at_most[thresholds]
    ends = ends_at[np.maximum(first, after[:, None])]
    left: Floats = np.minimum(ends, cap) - ages[:, None]
    # Older than every answer seen, none running that long either: another quarter of its age.
    stale = alive_now <= 0.0
    left[stale] = np.maximum(16.0, ages[stale] // 4)[:, None]
    left[ages >= cap] = 0.0
    return left


def peak_quantile(flights: Sequence[Flight], quantile: float) -> float:
    """The ``quantile`` over sampled futures of the highest KV the flights hold together."""
    if not flights:
        return 0.0
    held = np.asarray([flight.held for flight in flights], dtype=np.float64)
    left = remaining(flights, futures_for(len(flights)))
    order = np.argsort(left, axis=1)
    left_sorted = np.take_along_axis(left, order, axis=1)
    held_sorted = held[order]
    # At the j-th end (in time) the flights still running are j..n-1, each at h_i + r_j.
    held_after = np.cumsum(held_sorted[:, ::-1], axis=1)[:, ::-1]
    alive = np.arange(len(flights), 0, -1, dtype=np.float64)
    peaks = (held_after + alive * left_sorted).max(axis=1)
    return float(np.quantile(peaks, quantile))


def new_draws(rng: np.random.Generator) -> Floats:
    """A request's uniforms, strictly inside (0, 1)."""
    return rng.uniform(1e-9, 1.0, FUTURES)
