"""Wires the steps: dataset -> prompts -> tokenization -> scheduler -> client -> guard -> writer.

``generate`` and ``resume`` both end here, in ``execute``; the CLI only parses flags.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from eagledata.config import (
    AppConfig,
    FrozenSettings,
    RunSettings,
    format_validation_error,
    resolve_bundled,
)
from eagledata.errors import (
    ConfigError,
    EagledataError,
    RunDirError,
    ServerRefusedError,
    ServerUnavailableError,
)
from eagledata.quality.flags import FlagDetector
from eagledata.run.attempts import ItemSender
from eagledata.run.canary_setup import canary_prompts, start_canary
from eagledata.run.dataset import (
    ResolvedDataset,
    check_local_source,
    count_rows,
    resolve_dataset,
)
from eagledata.run.holding import HoldAndRelease
from eagledata.run.loadcontrol import LoadController, ServerPlan
from eagledata.run.manifest import RunDir, RunTotals, scan_totals
from eagledata.run.progress import Progress, Summary
from eagledata.run.records import make_record
from eagledata.run.scheduler import RetryPolicy, Scheduler
from eagledata.run.signals import first_fatal, stop_on_signals
from eagledata.run.telemetry import TelemetryLog
from eagledata.run.tokenization import LengthLimit, PromptTokenizer
from eagledata.run.verify import canary_line, canary_summary
from eagledata.run.workplan import Outcome, WorkItem, WorkPlan
from eagledata.run.writer import FailureLog, Journal, ShardWriter
from eagledata.server.client import SGLangClient
from eagledata.server.guard import KVGuard

PLAN_BATCH = 64


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


def default_out_dir(dataset: ResolvedDataset) -> Path:
    return Path("runs") / dataset.name


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
                limit = await self._first_contact(client, kv_guard)
                progress.close()
                progress = Progress(
                    total=planned_before or estimate,
                    initial=len(totals.done_ids),
                    enabled=self.show_progress,
                )
                if not self.run_dir.exists():
                    self.run_dir.create(self.frozen, self._manifest_extra(kv_guard, estimate))
                source: AsyncIterator[WorkItem] = _iterate([])
                if tokenizer is not None and config.canary.enabled:
                    canary_started = time.monotonic()
                    quality_log = Journal(self.run_dir.path / "quality.jsonl", 0.0)
                    canary_tokenizer = tokenizer
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
                telemetry = TelemetryLog(self.run_dir.path, config.load.telemetry_max_bytes)
                load = await self._load_controller(client, kv_guard, fixed, telemetry, progress)
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
                            async with asyncio.TaskGroup() as group:
                                guard_task = group.create_task(guard.run())
                                load_task = group.create_task(load.run())
                                try:
                                    await scheduler.run(source, sender.send)
                                finally:
                                    guard_task.cancel()
                                    load_task.cancel()
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

    async def _first_contact(self, client: SGLangClient, guard: KVGuard) -> LengthLimit:
        """Reach every server, check it (invariant 2), and derive the prompt length limit."""
        reachable = [endpoint for endpoint in client.endpoints if await client.health(endpoint.url)]
        for endpoint in client.endpoints:
            endpoint.healthy = endpoint in reachable
        if not reachable:
            urls = ", ".join(endpoint.url for endpoint in client.endpoints)
            raise ServerUnavailableError(
                f"cannot reach an SGLang server at {urls}; start one (eagledata launch-server) "
                "or fix --server"
            )
        try:
            facts = [await guard.check(endpoint.url) for endpoint in reachable]
        except ServerRefusedError as refused:
            raise self._name_the_model_setting(refused) from None
        input_limits = [f.max_req_input_len for f in facts if f.max_req_input_len is not None]
        contexts = [f.context_length for f in facts if f.context_length is not None]
        return LengthLimit.combine(
            configured_cap=self.config.generation.max_prompt_tokens,
            max_req_input_len=min(input_limits, default=None),
            context_length=min(contexts, default=None),
            max_new_tokens=self.config.generation.max_new_tokens,
        )

    async def _load_controller(
        self,
        client: SGLangClient,
        guard: KVGuard,
        fixed: int | None,
        telemetry: TelemetryLog,
        progress: Progress,
    ) -> LoadController:
        """The load controller over every server, routers read through their workers."""
        load = LoadController(
            client,
            self.config.load,
            fixed=fixed,
            max_new_tokens=self.config.generation.max_new_tokens,
            telemetry=telemetry,
            note=lambda message: progress.note(message),
        )
        for endpoint in client.endpoints:
            workers = None
            if endpoint.healthy:
                with contextlib.suppress(EagledataError):
                    workers = await client.router_workers(endpoint.url)
            load.add_server(ServerPlan(endpoint.url, guard.facts.get(endpoint.url), workers))
        return load

    def _name_the_model_setting(self, refused: ServerRefusedError) -> ServerRefusedError:
        """A refusal for serving another model says which setting asked for the model."""
        expected = self.frozen.expected_model
        if expected is None or f"expected {expected!r}" not in str(refused):
            return refused
        if self.run_dir.exists():
            where = f"frozen in {self.run_dir.run_json} when the run started"
            fix = f"point --server at a server of {expected}, or start a new run with --out"
        else:
            where = f"in {self.config.source}" if self.config.source else "in the config"
            fix = f"serve {expected}, or change server.expected_model {where} (or pass --config)"
        return ServerRefusedError(
            f"{refused}; server.expected_model is {expected!r}, {where}. Fix: {fix}"
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


@contextlib.contextmanager
def simulated_server(config: AppConfig) -> Iterator[AppConfig]:
    """Start the bundled simulated server when the config asks for it (the demo)."""
    if not config.server.simulated.enabled:
        yield config
        return
    from eagledata.simserver import SimConfig, SimServerThread

    options = dict(config.server.simulated.options)
    options.setdefault("tokenizer_path", resolve_bundled(config.tokenizer.name))
    with SimServerThread(SimConfig(**options)) as sim:
        server = config.server.model_copy(update={"urls": [sim.url]})
        yield config.model_copy(update={"server": server})


def _execute(
    config: AppConfig,
    dataset: ResolvedDataset,
    out_dir: Path,
    progress: bool,
    retry_failed: bool = False,
) -> Summary:
    run_dir = RunDir(out_dir)
    run_dir.lock()
    try:
        run = Run(config, dataset, run_dir, progress)
        if run_dir.exists():
            run_dir.check_frozen(run.frozen)
            _check_canary_frozen(run_dir, config)
            if retry_failed:
                run_dir.requeue_failures()  # under the lock: no other process writes failures
        with simulated_server(config) as live_config:
            run.config = live_config
            return asyncio.run(run.execute())
    except EagledataError as error:
        raise error.naming_run_dir(out_dir) from None
    finally:
        run_dir.unlock()


def _check_canary_frozen(run_dir: RunDir, config: AppConfig) -> None:
    """``--no-canary`` is chosen when a run starts and kept for its life."""
    stored = run_dir.read().get("canary")
    if isinstance(stored, dict) and stored.get("enabled") != config.canary.enabled:
        was = "with the canary" if stored.get("enabled") else "with --no-canary"
        raise RunDirError(
            f"{run_dir.path} was started {was}; that choice is frozen: continue it with "
            "'eagledata resume RUN_DIR' or pass a new --out"
        )


def generate(
    config: AppConfig, dataset_arg: str, out_dir: Path | None, *, progress: bool = True
) -> Summary:
    dataset = resolve_dataset(dataset_arg, config.datasets)
    check_local_source(dataset, config.source)  # before the run dir, tokenizer, server
    out = out_dir or config.run.out_dir or default_out_dir(dataset)
    return _execute(config, dataset, out, progress)


def resume(
    run_path: Path,
    *,
    server_urls: list[str] | None = None,
    concurrency: int | str | None = None,
    retry_failed: bool = False,
    progress: bool = True,
) -> Summary:
    run_dir = RunDir(run_path)
    manifest = run_dir.read()
    if "config" not in manifest:
        raise RunDirError(f"{run_path}/run.json lacks its settings; start a new run")
    config = AppConfig.model_validate(manifest["config"])
    stored_canary = manifest.get("canary")
    enabled = bool(stored_canary.get("enabled")) if isinstance(stored_canary, dict) else False
    # A run from before the canary existed has none: resume keeps it that way.
    config = config.model_copy(
        update={"canary": config.canary.model_copy(update={"enabled": enabled})}
    )
    if server_urls:
        config = config.model_copy(
            update={"server": config.server.model_copy(update={"urls": server_urls})}
        )
    if concurrency:
        config = config.model_copy(update={"run": _with_concurrency(config.run, concurrency)})
    frozen = run_dir.frozen()
    dataset = ResolvedDataset(frozen.dataset_name, frozen.dataset)
    check_local_source(dataset, f"{run_path}/run.json")
    return _execute(config, dataset, run_path, progress, retry_failed)


def _with_concurrency(run: RunSettings, concurrency: int | str) -> RunSettings:
    """``resume --concurrency auto|N``, checked like the config's own value."""
    try:
        return RunSettings.model_validate({**run.model_dump(), "concurrency": concurrency})
    except ValidationError as exc:
        raise ConfigError(
            format_validation_error(exc, "", frozenset({"run.concurrency"}))
        ) from None
