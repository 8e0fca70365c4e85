"""One session of work on a run directory, top to bottom.

``Run.execute`` opens the run directory's files, reaches and checks the servers and builds the
``Session`` once (``run/session_open.py``), starts the canary, then generates: the scheduler
(``run/scheduler.py``) takes each item the plan yields (``run/turns.py``) to
``ItemSender.send`` (``run/attempts.py``: attempt, retry, read the answer), which hands the
examined answer to the holder (``run/holding.py``); once every check of its server vouches for
it, ``Recorder.commit`` (``run/records.py``) builds its record and the shard writer
(``run/writer.py``) commits it. ``pipeline`` resolves the settings and the run directory and runs
one session.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

from eagledata import __version__
from eagledata.quality.canary_prompts import canary_prompts
from eagledata.run.attempts import ItemSender
from eagledata.run.canary_setup import start_canary
from eagledata.run.embedded import ProgressEvent, current
from eagledata.run.progress import Summary
from eagledata.run.records import SessionCounts
from eagledata.run.session_open import load_tokenizer, make_client, open_files, open_session
from eagledata.run.session_state import Session, SessionSettings
from eagledata.run.signals import (
    cancel_on_signals,
    first_fatal,
    stop_on_signals,
    write_task_dump,
)
from eagledata.run.turns import TurnSource
from eagledata.run.watchdog import Watchdog, watchdog_bound, where_it_waits
from eagledata.rundir.planstate import PlanStateBuilder
from eagledata.rundir.runlog import run_log
from eagledata.rundir.status import canary_line, canary_summary
from eagledata.rundir.totals import RunTotals, scan_totals
from eagledata.source.workitem import WorkItem
from eagledata.tasks import TaskScope

log = logging.getLogger(__name__)

STARTUP_STOPPED = (
    "interrupted while starting (checking the servers, the canary's baseline): nothing was "
    "generated yet"
)
RECENT_WINDOW_S = 600.0
TASK_SHUTDOWN_S = 10.0
"""How long the checks and the controller get to end once the work is done: a task still
running then is reported (one line, a dump file in the run directory) and abandoned."""


async def _iterate(items: list[WorkItem]) -> AsyncIterator[WorkItem]:
    for item in items:
        yield item


class Run:
    """One session of work on a run directory: what it was started with, what it added
    (``counts``), how it ended (``interrupted``)."""

    def __init__(self, settings: SessionSettings) -> None:
        self.settings = settings
        self.counts = SessionCounts()
        self.checks_s = 0.0
        """Time production waited on checks (the canary's baseline and start checks, the
        final checks): not counted in the session's tok/s (canary traffic is not data)."""
        self.interrupted: str | None = None
        self.plan_state = PlanStateBuilder()
        """What the plan needs from the committed files besides the done ids (dedupe keys,
        conversations to continue), read with them when the session opens the run."""

    async def execute(self) -> Summary:
        """Open the run directory, reach and check the servers, start the canary and the
        load controller, then generate until the plan is done or the session is stopped."""
        started = time.monotonic()
        run_dir = self.settings.run_dir
        session: Session | None = None
        with contextlib.ExitStack() as stack:  # closes what the session opened, in reverse
            stack.enter_context(run_log(run_dir.path))
            log.info(
                "session started (eagledata %s): %s into %s, servers %s, concurrency %s",
                __version__,
                self.settings.mix.name,
                run_dir.path,
                ", ".join(self.settings.config.server.urls),
                self.settings.config.run.concurrency,
            )
            files = open_files(self.settings, self.plan_state, stack)
            try:
                with cancel_on_signals(self._on_startup_stop):
                    tokenizer = None if files.all_done else await load_tokenizer(self.settings)
                async with make_client(self.settings, tokenizer) as client:
                    with cancel_on_signals(self._on_startup_stop):
                        session = await open_session(
                            self.settings,
                            files,
                            client,
                            tokenizer,
                            plan_state=self.plan_state,
                            counts=self.counts,
                            stack=stack,
                        )
                        await self._start_canary(session)
                    await self._generate(session)
            except asyncio.CancelledError:
                if self.interrupted != STARTUP_STOPPED:
                    self.interrupted = "interrupted twice: in-flight requests abandoned"
            except Exception as error:
                log.error("session stopped: %s", error)
                raise
            if self.interrupted:
                log.warning("session %s", self.interrupted)
            log.info(
                "session ended: %d records, %d failures, %d answer tokens this session",
                self.counts.records,
                self.counts.failures,
                self.counts.tokens,
            )
        plan = None if session is None else session.plan
        stopped = self.interrupted or (session is not None and session.scheduler.stopping)
        if plan is not None and plan.complete and not stopped:
            run_dir.set_planned(plan.enumerated, plan.by_dataset)
        # nothing was written when nothing was left: the totals read at the start still hold
        nothing_new = files.all_done and not self.counts.records
        return self._summary(started, files.totals if nothing_new else None)

    async def _start_canary(self, session: Session) -> None:
        """The canary's baseline and its first check of every server (quality/canary.py)."""
        settings = self.settings
        config, tokenizer = settings.config, session.tokenizer
        if tokenizer is None or session.quality_log is None:
            return
        started = time.monotonic()
        limit = session.limit
        # The controller reads the servers' load while the canary starts too: the canary's
        # requests pass its gate like the run's (server/budget.py).
        session.progress.phase = "canary start: baseline and first check"
        async with TaskScope(shutdown_s=TASK_SHUTDOWN_S, on_stuck=self._report_stuck) as scope:
            scope.create_task(session.load.run(), name="load-controller")
            scope.create_task(session.progress.heartbeat(), name="progress")
            monitor = await start_canary(
                settings.run_dir,
                config,
                session.client,
                session.kv_guard,
                session.holder,
                lambda: canary_prompts(config, settings.mix, tokenizer, limit),
                session.quality_log,
                # said only beside the live bar: stderr is one line on failure
                session.progress.note if settings.show_progress else lambda _: None,
                vocab_rows=tokenizer.model_vocab_rows,
            )
        session.holder.checks.append(monitor)
        self.checks_s += time.monotonic() - started

    async def _generate(self, session: Session) -> None:
        """Feed the plan to the scheduler while the checks and the controller run beside it;
        then the final checks. Results a server took down with it are generated again."""
        turns, examiner = session.turns, session.examiner
        if turns is None or examiner is None:
            return  # every item of the plan is done: nothing to send, hold or check
        server = self.settings.config.server
        sender = ItemSender(
            client=session.client,
            guard=session.holder,
            failures=session.files.failures,
            progress=session.progress,
            policy=self.settings.policy,
            sampling_params=self.settings.sampling_params,
            down_deadline_s=server.down_deadline_s,
            on_failure=session.count_failure,
            load=session.load,
            stopped=session.scheduler.stopped,
            examine=examiner.examine,
        )
        source, handle = turns.items(session.holder), turns.handler(sender.send)
        scheduler, holder, redo = session.scheduler, session.holder, session.recorder.redo
        session.progress.generation_started()
        with stop_on_signals(scheduler, session.progress, lambda: self._on_stop(turns)):
            while True:
                try:
                    # The checks, the controller and the watchdog run until the work is done;
                    # then they are cancelled and awaited within a bound (tasks.py).
                    async with TaskScope(
                        shutdown_s=TASK_SHUTDOWN_S, on_stuck=self._report_stuck
                    ) as scope:
                        scope.create_task(holder.run(), name="checks")
                        scope.create_task(session.load.run(), name="load-controller")
                        scope.create_task(self._watchdog(session).run(), name="watchdog")
                        scope.create_task(session.progress.heartbeat(), name="progress")
                        await scheduler.run(source, handle)
                except BaseExceptionGroup as group_error:
                    raise first_fatal(group_error) from None
                flush_started = time.monotonic()
                session.progress.phase = "final checks"
                async with TaskScope(shutdown_s=TASK_SHUTDOWN_S) as beat:
                    beat.create_task(session.progress.heartbeat(), name="progress")
                    await holder.flush()
                self.checks_s += time.monotonic() - flush_started
                if scheduler.stopping or not redo:
                    return
                again = (
                    f"generating {len(redo)} results again: their server went down "
                    "before a check could vouch for them"
                )
                log.warning("%s", again)
                session.progress.note(again)
                source = _iterate(list(redo))
                redo.clear()

    def _watchdog(self, session: Session) -> Watchdog:
        """Says where the run waits when it stops progressing (run/watchdog.py)."""
        bound = watchdog_bound(self.settings.config)
        holder, run_dir = session.holder, self.settings.run_dir

        def report(idle_s: float, where: str) -> None:
            dump = write_task_dump(run_dir.path, "stalled")
            stacks = f"; every task's stack is in {dump}" if dump is not None else ""
            log.warning("no progress for %.0f s: waiting on %s%s", idle_s, where, stacks)
            session.progress.note(
                f"warning: no progress for {idle_s:.0f} s (no answer, record or check; the "
                f"watchdog's bound is {bound:g} s): waiting on {where}{stacks}; the run goes on "
                f"(Ctrl-C stops it, 'eagledata resume {run_dir.path}' continues it)"
            )

        return Watchdog(
            bound,
            progress=lambda: (holder.progress, self.counts.failures, self.counts.records),
            where=lambda: where_it_waits(session.client, holder, session.scheduler.stats.in_flight),
            report=report,
        )

    def _report_stuck(self, tasks: list[asyncio.Task[Any]]) -> None:
        names = ", ".join(task.get_name() for task in tasks)
        dump = write_task_dump(self.settings.run_dir.path, "stuck")
        where = f"; every task's stack is in {dump}" if dump is not None else ""
        log.warning("%s did not end within %g s of the run's end%s", names, TASK_SHUTDOWN_S, where)
        message = (
            f"warning: {names} did not end within {TASK_SHUTDOWN_S:g} s of the run's end "
            f"and {'was' if len(tasks) == 1 else 'were'} abandoned{where}"
        )
        embedding = current()
        if embedding is None:
            print(message, file=sys.stderr)
        elif embedding.on_progress is not None:  # inside another program: to its callback
            embedding.on_progress(
                ProgressEvent("note", self.counts.records, None, 0.0, message=message)
            )

    def _on_startup_stop(self) -> None:
        self.interrupted = STARTUP_STOPPED

    def _on_stop(self, turns: TurnSource) -> None:
        """The first SIGINT/SIGTERM: the session ends once in-flight requests finish."""
        self.interrupted = "interrupted"
        turns.wake()

    def _summary(self, started: float, totals: RunTotals | None = None) -> Summary:
        run_dir = self.settings.run_dir
        totals = totals or scan_totals(run_dir.path)
        planned = run_dir.planned() if run_dir.exists() else None
        done = totals.written + totals.failed + totals.skipped
        return Summary(
            run_dir=str(run_dir.path),
            planned=planned,
            written=totals.written,
            failed=totals.failed,
            skipped=totals.skipped,
            # never negative: more outcomes than planned is ``Summary.mismatch``, an error
            left=None if planned is None else max(planned - done, 0),
            plan_complete=(run_dir.path / "plan.json").is_file(),
            session_records=self.counts.records,
            session_failures=self.counts.failures,
            session_tokens=self.counts.tokens,
            elapsed_s=time.monotonic() - started,
            quality=totals.quality_line(),
            interrupted=self.interrupted,
            checks_s=self.checks_s,
            rate=totals.rates(time.time(), RECENT_WINDOW_S)[0].text(),
            failure_reasons=dict(totals.failure_reasons),
            canary=canary_line(canary_summary(run_dir.path, run_dir.manifest()))
            if run_dir.exists()
            else "",
        )
