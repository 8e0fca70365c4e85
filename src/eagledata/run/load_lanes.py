"""The lanes of ``--concurrency auto`` and what they are built from: one ``Lane`` per server (per
DP rank under DP attention) with the controller's settings, each server's facts before its
first load sample (``ServerPlan``), the length model, and the requests waiting for a ticket
(``Waiter``). The controller that holds them is ``loadcontrol.py`` (``LoadController``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from eagledata.capacity.controller import Lane, Ticket
from eagledata.capacity.controller_settings import ControllerSettings
from eagledata.capacity.forecast import Floats
from eagledata.config import LoadSettings
from eagledata.server.serverfacts import ServerFacts


@dataclass(eq=False, slots=True)
class Waiter:
    """A request waiting for a ticket."""

    prompt_tokens: int
    draws: Floats
    fut: asyncio.Future[Ticket]
    lane: Lane | None = None
    """Pinned to this lane (a canary request), else any lane with room."""
    server: str | None = None
    """A canary request that names no DP rank on a server with a lane per rank: any lane of
    this server, and it is then sent pinned to that lane's rank (``LoadController.rank_of``)."""
    projected: int | None = None
    """Its exact KV at its end, when known (a canary request); else the length model's."""
    background: bool = False
    """The canary baseline's load (``CanaryScorer.score_under_load``): behind the check's own
    requests, ahead of the run's."""

    @property
    def canary(self) -> bool:
        """Not one of the run's own requests (those may take any lane of any server)."""
        return self.lane is not None or self.server is not None


@dataclass(frozen=True, slots=True)
class ServerPlan:
    """What the controller knows of a server before its first load sample."""

    url: str
    facts: ServerFacts | None
    workers: list[str] | None
    """The workers behind a router at ``url``; None for a plain server."""


def controller_settings(load: LoadSettings) -> ControllerSettings:
    return ControllerSettings(
        target_usage=load.target_usage,
        min_usage=load.min_usage,
        max_usage=load.max_usage,
        freeze_s=load.freeze_s,
        # A ceiling holds for five freezes a step: long enough for the creep not to re-probe a
        # retraction it learned of, short enough to follow a workload that changes.
        ceiling_hold_s=5 * load.freeze_s,
        creep_every_s=load.creep_every_s,
        length_quantile=load.length_quantile,
        overflow_quantile=load.overflow_quantile,
        backoff_gap_s=2 * load.poll_interval_s,
    )
