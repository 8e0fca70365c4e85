"""An answer's last stages: read as it arrives (``Examiner``: its flags, its reasoning tokens),
held until every check of its server vouches for it, then its record built (``record_of``: the
prompt's ids and messages, the answer's ids and provenance; the line's contract is
``rundir/lines.py``) and written (``Recorder.commit``: ``run/writer.py``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TypeVar

from eagledata.config import ServerSettings
from eagledata.quality.flags import FlagDetector
from eagledata.run.holding import HoldAndRelease
from eagledata.run.loadcontrol import LoadController
from eagledata.run.progress import Progress
from eagledata.run.scheduler import Scheduler
from eagledata.run.turns import TurnSource
from eagledata.run.writer import ShardWriter
from eagledata.rundir.lines import NONE_VALUES, RecordFlags, RecordLine
from eagledata.server.client import SGLangClient
from eagledata.server.guard import KVGuard
from eagledata.server.responses import GenerateResult
from eagledata.source.answers import AnswerReader
from eagledata.source.prompts import Message
from eagledata.source.workitem import WorkItem

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class ExaminedAnswer:
    """An answer as the checks hold it: the work item, the server's result, and what its record
    will say of it (flags, reasoning tokens), read when it arrived. Reading an answer decodes
    and re-encodes it (the round-trip flag): done at release, the up to ``guard_max_held``
    answers one check releases were read in one burst on the event loop, and the client sent
    nothing for that long while the server's answers kept ending."""

    item: WorkItem
    result: GenerateResult
    flags: list[str]
    reasoning_tokens: int | None


def completion_time(result: GenerateResult) -> float:
    """When the response completed, in unix seconds. A record is written when the KV guard
    releases it, up to a guard interval later; ``created_at`` must be the completion, or rates
    drawn from it (``report``, ``status``) bunch at the checks."""
    return time.time() - max(0.0, time.monotonic() - result.completed_at)


def make_record(
    *,
    item_id: str,
    dataset: str,
    row_id: str,
    sample: int,
    messages: list[Message],
    input_ids: list[int],
    result: GenerateResult,
    flags: list[str],
    conversation_id: str,
    turn: int,
    conversation_turns: int,
    reasoning_tokens: int | None,
    prompt_key: str,
    row_hash: str = "",
) -> RecordLine:
    """Every field of one JSON type whatever the answer (``RecordLine``): what the server did
    not report is written as its typed none (``NONE_VALUES``), never null. ``reasoning_tokens``
    is None for every record of a run whose tokenizer has no think tags, and only then."""
    return RecordLine(
        id=item_id,
        dataset=dataset,
        row_id=row_id,
        sample=sample,
        conversation_id=conversation_id,
        turn=turn,
        conversation_turns=conversation_turns,
        finish_reason=result.finish_reason,
        prompt_tokens=result.prompt_tokens,
        completion_tokens=result.completion_tokens,
        created_at=completion_time(result),
        messages=list(messages),
        input_ids=input_ids,
        output_ids=result.output_ids,
        text=result.text,
        # quality/flags.py: what a consumer should know about this answer; all false when clean
        flags=RecordFlags.of(flags),
        # ``matched`` may be an id or a stop string; keep the column typed for Arrow.
        matched_token_id=_or_none(
            result.matched if isinstance(result.matched, int) else None, "matched_token_id"
        ),
        cached_tokens=_or_none(result.cached_tokens, "cached_tokens"),
        server=result.server,
        rid=result.rid,
        weight_version=_or_none(result.weight_version, "weight_version"),
        e2e_latency=_or_none(result.e2e_latency, "e2e_latency"),
        spec_verify_ct=_or_none(result.spec_verify_ct, "spec_verify_ct"),
        reasoning_tokens=reasoning_tokens,
        prompt_key=prompt_key,
        row_hash=row_hash,
    )


def _or_none(value: _T | None, field: str) -> _T:
    """``value``, or the field's typed none where the server did not report one."""
    return NONE_VALUES[field] if value is None else value  # type: ignore[return-value]


def record_of(answer: ExaminedAnswer) -> RecordLine:
    """The record of a work item's answer: where it sits in its conversation, and its key."""
    item = answer.item
    return make_record(
        item_id=item.item_id,
        dataset=item.dataset,
        row_id=item.row_id,
        sample=item.sample,
        messages=item.messages,
        input_ids=item.input_ids,
        result=answer.result,
        flags=answer.flags,
        conversation_id=item.conversation_id,
        turn=item.turn,
        conversation_turns=item.conversation_turns,
        reasoning_tokens=answer.reasoning_tokens,
        # a plan computes the key of every prompt; "" (the field's none) only for an item
        # built without one
        prompt_key=item.prompt_key or "",
        row_hash=item.row_hash,
    )


@dataclass(frozen=True, slots=True)
class Examiner:
    """Reads an answer as it arrives, one at a time, before it is held (``ExaminedAnswer``)."""

    flagger: FlagDetector
    answers: AnswerReader

    def examine(self, item: WorkItem, result: GenerateResult) -> ExaminedAnswer:
        """What an answer's record says of it (it decodes and re-encodes the answer:
        ``quality/flags.py``'s round trip)."""
        flags = self.flagger.flags(
            input_ids=item.input_ids,
            output_ids=result.output_ids,
            finish_reason=result.finish_reason,
            matched=result.matched,
        )
        reasoning = self.answers.reasoning_tokens(
            item.input_ids, result.output_ids, result.finish_reason, result.matched
        )
        return ExaminedAnswer(item, result, flags, reasoning)


@dataclass(slots=True)
class SessionCounts:
    """What this session added: records, failures, answer tokens."""

    records: int = 0
    failures: int = 0
    tokens: int = 0

    def failure(self) -> None:
        self.failures += 1


class Recorder:
    """Holds each examined answer until every check of its server vouches for it
    (``holder``: run/holding.py), then commits it: its record is built and written, and its
    conversation may go on. An answer whose server went down is given back: a conversation's
    turn is sent again at once, anything else once this pass of the plan is done (``redo``)."""

    def __init__(
        self,
        *,
        client: SGLangClient,
        kv_guard: KVGuard,
        server: ServerSettings,
        writer: ShardWriter,
        turns: TurnSource | None,
        counts: SessionCounts,
        progress: Progress,
        scheduler: Scheduler[WorkItem],
        load: LoadController,
    ) -> None:
        self.writer = writer
        self.turns = turns
        self.counts = counts
        self.progress = progress
        self.scheduler = scheduler
        self.load = load
        self.redo: list[WorkItem] = []
        """Results given back that are not a conversation's turn: generated again once this
        pass of the plan is done."""
        # One hold-and-release for the KV check and the canary (the canary adds its check).
        self.holder = HoldAndRelease[ExaminedAnswer](
            client,
            [kv_guard],
            interval_s=server.guard_interval_s,
            max_held=server.guard_max_held,
            max_hold_s=server.guard_max_hold_s,
            release=self.commit,
            requeue=self.give_back,
        )

    def commit(self, answer: ExaminedAnswer) -> RecordLine:
        """A result every check vouched for: write its record, count it."""
        item, result = answer.item, answer.result
        record = record_of(answer)
        self.writer.write(record)
        # committed: the conversation's next turn may be built on it now
        if self.turns is not None:
            self.turns.committed(item, result)
        self.counts.records += 1
        self.counts.tokens += result.completion_tokens
        load = self.load
        self.progress.advance(
            tokens=result.completion_tokens,
            in_flight=sum(lane.in_flight for lanes in load.lanes.values() for lane in lanes)
            if load.auto
            else self.scheduler.stats.in_flight,
            load=load.bar_fields(),
        )
        return record

    def give_back(self, answer: ExaminedAnswer) -> None:
        if self.turns is None or not self.turns.given_back(answer.item):
            self.redo.append(answer.item)
