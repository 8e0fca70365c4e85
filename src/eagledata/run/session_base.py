"""The state every step of one session shares (``RunBase``: the settings, the run directory, the
counts), which the steps' classes build on: ``session_items`` (each work item),
``session_startup`` (the start) and ``session`` (``Run``: the session's steps in order).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from eagledata.config import AppConfig, FrozenSettings
from eagledata.run.scheduler import RetryPolicy
from eagledata.run.turns import TurnSource
from eagledata.rundir.manifest import RunDir
from eagledata.rundir.planstate import PlanStateBuilder
from eagledata.source.mix import Mix
from eagledata.source.workitem import WorkItem

STARTUP_STOPPED = (
    "interrupted while starting (checking the servers, the canary's baseline): nothing was "
    "generated yet"
)


@dataclass(slots=True)
class SessionCounts:
    records: int = 0
    failures: int = 0
    tokens: int = 0


class RunBase:
    """One session of work on a run directory: its state (the steps are its subclasses)."""

    def __init__(self, config: AppConfig, mix: Mix, run_dir: RunDir, show_progress: bool) -> None:
        self.config = config
        self.mix = mix
        self.run_dir = run_dir
        self.frozen = FrozenSettings.of(config, mix.name, list(mix.members), mix.seed)
        self.show_progress = show_progress
        self.counts = SessionCounts()
        self.checks_s = 0.0
        """Time production waited on checks (the canary's baseline and start checks, the
        final checks): not counted in the session's tok/s (canary traffic is not data)."""
        self.interrupted: str | None = None
        self.policy = RetryPolicy(
            config.server.max_attempts, config.server.backoff_base_s, config.server.backoff_max_s
        )
        self.sampling_params = config.generation.sampling_params()
        self.plan_state = PlanStateBuilder()
        """What the plan needs from the committed files besides the done ids (dedupe keys,
        conversations to continue), read with them when the session opens the run."""
        self.turns: TurnSource | None = None
        self.datasets: dict[str, Any] = {}
        """``run.json``'s ``datasets`` on a first session (``source/fingerprint.py``)."""

    def _count_failure(self, item: WorkItem | None = None) -> None:
        self.counts.failures += 1
        if item is not None and self.turns is not None:
            self.turns.failed(item)

    def _fixed(self) -> int | None:
        concurrency = self.config.run.concurrency
        return concurrency if isinstance(concurrency, int) else None

    def _ceiling(self) -> int:
        """Senders at most: ``--concurrency N``, or under auto ``load.max_in_flight``, each
        admitted by the controller."""
        return self._fixed() or self.config.load.max_in_flight
