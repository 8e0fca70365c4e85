"""One session of work on a run directory: the steps wired together.

dataset -> prompts -> tokenization -> scheduler -> client -> guard -> writer: ``Run.execute``
reaches and checks the servers, starts the canary and the load controller, feeds the plan to the
scheduler, and writes what the checks release, until the plan is done or the session is stopped.
``pipeline`` resolves the settings and the run directory and runs one session.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

from eagledata.config import AppConfig, FrozenSettings
from eagledata.quality.canary_prompts import canary_prompts
from eagledata.quality.flags import FlagDetector
from eagledata.run.attempts import ItemSender
from eagledata.run.canary_setup import start_canary
from eagledata.run.first_contact import first_contact, load_controller
from eagledata.run.holding import HoldAndRelease
from eagledata.run.loadcontrol import LoadController
from eagledata.run.progress import Progress, Summary
from eagledata.run.records import make_record
from eagledata.run.scheduler import RetryPolicy, Scheduler
from eagledata.run.signals import first_fatal, stop_on_signals, write_task_dump
from eagledata.run.writer import FailureLog, ShardWriter
from eagledata.rundir.journal import Journal
from eagledata.rundir.manifest import RunDir, RunTotals, scan_totals
from eagledata.rundir.status import canary_line, canary_summary
from eagledata.rundir.telemetry import TelemetryLog
from eagledata.server.budget import SlotGate
from eagledata.server.client import SGLangClient
from eagledata.server.guard import KVGuard
from eagledata.source.dataset import ResolvedDataset, count_rows
from eagledata.source.tokenization import PromptTokenizer
from eagledata.source.workplan import Outcome, WorkItem, WorkPlan
from eagledata.tasks import TaskScope

PLAN_BATCH = 64
TASK_SHUTDOWN_S = 10.0
"""How long the checks and the controller get to end once the work is done: a task still
running then is reported (one line, a dump file in the run directory) and abandoned."""


@dataclass(slots=True)
class SessionCounts:
    records: int = 0
    failures: int = 0
    tokens: int = 0


def frozen_settings(config: AppConfig, dataset: ResolvedDataset) -> FrozenSettings:
    return FrozenSettings(
        dataset_name=dataset.name,
        dataset=dataset.settings,
        tokenizer=config.tokenizer,
        generation=config.generation,
        limit=config.run.limit,
        shard_size=config.run.shard_size,
        expected_model=config.server.expected_model,
        bf16_kv_bytes_per_token=config.server.bf16_kv_bytes_per_token,
    )


async def _iterate(items: list[WorkItem]) -> AsyncIterator[WorkItem]:
    for item in items:
        yield item


class Run:
    """One session of work on a run directory."""

    def __init__(
        self, config: AppConfig, dataset: ResolvedDataset, run_dir: RunDir, show_progress: bool
    ) -> None:
        self.config = config
        self.dataset = dataset
        self.run_dir = run_dir
        self.frozen = frozen_settings(config, dataset)
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

    # --- the plan (runs in a worker thread, one batch at a time) --------------------------

    async def _source(
        self, plan: Iterator[WorkItem | Outcome], failures: FailureLog, progress: Progress
    ) -> AsyncIterator[WorkItem]:
        while True:
            batch = await asyncio.to_thread(lambda: list(itertools.islice(plan, PLAN_BATCH)))
            if not batch:
                return
            for entry in batch:
                if isinstance(entry, Outcome):
                    failures.write(entry.entry)
                    self.counts.failures += 1
                    progress.advance()
                else:
                    yield entry

    def _count_failure(self) -> None:
        self.counts.failures += 1

    # --- the session --------------------------------------------------------------------------

    async def execute(self) -> Summary:
        started = time.monotonic()
        config = self.config
        writer = ShardWriter(self.run_dir.path, config.run.shard_size, config.run.fsync_interval_s)
        writer.seal_pending()
        # under the lock: an index found missing, torn, stale or forged is written back
        totals = scan_totals(self.run_dir.path, persist_indexes=True)
        planned_before = self.run_dir.planned() if self.run_dir.exists() else None
        # A plan read to its end whose every item is done: nothing to tokenize, send or flag,
        # so neither the tokenizer nor the dataset is read (every done id is a plan id, so the
        # counts decide it).
        all_done = (
            (self.run_dir.path / "plan.json").is_file()
            and planned_before is not None
            and len(totals.done_ids) >= planned_before
        )
        tokenizer: PromptTokenizer | None = None
        flagger: FlagDetector | None = None
        if not all_done:
            tokenizer = await asyncio.to_thread(PromptTokenizer, config.tokenizer)
            flagger = FlagDetector.from_vocab(tokenizer.token_id, tokenizer.roundtrip)
        failures = FailureLog(self.run_dir.path, config.run.fsync_interval_s)
        check_log = self.run_dir.check_log(config.run.fsync_interval_s)
        samples = config.generation.samples_per_prompt
        rows = None if all_done else count_rows(self.dataset.settings, config.run.limit)
        estimate = rows * samples if rows is not None else None
        # The live bar starts once the servers have passed: a run that cannot start says so in
        # one line on stderr, without a bar drawn above it.
        progress = Progress(total=None, initial=0, enabled=False)
        api_key = SGLangClient.api_key_from_env(config.server.api_key_env)
        # --concurrency auto: up to load.max_in_flight senders, each admitted by the controller.
        fixed = config.run.concurrency if isinstance(config.run.concurrency, int) else None
        ceiling = fixed or config.load.max_in_flight
        client = SGLangClient(
            config.server.urls,
            in_flight=ceiling,
            connections_per_pool=config.server.connections_per_pool,
            connect_timeout_s=config.server.connect_timeout_s,
            request_timeout_s=config.server.request_timeout_s,
            api_key=api_key,
            api_key_env=config.server.api_key_env,
        )

        def release(payload: tuple[WorkItem, Any]) -> None:
            item, result = payload
            assert flagger is not None  # results exist only when the plan had work
            writer.write(
                make_record(
                    item_id=item.item_id,
                    dataset=self.dataset.name,
                    row_id=item.row_id,
                    sample=item.sample,
                    messages=item.messages,
                    input_ids=item.input_ids,
                    result=result,
                    flags=flagger.flags(
                        input_ids=item.input_ids,
                        output_ids=result.output_ids,
                        finish_reason=result.finish_reason,
                        matched=result.matched,
                    ),
                )
            )
            self.counts.records += 1
            self.counts.tokens += result.completion_tokens
            progress.advance(
                tokens=result.completion_tokens,
                in_flight=scheduler.stats.in_flight
                if load is None or not load.auto
                else sum(lane.in_flight for lanes in load.lanes.values() for lane in lanes),
                held=guard.held,
                load=None if load is None else load.bar_fields(),
            )

        scheduler: Scheduler[WorkItem] = Scheduler(ceiling)
        load: LoadController | None = None
        telemetry: TelemetryLog | None = None
        # Results the guard gives back (their server went down before a check vouched for them).
        redo: list[WorkItem] = []
        plan: WorkPlan | None = None
        quality_log: Journal | None = None
        try:
            async with client:
                kv_guard = KVGuard(
                    client,
                    expected_model=self.frozen.expected_model,
                    bf16_bytes_per_token=self.frozen.bf16_kv_bytes_per_token,
                    check_log=check_log,
                )
                # One hold-and-release for the KV check and the canary (run/holding.py).
                guard: HoldAndRelease[tuple[WorkItem, Any]] = HoldAndRelease(
                    client,
                    [kv_guard],
                    interval_s=config.server.guard_interval_s,
                    max_held=config.server.guard_max_held,
                    release=release,
                    requeue=lambda payload: redo.append(payload[0]),
                )
                limit = await first_contact(
                    client, kv_guard, self.config, self.run_dir, self.frozen.expected_model
                )
                progress.close()
                progress = Progress(
                    total=planned_before or estimate,
                    initial=len(totals.done_ids),
                    enabled=self.show_progress,
                )
                if not self.run_dir.exists():
                    self.run_dir.create(self.frozen, self._manifest_extra(kv_guard, estimate))
                source: AsyncIterator[WorkItem] = _iterate([])
                telemetry = TelemetryLog(self.run_dir.path, config.load.telemetry_max_bytes)
                load = await load_controller(
                    client, kv_guard, config, fixed, telemetry, progress, totals.output_lengths
                )
                # Every generation passes one gate (server/budget.py), the canary's too: a fixed
                # --concurrency N bounds all we have in flight on a server; under auto the
                # controller counts the canary's requests like the run's.
                client.gate = SlotGate(fixed) if fixed is not None else load
                if tokenizer is not None and config.canary.enabled:
                    canary_started = time.monotonic()
                    quality_log = Journal(self.run_dir.path / "quality.jsonl", 0.0)
                    canary_tokenizer = tokenizer
                    # The controller reads the servers' load while the canary starts too.
                    async with TaskScope(shutdown_s=TASK_SHUTDOWN_S) as scope:
                        scope.create_task(load.run(), name="load-controller")
                        monitor = await start_canary(
                            self.run_dir,
                            config,
                            client,
                            kv_guard,
                            guard,
                            lambda: canary_prompts(config, self.dataset, canary_tokenizer, limit),
                            quality_log,
                            # said only beside the live bar: stderr is one line on failure
                            progress.note if self.show_progress else lambda _: None,
                        )
                    guard.checks.append(monitor)
                    self.checks_s += time.monotonic() - canary_started
                if tokenizer is not None:
                    plan = WorkPlan(
                        self.dataset,
                        samples_per_prompt=samples,
                        row_limit=config.run.limit,
                        tokenizer=tokenizer,
                        limit=limit,
                        done=totals.done_ids,
                    )
                    source = self._source(plan, failures, progress)
                sender = ItemSender(
                    client=client,
                    guard=guard,
                    failures=failures,
                    progress=progress,
                    policy=self.policy,
                    sampling_params=self.sampling_params,
                    down_deadline_s=config.server.down_deadline_s,
                    dataset_name=self.dataset.name,
                    on_failure=self._count_failure,
                    load=load,
                )
                with stop_on_signals(scheduler, progress, self._on_stop):
                    while True:
                        try:
                            # The checks and the controller run until the work is done; then
                            # they are cancelled and awaited within a bound (run/tasks.py).
                            async with TaskScope(
                                shutdown_s=TASK_SHUTDOWN_S, on_stuck=self._report_stuck
                            ) as scope:
                                scope.create_task(guard.run(), name="checks")
                                scope.create_task(load.run(), name="load-controller")
                                await scheduler.run(source, sender.send)
                        except BaseExceptionGroup as group_error:
                            raise first_fatal(group_error) from None
                        flush_started = time.monotonic()
                        await guard.flush()
                        self.checks_s += time.monotonic() - flush_started
                        if scheduler.stopping or not redo:
                            break
                        progress.note(
                            f"generating {len(redo)} results again: their server went down "
                            "before a check could vouch for them"
                        )
                        source = _iterate(list(redo))
                        redo.clear()
        except asyncio.CancelledError:
            self.interrupted = "interrupted twice: in-flight requests abandoned"
        finally:
            progress.close()
            writer.close()
            failures.close()
            check_log.close()
            if quality_log is not None:
                quality_log.close()
            if telemetry is not None:
                telemetry.close()
        if plan is not None and plan.complete and not self.interrupted and not scheduler.stopping:
            self.run_dir.set_planned(plan.enumerated)
        # nothing was written when nothing was left: the totals read at the start still hold
        return self._summary(started, totals if all_done and not self.counts.records else None)

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

    def _on_stop(self) -> None:
        """The first SIGINT/SIGTERM: the session ends once in-flight requests finish."""
        self.interrupted = "interrupted"

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
            canary=canary_line(canary_summary(self.run_dir.path, self.run_dir.read()))
            if self.run_dir.exists()
            else "",
        )
