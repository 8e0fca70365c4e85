"""How one session starts, in order: open the run directory's files (sealing what an earlier
process left open, counting what is done), build the client, reach and check every server
(creating the run directory on a first session), start the load controller, read the plan, and
build the stages each item goes through; the result is one ``Session``, built once.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from eagledata.config import AppConfig
from eagledata.quality.flags import FlagDetector
from eagledata.run.first_contact import first_contact, load_controller
from eagledata.run.progress import Progress
from eagledata.run.records import Examiner, Recorder, SessionCounts
from eagledata.run.scheduler import Scheduler
from eagledata.run.session_state import Session, SessionFiles, SessionSettings
from eagledata.run.turns import TurnSource
from eagledata.run.writer import FailureLog, ShardWriter
from eagledata.rundir.journal import Journal
from eagledata.rundir.planstate import PlanStateBuilder
from eagledata.rundir.telemetry import TelemetryLog
from eagledata.rundir.totals import scan_totals
from eagledata.server.budget import SlotGate
from eagledata.server.client import SGLangClient
from eagledata.server.guard import KVGuard
from eagledata.source.mix import estimate_items
from eagledata.source.tokenization import PromptTokenizer
from eagledata.source.workitem import WorkItem
from eagledata.source.workplan import WorkPlan


def open_files(
    settings: SessionSettings, plan_state: PlanStateBuilder, stack: contextlib.ExitStack
) -> SessionFiles:
    """Seal what an earlier process left open, count what is done, open the journals (closed
    by ``stack``: the shard journal first, sealed into ``shards/``)."""
    config, run_dir = settings.config, settings.run_dir
    path = run_dir.path
    fingerprint = settings.frozen.fingerprint()
    writer = ShardWriter(
        path, config.run.shard_size, config.run.fsync_interval_s, fingerprint=fingerprint
    )
    writer.seal_pending()
    # under the lock: an index found missing, torn, stale or forged is written back
    totals = scan_totals(path, persist_indexes=True, plan_state=plan_state)
    run_dir.check_adopted(totals, fingerprint, vouched=run_dir.exists())
    planned = run_dir.planned() if run_dir.exists() else None
    # A plan read to its end whose every item is done: nothing to tokenize, send or flag,
    # so neither the tokenizer nor the dataset is read (every done id is a plan id, so the
    # counts decide it).
    all_done = (
        run_dir.plan_file() is not None and planned is not None and len(totals.done_ids) >= planned
    )
    # the plan's size before it is read to its end (a run that knows it does not ask again)
    estimate = (
        None
        if all_done or planned is not None
        else estimate_items(settings.mix, config.generation, config.run.limit)
    )
    failures = FailureLog(path, config.run.fsync_interval_s, fingerprint=fingerprint)
    check_log = run_dir.check_log(config.run.fsync_interval_s)
    stack.callback(check_log.close)
    stack.callback(failures.close)
    stack.callback(writer.close)
    return SessionFiles(
        writer=writer,
        failures=failures,
        check_log=check_log,
        totals=totals,
        planned_before=planned,
        all_done=all_done,
        estimate=estimate,
    )


async def load_tokenizer(settings: SessionSettings) -> PromptTokenizer:
    return await asyncio.to_thread(PromptTokenizer, settings.config.tokenizer)


def make_client(settings: SessionSettings, tokenizer: PromptTokenizer | None) -> SGLangClient:
    server = settings.config.server
    return SGLangClient(
        server.urls,
        in_flight=settings.ceiling,
        connections_per_pool=server.connections_per_pool,
        connect_timeout_s=server.connect_timeout_s,
        request_timeout_s=server.request_timeout_s,
        api_key=SGLangClient.api_key_from_env(server.api_key_env),
        api_key_env=server.api_key_env,
        # an answer's ids are checked against the vocabulary before anything reads them
        vocab_size=None if tokenizer is None else tokenizer.vocab_size,
        embedding_rows=None if tokenizer is None else tokenizer.embedding_rows,
        # an answer cut at its length on its stop token ended (server/responses.py)
        eos_ids=frozenset() if tokenizer is None else tokenizer.eos_ids,
    )


async def open_session(
    settings: SessionSettings,
    files: SessionFiles,
    client: SGLangClient,
    tokenizer: PromptTokenizer | None,
    *,
    plan_state: PlanStateBuilder,
    counts: SessionCounts,
    stack: contextlib.ExitStack,
) -> Session:
    """Every server reached and checked (the KV guard), the run directory created on a first
    session, the live bar, the load controller, the plan and the stages of an item. What it
    opens is closed by ``stack``."""
    config, run_dir = settings.config, settings.run_dir
    kv_guard = KVGuard(
        client,
        expected_model=settings.frozen.expected_model,
        bf16_bytes_per_token=settings.frozen.bf16_kv_bytes_per_token,
        kv_heads=settings.frozen.kv_heads,
        check_log=files.check_log,
    )
    limit = await first_contact(client, kv_guard, config, run_dir, settings.frozen.expected_model)
    # The live bar starts once the servers have passed: a run that cannot start says so in
    # one line on stderr, without a bar drawn above it.
    progress = Progress(
        total=files.planned_before or files.estimate,
        initial=len(files.totals.done_ids),
        enabled=settings.show_progress,
        log_every_s=config.run.progress_log_s,
    )
    stack.callback(progress.close)
    if not run_dir.exists():
        run_dir.create(settings.frozen, _manifest_extra(settings, kv_guard, files.estimate))
    scheduler = Scheduler[WorkItem](settings.ceiling)

    telemetry = TelemetryLog(run_dir.path, config.load.telemetry_max_bytes)
    stack.callback(telemetry.close)
    load = await load_controller(
        client,
        kv_guard,
        _longest_answers(settings),
        settings.fixed,
        telemetry,
        progress,
        files.totals.output_lengths,
    )
    load.still_to_come = scheduler.unstarted
    # Every generation passes one gate (server/budget.py), the canary's too: a fixed
    # --concurrency N bounds all we have in flight on a server; under auto the controller
    # counts the canary's requests like the run's.
    client.gate = SlotGate(settings.fixed) if settings.fixed is not None else load

    plan = turns = examiner = quality_log = None
    if tokenizer is not None:  # work is left: the plan, and what feeds it turn by turn
        done = files.totals.done_ids
        state = await asyncio.to_thread(plan_state.finish, done)
        plan = WorkPlan(
            settings.mix,
            generation=config.generation,
            template_kwargs=config.tokenizer.chat_template_kwargs,
            row_limit=config.run.limit,
            tokenizer=tokenizer,
            limit=limit,
            done=done,
            state=state,
        )
        turns = TurnSource(
            plan,
            tokenizer=tokenizer,
            failures=files.failures,
            progress=progress,
            scheduler=scheduler,
            # room for what is in flight and what the checks hold
            max_open=settings.ceiling + config.server.guard_max_held,
            on_outcome=counts.failure,
            reasoning_field=plan.reasoning_field,
        )
        examiner = Examiner(
            FlagDetector.from_vocab(tokenizer.token_id, tokenizer.roundtrip), turns.answers
        )
        if config.canary.enabled:
            quality_log = Journal(run_dir.path / "quality.jsonl", 0.0)
            stack.callback(quality_log.close)
    recorder = Recorder(
        client=client,
        kv_guard=kv_guard,
        server=config.server,
        writer=files.writer,
        turns=turns,
        counts=counts,
        progress=progress,
        scheduler=scheduler,
        load=load,
    )
    progress.hold_state = recorder.holder.state
    return Session(
        settings=settings,
        files=files,
        client=client,
        kv_guard=kv_guard,
        limit=limit,
        progress=progress,
        scheduler=scheduler,
        load=load,
        recorder=recorder,
        counts=counts,
        tokenizer=tokenizer,
        plan=plan,
        turns=turns,
        examiner=examiner,
        quality_log=quality_log,
    )


def _longest_answers(settings: SessionSettings) -> AppConfig:
    """The settings with the longest ``max_new_tokens`` of the run's datasets: the load
    controller's prior for answer lengths (a dataset of a mix may set its own)."""
    config = settings.config
    generation = config.generation
    longest = max(
        member.dataset.generation(generation).max_new_tokens for member in settings.mix.members
    )
    if longest == generation.max_new_tokens:
        return config
    update = {"generation": generation.model_copy(update={"max_new_tokens": longest})}
    return config.model_copy(update=update)


def _manifest_extra(
    settings: SessionSettings, guard: KVGuard, estimate: int | None
) -> dict[str, Any]:
    config = settings.config
    return {
        "config": config.model_dump(mode="json", by_alias=True),
        "planned_estimate": estimate,
        # how rows without an id are named (source/dataset.py): kept for the run's life
        "row_id_scheme": settings.mix.id_scheme,
        # each dataset's file fingerprint; its rows' are rows/NAME.jsonl (fingerprint.py)
        "datasets": settings.datasets,
        # Frozen for the run's life: resume keeps it (``--no-canary`` at generate only).
        "canary": {"enabled": config.canary.enabled},
        "server_facts": {url: facts.model_dump(mode="json") for url, facts in guard.facts.items()},
    }
