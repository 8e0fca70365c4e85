"""What eagledata may have in flight on a server: one gate for every generation it sends there.

``--concurrency N`` is a bound on *everything* eagledata has in flight on one server: the run's
own requests, the canary's (its references, warm-ups, scorings, probes and the load of its
baseline), and the one-token probe that asks whether a failing server works. Each passes the
client's ``TrafficGate`` before it is sent and leaves it when its answer (or error) is in:

* ``SlotGate`` (a fixed ``--concurrency N``): N slots per server, first come first served;
* under ``--concurrency auto`` the load controller (``run/loadcontrol.py``) is the gate: a
  canary request becomes a ticket on the lane (server, DP rank) it is pinned to, counted in that
  lane's in-flight requests and its KV forecast like any other, at its exact length (a canary
  request's length is known: it ignores EOS or asks for no tokens), and nothing it returns
  enters the answer-length model.

The run's own requests under auto take their tickets before they choose a server (the
controller picks the lane), so they pass ``admitted=True`` to ``SGLangClient.generate``.
"""

from __future__ import annotations

import asyncio
from typing import Protocol


class TrafficGate(Protocol):
    """Admits one generation request to one server, and is told when it ended."""

    async def enter(
        self, url: str, rank: int | None, prompt_tokens: int, max_new_tokens: int
    ) -> object:
        """Wait until the request may be sent to ``url`` (DP rank ``rank``); the returned pass
        goes back to ``leave``."""
        ...

    def leave(self, entry: object) -> None:
        """The request ended (an answer, an error, a cancel)."""
        ...


class SlotGate:
    """``--concurrency N``: at most N requests in flight per server, whoever sends them."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self._free: dict[str, asyncio.Semaphore] = {}

    def _semaphore(self, url: str) -> asyncio.Semaphore:
        semaphore = self._free.get(url)
        if semaphore is None:
            semaphore = self._free[url] = asyncio.Semaphore(self.slots)
        return semaphore

    def has_room(self, url: str) -> bool:
        return not self._semaphore(url).locked()

    async def enter(
        self, url: str, rank: int | None, prompt_tokens: int, max_new_tokens: int
    ) -> object:
        await self._semaphore(url).acquire()
        return url

    def leave(self, entry: object) -> None:
        assert isinstance(entry, str)
        self._semaphore(entry).release()
