"""A session inside another program (the library's calls, ``library/``): no signal handlers, no
bar and nothing on stderr; progress, and what the CLI would say beside its bar, go to a callback.

The CLI owns its process: it takes SIGINT/SIGTERM, draws a bar, writes notes to stderr. A trainer
calling ``eagledata.regenerate`` owns its process instead: its own signal handlers stay, its
terminal stays clean. ``embedded(...)`` marks the calling context (a ``ContextVar``: tasks the
session starts inherit it, another thread or task of the host does not), and the three places
that touch the process ask ``current()``: ``Progress`` (run/progress.py), the signal handlers
(run/signals.py) and the stuck-task warning (run/session.py).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Literal

EVENT_EVERY_S = 0.5
"""Progress events at most this often (and once more when the session's work ends)."""


@dataclass(frozen=True, slots=True)
class ProgressEvent:
    """What the CLI's bar shows, for a callback: ``kind`` is ``progress`` (a count moved),
    ``note`` (a line the CLI would print beside its bar, in ``message``) or ``end`` (the
    session's work ended: the last counts)."""

    kind: Literal["progress", "note", "end"]
    done: int
    """Items with an outcome (records, failures, skips), this session's and earlier ones'."""
    planned: int | None
    """The plan's size when known (an estimate until the plan is read to its end)."""
    tokens_per_s: float
    """Output tokens per second over the last minute."""
    in_flight: int = 0
    held: int = 0
    """Answers held until a KV check and the canary vouch for them."""
    message: str = ""


@dataclass(frozen=True, slots=True)
class Embedding:
    on_progress: Callable[[ProgressEvent], None] | None = None


_CURRENT: ContextVar[Embedding | None] = ContextVar("eagledata_embedding", default=None)


def current() -> Embedding | None:
    """The embedding of the calling context; None under the CLI."""
    return _CURRENT.get()


@contextlib.contextmanager
def embedded(on_progress: Callable[[ProgressEvent], None] | None = None) -> Iterator[Embedding]:
    """Sessions started in this block (in this context) are embedded."""
    embedding = Embedding(on_progress)
    token = _CURRENT.set(embedding)
    try:
        yield embedding
    finally:
        _CURRENT.reset(token)


class EventThrottle:
    """Progress events at most every ``EVENT_EVERY_S``; notes and the end always."""

    def __init__(self, embedding: Embedding) -> None:
        self.callback = embedding.on_progress
        self._last = 0.0

    def progress(self, event: ProgressEvent) -> None:
        now = time.monotonic()
        if self.callback is None or now - self._last < EVENT_EVERY_S:
            return
        self._last = now
        self.callback(event)

    def always(self, event: ProgressEvent) -> None:
        if self.callback is not None:
            self.callback(event)
