"""The only tqdm user: a live bar while a run goes (what is held and for which check, a time left
that leaves the checks out, a log line at least every `[run] progress_log_s`), and the plain
summary at its end."""

from __future__ import annotations

import asyncio
import shutil
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, TextIO

from tqdm import tqdm

from eagledata.run.embedded import EventThrottle, ProgressEvent, current
from eagledata.run.holding import HoldState
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
"""Off a terminal (a log file, CI), one plain progress line at least this often, whether or not
an item finished: a run whose first minute is checks still says so."""
REFRESH_S = 1.0
"""How often the heartbeat redraws the bar (and looks whether a log line is due)."""
BAR_MIN_COLUMNS = 52
"""In a terminal, tqdm's share, counts and elapsed time (~30 characters) and a bar of at least 20
keep this much of the line; the suffix gets the rest."""
BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]"
"""tqdm's own remaining time and rate are left out: they divide by the time since the bar began,
which counts the canary's start and every hold; the suffix's ``eta`` does not."""


def fit_suffix(fields: dict[str, object], room: int) -> str:
    """``key=value`` pairs, dropping the last ones until they fit in ``room`` characters (the
    first are the ones that matter: the time left and what is held, then tok/s, then the
    servers' load, then ours)."""
    parts = [str(value) if key == "held" else f"{key}={value}" for key, value in fields.items()]
    while parts and len(", ".join(parts)) > room:
        parts.pop()
    return ", ".join(parts)


def nothing_held() -> HoldState:
    return HoldState(0)


def format_eta(seconds: float) -> str:
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class Progress:
    """Records done of planned, the time left, what is held and why, output tok/s, requests in
    flight.

    In a terminal: tqdm's live bar, its suffix cut to the terminal's width, redrawn every
    ``REFRESH_S`` by ``heartbeat`` (a hold of a minute is counted down, not frozen). Anywhere else
    (a log file, CI): no bar (its carriage returns join every update into one line), but one plain
    line at least every ``log_every_s``, whether or not an item finished. Inside another program
    (run/embedded.py): nothing is written; the counts and the notes go to its callback, if it
    gave one.

    The time left counts answers (written or held) over the time since generation began
    (``generation_started``): the servers' first checks and the canary's start are not part of
    the rate, and held answers are not "left"; they land at the next check, which is added.
    """

    def __init__(
        self,
        *,
        total: int | None,
        initial: int,
        enabled: bool = True,
        stream: TextIO | None = None,
        log_every_s: float = LOG_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
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
        self.initial = initial
        self.done = initial
        self.log_every_s = log_every_s
        self.clock = clock
        self._started = clock()
        self._last_log = self._started
        self._generating_since: float | None = None
        self.phase = ""
        """What the session does while no answer can come (``canary start``, ``final checks``)."""
        self.hold_state: Callable[[], HoldState] = nothing_held
        """The holder's ``state`` once there is one (run/holding.py)."""
        self._bar = tqdm(
            total=total,
            initial=initial,
            unit="rec",
            dynamic_ncols=True,
            disable=not (enabled and self.interactive),
            file=self._out,
            mininterval=0.1,
            bar_format=BAR_FORMAT,
        )
        self._last_postfix = -float("inf")
        self._measures: dict[str, object] = {}

    def generation_started(self) -> None:
        """Answers can come from now on: the time left is measured from here."""
        if self._generating_since is None:
            self._generating_since = self.clock()
        self.phase = ""

    def eta_s(self, held: int, next_check_in_s: float | None) -> float | None:
        """Seconds until every planned record is written, or None before an answer came."""
        if self.total is None or self._generating_since is None:
            return None
        answered = self.done + held - self.initial
        generating_s = self.clock() - self._generating_since
        if answered <= 0 or generating_s <= 0:
            return None
        left = max(self.total - self.done - held, 0)
        wait = (next_check_in_s or 0.0) if held else 0.0
        return left / (answered / generating_s) + wait

    def advance(
        self,
        *,
        tokens: int = 0,
        in_flight: int = 0,
        load: dict[str, str] | None = None,
    ) -> None:
        """One more item done; ``load`` adds the servers' KV usage, running and queued."""
        now = self.clock()
        if tokens:
            self.rate.add(tokens, now)
        self.done += 1
        self._bar.update(1)
        self._measures = {"tok/s": None, **(load or {}), "in_flight": in_flight}
        if now - self._last_postfix >= 0.5:
            self.refresh(now, log=False)
        if self._events is not None:
            held = self.hold_state().held
            self._events.progress(self._event("progress", in_flight=in_flight, held=held))
        if self._log_due(now):
            self._log_line(now)

    def fields(self, now: float) -> dict[str, object]:
        """The suffix: time left, what is held (or the phase), tok/s, load, in flight."""
        state = self.hold_state()
        eta = self.eta_s(state.held, state.next_in_s)
        fields: dict[str, object] = {}
        if self.total is not None:  # no plan size, no time left to say
            fields["eta"] = "?" if eta is None else format_eta(eta)
        if self.phase and not state.held:
            fields["held"] = self.phase
        elif state.text():
            fields["held"] = state.text()
        fields.update(self._measures)
        fields["tok/s"] = f"{self.rate.rate(now):,.0f}"
        return fields

    def refresh(self, now: float | None = None, *, log: bool = True) -> None:
        """Redraw the suffix; off a terminal, write a line if none was written for
        ``log_every_s``."""
        now = self.clock() if now is None else now
        self._last_postfix = now
        if not self._bar.disable:
            width = self._bar.ncols or shutil.get_terminal_size().columns
            suffix = fit_suffix(self.fields(now), width - BAR_MIN_COLUMNS)
            self._bar.set_postfix_str(suffix, refresh=True)
        if log and self._log_due(now):
            self._log_line(now)

    async def heartbeat(self, every_s: float = REFRESH_S) -> None:
        """Redraw every ``every_s`` until cancelled by its owner's task group: the line moves
        while the canary or a hold keeps answers back."""
        while True:
            await asyncio.sleep(every_s)
            self.refresh()

    def _log_due(self, now: float) -> bool:
        return self.enabled and not self.interactive and now - self._last_log >= self.log_every_s

    def _log_line(self, now: float) -> None:
        self._last_log = now
        done = f"{self.done:,}" + (f"/{self.total:,}" if self.total else "")
        share = f" ({self.done / self.total:.1%})" if self.total else ""
        elapsed = now - self._started
        fields = self.fields(now)
        suffix = ", ".join(
            str(value) if key == "held" else f"{key} {value}" for key, value in fields.items()
        )
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
        # The last suffix may be half a second old: show the final state, not a stale one.
        self.hold_state = nothing_held
        self.phase = ""
        self._measures["in_flight"] = 0
        if not self._bar.disable:
            self.refresh(log=False)
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
