"""Fault injection: which faults one HTTP request draws, from a seeded hash of its content."""

from __future__ import annotations

import hashlib

import orjson

from eagledata.simserver.config import SimConfig
from eagledata.simserver.protocol import abort_reason
from eagledata.simserver.scheduler import Item

FAULT_KINDS = ("fail_500", "fail_503", "reset", "stall", "abort", "bad_count", "stream_error")

ATTEMPTS_LIMIT = 1_000_000
"""Attempt counters kept at most; past it they all start again from zero."""


def decide_faults(config: SimConfig, key: bytes, attempt: int) -> frozenset[str]:
    """Faults for one HTTP request, from (seed, request content, attempt number): reproducible
    whatever the arrival order, and a retry of the same content draws afresh."""
    if not config.any_fault():
        return frozenset()
    salt = orjson.dumps([config.seed, attempt])
    h = hashlib.blake2b(key + salt, digest_size=4 * len(FAULT_KINDS)).digest()
    chosen = set()
    for i, kind in enumerate(FAULT_KINDS):
        u = int.from_bytes(h[4 * i : 4 * i + 4]) / 2**32
        if u < float(getattr(config, f"{kind}_rate")):
            chosen.add(kind)
    return frozenset(chosen)


def draw_faults(config: SimConfig, attempts: dict[bytes, int], key: bytes) -> frozenset[str]:
    """:func:`decide_faults` for the next attempt of the request content ``key``."""
    if not config.any_fault():
        return frozenset()
    attempt = attempts.get(key, 0)
    if len(attempts) >= ATTEMPTS_LIMIT:
        attempts.clear()
    attempts[key] = attempt + 1
    return decide_faults(config, key, attempt)


def apply_fault_abort(item: Item) -> None:
    """The ``abort`` fault: the scheduler aborts the item halfway through its output."""
    item.keep = len(item.output_ids) // 2
    item.abort_finish = abort_reason("Simulated scheduler abort.", 500, "InternalServerError")
