"""Answers a real model sometimes gives and the quality flags must catch: empty ones (the stop
token alone) and degenerate ones (the answer falls into a loop and repeats until
``max_new_tokens``), at chosen rates (``SimConfig.empty_rate``, ``loop_rate``).

Which shape an answer takes is drawn from the same digest as the answer itself, so it is
reproducible (``expected_output`` gives the same ids), and every answer's shape is kept in the
server's ``AnswerLedger`` (``/_sim/stats`` -> ``answers``): the ground truth the flag detectors'
recall and false-positive rates are measured against.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

EMPTY = "empty"
LOOP = "loop"
LEDGER_LIMIT = 200_000
MAX_LOOP_PERIOD = 96
"""Loops repeat a span of 1..MAX_LOOP_PERIOD tokens: a token, a phrase, a sentence."""


def draw_shape(h: bytes, empty_rate: float, loop_rate: float) -> str | None:
    """``empty``, ``loop`` or None (an ordinary answer), from bytes 12..16 of the answer's hash."""
    u = int.from_bytes(h[12:16]) / 2**32
    if u < empty_rate:
        return EMPTY
    if u < empty_rate + loop_rate:
        return LOOP
    return None


def loop_answer(body: list[int], h: bytes, max_new: int) -> list[int]:
    """An ordinary start, then a span of it repeated until ``max_new`` ids (the model never
    gets out of the loop: finish ``length``)."""
    if max_new <= 0 or not body:
        return body[:max_new]
    period = 1 + int.from_bytes(h[:2]) % min(MAX_LOOP_PERIOD, max(1, max_new // 4))
    lead = int.from_bytes(h[2:4]) % max(1, max_new // 2)
    lead = min(lead, max(0, len(body) - period))
    cycle = body[lead : lead + period] or body[:1]
    out = body[:lead]
    while len(out) < max_new:
        out.extend(cycle)
    return out[:max_new]


@dataclass(slots=True)
class AnswerLedger:
    """What the server produced, per rid: the answer's drawn shape and whether it was produced
    while silently degraded. Capped at ``LEDGER_LIMIT`` rids (the counters are not)."""

    shapes: dict[str, str] = field(default_factory=dict)
    degraded: dict[str, float] = field(default_factory=dict)
    """rid -> server time the degraded answer was produced."""
    counts: Counter[str] = field(default_factory=Counter)

    def note(self, rid: str, shape: str | None, degraded: bool, now: float) -> None:
        self.counts[shape or "ordinary"] += 1
        if shape is not None and len(self.shapes) < LEDGER_LIMIT:
            self.shapes[rid] = shape
        if degraded:
            self.counts["degraded"] += 1
            if len(self.degraded) < LEDGER_LIMIT:
                self.degraded[rid] = now

    def as_dict(self) -> dict[str, Any]:
        return {
            "shapes": dict(self.shapes),
            "degraded": dict(self.degraded),
            "counts": dict(self.counts),
        }
