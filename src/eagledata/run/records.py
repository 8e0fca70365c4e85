"""A record built from an answer: the prompt's ids and messages, the answer's ids and provenance
(the line's contract: ``rundir/lines.py``)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TypeVar

from eagledata.rundir.lines import NONE_VALUES, RecordFlags, RecordLine
from eagledata.server.responses import GenerateResult
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
