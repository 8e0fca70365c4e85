"""Speculative decoding's acceptance length, measured from the records a run wrote.

SGLang's own per-answer figure is ``spec_accept_length = completion_tokens / spec_verify_ct``;
over many answers the honest mean weighs them by length: the sum of their completion tokens over
the sum of their verify counts. Records without ``spec_verify_ct`` (no speculative decoding, or a
one-token answer that ran no verify step) do not count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Acceptance:
    """Tokens and verify steps over all records and over the recent ones."""

    tokens: int = 0
    verify_ct: int = 0
    records: int = 0
    recent_tokens: int = 0
    recent_verify_ct: int = 0

    def add(self, verify_ct: int | None, tokens: int, *, recent: bool) -> None:
        """One record's ``spec_verify_ct`` and ``completion_tokens``."""
        if verify_ct is None or verify_ct <= 0:
            return
        self.tokens += tokens
        self.verify_ct += verify_ct
        self.records += 1
        if recent:
            self.recent_tokens += tokens
            self.recent_verify_ct += verify_ct

    @property
    def overall(self) -> float | None:
        return self.tokens / self.verify_ct if self.verify_ct else None

    @property
    def recent(self) -> float | None:
        return self.recent_tokens / self.recent_verify_ct if self.recent_verify_ct else None

    def line(self) -> str | None:
        """The ``status`` line, or None when no record was speculatively decoded."""
        overall = self.overall
        if overall is None:
            return None
        recent = self.recent
        text = f"acceptance {overall:.2f} tokens/verify step over {self.records:,} records"
        if recent is not None:
            text += f", {recent:.2f} recently"
        return text

    def to_json(self) -> dict[str, Any] | None:
        """``status --json``'s ``speculative`` object, or None."""
        if self.overall is None:
            return None
        return {
            "accept_length": self.overall,
            "accept_length_recent": self.recent,
            "records": self.records,
            "completion_tokens": self.tokens,
            "verify_ct": self.verify_ct,
        }
