"""The liveness watchdog: a run that stops progressing says where it waits (invariant 7).

Every wait of a run has a deadline, so a healthy run makes progress within a bound its settings
give (``watchdog_bound``): a request lives at most ``connect_timeout_s + request_timeout_s``, a
server that went down is waited for at most ``down_deadline_s``, a failed attempt is retried at
most ``backoff_max_s`` later, and the holder probes a server marked down every
``guard_interval_s``. Progress is an answer (a result held for the checks, or an item that failed
for good), a record released, or a check that passed while results waited for it.

The watchdog runs beside the work, a task of the session's ``TaskScope`` (so it ends with the
work). When it has seen no progress for the bound (``[run] watchdog_s`` overrides it), it writes
every task's stack to ``RUN_DIR/task-dump-stalled-<time>.txt`` and says in one stderr line where
the run waits: the requests in flight per server, a server marked down, the check running, the
results held. It does not stop the run: the server may answer again, and Ctrl-C then
``eagledata resume`` work as always. It speaks once per stall; progress re-arms it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable
from typing import Any

from eagledata.config import AppConfig
from eagledata.run.holding import HoldAndRelease
from eagledata.server.client import SGLangClient

LOOKS_PER_BOUND = 20
"""How often the watchdog looks, as a share of its bound (at most every ``MAX_LOOK_S``)."""
MAX_LOOK_S = 10.0


def watchdog_bound(config: AppConfig) -> float:
    """Seconds a healthy run can go without progress while it has work: the longest wait
    (a request's whole life, or a server that went down), then the longest backoff before the
    retry, then a round of the holder (which brings a server back). ``[run] watchdog_s``
    overrides it."""
    if config.run.watchdog_s is not None:
        return config.run.watchdog_s
    server = config.server
    request_life = server.connect_timeout_s + server.request_timeout_s
    longest_wait = max(request_life, server.down_deadline_s)
    return longest_wait + server.backoff_max_s + server.guard_interval_s


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def where_it_waits(client: SGLangClient, holder: HoldAndRelease[Any], sending: int) -> str:
    """What the run is waiting on, in words: requests in flight per server, servers marked
    down, the check running, results held; ``sending`` items are in the senders' hands."""
    now = time.monotonic()
    parts = []
    for endpoint in client.endpoints:
        down = "" if endpoint.healthy else " (marked down)"
        if endpoint.in_flight:
            requests = _plural(endpoint.in_flight, "request")
            parts.append(f"{requests} in flight to {endpoint.url}{down}")
        elif down:
            parts.append(f"{endpoint.url}{down}")
    if holder.checking is not None:
        name, url, started = holder.checking
        parts.append(f"the {name} check of {url}, running for {now - started:.0f} s")
    if holder.held:
        parts.append(f"{_plural(holder.held, 'result')} held for the checks")
    if not parts:
        parts.append(
            f"{_plural(sending, 'item')} being sent and no request in flight "
            "(a backoff, the load gate, or the dataset)"
        )
    return "; ".join(parts)


class Watchdog:
    """Looks at ``progress`` (any value that changes when the run progresses) until cancelled;
    after ``bound_s`` without a change, ``report(idle_s, where())`` once per stall."""

    def __init__(
        self,
        bound_s: float,
        *,
        progress: Callable[[], Hashable],
        where: Callable[[], str],
        report: Callable[[float, str], None],
    ) -> None:
        self.bound_s = bound_s
        self.progress = progress
        self.where = where
        self.report = report
        self.stalls = 0

    async def run(self) -> None:
        look_every = min(self.bound_s / LOOKS_PER_BOUND, MAX_LOOK_S)
        seen = self.progress()
        since = time.monotonic()
        said = False
        while True:
            now = time.monotonic()
            wait = look_every if said else min(look_every, since + self.bound_s - now)
            await asyncio.sleep(max(wait, 0.0))
            now = time.monotonic()
            current = self.progress()
            if current != seen:
                seen, since, said = current, now, False
            elif not said and now - since >= self.bound_s:
                said = True
                self.stalls += 1
                self.report(now - since, self.where())
