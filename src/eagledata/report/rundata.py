"""Everything the report shows, gathered from a run directory in one streaming pass per file.

Read-only and lock-free: the run may be in progress. Each side file (``checks.jsonl``,
``quality.jsonl``, ``telemetry.jsonl``, ``failures.jsonl``) is read up to its last newline; a line
that is not a JSON object of the documented shape (docs/run-directory.md) is counted and skipped,
never fatal: a report of a damaged run is still a report.
"""

from __future__ import annotations

import itertools
import time
from array import array
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from eagledata.report.headline import status_snapshot
from eagledata.report.records_scan import RecordSeries, scan_records
from eagledata.rundir.journal import iter_jsonl_lines
from eagledata.rundir.lines import CheckLine, Line, LineError, QualityLine, TelemetryLine
from eagledata.rundir.manifest import RunDir
from eagledata.rundir.runfiles import Manifest
from eagledata.rundir.telemetry import lane_name

LineT = TypeVar("LineT", bound=Line)


@dataclass(frozen=True)
class GuardCheck:
    time: float
    server: str
    ok: bool
    problems: tuple[str, ...]


@dataclass(frozen=True)
class Reconnect:
    """A server whose checks resumed after a silence: it was down, restarted or the run paused."""

    time: float
    server: str
    silent_s: float
    source: str  # "checks" (a gap between KV checks) or "canary" (a reconnect-triggered canary)


@dataclass(frozen=True)
class CanaryCheck:
    time: float
    server: str
    kind: str
    trigger: str
    verdict: str
    stats: dict[str, float]
    thresholds: dict[str, float]
    reason: str


@dataclass
class LoadSeries:
    """One server's (or one DP rank's) telemetry samples, in time order."""

    label: str
    time: array[float] = field(default_factory=lambda: array("d"))
    token_usage: array[float] = field(default_factory=lambda: array("d"))
    running: array[float] = field(default_factory=lambda: array("d"))
    queued: array[float] = field(default_factory=lambda: array("d"))
    retracted: array[float] = field(default_factory=lambda: array("d"))
    in_flight: array[float] = field(default_factory=lambda: array("d"))
    target: array[float] = field(default_factory=lambda: array("d"))


@dataclass(frozen=True)
class RunInfo:
    run_dir: str
    dataset: str
    model: str | None
    tokenizer: str
    max_new_tokens: int | None
    servers: tuple[str, ...]
    started_at: float | None
    versions: dict[str, str]
    kv_dtypes: tuple[str, ...]


@dataclass
class RunData:
    info: RunInfo
    status: dict[str, Any]
    records: RecordSeries
    checks: list[GuardCheck]
    reconnects: list[Reconnect]
    canary: list[CanaryCheck]
    load: dict[str, LoadSeries]
    generated_at: float
    # lines of side files that did not have the documented shape: {file name: count}
    skipped_lines: Counter[str] = field(default_factory=Counter)

    def span(self) -> tuple[float, float]:
        """(start, end) in unix seconds: from the run's creation to its last event."""
        created = np.frombuffer(self.records.created_at, dtype=np.float64)
        created = created[created > 0]
        times = [c.time for c in self.checks] + [c.time for c in self.canary]
        for series in self.load.values():
            if len(series.time):
                times.append(max(series.time))
        if created.size:
            times += [float(created.min()), float(created.max())]
        start = self.info.started_at or (min(times) if times else 0.0)
        return start, max([start, *times])


def gather(path: Path) -> RunData:
    """Read a run directory (in progress or finished) into what the report draws."""
    run_dir = RunDir(path)
    manifest = run_dir.manifest()  # a non-run directory gets RunDirError's one line
    skipped: Counter[str] = Counter()
    records = scan_records(path)
    checks = _guard_checks(path, skipped)
    canary = _canary_checks(path, skipped)
    load = _load_series(path, skipped)
    interval = _guard_interval(manifest)
    return RunData(
        info=_run_info(path, manifest),
        status=status_snapshot(path),
        records=records,
        checks=checks,
        reconnects=find_reconnects(checks, canary, interval),
        canary=canary,
        load=load,
        generated_at=time.time(),
        skipped_lines=skipped,
    )


def _lines(path: Path, model: type[LineT], skipped: Counter[str]) -> Iterator[LineT]:
    """Every whole line of ``path`` that is a ``model`` line; the others are counted."""
    if not path.is_file():
        return
    for line in iter_jsonl_lines(path):
        try:
            yield model.parse(line)
        except LineError:
            skipped[path.name] += 1


def _float(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def _run_info(path: Path, manifest: Manifest) -> RunInfo:
    frozen = manifest.frozen
    generation = frozen.get("generation") or {}
    tokenizer = frozen.get("tokenizer") or {}
    facts = manifest.server_facts
    urls = manifest.setting("server", "urls") or list(facts)
    dtypes = sorted({str(f.get("kv_cache_dtype")) for f in facts.values()})
    model = frozen.get("expected_model") or next(
        (f.get("model_path") for f in facts.values()), None
    )
    max_new = generation.get("max_new_tokens")
    return RunInfo(
        run_dir=str(path),
        dataset=str(frozen.get("dataset_name", "?")),
        model=model,
        tokenizer=str(tokenizer.get("name", "?")),
        max_new_tokens=max_new if isinstance(max_new, int) else None,
        servers=tuple(str(url) for url in urls),
        started_at=manifest.created_at,
        versions={str(k): str(v) for k, v in manifest.versions.items()},
        kv_dtypes=tuple(dtypes),
    )


def _guard_interval(manifest: Manifest) -> float:
    interval = _float(manifest.setting("server", "guard_interval_s"))
    return interval if interval and interval > 0 else 30.0


def _guard_checks(path: Path, skipped: Counter[str]) -> list[GuardCheck]:
    checks = [
        GuardCheck(time=line.time, server=line.server, ok=line.ok, problems=tuple(line.problems))
        for line in _lines(path / "checks.jsonl", CheckLine, skipped)
    ]
    checks.sort(key=lambda check: check.time)
    return checks


def _canary_checks(path: Path, skipped: Counter[str]) -> list[CanaryCheck]:
    found = [
        CanaryCheck(
            time=line.time,
            server=line.server,
            kind=line.kind,
            trigger=line.trigger,
            verdict=line.verdict,
            stats=line.stats,
            thresholds=line.thresholds,
            reason=line.reason,
        )
        for line in _lines(path / "quality.jsonl", QualityLine, skipped)
    ]
    found.sort(key=lambda check: check.time)
    return found


def find_reconnects(
    checks: list[GuardCheck], canary: list[CanaryCheck], guard_interval_s: float
) -> list[Reconnect]:
    """Where a server came back: its KV checks resumed after more than three guard intervals of
    silence (a server down, restarted, or the run stopped and resumed), or the canary ran because
    of a reconnect. The guard checks every server each interval while it answers, so a longer
    silence means it did not."""
    found: list[Reconnect] = []
    last: dict[str, float] = {}
    for check in checks:
        before = last.get(check.server)
        if before is not None and check.time - before > 3 * guard_interval_s:
            found.append(Reconnect(check.time, check.server, check.time - before, "checks"))
        last[check.server] = check.time
    for entry in canary:
        if entry.trigger == "reconnect":
            found.append(Reconnect(entry.time, entry.server, 0.0, "canary"))
    found.sort(key=lambda r: r.time)
    return found


_LOAD_COLUMNS = (
    ("token_usage", "token_usage"),
    ("running", "num_running_reqs"),
    ("queued", "num_queue_reqs"),
    ("retracted", "num_retracted_reqs"),
    ("in_flight", "in_flight"),
    ("target", "target"),
)


def _load_series(path: Path, skipped: Counter[str]) -> dict[str, LoadSeries]:
    """Per server (or rank) columns of telemetry.

    The hot loop of a multi-day run (a sample per server every few seconds): kept to plain
    lookups and appends."""
    series: dict[str, LoadSeries] = {}
    nan = float("nan")
    # A long run rotates its telemetry: telemetry.1.jsonl holds the samples before the live file.
    rotated = _lines(path / "telemetry.1.jsonl", TelemetryLine, skipped)
    live = _lines(path / "telemetry.jsonl", TelemetryLine, skipped)
    for entry in itertools.chain(rotated, live):
        label = lane_name(entry.server, entry.rank)
        into = series.get(label)
        if into is None:
            into = series[label] = LoadSeries(label)
        into.time.append(entry.time)
        for name, key in _LOAD_COLUMNS:
            value = getattr(entry, key)
            getattr(into, name).append(nan if value is None else value)
    return series
