"""``eagledata status``: a run's counts, rates, quality, canary and latest load.

It reads committed data only and writes nothing: a shard index it cannot trust is rebuilt in
memory; the next ``resume`` (which holds the run's lock) writes it back. The session's summary
line reuses the canary's line from here; ``verify`` (checking the data itself) is in ``verify``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from eagledata.config import FrozenSettings
from eagledata.rundir.journal import iter_jsonl_lines
from eagledata.rundir.lines import LineError, QualityLine, TelemetryLine
from eagledata.rundir.manifest import RunDir
from eagledata.rundir.rates import Rate, duration
from eagledata.rundir.runfiles import Manifest
from eagledata.rundir.telemetry import TELEMETRY_FILE, lane_name
from eagledata.rundir.totals import RunTotals, count_mismatch, scan_totals


@dataclass(frozen=True)
class StatusReport:
    run_dir: str
    planned: int | None
    plan_complete: bool
    written: int
    failed: int
    skipped: int
    prompt_tokens: int
    completion_tokens: int
    overall: Rate
    recent: Rate
    """Output tok/s over active time (rundir/rates.py): the whole run, and its last 10 min."""
    failure_reasons: dict[str, int]
    quality: str
    finish_reasons: dict[str, int] = field(default_factory=dict)
    flags: dict[str, int] = field(default_factory=dict)
    canary: dict[str, Any] = field(default_factory=dict)
    load: dict[str, Any] | None = None
    speculative: str | None = None
    """Measured speculative acceptance length, when records carry verify counts."""
    speculative_json: dict[str, Any] | None = None
    skipped_reasons: dict[str, int] = field(default_factory=dict)
    """Skipped items by reason (``duplicate``: a prompt an earlier row planned)."""
    datasets: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per dataset of the run: counts and the generation settings it was frozen with."""

    @property
    def left(self) -> int | None:
        if self.planned is None:
            return None
        return max(self.planned - self.written - self.failed - self.skipped, 0)

    @property
    def mismatch(self) -> str | None:
        """More outcomes than planned: ``left`` would be negative (an error, not 0 left)."""
        return count_mismatch(
            self.run_dir,
            self.planned,
            self.written,
            self.failed,
            self.skipped,
            plan_complete=self.plan_complete,
        )

    @property
    def eta_s(self) -> float | None:
        """Seconds left at the recent rate (0 when nothing is left; None: no rate yet, or
        counts that disagree)."""
        if self.mismatch:
            return None
        if self.left == 0:
            return 0.0
        per_s = self.recent.records_per_s or self.overall.records_per_s
        if self.left is None or not per_s:
            return None
        return self.left / per_s

    def render(self) -> str:
        planned = "?" if self.planned is None else f"{self.planned:,}"
        if self.planned is not None and not self.plan_complete:
            planned += " (estimate)"
        left = "unknown until the dataset is read" if self.left is None else f"{self.left:,}"
        if self.mismatch:
            eta = "unknown: the counts disagree (problem below)"
        elif self.left == 0:
            eta = "done"
        elif self.eta_s is None:
            eta = "after the first rated minutes"
        else:
            eta = _duration(self.eta_s)
        lines = [
            f"run:      {self.run_dir}",
            f"planned:  {planned}",
            f"written:  {self.written:,}",
            f"failed:   {self.failed:,}" + _reasons(self._failed_reasons()),
            f"skipped:  {self.skipped:,}" + _reasons(self.skipped_reasons),
            f"left:     {left}",
            f"tokens:   {self.prompt_tokens:,} prompt, {self.completion_tokens:,} output",
            f"quality:  {self.quality}",
            f"canary:   {canary_line(self.canary)}",
            f"rate:     {self.overall.text()}" + self._recent_text(),
            f"eta:      {eta}",
        ]
        if self.speculative is not None:
            lines.append(f"spec:     {self.speculative}")
        for name, entry in self.datasets.items():
            lines.append(f"dataset:  {name}: {_dataset_line(entry)}")
        lines += [f"load:     {_load_line(entry)}" for entry in (self.load or {}).values()]
        if self.mismatch:
            lines.append(f"problem:  {self.mismatch}")
        return "\n".join(lines)

    def _recent_text(self) -> str:
        if self.recent.tok_s is None or self.left == 0:
            return ""
        per_hour = (self.recent.records_per_s or 0.0) * 3600
        return f"; last 10 min {self.recent.tok_s:,.1f} tok/s, {per_hour:,.0f} records/h"

    def to_json(self) -> dict[str, Any]:
        """The ``status --json`` object (docs/run-directory.md)."""
        return {
            "run_dir": self.run_dir,
            "planned": self.planned,
            "plan_complete": self.plan_complete,
            "written": self.written,
            "failed": self.failed,
            "skipped": self.skipped,
            "skipped_reasons": dict(self.skipped_reasons),
            "left": self.left,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.completion_tokens,
            "tok_s": {
                "overall": self.overall.tok_s,
                "recent": self.recent.tok_s,
                "active_s": self.overall.active_s,
            },
            "eta_s": self.eta_s,
            "finish_reasons": dict(self.finish_reasons),
            "failure_reasons": dict(self.failure_reasons),
            "quality": {"flags": dict(self.flags), "canary": dict(self.canary)},
            "load": self.load,
            "speculative": self.speculative_json,
            "datasets": {name: dict(entry) for name, entry in self.datasets.items()},
            "problem": self.mismatch,
        }

    def _failed_reasons(self) -> dict[str, int]:
        """``failure_reasons`` holds the skipped reasons too; the failed line shows its own."""
        failed = dict(self.failure_reasons)
        for reason, count in self.skipped_reasons.items():
            left = failed.get(reason, 0) - count
            if left > 0:
                failed[reason] = left
            else:
                failed.pop(reason, None)
        return failed


def _dataset_line(entry: dict[str, Any]) -> str:
    """One dataset of the run: its counts, then its settings."""
    planned, estimate = entry.get("planned"), entry.get("planned_estimate")
    if planned is not None:
        planned_text = f"planned {planned:,}"
    elif estimate is not None:
        planned_text = f"planned {estimate:,} (estimate)"
    else:  # several datasets: the run's estimate is not split between them
        planned_text = "planned: counted once the plan is read"
    counts = [
        planned_text,
        f"written {entry['written']:,}",
        f"failed {entry['failed']:,}",
        f"skipped {entry['skipped']:,}" + _reasons(entry["skipped_reasons"]),
    ]
    settings = entry.get("settings") or {}
    shown = ", ".join(
        f"{key} {orjson.dumps(value).decode() if isinstance(value, dict) else value}"
        for key, value in settings.items()
    )
    return ", ".join(counts) + (f"; {shown}" if shown else "")


def dataset_settings(frozen: FrozenSettings) -> dict[str, dict[str, Any]]:
    """Each dataset's generation settings as the run froze them: the run's, with the dataset's
    own over them."""
    found: dict[str, dict[str, Any]] = {}
    for member in frozen.members():
        generation = member.dataset.generation(frozen.generation)
        settings: dict[str, Any] = {
            "turns": generation.turns,
            "temperature": generation.temperature,
            "top_p": generation.top_p,
            "max_new_tokens": generation.max_new_tokens,
            "samples_per_prompt": generation.samples_per_prompt,
            "chat_template_kwargs": member.dataset.template_kwargs(
                frozen.tokenizer.chat_template_kwargs
            ),
        }
        if member.rows is not None:
            settings["rows"] = member.rows
        if member.share is not None:
            settings["share"] = member.share
        found[member.name] = settings
    return found


def canary_line(canary: dict[str, Any]) -> str:
    """``off (--no-canary)``, or the checks so far and the last verdict."""
    if not canary.get("enabled"):
        return "off (--no-canary)" if canary.get("disabled_by_flag") else "off"
    checks = canary.get("checks", 0)
    line = (
        f"{checks:,} checks, {canary.get('passed', 0):,} passed, {canary.get('failed', 0):,} failed"
    )
    last = canary.get("last")
    if isinstance(last, dict):
        line += f"; last: {last.get('verdict')} ({last.get('trigger')}, {last.get('server')})"
        if last.get("reason"):
            line += f": {last['reason']}"
    return line


def canary_summary(path: Path, manifest: Manifest) -> dict[str, Any]:
    """``{"enabled", "checks", "passed", "failed", "baseline", "last"}`` from run.json and
    ``quality.jsonl``. ``checks`` counts every canary check after the baseline runs."""
    enabled = manifest.canary_enabled
    summary: dict[str, Any] = {
        "enabled": enabled,
        "disabled_by_flag": manifest.canary is not None and not enabled,
        "checks": 0,
        "passed": 0,
        "failed": 0,
        "errors": 0,
        "fired": 0,
        "baseline": 0,
        "last": None,
    }
    ledger = path / "quality.jsonl"
    if not ledger.is_file():
        return summary
    for line in iter_jsonl_lines(ledger):
        try:
            entry = QualityLine.parse(line)
        except LineError:
            continue
        if entry.kind == "baseline":
            summary["baseline"] += 1
            continue
        summary["checks"] += 1
        verdict = entry.verdict
        if verdict == "pass":
            summary["passed"] += 1
        elif verdict == "error":
            summary["errors"] += 1
        elif verdict == "fired":  # past a threshold once; its immediate rerun decided
            summary["fired"] += 1
        else:
            summary["failed"] += 1
        summary["last"] = entry.model_dump(mode="json")
    return summary


TELEMETRY_TAIL_BYTES = 256 * 1024


def lane_key(sample: dict[str, Any]) -> str:
    """A telemetry sample's lane (``telemetry.lane_name``)."""
    rank = sample.get("rank")
    return lane_name(str(sample.get("server")), rank if isinstance(rank, int) else None)


def latest_load(path: Path) -> dict[str, Any] | None:
    """The latest ``telemetry.jsonl`` sample per lane (``lane_key``: a server, or a DP rank
    of one), read from the file's tail only."""
    telemetry = path / TELEMETRY_FILE
    if not telemetry.is_file():
        return None
    with telemetry.open("rb") as handle:
        size = handle.seek(0, 2)
        handle.seek(max(0, size - TELEMETRY_TAIL_BYTES))
        data = handle.read()
    if size > TELEMETRY_TAIL_BYTES:
        data = data[data.find(b"\n") + 1 :]  # the first line read is probably cut
    data = data[: data.rfind(b"\n") + 1]  # whole lines only
    latest: dict[str, Any] = {}
    for line in data.splitlines():
        try:
            sample = TelemetryLine.parse(line)
        except LineError:
            continue
        latest[lane_name(sample.server, sample.rank)] = sample.model_dump(mode="json")
    return latest or None


def _load_line(entry: dict[str, Any]) -> str:
    """One server's latest sample: what its operator would read in the server log."""
    server = lane_key(entry)
    usage = entry.get("token_usage")
    parts = [] if usage is None else [f"kv {100 * usage:.0f}%"]
    for key, label in (("num_running_reqs", "running"), ("num_queue_reqs", "queued")):
        if entry.get(key) is not None:
            parts.append(f"{label} {entry[key]}")
    if entry.get("gen_throughput") is not None:
        parts.append(f"server {entry['gen_throughput']:,.0f} tok/s")
    in_flight = f"in flight {entry.get('in_flight') or 0}"
    if entry.get("target") is not None:
        in_flight += f" (target {entry['target']})"
    parts.append(in_flight)
    parts.append(f"retractions seen {entry.get('num_retracted_reqs') or 0}")
    if entry.get("source") == "none":
        parts.append("no load signal")
    age = time.time() - float(entry.get("time") or 0)
    return f"{server}: " + ", ".join(parts) + f" ({_duration(max(0.0, age))} ago)"


def _reasons(reasons: dict[str, int]) -> str:
    if not reasons:
        return ""
    return " (" + ", ".join(f"{name} {count}" for name, count in sorted(reasons.items())) + ")"


def _duration(seconds: float) -> str:
    return duration(seconds)


def _datasets(run_dir: RunDir, totals: RunTotals) -> dict[str, dict[str, Any]]:
    """Per dataset: planned (once the plan is read to its end), written, failed, skipped and
    why, and its settings."""
    try:
        settings = dataset_settings(run_dir.frozen())
    except (KeyError, ValueError):  # a run.json without readable frozen settings
        settings = {}
    planned = run_dir.planned_by_dataset() or {}
    names = [*settings, *(n for n in totals.datasets if n not in settings)]
    # one dataset: the run's estimate is its own, as the run's planned line says it
    estimate = run_dir.planned() if len(names) == 1 and not planned else None
    datasets: dict[str, dict[str, Any]] = {}
    for name in names:
        counts = totals.datasets.get(name)
        written = counts.written if counts else 0
        failed = counts.failed if counts else 0
        skipped = counts.skipped if counts else 0
        of_plan = planned.get(name)
        datasets[name] = {
            "planned": of_plan,
            "written": written,
            "failed": failed,
            "skipped": skipped,
            "skipped_reasons": dict(counts.skipped_reasons) if counts else {},
            "failure_reasons": dict(counts.failure_reasons) if counts else {},
            "planned_estimate": estimate if of_plan is None else None,
            "left": None if of_plan is None else max(of_plan - written - failed - skipped, 0),
            "settings": settings.get(name, {}),
        }
    return datasets


def run_status(path: Path, window_s: float = 600.0) -> StatusReport:
    run_dir = RunDir(path)
    manifest = run_dir.manifest()
    totals = scan_totals(path, recent_window_s=window_s)
    overall, recent = totals.rates(time.time(), window_s)
    return StatusReport(
        run_dir=str(path),
        planned=run_dir.planned(),
        plan_complete=run_dir.plan_file() is not None,
        written=totals.written,
        failed=totals.failed,
        skipped=totals.skipped,
        prompt_tokens=totals.prompt_tokens,
        completion_tokens=totals.completion_tokens,
        overall=overall,
        recent=recent,
        failure_reasons=totals.failure_reasons,
        quality=totals.quality_line(),
        finish_reasons=totals.finish_reasons,
        flags=totals.flags,
        canary=canary_summary(path, manifest),
        load=latest_load(path),
        speculative=totals.acceptance.line(),
        speculative_json=totals.acceptance.to_json(),
        skipped_reasons=totals.skipped_reasons,
        datasets=_datasets(run_dir, totals),
    )
