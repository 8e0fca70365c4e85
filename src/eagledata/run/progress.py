"""The only tqdm user: a live bar while a run goes, and the plain summary at its end."""

from __future__ import annotations

import shutil
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Literal, TextIO

from tqdm import tqdm

from eagledata.run.embedded import EventThrottle, ProgressEvent, current
from eagledata.rundir.totals import count_mismatch


class RateWindow:
    """Tokens per second over the last ``window_s`` seconds (the lifetime mean hides stalls)."""

    def __init__(self, window_s: float = 60.0) -> None:
        self.window_s = window_s
        self._events: deque[tuple[float, int]] = deque()
        self._sum = 0

    def add(self, tokens: int, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self._events.append((now, tokens))
        self._sum += tokens
        self._trim(now)

    def _trim(self, now: float) -> None:
        while self._events and self._events[0][0] < now - self.window_s:
            self._sum -= self._events.popleft()[1]

    def rate(self, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        self._trim(now)
        if not self._events:
            return 0.0
        span = max(now - self._events[0][0], 1.0)
        return self._sum / span


LOG_EVERY_S = 30.0
"""Off a terminal (a log file, CI), one plain progress line this often."""
BAR_MIN_COLUMNS = 70
"""In a terminal, tqdm's counts, times and rate (~50 characters) and a bar of at least 20 keep this
much of the line; the suffix gets the rest."""


def fit_suffix(fields: dict[str, object], room: int) -> str:
    """``key=value`` pairs, dropping the last ones until they fit in ``room`` characters (the
    first are the ones that matter: tok/s, then the servers' load, then ours)."""
    parts = [f"{key}={value}" for key, value in fields.items()]
    while parts and len(", ".join(parts)) > room:
        parts.pop()
    return ", ".join(parts)


class Progress:
    """Records done of planned, output tok/s, requests in flight, held by the guard, ETA.

    In a terminal: tqdm's live bar, its suffix cut to the terminal's width. Anywhere else (a
    log file, CI): no bar (its carriage returns join every update into one line), but one plain
    line every ``log_every_s``, ending in a newline. Inside another program (run/embedded.py):
    nothing is written; the counts and the notes go to its callback, if it gave one.
    """

    def __init__(
        self,
        *,
        total: int | None,
        initial: int,
        enabled: bool = True,
        stream: TextIO | None = None,
        log_every_s: float = LOG_EVERY_S,
    ) -> None:
        self.rate = RateWindow()
        self._out = stream or sys.stderr
        embedding = current()
        self._events = None if embedding is None else EventThrottle(embedding)
        if self._events is not None:
            enabled = False  # no bar, no log lines: the host's terminal is its own
        self.interactive = hasattr(self._out, "isatty") and self._out.isatty()
        self.enabled = enabled
        self.total = total
        self.done = initial
        self.log_every_s = log_every_s
        self._started = time.monotonic()
        self._last_log = self._started
        self._bar = tqdm(
            total=total,
            initial=initial,
            unit="rec",
            dynamic_ncols=True,
            disable=not (enabled and self.interactive),
            file=self._out,
            smoothing=0.05,
            mininterval=0.1,
        )
        self._last_postfix = 0.0
        self._fields: dict[str, object] = {}

    def advance(
        self,
        *,
        tokens: int = 0,
        in_flight: int = 0,
        held: int = 0,
        load: dict[str, str] | None = None,
    ) -> None:
        """One more item done; ``load`` adds the servers' KV usage, running and queued."""
        if tokens:
            self.rate.add(tokens)
        self.done += 1
        self._bar.update(1)
        now = time.monotonic()
        if now - self._last_postfix >= 0.5:
            self._last_postfix = now
            fields: dict[str, object] = {"tok/s": f"{self.rate.rate(now):,.0f}", **(load or {})}
            fields.update(in_flight=in_flight, held=held)
            self._fields = fields
            self._show(fields)
        if self._events is not None:
            self._events.progress(self._event("progress", in_flight=in_flight, held=held))
        if self.enabled and not self.interactive and now - self._last_log >= self.log_every_s:
            self._last_log = now
            self._log_line()

    def _show(self, fields: dict[str, object]) -> None:
        if self._bar.disable:
            return
        width = self._bar.ncols or shutil.get_terminal_size().columns
        self._bar.set_postfix_str(fit_suffix(fields, width - BAR_MIN_COLUMNS), refresh=False)

    def _log_line(self) -> None:
        done = f"{self.done:,}" + (f"/{self.total:,}" if self.total else "")
        share = f" ({self.done / self.total:.1%})" if self.total else ""
        elapsed = time.monotonic() - self._started
        suffix = ", ".join(f"{key} {value}" for key, value in self._fields.items())
        self._out.write(f"progress: {done} records{share} after {elapsed:,.0f} s; {suffix}\n")
        self._out.flush()

    def _event(
        self, kind: Literal["progress", "note", "end"], message: str = "", **counts: int
    ) -> ProgressEvent:
        return ProgressEvent(
            kind, self.done, self.total, self.rate.rate(), message=message, **counts
        )

    def note(self, message: str) -> None:
        if self._events is not None:
            self._events.always(self._event("note", message))
            return
        if self._bar.disable:
            self._out.write(message + "\n")
            self._out.flush()
        else:
            self._bar.write(message, file=self._out)

    def close(self) -> None:
        if self._events is not None:
            self._events.always(self._event("end"))
        # The last postfix may be half a second old: show the final state, not a stale one.
        self._show({"tok/s": f"{self.rate.rate():,.0f}", "in_flight": 0, "held": 0})
        self._bar.close()


@dataclass(frozen=True, slots=True)
class Summary:
    run_dir: str
    planned: int | None
    written: int
    failed: int
    skipped: int
    left: int | None
    session_records: int
    session_failures: int
    session_tokens: int
    elapsed_s: float
    quality: str = ""
    interrupted: str | None = None
    canary: str = ""
    checks_s: float = 0.0
    """Seconds production waited on the canary's start and the final checks."""
    rate: str = ""
    """The run's output rate, as ``status`` says it (rundir/rates.py)."""
    failure_reasons: dict[str, int] = field(default_factory=dict)
    plan_complete: bool = False
    """``planned`` is the plan read to its end (``plan.json``), not an estimate."""
    resumable: bool = True
    """False when a new run was stopped while starting: its folder was removed, nothing to
    resume."""

    @property
    def mismatch(self) -> str | None:
        """The run holds more outcomes than its plan has items (``left`` would be negative)."""
        return count_mismatch(
            self.run_dir,
            self.planned,
            self.written,
            self.failed,
            self.skipped,
            plan_complete=self.plan_complete,
        )

    @property
    def all_failed(self) -> str | None:
        """Why a finished plan wrote no record at all (every item failed), or None."""
        if self.written or not self.failed or self.left or self.interrupted:
            return None
        reasons = ", ".join(f"{name} {n:,}" for name, n in sorted(self.failure_reasons.items()))
        return (
            f"every item failed, no record was written ({reasons}); the reasons are in "
            f"{self.run_dir}/failures.jsonl"
        )

    def render(self) -> str:
        planned = "?" if self.planned is None else f"{self.planned:,}"
        left = "?" if self.left is None else f"{self.left:,}"
        lines = [
            f"planned {planned} = written {self.written:,} + failed {self.failed:,} "
            f"+ skipped {self.skipped:,} + left {left}",
            f"this session: {self.session_records:,} records, {self.session_failures:,} failures, "
            f"{self.session_tokens:,} output tokens in {self.elapsed_s:,.1f} s"
            + (f" ({self.checks_s:,.1f} s of it on checks)" if self.checks_s >= 0.05 else ""),
        ]
        if self.rate:
            lines.append(f"rate: {self.rate}")
        if self.quality:
            lines.append(f"quality: {self.quality}")
        if self.canary:
            lines.append(f"canary: {self.canary}")
        if self.interrupted and not self.resumable:
            lines.append(
                f"stopped early: {self.interrupted}; the run had not started, so "
                f"{self.run_dir} was removed: run the same command again"
            )
            return "\n".join(lines)
        if self.interrupted:
            lines.append(
                f"stopped early: {self.interrupted}; continue with "
                f"'eagledata resume {self.run_dir}'"
            )
        lines.append(
            f"output: {self.run_dir}/shards/*.jsonl (failures: {self.run_dir}/failures.jsonl)"
        )
        return "\n".join(lines)
