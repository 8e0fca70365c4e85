"""The ids of a run's items, and the failure line built when one ends without a record (the
lines themselves: ``rundir/lines.py``)."""

from __future__ import annotations

import time
from typing import Literal

from eagledata.rundir.lines import FailureLine


def record_id(dataset: str, row_id: str, sample: int) -> str:
    """Stable and unique: dataset, source row, sample index."""
    return f"{dataset}/{row_id}/{sample}"


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
    )
