"""The job's tail on lanes of unequal speed: where a request may still start so that it does not
end after the job could have.

While the dataset has work to come, every lane with room takes the next request: each answer
that ends anywhere is throughput. Once the last requests wait at the gate, the job ends when its
slowest lane's last answer does. A request started now on a lane whose answers take ``life_i``
seconds ends at ``now + life_i``; the same request, left waiting for a faster lane, ends when
that lane has taken the waiters before it (at ``rate_j`` answers a second, the pace its answers
end and free room) plus ``life_j``. So the remaining ``R`` requests are shared out as water
fills vessels: the job's end ``T`` (seconds from now) solves

    sum over lanes with life_i < T of  rate_i * (T - life_i)  =  R

and a lane whose answers take longer than ``T`` gets none of them: anything started there ends
after every other lane has finished. On two servers of the ``fast`` shape, one at half speed
(answers 2.2 and 4.6 s, 35 and 18.5 a second at a 0.1 time scale), the slow one stops taking
work once fewer than ~84 requests are left, and both end together (docs/throughput.md).

Lanes of equal speed (the DP ranks of one server) all stay below ``T``: the rule changes nothing
there. A lane whose speed is not known yet (no answers) is never held back. No I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LaneSpeed:
    """How one lane serves the run's requests, from its answers so far."""

    life_s: float
    """Seconds from a request's sending to its answer (a moving mean)."""
    rate: float
    """Answers it ends per second, while it is full (the pace room opens there)."""


def drain_horizon(lanes: Sequence[LaneSpeed], remaining: int) -> float:
    """``T``: seconds from now at which ``remaining`` requests, shared out to end as early as
    they can, have all ended (``inf`` with no lane of known speed)."""
    usable = sorted((lane for lane in lanes if lane.rate > 0), key=lambda lane: lane.life_s)
    if not usable:
        return float("inf")
    rates = weighted = 0.0
    horizon = float("inf")
    for index, lane in enumerate(usable):
        rates += lane.rate
        weighted += lane.rate * lane.life_s
        horizon = (max(0, remaining) + weighted) / rates
        following = usable[index + 1].life_s if index + 1 < len(usable) else float("inf")
        if horizon <= following:
            break  # the next lane's answers take longer than the job has left: it gets none
    return horizon


def lanes_to_skip(speeds: Sequence[LaneSpeed | None], remaining: int) -> list[bool]:
    """Per lane (in ``speeds``' order): True where a request started now would end after the
    job's tail, ``drain_horizon``, on the other lanes. ``None``: a lane of unknown speed, never
    skipped."""
    horizon = drain_horizon([speed for speed in speeds if speed is not None], remaining)
    return [speed is not None and speed.life_s > horizon for speed in speeds]
