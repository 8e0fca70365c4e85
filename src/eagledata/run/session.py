"""One session of work on a run directory: the steps wired together.

dataset -> prompts -> tokenization -> scheduler -> client -> guard -> writer: ``Run.execute``
reaches and checks the servers, starts the canary and the load controller, feeds the plan to the
scheduler, and writes what the checks release, until the plan is done or the session is stopped.
``pipeline`` resolves the settings and the run directory and runs one session.

``Run`` (here: the steps in order, the canary's start, the generation loop, the summary) builds
on ``session_startup`` (opening the files, reaching the servers, the load controller), which
builds on ``session_items`` (what happens to each work item), over ``session_base`` (the state).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from eagledata.quality.canary_prompts import canary_prompts
from eagledata.run.canary_setup import start_canary
from eagledata.run.embedded import ProgressEvent, current
from eagledata.run.progress import Summary
from eagledata.run.session_base import STARTUP_STOPPED
from eagledata.run.session_startup import SessionStartup
from eagledata.run.session_state import SessionParts
from eagledata.run.signals import (
    cancel_on_signals,
    first_fatal,
    stop_on_signals,
    write_task_dump,
)
from eagledata.rundir.journal import Journal
from eagledata.rundir.status import canary_line, canary_summary
from eagledata.rundir.totals import RunTotals, scan_totals
from eagledata.source.tokenization import PromptTokenizer
from eagledata.source.workitem import WorkItem
from eagledata.tasks import TaskScope

RECENT_WINDOW_S = 600.0
TASK_SHUTDOWN_S = 10.0
"""How long the checks and the controller get to end once the work is done: a task still
running then is reported (one line, a dump file in the run directory) and abandoned."""


async def _iterate(items: list[WorkItem]) -> AsyncIterator[WorkItem]:
    for item in items:
        yield item


class Run(SessionStartup):
    """One session of work on a run directory."""

    # --- the session --------------------------------------------------------------------------

    async def execute(self) -> Summary:
        """Open the run directory, reach and check the servers, start the canary and the
        load controller, then generate until the plan is done or the session is stopped."""
        started = time.monotonic()
        files = self._open_files()
        parts: SessionParts | None = None
        try:
            with cancel_on_signals(self._on_startup_stop):
                tokenizer = None if files.all_done else await self._tokenizer()
            async with self._client(tokenizer) as client:
                with cancel_on_signals(self._on_startup_stop):
                    parts = await self._contact_servers(client, files, tokenizer)
                    await self._start_load_controller(parts)
                    await self._start_canary(parts, tokenizer)
                await self._generate(parts)
        except asyncio.CancelledError:
            if self.interrupted != STARTUP_STOPPED:
                self.interrupted = "interrupted twice: in-flight requests abandoned"
        finally:
            files.close(parts)
        plan = None if parts is None else parts.plan
        stopped = self.interrupted or (parts is not None and parts.scheduler.stopping)
        if plan is not None and plan.complete and not stopped:
            self.run_dir.set_planned(plan.enumerated, plan.by_dataset)
        # nothing was written when nothing was left: the totals read at the start still hold
        nothing_new = files.all_done and not self.counts.records
        return self._summary(started, files.totals if nothing_new else None)

    async def _start_canary(self, parts: SessionParts, tokenizer: PromptTokenizer | None) -> None:
        """The canary's baseline and its first check of every server (quality/canary.py)."""
        config = self.config
        if tokenizer is None or not config.canary.enabled:
            return
        started = time.monotonic()
        parts.quality_log = Journal(self.run_dir.path / "quality.jsonl", 0.0)
        limit = parts.limit
        # The controller reads the servers' load while the canary starts too: the canary's
        # requests pass its gate like the run's (server/budget.py).
        parts.bar.phase = "canary start: baseline and first check"
        async with TaskScope(shutdown_s=TASK_SHUTDOWN_S, on_stuck=self._report_stuck) as scope:
            scope.create_task(parts.controller.run(), name="load-controller")
            scope.create_task(parts.bar.heartbeat(), name="progress")
            monitor = await start_canary(
                self.run_dir,
                config,
                parts.client,
                parts.kv_guard,
                parts.holder,
                lambda: canary_prompts(config, self.mix, tokenizer, limit),
                parts.quality_log,
                # said only beside the live bar: stderr is one line on failure
                parts.bar.note if self.show_progress else lambda _: None,
                vocab_rows=tokenizer.model_vocab_rows,
            )
        parts.holder.checks.append(monitor)
        self.checks_s += time.monotonic() - started

    async def _generate(self, parts: SessionParts) -> None:
        """Feed the plan to the scheduler while the checks and the controller run beside it;
        then the final checks. Results a server took down with it are generated again."""
        source: AsyncIterator[WorkItem] = _iterate([])
        sender = self._sender(parts)
        handle: Callable[[WorkItem], Awaitable[None]] = sender.send
        if parts.tokenizer is not None:
            self.turns = await self._turn_source(parts)
            source, handle = self.turns.items(), self.turns.handler(sender.send)
        scheduler = parts.scheduler
        parts.bar.generation_started()
        with stop_on_signals(scheduler, parts.bar, self._on_stop):
            while True:
                try:
                    # The checks, the controller and the watchdog run until the work is done;
                    # then they are cancelled and awaited within a bound (tasks.py).
                    async with TaskScope(
                        shutdown_s=TASK_SHUTDOWN_S, on_stuck=self._report_stuck
                    ) as scope:
                        scope.create_task(parts.holder.run(), name="checks")
                        scope.create_task(parts.controller.run(), name="load-controller")
                        scope.create_task(self._watchdog(parts).run(), name="watchdog")
                        scope.create_task(parts.bar.heartbeat(), name="progress")
                        await scheduler.run(source, handle)
                except BaseExceptionGroup as group_error:
                    raise first_fatal(group_error) from None
                flush_started = time.monotonic()
                parts.bar.phase = "final checks"
                async with TaskScope(shutdown_s=TASK_SHUTDOWN_S) as beat:
                    beat.create_task(parts.bar.heartbeat(), name="progress")
                    await parts.holder.flush()
                self.checks_s += time.monotonic() - flush_started
                if scheduler.stopping or not parts.redo:
                    return
                parts.bar.note(
                    f"generating {len(parts.redo)} results again: their server went down "
                    "before a check could vouch for them"
                )
                source = _iterate(list(parts.redo))
                parts.redo.clear()

    def _report_stuck(self, tasks: list[asyncio.Task[Any]]) -> None:
        names = ", ".join(task.get_name() for task in tasks)
        dump = write_task_dump(self.run_dir.path, "stuck")
        where = f"; every task's stack is in {dump}" if dump is not None else ""
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

    def _on_stop(self) -> None:
        """The first SIGINT/SIGTERM: the session ends once in-flight requests finish."""
        self.interrupted = "interrupted"
        if self.turns is not None:
            self.turns.wake()

    def _summary(self, started: float, totals: RunTotals | None = None) -> Summary:
        totals = totals or scan_totals(self.run_dir.path)
        planned = self.run_dir.planned() if self.run_dir.exists() else None
        done = totals.written + totals.failed + totals.skipped
        return Summary(
            run_dir=str(self.run_dir.path),
            planned=planned,
            written=totals.written,
            failed=totals.failed,
            skipped=totals.skipped,
            # never negative: more outcomes than planned is ``Summary.mismatch``, an error
            left=None if planned is None else max(planned - done, 0),
            plan_complete=(self.run_dir.path / "plan.json").is_file(),
            session_records=self.counts.records,
            session_failures=self.counts.failures,
            session_tokens=self.counts.tokens,
            elapsed_s=time.monotonic() - started,
            quality=totals.quality_line(),
            interrupted=self.interrupted,
            checks_s=self.checks_s,
            rate=totals.rates(time.time(), RECENT_WINDOW_S)[0].text(),
            failure_reasons=dict(totals.failure_reasons),
            canary=canary_line(canary_summary(self.run_dir.path, self.run_dir.read()))
            if self.run_dir.exists()
            else "",
        )
