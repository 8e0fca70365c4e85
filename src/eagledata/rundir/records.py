"""The ids of a run's items, and the failure line built when one ends without a record (the
lines themselves: ``rundir/lines.py``)."""

from __future__ import annotations

import time
from typing import Literal

from eagledata.rundir.lines import FailureLine


def record_id(dataset: str, row_id: str, sample: int) -> str:
    """Stable and unique: dataset, source row, sample index. Under ``turns = "all"`` it is the
    id of the conversation, and each turn's record adds the turn (``turn_id``)."""
    return f"{dataset}/{row_id}/{sample}"


def turn_id(conversation_id: str, turn: int) -> str:
    """A turn's record id under ``turns = "all"``: ``dataset/row_id/sample/turn``."""
    return f"{conversation_id}/{turn}"


def next_turn_id(item_id: str) -> str:
    """The id of the turn after the turn ``item_id`` (a ``turn_id``)."""
    conversation_id, _, turn = item_id.rpartition("/")
    return turn_id(conversation_id, int(turn) + 1)


def failure_line(
    *,
    item_id: str,
    dataset: str,
    row_id: str,
    sample: int,
    reason: str,
    message: str,
    attempts: int,
    status: Literal["failed", "skipped"] = "failed",
    prompt_key: str | None = None,
) -> FailureLine:
    return FailureLine(
        id=item_id,
        status=status,
        reason=reason,
        message=message,
        dataset=dataset,
        row_id=row_id,
        sample=sample,
        attempts=attempts,
        time=time.time(),
        prompt_key=prompt_key,
    )
