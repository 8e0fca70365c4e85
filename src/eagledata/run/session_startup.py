"""How one session starts: it opens the run directory's files (sealing what an earlier process left
open, counting what is done), builds the client, reaches and checks every server (creating the
run directory on a first session) and starts the load controller.
"""

from __future__ import annotations

import asyncio
from typing import Any

from eagledata.config import AppConfig
from eagledata.quality.flags import FlagDetector
from eagledata.run.first_contact import first_contact, load_controller
from eagledata.run.holding import HoldAndRelease
from eagledata.run.progress import Progress
from eagledata.run.scheduler import Scheduler
from eagledata.run.session_items import SessionItems
from eagledata.run.session_state import SessionFiles, SessionParts
from eagledata.run.writer import FailureLog, ShardWriter
from eagledata.rundir.telemetry import TelemetryLog
from eagledata.rundir.totals import scan_totals
from eagledata.server.budget import SlotGate
from eagledata.server.client import SGLangClient
from eagledata.server.guard import KVGuard
from eagledata.source.mix import estimate_items
from eagledata.source.tokenization import PromptTokenizer


class SessionStartup(SessionItems):
    """A session's start, up to its first request (the canary's start: ``session.py``)."""

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
            embedding_rows=None if tokenizer is None else tokenizer.embedding_rows,
            # an answer cut at its length on its stop token ended (server/responses.py)
            eos_ids=frozenset() if tokenizer is None else tokenizer.eos_ids,
        )

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
            kv_heads=self.frozen.kv_heads,
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
            requeue=lambda answer: self._give_back(parts, answer.item),
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
            log_every_s=config.run.progress_log_s,
        )
        parts.progress.hold_state = parts.holder.state
        if not self.run_dir.exists():
            self.run_dir.create(self.frozen, self._manifest_extra(kv_guard, files.estimate))
        return parts

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
        parts.load.still_to_come = parts.scheduler.unstarted
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

    def _manifest_extra(self, guard: KVGuard, estimate: int | None) -> dict[str, Any]:
        return {
            "config": self.config.model_dump(mode="json", by_alias=True),
            "planned_estimate": estimate,
            # how rows without an id are named (source/dataset.py): kept for the run's life
            "row_id_scheme": self.mix.id_scheme,
            # each dataset's file fingerprint; its rows' are rows/NAME.jsonl (fingerprint.py)
            "datasets": self.datasets,
            # Frozen for the run's life: resume keeps it (``--no-canary`` at generate only).
            "canary": {"enabled": self.config.canary.enabled},
            "server_facts": {
                url: facts.model_dump(mode="json") for url, facts in guard.facts.items()
            },
        }
