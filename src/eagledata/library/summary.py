"""What one library call returns (``RunSummary``), and what it raises instead of an exit code.

The CLI turns a summary's problems into exit codes (``cli/shell.py``'s ``finish_run``); a caller
of the library gets them as errors of the one tree: more outcomes than the plan has items is a
``RunDirError``, a finished plan without a single record a ``NothingWrittenError``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from eagledata.errors import NothingWrittenError, RunDirError
from eagledata.run.progress import Summary


@dataclass(frozen=True, slots=True)
class RunSummary:
    """One round's run directory after a call: the plan's outcomes, this call's output rate and
    the quality verdict (``planned = written + failed + skipped + left``)."""

    run_dir: Path
    round: int
    planned: int | None
    """Items in the plan (None while it is an estimate nobody read to its end)."""
    written: int
    failed: int
    skipped: int
    left: int | None
    """Items without an outcome yet: 0 once the round is complete."""
    tokens_per_s: float
    """This call's output tokens per second (its records' tokens over its wall clock)."""
    session_records: int
    """Records this call wrote (0 when the round was already complete)."""
    elapsed_s: float
    quality: str
    """Finish reasons, answer lengths and record flags, as ``eagledata status`` says them."""
    canary: str
    """The logprob canary's checks and its last verdict ("off" without it)."""
    rate: str = ""
    """The round's output rate, as ``status`` says it."""
    failure_reasons: dict[str, int] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        """Every item of the plan has its outcome."""
        return self.left == 0 and self.planned is not None

    @classmethod
    def of(cls, summary: Summary, round_index: int) -> RunSummary:
        """The library's view of a session's summary; its problems raised as errors."""
        if summary.mismatch:
            raise RunDirError(summary.mismatch)
        if summary.all_failed:
            raise NothingWrittenError(summary.all_failed)
        elapsed = summary.elapsed_s - summary.checks_s
        return cls(
            run_dir=Path(summary.run_dir),
            round=round_index,
            planned=summary.planned,
            written=summary.written,
            failed=summary.failed,
            skipped=summary.skipped,
            left=summary.left,
            tokens_per_s=summary.session_tokens / elapsed if elapsed > 0 else 0.0,
            session_records=summary.session_records,
            elapsed_s=summary.elapsed_s,
            quality=summary.quality,
            canary=summary.canary,
            rate=summary.rate,
            failure_reasons=dict(summary.failure_reasons),
        )
