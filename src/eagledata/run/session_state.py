"""What one session holds: its settings (``SessionSettings``), the run directory's open files
(``SessionFiles``), and everything built once its servers answer (``Session``), each made once
and never changed after (``run/session_open.py`` builds them, ``run/session.py`` drives them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from eagledata.config import AppConfig, FrozenSettings
from eagledata.run.holding import HoldAndRelease
from eagledata.run.loadcontrol import LoadController
from eagledata.run.progress import Progress
from eagledata.run.records import ExaminedAnswer, Examiner, Recorder, SessionCounts
from eagledata.run.scheduler import RetryPolicy, Scheduler
from eagledata.run.turns import TurnSource
from eagledata.run.writer import FailureLog, ShardWriter
from eagledata.rundir.journal import Journal
from eagledata.rundir.manifest import RunDir
from eagledata.rundir.totals import RunTotals
from eagledata.server.client import SGLangClient
from eagledata.server.guard import KVGuard
from eagledata.source.mix import Mix
from eagledata.source.tokenization import LengthLimit, PromptTokenizer
from eagledata.source.workitem import WorkItem
from eagledata.source.workplan import WorkPlan


@dataclass(frozen=True, slots=True)
class SessionSettings:
    """What a session is started with: the settings, the datasets, the run directory."""

    config: AppConfig
    mix: Mix
    run_dir: RunDir
    frozen: FrozenSettings
    show_progress: bool
    datasets: dict[str, Any] = field(default_factory=dict)
    """Each dataset's fingerprint, recorded before a first session (``source/fingerprint.py``)
    for its ``run.json``; empty when the run exists."""

    @property
    def fixed(self) -> int | None:
        """``--concurrency N``, or None under auto."""
        concurrency = self.config.run.concurrency
        return concurrency if isinstance(concurrency, int) else None

    @property
    def ceiling(self) -> int:
        """Senders at most: ``--concurrency N``, or under auto ``load.max_in_flight``, each
        admitted by the controller."""
        return self.fixed or self.config.load.max_in_flight

    @property
    def policy(self) -> RetryPolicy:
        server = self.config.server
        return RetryPolicy(server.max_attempts, server.backoff_base_s, server.backoff_max_s)

    @property
    def sampling_params(self) -> dict[str, Any]:
        return self.config.generation.sampling_params()


@dataclass(frozen=True, slots=True)
class SessionFiles:
    """The run directory's open files for one session, and what was done before it."""

    writer: ShardWriter
    failures: FailureLog
    check_log: Journal
    totals: RunTotals
    planned_before: int | None
    all_done: bool
    estimate: int | None


@dataclass(frozen=True, slots=True)
class Session:
    """A session once its servers answered: built once (``session_open.open_session``), then
    read by every step. ``plan``, ``turns`` and ``examiner`` are None when nothing is left to
    generate (no tokenizer was loaded)."""

    settings: SessionSettings
    files: SessionFiles
    client: SGLangClient
    kv_guard: KVGuard
    limit: LengthLimit
    progress: Progress
    scheduler: Scheduler[WorkItem]
    load: LoadController
    recorder: Recorder
    counts: SessionCounts
    tokenizer: PromptTokenizer | None
    plan: WorkPlan | None
    turns: TurnSource | None
    examiner: Examiner | None
    quality_log: Journal | None

    @property
    def holder(self) -> HoldAndRelease[ExaminedAnswer]:
        return self.recorder.holder

    def count_failure(self, item: WorkItem) -> None:
        """One more item in the failure file; a conversation's turn ends its conversation."""
        self.counts.failure()
        if self.turns is not None:
            self.turns.failed(item)
