"""A record built from an answer: the prompt's ids and messages, the answer's ids and provenance
(the line's contract: ``rundir/lines.py``)."""

from __future__ import annotations

import time

from eagledata.rundir.lines import RecordLine
from eagledata.server.responses import GenerateResult
from eagledata.source.prompts import Message


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
) -> RecordLine:
    return RecordLine(
        id=item_id,
        dataset=dataset,
        row_id=row_id,
        sample=sample,
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
    )
