"""AIMD on the share of its pool a lane may fill, ``u*`` (``--concurrency auto``).

The gate (``capacity/controller.py``) admits work while its forecast stays within ``u* x pool``;
this module moves ``u*``. No I/O and no clock of its own: every method takes ``now``.

* **Back off**: any retraction takes ``backoff`` (0.05) off and freezes increases for
  ``freeze_s``. One overflow backs off once, however many times SGLang retracts while draining
  it (requests admitted before the backoff): measured, one overflow retracted four times in 30
  modelled s, and four backoffs took the target from 0.95 to 0.75 and kept it there.
* **Creep**: every ``creep_every_s`` the target rises by ``creep`` (0.01) if it is what held work
  back (once lengths are learned: before that the prior holds it) and the pool's measured peak
  stayed under ``calm_usage``; it falls by as much if the peak came within reach of a
  retraction (``near_miss_usage``) though none happened. A pool that is filling, or a target
  that holds nothing back, says nothing about the target, so neither raises it.
* **Pace**: every period above is the configured one times ``pace`` (at most 1): half a
  request's lifetime on this server over ``freeze_s``. A server whose answers take minutes keeps
  the configured periods; one whose answers take a second runs them a hundred times faster, so
  that what the target does depends on how the server runs, not on how fast the client's clock
  goes beside it (the creep rises by one step per period elapsed, not per sample seen).
* **Ceiling**: the target a retraction happened at. The creep stops half a backoff below it, so
  the AIMD does not probe back into the retraction it backed off from, every ``freeze_s``, on a
  workload whose answers have a long tail (a creep to one step below it retracted again,
  measured on exponential answers); it lifts by one creep step for every ``ceiling_hold_s``
  without a retraction, because the workload it was learned on may change.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from eagledata.capacity.controller_settings import ControllerSettings

MAX_PERIODS_AT_ONCE = 3
"""The most creep steps one sample takes (after a gap of several periods)."""


@dataclass(eq=False)
class UsageTarget:
    """One lane's ``u*`` and what it learned from the server's retractions."""

    settings: ControllerSettings
    value: float
    frozen_until: float = 0.0
    last_backoff: float = -math.inf
    ceiling: float | None = None
    """The target the last retraction happened at (None: none yet); the creep stays below it."""
    ceiling_since: float = 0.0
    """When the ceiling was set or last lifted."""
    overflowing: bool = False
    """A retraction backed off and the pool has not yet come back under the target since (nor
    has a freeze passed without a retraction, for a server that reports no usage): a retraction
    meanwhile is the same overflow draining, not news about the target."""
    last_creep: float | None = None
    peak_usage: float = 0.0
    """The pool's highest measured usage since the last creep period (or backoff)."""
    retractions: int = 0
    """Retractions backed off for (one per ``backoff_gap_s``, however they were reported)."""
    held_back: bool = False
    """The target share held a request back since the last creep period."""
    pace: float = 1.0
    """Every period is its setting times this (``pace_by``)."""

    def pace_by(self, lifetime_s: float) -> None:
        """Periods in proportion to a request's lifetime: the freeze lasts at most half of
        one (and at most ``freeze_s``)."""
        settings = self.settings
        if settings.freeze_s > 0:
            self.pace = min(1.0, max(1e-4, 0.5 * lifetime_s / settings.freeze_s))

    def measured(self, usage: float | None) -> None:
        """The pool's usage in a sample without a retraction."""
        self.peak_usage = max(self.peak_usage, usage or 0.0)
        if usage is not None and usage < self.value:
            self.overflowing = False

    def back_off(self, now: float) -> None:
        """A retraction: lower the target and hold it there for a while."""
        settings = self.settings
        same_overflow = self.overflowing and now < self.frozen_until
        self.frozen_until = now + settings.freeze_s * self.pace
        self.peak_usage = 0.0  # what counts for the next increase is the calm after this
        if now - self.last_backoff < settings.backoff_gap_s:
            return
        self.last_backoff = now
        self.retractions += 1
        if same_overflow:
            return
        self.overflowing = True
        # The ceiling is the target that retracted, never above the previous ceiling: a lower
        # retraction teaches more than the higher one it replaces.
        self.ceiling = self.value if self.ceiling is None else min(self.ceiling, self.value)
        self.ceiling_since = now
        self.value = max(settings.min_usage, self.value - settings.backoff)

    def period(self, now: float) -> bool:
        """Once per ``creep_every_s`` outside a freeze: move the target as the period says
        (module docstring). True when a period ended, whatever it did to the target."""
        settings = self.settings
        self._lift_ceiling(now)
        every = settings.creep_every_s * self.pace
        if self.last_creep is None:
            self.last_creep = now  # periods count from the first sample
        # Periods count from the end of a freeze: it held the target, whatever they saw.
        since = max(self.last_creep, self.frozen_until)
        if now < self.frozen_until or now - since < every:
            return False
        # A sample may come after several periods (a slow poll beside a fast server): the
        # target moves as far as they would have moved it, a few at most.
        periods = min(MAX_PERIODS_AT_ONCE, int((now - since) / every))
        self.last_creep = now
        peak, self.peak_usage = self.peak_usage, 0.0
        held_back, self.held_back = self.held_back, False
        if peak >= settings.near_miss_usage:
            self.value = max(settings.min_usage, self.value - settings.creep)
        elif held_back and peak < settings.calm_usage:
            highest = settings.max_usage
            if self.ceiling is not None:
                highest = min(highest, self.ceiling - settings.backoff / 2)
            # Rounded, so that 0.85 + 0.01 x 2 is not 1e-16 over a limit of 0.87.
            for _ in range(periods):
                raised = round(self.value + settings.creep, 6)
                if raised > round(highest, 6):
                    break
                self.value = raised
        return True

    def _lift_ceiling(self, now: float) -> None:
        """One creep step up for every ``ceiling_hold_s`` without a retraction; gone once it is
        above the highest target."""
        settings = self.settings
        if self.ceiling is None or now - self.ceiling_since < settings.ceiling_hold_s * self.pace:
            return
        self.ceiling_since = now
        self.ceiling += settings.creep
        if self.ceiling > settings.max_usage + settings.creep:
            self.ceiling = None
