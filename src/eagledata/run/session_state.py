"""What one session holds open: the run directory's files, and the parts built once its servers
answer (``run/session.py`` wires them)."""

from __future__ import annotations

from dataclasses import dataclass, field

from eagledata.quality.flags import FlagDetector
from eagledata.run.holding import HoldAndRelease
from eagledata.run.loadcontrol import LoadController
from eagledata.run.progress import Progress
from eagledata.run.records import ExaminedAnswer
from eagledata.run.scheduler import Scheduler
from eagledata.run.writer import FailureLog, ShardWriter
from eagledata.rundir.journal import Journal
from eagledata.rundir.telemetry import TelemetryLog
from eagledata.rundir.totals import RunTotals
from eagledata.server.client import SGLangClient
from eagledata.server.guard import KVGuard
from eagledata.source.tokenization import LengthLimit, PromptTokenizer
from eagledata.source.workitem import WorkItem
from eagledata.source.workplan import WorkPlan


@dataclass
class SessionFiles:
    """The run directory's open files for one session, and what was done before it."""

    writer: ShardWriter
    failures: FailureLog
    check_log: Journal
    totals: RunTotals
    planned_before: int | None
    all_done: bool
    estimate: int | None

    def close(self, parts: SessionParts | None) -> None:
        if parts is not None:
            parts.close()
        self.writer.close()
        self.failures.close()
        self.check_log.close()


@dataclass
class SessionParts:
    """What a session builds once its servers answer: the checks, the controller, the plan."""

    client: SGLangClient
    files: SessionFiles
    kv_guard: KVGuard
    scheduler: Scheduler[WorkItem]
    flagger: FlagDetector | None
    tokenizer: PromptTokenizer | None
    guard: HoldAndRelease[ExaminedAnswer] | None = None
    limit: LengthLimit = field(default_factory=lambda: LengthLimit(None, "none"))
    progress: Progress | None = None
    load: LoadController | None = None
    telemetry: TelemetryLog | None = None
    quality_log: Journal | None = None
    plan: WorkPlan | None = None
    redo: list[WorkItem] = field(default_factory=list)
    """Results the holder gave back: their server went down before a check vouched for them."""

    @property
    def holder(self) -> HoldAndRelease[ExaminedAnswer]:
        assert self.guard is not None, "set when the servers are contacted"
        return self.guard

    @property
    def bar(self) -> Progress:
        assert self.progress is not None, "set when the servers are contacted"
        return self.progress

    @property
    def controller(self) -> LoadController:
        assert self.load is not None, "set before generation starts"
        return self.load

    def close(self) -> None:
        if self.progress is not None:
            self.progress.close()
        if self.quality_log is not None:
            self.quality_log.close()
        if self.telemetry is not None:
            self.telemetry.close()
