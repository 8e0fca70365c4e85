"""Which records an export keeps, and why each of the others is left out.

Records carry quality ``flags`` (docs/run-directory.md). A run made before flags existed has no
``flags`` (None): its records get the flags that need only their ids (``truncated``, ``empty``,
``degenerate``), from the same detector generation uses. ``empty`` and ``degenerate`` answers are
left out unless
the user keeps them; rows longer than the trainer's ``max_length`` are left out and counted, since
a trainer would cut them (SpecForge, speculators) and train on a tail-less answer.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from eagledata.errors import ExportError
from eagledata.quality.flags import ALL_FLAGS, FlagDetector
from eagledata.rundir.lines import RecordLine

KNOWN_FLAGS = ALL_FLAGS
# No tokenizer: the round-trip and think detectors are off, the id-only ones on.
_FROM_IDS = FlagDetector()
EXCLUDED_BY_DEFAULT = frozenset({"empty", "degenerate"})

# Skip reasons of the export itself (generation outcomes are named in report.py).
MALFORMED = "malformed_record"
NO_OUTPUT = "no_output_ids"
TOO_LONG = "too_long"
DUPLICATE = "duplicate_id"


def flag_reason(flag: str) -> str:
    return f"flag:{flag}"


def record_flags(record: RecordLine) -> list[str]:
    if record.flags is not None:
        return record.flags.names()
    return _FROM_IDS.flags(
        input_ids=record.input_ids,
        output_ids=list(record.output_ids),
        finish_reason=record.finish_reason,
        matched=record.matched,
    )


@dataclass(frozen=True)
class Selection:
    excluded: frozenset[str]
    max_length: int | None

    @classmethod
    def build(cls, keep: Iterable[str] = (), max_length: int | None = None) -> Selection:
        kept = set(keep)
        unknown = sorted(kept - set(KNOWN_FLAGS))
        if unknown:
            raise ExportError(
                f"--keep {unknown[0]}: unknown flag; use one of {', '.join(KNOWN_FLAGS)}"
            )
        if max_length is not None and max_length < 1:
            raise ExportError(f"--max-length {max_length}: must be a positive number of tokens")
        return cls(excluded=EXCLUDED_BY_DEFAULT - kept, max_length=max_length)

    def skip_reason(self, record: RecordLine) -> str | None:
        """Why ``record`` is left out, or None to export it."""
        prompt, output = record.input_ids, record.output_ids
        if not prompt:
            return MALFORMED
        if record.prompt_tokens != len(prompt) or record.completion_tokens != len(output):
            return MALFORMED
        excluded = sorted(self.excluded.intersection(record_flags(record)))
        if excluded:
            return flag_reason(excluded[0])
        if not output:  # nothing to supervise: every trainer would drop it silently
            return NO_OUTPUT
        if self.max_length is not None and len(prompt) + len(output) > self.max_length:
            return TOO_LONG
        return None
