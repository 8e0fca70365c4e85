"""A record built from an answer: the prompt's ids and messages, the answer's ids and provenance
(the line's contract: ``rundir/lines.py``)."""

from __future__ import annotations

import time

from eagledata.rundir.lines import RecordLine
from eagledata.server.responses import GenerateResult
from eagledata.source.prompts import Message
from eagledata.source.workplan import WorkItem


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
    flags: list[str] | None = None,
    conversation_id: str | None = None,
    turn: int | None = None,
    conversation_turns: int | None = None,
    reasoning_tokens: int | None = None,
    prompt_key: str | None = None,
) -> RecordLine:
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
        # quality/flags.py: what a consumer should know about this answer; [] when clean
        flags=flags if flags is not None else [],
        # ``matched`` may be an id or a stop string; keep the column typed for Arrow.
        matched_token_id=result.matched if isinstance(result.matched, int) else None,
        cached_tokens=result.cached_tokens,
        server=result.server,
        rid=result.rid,
        weight_version=result.weight_version,
        e2e_latency=result.e2e_latency,
        spec_verify_ct=result.spec_verify_ct,
        reasoning_tokens=reasoning_tokens,
        prompt_key=prompt_key,
    )


def record_of(
    item: WorkItem,
    result: GenerateResult,
    flags: list[str],
    reasoning_tokens: int | None,
) -> RecordLine:
    """The record of a work item's answer: where it sits in its conversation, and its key."""
    return make_record(
        item_id=item.item_id,
        dataset=item.dataset,
        row_id=item.row_id,
        sample=item.sample,
        messages=item.messages,
        input_ids=item.input_ids,
        result=result,
        flags=flags,
        conversation_id=item.conversation_id,
        turn=item.turn,
        conversation_turns=item.conversation_turns,
        reasoning_tokens=reasoning_tokens,
        prompt_key=item.prompt_key,
    )
