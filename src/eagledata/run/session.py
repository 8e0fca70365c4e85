"""One session of work on a run directory: the steps wired together.

dataset -> prompts -> tokenization -> scheduler -> client -> guard -> writer: ``Run.execute``
reaches and checks the servers, starts the canary and the load controller, feeds the plan to the
scheduler, and writes what the checks release, until the plan is done or the session is stopped.
``pipeline`` resolves the settings and the run directory and runs one session.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from eagledata.config import AppConfig, FrozenSettings
from eagledata.quality.canary_prompts import canary_prompts
from eagledata.quality.flags import FlagDetector
from eagledata.run.attempts import ItemSender
from eagledata.run.canary_setup import start_canary
from eagledata.run.first_contact import first_contact, load_controller
from eagledata.run.holding import HoldAndRelease
from eagledata.run.progress import Progress, Summary
from eagledata.run.records import record_of
from eagledata.run.scheduler import RetryPolicy, Scheduler
from eagledata.run.session_state import SessionFiles, SessionParts
from eagledata.run.signals import (
    cancel_on_signals,
    first_fatal,
    stop_on_signals,
    write_task_dump,
)
from eagledata.run.turns import TurnSource
from eagledata.run.watchdog import Watchdog, watchdog_bound, where_it_waits
from eagledata.run.writer import FailureLog, ShardWriter
from eagledata.rundir.journal import Journal
from eagledata.rundir.manifest import RunDir, RunTotals, scan_totals
from eagledata.rundir.planstate import PlanStateBuilder
from eagledata.rundir.status import canary_line, canary_summary
from eagledata.rundir.telemetry import TelemetryLog
from eagledata.server.budget import SlotGate
from eagledata.server.client import SGLangClient
from eagledata.server.guard import KVGuard
from eagledata.server.responses import GenerateResult
from eagledata.source.mix import Mix, estimate_items
from eagledata.source.tokenization import PromptTokenizer
from eagledata.source.workplan import WorkItem, WorkPlan
from eagledata.tasks import TaskScope

RECENT_WINDOW_S = 600.0
STARTUP_STOPPED = (
    "interrupted while starting (checking the servers, the canary's baseline): nothing was "
    "generated yet"
)
TASK_SHUTDOWN_S = 10.0
"""How long the checks and the controller get to end once the work is done: a task still
running then is reported (one line, a dump file in the run directory) and abandoned."""


@dataclass(slots=True)
class SessionCounts:
    records: int = 0
    failures: int = 0
    tokens: int = 0


async def _iterate(items: list[WorkItem]) -> AsyncIterator[WorkItem]:
    for item in items:
        yield item


class Run:
    """One session of work on a run directory."""

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

    def _count_failure(self, item: WorkItem | None = None) -> None:
        self.counts.failures += 1
        if item is not None and self.turns is not None:
            self.turns.failed(item)

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

    def _open_files(self) -> SessionFiles:
        """Seal what an earlier process left open, count what is done, open the journals."""
        config = self.config
        path = self.run_dir.path
        fingerprint = self.frozen.fingerprint()
        writer = ShardWriter(
            path, config.run.shard_size, config.run.fsync_interval_s, fingerprint=fingerprint
        )
        writer.seal_pending()
        # under the lock: an index found missing, torn, stale or forged is written back
        totals = scan_totals(path, persist_indexes=True, plan_state=self.plan_state)
        self.run_dir.check_adopted(totals, fingerprint, vouched=self.run_dir.exists())
        planned = self.run_dir.planned() if self.run_dir.exists() else None
        # A plan read to its end whose every item is done: nothing to tokenize, send or flag,
        # so neither the tokenizer nor the dataset is read (every done id is a plan id, so the
        # counts decide it).
        all_done = (
            (path / "plan.json").is_file()
            and planned is not None
            and len(totals.done_ids) >= planned
        )
        # the plan's size before it is read to its end (a run that knows it does not ask again)
        estimate = (
            None
            if all_done or planned is not None
            else estimate_items(self.mix, config.generation, config.run.limit)
        )
        return SessionFiles(
            writer=writer,
            failures=FailureLog(path, config.run.fsync_interval_s, fingerprint=fingerprint),
            check_log=self.run_dir.check_log(config.run.fsync_interval_s),
            totals=totals,
            planned_before=planned,
            all_done=all_done,
            estimate=estimate,
        )

    async def _tokenizer(self) -> PromptTokenizer:
        return await asyncio.to_thread(PromptTokenizer, self.config.tokenizer)

    def _client(self, tokenizer: PromptTokenizer | None) -> SGLangClient:
        server = self.config.server
        return SGLangClient(
            server.urls,
            in_flight=self._ceiling(),
            connections_per_pool=server.connections_per_pool,
            connect_timeout_s=server.connect_timeout_s,
            request_timeout_s=server.request_timeout_s,
            api_key=SGLangClient.api_key_from_env(server.api_key_env),
            api_key_env=server.api_key_env,
            # an answer's ids are checked against the vocabulary before anything reads them
            vocab_size=None if tokenizer is None else tokenizer.vocab_size,
        )

    def _fixed(self) -> int | None:
        concurrency = self.config.run.concurrency
        return concurrency if isinstance(concurrency, int) else None

    def _ceiling(self) -> int:
        """Senders at most: ``--concurrency N``, or under auto ``load.max_in_flight``, each
        admitted by the controller."""
        return self._fixed() or self.config.load.max_in_flight

    async def _contact_servers(
        self, client: SGLangClient, files: SessionFiles, tokenizer: PromptTokenizer | None
    ) -> SessionParts:
        """The KV guard and the holder over it, every server reached and checked, the run
        directory created on a first session; then the live bar."""
        config = self.config
        kv_guard = KVGuard(
            client,
            expected_model=self.frozen.expected_model,
            bf16_bytes_per_token=self.frozen.bf16_kv_bytes_per_token,
            check_log=files.check_log,
        )
        parts = SessionParts(
            client=client,
            files=files,
            kv_guard=kv_guard,
            scheduler=Scheduler(self._ceiling()),
            flagger=None
            if tokenizer is None
            else FlagDetector.from_vocab(tokenizer.token_id, tokenizer.roundtrip),
            tokenizer=tokenizer,
        )
        # One hold-and-release for the KV check and the canary (run/holding.py).
        parts.guard = HoldAndRelease(
            client,
            [kv_guard],
            interval_s=config.server.guard_interval_s,
            max_held=config.server.guard_max_held,
            max_hold_s=config.server.guard_max_hold_s,
            release=lambda payload: self._release(parts, payload),
            requeue=lambda payload: self._give_back(parts, payload[0]),
        )
        parts.limit = await first_contact(
            client, kv_guard, config, self.run_dir, self.frozen.expected_model
        )
        # The live bar starts once the servers have passed: a run that cannot start says so in
        # one line on stderr, without a bar drawn above it.
        parts.progress = Progress(
            total=files.planned_before or files.estimate,
            initial=len(files.totals.done_ids),
            enabled=self.show_progress,
        )
        if not self.run_dir.exists():
            self.run_dir.create(self.frozen, self._manifest_extra(kv_guard, files.estimate))
        return parts

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
        async with TaskScope(shutdown_s=TASK_SHUTDOWN_S, on_stuck=self._report_stuck) as scope:
            scope.create_task(parts.controller.run(), name="load-controller")
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
            )
        parts.holder.checks.append(monitor)
        self.checks_s += time.monotonic() - started

    async def _start_load_controller(self, parts: SessionParts) -> None:
        parts.telemetry = TelemetryLog(self.run_dir.path, self.config.load.telemetry_max_bytes)
        parts.load = await load_controller(
            parts.client,
            parts.kv_guard,
            self._longest_answers(),
            self._fixed(),
            parts.telemetry,
            parts.bar,
            parts.files.totals.output_lengths,
        )
        # Every generation passes one gate (server/budget.py), the canary's too: a fixed
        # --concurrency N bounds all we have in flight on a server; under auto the controller
        # counts the canary's requests like the run's.
        fixed = self._fixed()
        parts.client.gate = SlotGate(fixed) if fixed is not None else parts.load

    def _longest_answers(self) -> AppConfig:
        """The settings with the longest ``max_new_tokens`` of the run's datasets: the load
        controller's prior for answer lengths (a dataset of a mix may set its own)."""
        generation = self.config.generation
        longest = max(
            member.dataset.generation(generation).max_new_tokens for member in self.mix.members
        )
        if longest == generation.max_new_tokens:
            return self.config
        update = {"generation": generation.model_copy(update={"max_new_tokens": longest})}
        return self.config.model_copy(update=update)

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
                        await scheduler.run(source, handle)
                except BaseExceptionGroup as group_error:
                    raise first_fatal(group_error) from None
                flush_started = time.monotonic()
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

    async def _turn_source(self, parts: SessionParts) -> TurnSource:
        """The plan of this session, and what feeds it to the scheduler with each
        conversation's next turns (run/turns.py)."""
        assert parts.tokenizer is not None
        config = self.config
        done = parts.files.totals.done_ids
        state = await asyncio.to_thread(self.plan_state.finish, done)
        parts.plan = WorkPlan(
            self.mix,
            generation=config.generation,
            template_kwargs=config.tokenizer.chat_template_kwargs,
            row_limit=config.run.limit,
            tokenizer=parts.tokenizer,
            limit=parts.limit,
            done=done,
            state=state,
        )
        return TurnSource(
            parts.plan,
            tokenizer=parts.tokenizer,
            failures=parts.files.failures,
            progress=parts.bar,
            scheduler=parts.scheduler,
            holder=parts.holder,
            # room for what is in flight and what the checks hold
            max_open=self._ceiling() + config.server.guard_max_held,
            on_outcome=self._count_failure,
            reasoning_field=parts.plan.reasoning_field,
        )

    def _give_back(self, parts: SessionParts, item: WorkItem) -> None:
        """A held result whose server went down: a conversation's turn is sent again at once,
        anything else once this pass of the plan is done."""
        if self.turns is None or not self.turns.given_back(item):
            parts.redo.append(item)

    def _watchdog(self, parts: SessionParts) -> Watchdog:
        """Says where the run waits when it stops progressing (run/watchdog.py)."""
        bound = watchdog_bound(self.config)
        holder = parts.holder

        def report(idle_s: float, where: str) -> None:
            dump = write_task_dump(self.run_dir.path, "stalled")
            stacks = f"; every task's stack is in {dump}" if dump is not None else ""
            parts.bar.note(
                f"warning: no progress for {idle_s:.0f} s (no answer, record or check; the "
                f"watchdog's bound is {bound:g} s): waiting on {where}{stacks}; the run goes on "
                f"(Ctrl-C stops it, 'eagledata resume {self.run_dir.path}' continues it)"
            )

        return Watchdog(
            bound,
            progress=lambda: (holder.progress, self.counts.failures, self.counts.records),
            where=lambda: where_it_waits(parts.client, holder, parts.scheduler.stats.in_flight),
            report=report,
        )

    def _sender(self, parts: SessionParts) -> ItemSender:
        server = self.config.server
        return ItemSender(
            client=parts.client,
            guard=parts.holder,
            failures=parts.files.failures,
            progress=parts.bar,
            policy=self.policy,
            sampling_params=self.sampling_params,
            down_deadline_s=server.down_deadline_s,
            on_failure=self._count_failure,
            load=parts.controller,
            stopped=parts.scheduler.stopped,
        )

    def _release(self, parts: SessionParts, payload: tuple[WorkItem, GenerateResult]) -> None:
        """A result every check vouched for: flag it, write it, count it."""
        item, result = payload
        # results exist only when the plan had work
        assert parts.flagger is not None and self.turns is not None
        flags = parts.flagger.flags(
            input_ids=item.input_ids,
            output_ids=result.output_ids,
            finish_reason=result.finish_reason,
            matched=result.matched,
        )
        reasoning = self.turns.answers.reasoning_tokens(
            item.input_ids, result.output_ids, result.finish_reason, result.matched
        )
        parts.files.writer.write(record_of(item, result, flags, reasoning))
        # committed: the conversation's next turn may be built on it now
        self.turns.committed(item, result)
        self.counts.records += 1
        self.counts.tokens += result.completion_tokens
        load = parts.load
        parts.bar.advance(
            tokens=result.completion_tokens,
            in_flight=parts.scheduler.stats.in_flight
            if load is None or not load.auto
            else sum(lane.in_flight for lanes in load.lanes.values() for lane in lanes),
            held=parts.holder.held,
            load=None if load is None else load.bar_fields(),
        )

    def _manifest_extra(self, guard: KVGuard, estimate: int | None) -> dict[str, Any]:
        return {
            "config": self.config.model_dump(mode="json", by_alias=True),
            "planned_estimate": estimate,
            # Frozen for the run's life: resume keeps it (``--no-canary`` at generate only).
            "canary": {"enabled": self.config.canary.enabled},
            "server_facts": {
                url: facts.model_dump(mode="json") for url, facts in guard.facts.items()
            },
        }

    def _report_stuck(self, tasks: list[asyncio.Task[Any]]) -> None:
        names = ", ".join(task.get_name() for task in tasks)
        dump = write_task_dump(self.run_dir.path, "stuck")
        where = f"; every task's stack is in {dump}" if dump is not None else ""
        print(
            f"warning: {names} did not end within {TASK_SHUTDOWN_S:g} s of the run's end "
            f"and {'was' if len(tasks) == 1 else 'were'} abandoned{where}",
            file=sys.stderr,
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
            left=None if planned is None else planned - done,
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
