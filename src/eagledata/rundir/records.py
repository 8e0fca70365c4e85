"""The record and failure-line contract: the keys every record holds, its stable id, and one
line of the failure file."""

from __future__ import annotations

import time
from typing import Any

REQUIRED_RECORD_KEYS = (
    "id",
    "input_ids",
    "output_ids",
    "text",
    "finish_reason",
    "prompt_tokens",
    "completion_tokens",
    "messages",
)


def record_id(dataset: str, row_id: str, sample: int) -> str:
    """Stable and unique: dataset, source row, sample index."""
    return f"{dataset}/{row_id}/{sample}"


def failure_entry(
    *,
    item_id: str,
    dataset: str,
    row_id: str,
    sample: int,
    reason: str,
    message: str,
    attempts: int,
    status: str = "failed",
) -> dict[str, Any]:
    return {
        "id": item_id,
        "status": status,
        "reason": reason,
        "message": message,
        "dataset": dataset,
        "row_id": row_id,
        "sample": sample,
        "attempts": attempts,
        "time": time.time(),
    }
