"""Hold and release: a result lands only once every check of its server, begun after the result
completed, has passed (invariants 2 and 5).

The checks are the KV guard (``server/guard.py``: what the server says its KV cache is) and,
unless ``--no-canary``, the logprob canary (``quality/canary.py``: what the server computes). One
mechanism holds for both: each check records, per server, when its last *passing* run started; a
result that completed at *t* on server *S* is released when every check's last pass on *S*
started after *t*. A server swapped or degraded between two checks cannot slip a result in.

Checks run every ``interval_s``, as soon as ``max_held`` results wait, and as soon as the oldest
result a check has not vouched for has waited ``max_hold_s``: a result reaches the shards within
about ``max_hold_s`` (plus a check's own time) of its completion, so a crash loses at most that
window of answers, however short the run or slow the server.

A check that refuses a server (``ServerRefusedError``: fp8, another model, canary drift) drops
every held result, which ``resume`` generates again against a good server, and stops the run.
A server that goes down takes its held results with it: no later check can vouch for the
process that produced them. They are handed back through ``requeue`` and generated again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from eagledata.errors import ServerRefusedError, ServerUnavailableError
from eagledata.server.client import SGLangClient

T = TypeVar("T")
log = logging.getLogger(__name__)


class ServerCheck(Protocol):
    """One check a result's server must pass before the result is released."""

    name: str

    def due(self, url: str, held: int) -> str | None:
        """The trigger that makes a check of ``url`` due now (``held`` of its results wait)."""
        ...

    async def check(self, url: str, trigger: str) -> Any:
        """Raise ``ServerRefusedError`` to refuse, ``ServerUnavailableError`` if it cannot."""
        ...


@dataclass(frozen=True, slots=True)
class HoldState:
    """What the progress line says of the held results: how many, which check they wait for,
    and when it runs next (``next_in_s``; 0 while it runs)."""

    held: int
    waiting_for: str = ""
    next_in_s: float | None = None

    def text(self) -> str:
        if not self.held:
            return f"{self.waiting_for} running" if self.waiting_for else ""
        said = f"held {self.held:,}" + (f" ({self.waiting_for})" if self.waiting_for else "")
        if self.next_in_s is None:
            return said
        if self.next_in_s <= 0:
            return f"{said}, checking now"
        return f"{said}, next check in {self.next_in_s:,.0f} s"


@dataclass(frozen=True, slots=True)
class Held(Generic[T]):
    payload: T
    server: str
    completed_at: float


HOLD_TIME = "hold_time"
"""The trigger of a check that is due because a result has waited ``max_hold_s``."""


class HoldAndRelease(Generic[T]):
    """Holds results until every check of their server vouches for them, then hands them to
    ``release``; runs the checks on a period, when ``max_held`` results wait, and when a result
    has waited ``max_hold_s``."""

    def __init__(
        self,
        client: SGLangClient,
        checks: list[ServerCheck],
        *,
        interval_s: float,
        max_held: int,
        max_hold_s: float = float("inf"),
        release: Callable[[T], object],
        requeue: Callable[[T], None] | None = None,
    ) -> None:
        self.client = client
        self.checks = checks
        self.interval_s = interval_s
        self.max_held = max_held
        self.max_hold_s = max_hold_s
        self.release = release
        self.requeue = requeue
        self._held: list[Held[T]] = []
        self._passed: dict[tuple[str, str], float] = {}
        """(check name, server) -> monotonic start of that check's last pass there."""
        self._wake = asyncio.Event()
        self._asked: str | None = None
        """A round asked for now (``request_round``): its trigger."""
        self._due_now = False
        """Set with ``_wake`` when ``max_held`` results wait; ``_wake`` alone: look again."""
        self.next_round_at = time.monotonic() + interval_s
        """When the check loop wakes next (monotonic), without a new trigger."""
        self.checking: tuple[str, str, float] | None = None
        """The check running now: (check name, server, monotonic start); for the watchdog."""
        self.progress = 0
        """Answers held, results released, and checks that vouched for a waiting result: it
        stands still only when the run's work does (run/watchdog.py). A check repeated while
        results wait for another check does not count: the work is not moving."""

    @property
    def held(self) -> int:
        return len(self._held)

    def held_of(self, server: str) -> int:
        return sum(1 for held in self._held if held.server == server)

    def hold(self, payload: T, server: str, completed_at: float) -> None:
        self._held.append(Held(payload, server, completed_at))
        self.progress += 1
        if len(self._held) >= self.max_held:
            self._due_now = True
            self._wake.set()
        elif len(self._held) == 1:
            self._wake.set()  # the first result held: the loop's next wake-up may come sooner

    def oldest_held_at(self) -> float | None:
        """When the result held longest completed (monotonic), or None."""
        return min((held.completed_at for held in self._held), default=None)

    def state(self) -> HoldState:
        """The held results, the check the oldest waits for, and when that check runs next:
        for the progress line, which would otherwise sit still while results wait."""
        now = time.monotonic()
        if self.checking is not None:
            name, _, _ = self.checking
            return HoldState(len(self._held), f"{name} check", 0.0)
        if not self._held:
            return HoldState(0)
        oldest = min(self._held, key=lambda held: held.completed_at)
        blocking = [
            check
            for check in self.checks
            if self._passed.get((check.name, oldest.server), -float("inf")) < oldest.completed_at
        ]
        if not blocking:
            return HoldState(len(self._held), "releasing")
        # the round that runs every blocking check: the later of the loop's next wake-up and the
        # slowest check's own period, unless the oldest result's wait forces it first
        due_at = self.next_round_at
        for check in blocking:
            own = getattr(check, "next_due_at", None)
            if callable(own):
                check_at = own(oldest.server)
                if check_at is not None:
                    due_at = max(due_at, check_at)
        due_at = min(due_at, max(self.next_round_at, oldest.completed_at + self.max_hold_s))
        if len(self._held) >= self.max_held:
            due_at = now
        names = " and ".join(check.name for check in blocking)
        return HoldState(len(self._held), f"{names} check", max(due_at - now, 0.0))

    def request_round(self, trigger: str) -> None:
        """Run every check now, with ``trigger``, instead of at the next period or when
        ``max_held`` results wait: for a caller that can do nothing until held results land
        (the next turns of conversations, ``run/turns.py``)."""
        self._asked = trigger
        self._wake.set()

    async def run_check(self, check: ServerCheck, url: str, trigger: str) -> None:
        """Run one check; a pass vouches for what completed on ``url`` before it started."""
        started = time.monotonic()
        self.checking = (check.name, url, started)
        try:
            await check.check(url, trigger)
        except ServerRefusedError as refused:
            log.error(
                "%s check of %s (%s) refused it; %d held results dropped: %s",
                check.name,
                url,
                trigger,
                len(self._held),
                refused,
            )
            self._held.clear()  # dropped, not failed: resume generates them again
            raise
        finally:
            self.checking = None
        log.info(
            "%s check of %s (%s) passed in %.2f s; %d results held",
            check.name,
            url,
            trigger,
            time.monotonic() - started,
            self.held_of(url),
        )
        before = self._passed.get((check.name, url), -float("inf"))
        self._passed[(check.name, url)] = started
        if any(h.server == url and before < h.completed_at <= started for h in self._held):
            self.progress += 1  # it vouched for a result no earlier pass had

    def _waited_too_long(self, check: ServerCheck, url: str) -> str | None:
        """``hold_time`` when a result of ``url`` this check has not vouched for has waited
        ``max_hold_s``."""
        passed = self._passed.get((check.name, url))
        limit = time.monotonic() - self.max_hold_s
        for held in self._held:
            if held.server != url or (passed is not None and held.completed_at <= passed):
                continue
            if held.completed_at <= limit:
                return HOLD_TIME
        return None

    def vouched_until(self, url: str) -> float | None:
        """The latest completion time every check of ``url`` vouches for, or None."""
        starts = [self._passed.get((check.name, url)) for check in self.checks]
        if any(start is None for start in starts):
            return None
        return min(start for start in starts if start is not None)

    async def check_and_release(self, *, force: str | None = None) -> None:
        """One round: every due check of every healthy server, then release what they vouch for.

        A server that cannot be read now is marked down, not fatal: its results are given back,
        the scheduler's work goes to the others (or waits for it), and it is checked again when
        it answers ``/health`` (``SGLangClient.revive``).
        """
        for endpoint in self.client.endpoints:
            url = endpoint.url
            if not endpoint.healthy:
                self._give_back(url)
                continue
            try:
                for check in self.checks:
                    trigger = (
                        force
                        or check.due(url, self.held_of(url))
                        or self._waited_too_long(check, url)
                    )
                    if trigger is not None:
                        await self.run_check(check, url, trigger)
            except ServerUnavailableError:
                endpoint.healthy = False
                self._give_back(url)
                continue
            until = self.vouched_until(url)
            if until is None:
                continue
            keep: list[Held[T]] = []
            released = 0
            for held in self._held:
                if held.server == url and held.completed_at <= until:
                    self.release(held.payload)
                    self.progress += 1
                    released += 1
                else:
                    keep.append(held)
            self._held = keep
            if released:
                log.info("%d results of %s released; %d still held", released, url, len(keep))

    async def run(self) -> None:
        """The periodic check loop; runs until cancelled by its owner's task group."""
        while True:
            await self._sleep_until_due()
            self._due_now = False
            asked, self._asked = self._asked, None
            await self.client.revive(self.check_reconnected)
            await self.check_and_release(force=asked)

    async def _sleep_until_due(self) -> None:
        """Until ``interval_s`` has passed, ``max_held`` results wait, or the oldest held result
        has waited ``max_hold_s``."""
        round_at = time.monotonic() + self.interval_s
        while True:
            oldest = self.oldest_held_at()
            due_at = round_at if oldest is None else min(round_at, oldest + self.max_hold_s)
            self.next_round_at = due_at
            remaining = due_at - time.monotonic()
            if self._due_now or self._asked is not None or remaining <= 0:
                return
            self._wake.clear()
            # asyncio.timeout, not wait_for: 3.11's wait_for can swallow the owner's cancel
            # when the wake-up and the cancel race, and the run would then never end.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._wake.wait()

    def _give_back(self, server: str | None = None) -> None:
        """Hand the results held from ``server`` (from every server if None) to ``requeue``."""
        keep: list[Held[T]] = []
        given = sum(1 for held in self._held if server is None or held.server == server)
        if given:
            log.warning(
                "%d held results of %s given back: no check can vouch for them now",
                given,
                server or "every server",
            )
        for held in self._held:
            if server is None or held.server == server:
                if self.requeue is not None:  # without one, dropped: resume generates it again
                    self.requeue(held.payload)
            else:
                keep.append(held)
        self._held = keep

    async def check_reconnected(self, url: str) -> None:
        """Check a server that was down with every check; what it produced before going down
        is given back (the process answering now may be another one)."""
        self._give_back(url)
        for check in self.checks:
            await self.run_check(check, url, "reconnect")

    async def flush(self) -> None:
        """Final rounds at the end of a run: every check runs once more, and what it vouches for
        is released. Results of a server that is down by now cannot be vouched for: they are
        given back (``requeue``), or without one dropped, and ``resume`` generates them again.
        """
        for _ in range(3):
            if not self._held:
                return
            await asyncio.sleep(0.001)  # let the monotonic clock pass the last completion
            await self.check_and_release(force="end")
        self._give_back()
