"""What eagledata may have in flight on a server: one gate for every generation it sends there.

``--concurrency N`` is a bound on *everything* eagledata has in flight on one server: the run's
own requests, the canary's (its references, warm-ups, scorings, probes and the load of its
baseline), and the one-token probe that asks whether a failing server works. Each passes the
client's ``TrafficGate`` before it is sent and leaves it when its answer (or error) is in:

* ``SlotGate`` (a fixed ``--concurrency N``): N slots per server, first come first served, the
  canary baseline's load (``background``) behind every other waiting request;
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
import contextlib
from collections import deque
from typing import Protocol


class TrafficGate(Protocol):
    """Admits one generation request to one server, and is told when it ended."""

    async def enter(
        self,
        url: str,
        rank: int | None,
        prompt_tokens: int,
        max_new_tokens: int,
        *,
        background: bool = False,
    ) -> object:
        """Wait until the request may be sent to ``url`` (DP rank ``rank``); the returned pass
        goes back to ``leave``. ``background``: the canary baseline's load, which waits behind
        every other request (the check it loads must get its turn)."""
        ...

    def leave(self, entry: object) -> None:
        """The request ended (an answer, an error, a cancel)."""
        ...

    def rank_of(self, entry: object) -> int | None:
        """The DP rank the gate charged a request that named none to (it is then sent pinned
        there), or None."""
        ...


class Slots:
    """N slots of one server, handed out first come first served, every waiting request before
    any waiting ``background`` one."""

    def __init__(self, slots: int) -> None:
        self.free = slots
        self._waiting: tuple[deque[asyncio.Future[None]], deque[asyncio.Future[None]]] = (
            deque(),
            deque(),
        )

    def locked(self) -> bool:
        return self.free <= 0 or any(not fut.done() for queue in self._waiting for fut in queue)

    async def acquire(self, background: bool) -> None:
        if not self.locked():
            self.free -= 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting[background].append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # handed a slot as it was cancelled: pass it on
            raise
        finally:
            with contextlib.suppress(ValueError):
                self._waiting[background].remove(fut)

    def release(self) -> None:
        for queue in self._waiting:
            while queue:
                fut = queue.popleft()
                if not fut.done():
                    fut.set_result(None)  # the slot passes to it directly
                    return
        self.free += 1


class SlotGate:
    """``--concurrency N``: at most N requests in flight per server, whoever sends them."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self._free: dict[str, Slots] = {}

    def _slots(self, url: str) -> Slots:
        slots = self._free.get(url)
        if slots is None:
            slots = self._free[url] = Slots(self.slots)
        return slots

    def has_room(self, url: str) -> bool:
        return not self._slots(url).locked()

    async def enter(
        self,
        url: str,
        rank: int | None,
        prompt_tokens: int,
        max_new_tokens: int,
        *,
        background: bool = False,
    ) -> object:
        await self._slots(url).acquire(background)
        return url

    def leave(self, entry: object) -> None:
        assert isinstance(entry, str)
        self._slots(entry).release()

    def rank_of(self, entry: object) -> int | None:
        return None
