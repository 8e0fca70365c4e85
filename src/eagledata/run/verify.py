"""``eagledata verify`` and ``eagledata status``: reports over a run directory.

Both read committed data only and write nothing: a shard index they cannot trust is rebuilt in
memory; the next ``resume`` (which holds the run's lock) writes it back.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from eagledata.run.idset import CompactIdSet
from eagledata.run.manifest import (
    RunDir,
    RunTotals,
    pending_journals,
    scan_totals,
    sealed_shards,
    shard_indexes,
)
from eagledata.run.records import REQUIRED_RECORD_KEYS
from eagledata.run.shardindex import (
    IndexBuilder,
    IndexRejected,
    ShardIndex,
    index_differences,
    index_path,
    load_index,
)
from eagledata.run.writer import iter_jsonl_lines

MAX_LISTED = 50


@dataclass
class VerifyReport:
    records: int = 0
    failures: int = 0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def add(self, problem: str) -> None:
        self.problems.append(problem)


def _check_record(record: object, where: str, report: VerifyReport) -> str | None:
    if not isinstance(record, dict):
        report.add(f"{where}: not a JSON object")
        return None
    missing = [key for key in REQUIRED_RECORD_KEYS if key not in record]
    if missing:
        report.add(f"{where}: missing {', '.join(missing)}")
        return None
    input_ids, output_ids = record["input_ids"], record["output_ids"]
    if not (isinstance(input_ids, list) and all(type(t) is int for t in input_ids)):
        report.add(f"{where}: input_ids is not a list of ints")
    elif record["prompt_tokens"] != len(input_ids):
        report.add(f"{where}: prompt_tokens {record['prompt_tokens']} != {len(input_ids)} ids")
    if not (isinstance(output_ids, list) and all(type(t) is int for t in output_ids)):
        report.add(f"{where}: output_ids is not a list of ints")
    elif record["completion_tokens"] != len(output_ids):
        report.add(
            f"{where}: completion_tokens {record['completion_tokens']} != {len(output_ids)} ids"
        )
    elif (
        record["finish_reason"] == "stop"
        and isinstance(record.get("matched_token_id"), int)
        and (not output_ids or output_ids[-1] != record["matched_token_id"])
    ):
        report.add(f"{where}: finish 'stop' but the matched token is not the last output id")
    if record["finish_reason"] not in ("stop", "length"):
        report.add(f"{where}: finish_reason {record['finish_reason']!r} is not stop or length")
    item_id = record["id"]
    return item_id if isinstance(item_id, str) else None


class _Claims:
    """Each id once across shards, journal and failure file, at 16 B an id (``idset``).

    Ids are added in bulk (fast); a repeat shows as fewer distinct ids than claims. Only then are
    the sources read again to name each repeat and where its first copy is (``_repeats``).
    """

    def __init__(self) -> None:
        self.seen = CompactIdSet()
        self.claimed = 0

    def claim_all(self, ids: list[str]) -> None:
        self.seen.update(ids)
        self.claimed += len(ids)

    def has_repeats(self) -> bool:
        return len(self.seen) < self.claimed


def _check_lines(
    path: Path,
    relative: Path,
    report: VerifyReport,
    claims: _Claims,
    builder: IndexBuilder | None,
) -> None:
    """Read every line of a shard or journal: JSON, required keys, token counts, ids."""
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        torn = "a torn last line (repaired by 'eagledata resume')"
        if path.parent.name == "pending":
            report.notes.append(f"{relative}: {torn}")
        else:
            report.add(f"{relative}: sealed shard with {torn}")
        if builder is not None:
            builder.hasher.update(data[data.rfind(b"\n") + 1 :])
        data = data[: data.rfind(b"\n") + 1]
    ids: list[str] = []
    for line_no, line in enumerate(data.splitlines(keepends=True), start=1):
        where = f"{relative}:{line_no}"
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            report.add(f"{where}: invalid JSON ({exc})")
            if builder is not None:
                builder.add_unparsable(line)
            continue
        if builder is not None:
            builder.add(line, record)
        report.records += 1
        item_id = _check_record(record, where, report)
        if item_id is not None:
            ids.append(item_id)
    claims.claim_all(ids)


def _check_index(index: ShardIndex, relative: Path, report: VerifyReport, claims: _Claims) -> None:
    """A trusted index stands for its shard: its counts, its finish reasons, its ids."""
    report.records += index.records
    if index.invalid_lines:
        report.add(f"{relative}: {index.invalid_lines} line(s) that are not records")
    for reason in sorted(set(index.finish_reasons) - {"stop", "length"}):
        report.add(f"{relative}: finish_reason {reason!r} is not stop or length")
    claims.claim_all(index.ids)


def _id_sources(path: Path) -> Iterator[tuple[str, str]]:
    """Every (id, where) of a run in verify's order: shards, the open journal, failures."""
    for read in shard_indexes(path, persist=False):
        relative = read.shard.relative_to(path)
        for line_no, item_id in enumerate(read.index.ids, start=1):
            yield item_id, f"{relative}:{line_no}"
    for journal in pending_journals(path):
        relative = journal.relative_to(path)
        for line_no, line in enumerate(iter_jsonl_lines(journal), start=1):
            yield from _id_of(line, f"{relative}:{line_no}")
    failures = path / "failures.jsonl"
    if failures.is_file():
        for line_no, line in enumerate(iter_jsonl_lines(failures), start=1):
            yield from _id_of(line, f"failures.jsonl:{line_no}")


def _id_of(line: bytes, where: str) -> Iterator[tuple[str, str]]:
    with contextlib.suppress(orjson.JSONDecodeError):
        value = orjson.loads(line)
        if isinstance(value, dict) and isinstance(value.get("id"), str):
            yield value["id"], where


def _repeats(path: Path) -> list[str]:
    """``WHERE: id X already at FIRST`` for each repeat: two more passes, over ids only."""
    seen = CompactIdSet()
    repeated: set[str] = set()
    for item_id, _ in _id_sources(path):
        if item_id in seen:
            repeated.add(item_id)
        else:
            seen.add(item_id)
    first: dict[str, str] = {}
    problems = []
    for item_id, where in _id_sources(path):
        if item_id not in repeated:
            continue
        if item_id in first:
            problems.append(f"{where}: id {item_id!r} already at {first[item_id]}")
        else:
            first[item_id] = where
    return problems


def verify_run(path: Path, *, full: bool = False) -> VerifyReport:
    """Check a run directory. Sealed shards are checked through their trusted index; a shard
    whose index cannot be trusted, the open journal, and with ``full`` every shard, line by line
    (``full`` also compares each index with its shard). Nothing is written.
    """
    run_dir = RunDir(path)
    run_dir.read()  # refuses a non-run directory or another schema with its own message
    report = VerifyReport()
    claims = _Claims()
    rebuilt: dict[str, list[str]] = {}
    for shard in sealed_shards(path):
        relative = shard.relative_to(path)
        trusted: ShardIndex | None = None
        try:
            trusted = load_index(shard)
        except IndexRejected as rejected:
            rebuilt.setdefault(rejected.kind, []).append(shard.name)
        if trusted is not None and not full:
            _check_index(trusted, relative, report, claims)
            continue
        try:
            before = shard.stat()
            builder = IndexBuilder(shard.name)
            _check_lines(shard, relative, report, claims, builder)
        except FileNotFoundError:
            continue
        fresh = builder.finish(before.st_size, before.st_mtime_ns)
        if trusted is not None and (differences := index_differences(trusted, fresh)):
            # it passed every quick check, so resume and status would trust it: a problem
            report.add(
                f"{relative}: its index differs from the shard ({', '.join(differences)}); "
                f"delete {index_path(shard).relative_to(path)} and run 'eagledata resume "
                f"{path}' to rebuild it"
            )
    for kind, names in sorted(rebuilt.items()):
        listed = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        report.notes.append(
            f"rebuilt {len(names)} shard index(es) from their shard, {kind}: {listed} "
            "('eagledata resume' writes them back)"
        )
    for journal in pending_journals(path):
        _check_lines(journal, journal.relative_to(path), report, claims, None)
    failures = path / "failures.jsonl"

    def failure_lines() -> Iterator[tuple[int, bytes]]:
        if failures.is_file():
            yield from enumerate(failures.read_bytes().splitlines(), start=1)

    failure_ids: list[str] = []
    for line_no, line in failure_lines():
        where = f"failures.jsonl:{line_no}"
        try:
            entry = orjson.loads(line)
        except orjson.JSONDecodeError:
            report.add(f"{where}: invalid JSON")
            continue
        report.failures += 1
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
            report.add(f"{where}: failure entry without an id")
            continue
        if not entry.get("reason"):
            report.add(f"{where}: failure entry without a reason")
        failure_ids.append(entry["id"])
    claims.claim_all(failure_ids)
    if claims.has_repeats():
        for problem in _repeats(path)[:MAX_LISTED]:
            report.add(problem)
    planned = run_dir.planned()
    plan_complete = (path / "plan.json").is_file()
    accounted = report.records + report.failures
    if plan_complete and planned is not None and accounted != planned:
        report.add(
            f"plan has {planned} items but {accounted} are accounted for "
            f"({report.records} records + {report.failures} failed/skipped)"
        )
    elif not plan_complete:
        report.notes.append("the run has not finished its plan yet; counts are not reconciled")
    del report.problems[MAX_LISTED:]
    return report


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
    recent_tok_per_s: float
    recent_rec_per_s: float
    failure_reasons: dict[str, int]
    quality: str
    overall_tok_per_s: float = 0.0
    finish_reasons: dict[str, int] = field(default_factory=dict)
    flags: dict[str, int] = field(default_factory=dict)
    canary: dict[str, Any] = field(default_factory=dict)
    load: dict[str, Any] | None = None
    speculative: str | None = None
    """Measured speculative acceptance length, when records carry verify counts."""
    speculative_json: dict[str, Any] | None = None

    @property
    def left(self) -> int | None:
        if self.planned is None:
            return None
        return max(self.planned - self.written - self.failed - self.skipped, 0)

    @property
    def eta_s(self) -> float | None:
        if self.left is None or self.recent_rec_per_s <= 0:
            return None
        return self.left / self.recent_rec_per_s

    def render(self) -> str:
        planned = "?" if self.planned is None else f"{self.planned:,}"
        if self.planned is not None and not self.plan_complete:
            planned += " (estimate)"
        left = "?" if self.left is None else f"{self.left:,}"
        eta = "?" if self.eta_s is None else _duration(self.eta_s)
        lines = [
            f"run:      {self.run_dir}",
            f"planned:  {planned}",
            f"written:  {self.written:,}",
            f"failed:   {self.failed:,}" + _reasons(self.failure_reasons),
            f"skipped:  {self.skipped:,}",
            f"left:     {left}",
            f"tokens:   {self.prompt_tokens:,} prompt, {self.completion_tokens:,} output",
            f"quality:  {self.quality}",
            f"canary:   {canary_line(self.canary)}",
            f"rate:     {self.recent_tok_per_s:,.1f} output tok/s, "
            f"{self.recent_rec_per_s * 3600:,.0f} records/h (last 10 min)",
            f"eta:      {eta}",
        ]
        if self.speculative is not None:
            lines.append(f"spec:     {self.speculative}")
        lines += [f"load:     {_load_line(entry)}" for entry in (self.load or {}).values()]
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        """The ``status --json`` object (docs/run-directory.md)."""
        return {
            "run_dir": self.run_dir,
            "planned": self.planned,
            "plan_complete": self.plan_complete,
            "written": self.written,
            "failed": self.failed,
            "skipped": self.skipped,
            "left": self.left,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.completion_tokens,
            "tok_s": {"overall": self.overall_tok_per_s, "recent": self.recent_tok_per_s},
            "eta_s": self.eta_s,
            "finish_reasons": dict(self.finish_reasons),
            "failure_reasons": dict(self.failure_reasons),
            "quality": {"flags": dict(self.flags), "canary": dict(self.canary)},
            "load": self.load,
            "speculative": self.speculative_json,
        }


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


def canary_summary(path: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """``{"enabled", "checks", "passed", "failed", "baseline", "last"}`` from run.json and
    ``quality.jsonl``. ``checks`` counts every canary check after the baseline runs."""
    setting = manifest.get("canary")
    enabled = bool(setting.get("enabled")) if isinstance(setting, dict) else False
    summary: dict[str, Any] = {
        "enabled": enabled,
        "disabled_by_flag": isinstance(setting, dict) and not enabled,
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
            entry = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(entry, dict):
            continue
        if entry.get("kind") == "baseline":
            summary["baseline"] += 1
            continue
        summary["checks"] += 1
        verdict = entry.get("verdict")
        if verdict == "pass":
            summary["passed"] += 1
        elif verdict == "error":
            summary["errors"] += 1
        elif verdict == "fired":  # past a threshold once; its immediate rerun decided
            summary["fired"] += 1
        else:
            summary["failed"] += 1
        summary["last"] = entry
    return summary


TELEMETRY_TAIL_BYTES = 256 * 1024


def latest_load(path: Path) -> dict[str, Any] | None:
    """The latest ``telemetry.jsonl`` sample per server (read from the file's tail only)."""
    telemetry = path / "telemetry.jsonl"
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
            sample = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(sample, dict) and isinstance(sample.get("server"), str):
            latest[sample["server"]] = sample
    return latest or None


def _load_line(entry: dict[str, Any]) -> str:
    """One server's latest sample: what its operator would read in the server log."""
    server = str(entry.get("server"))
    if entry.get("rank") is not None:
        server += f" rank {entry['rank']}"
    usage = entry.get("token_usage")
    parts = [
        "kv ?" if usage is None else f"kv {100 * usage:.0f}%",
        f"running {entry.get('num_running_reqs', '?')}",
        f"queued {entry.get('num_queue_reqs', '?')}",
    ]
    if entry.get("gen_throughput") is not None:
        parts.append(f"{entry['gen_throughput']:,.0f} tok/s")
    parts.append(f"in flight {entry.get('in_flight', '?')} (target {entry.get('target', '?')})")
    parts.append(f"retractions seen {entry.get('num_retracted_reqs', 0)}")
    age = time.time() - float(entry.get("time") or 0)
    return f"{server}: " + ", ".join(parts) + f" ({_duration(max(0.0, age))} ago)"


def _reasons(reasons: dict[str, int]) -> str:
    if not reasons:
        return ""
    return " (" + ", ".join(f"{name} {count}" for name, count in sorted(reasons.items())) + ")"


def _duration(seconds: float) -> str:
    hours, rest = divmod(int(seconds), 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def run_status(path: Path, window_s: float = 600.0) -> StatusReport:
    run_dir = RunDir(path)
    manifest = run_dir.read()
    totals = scan_totals(path, recent_window_s=window_s)
    now = time.time()
    tokens = sum(count for _, count in totals.recent)
    span = min(window_s, now - min((t for t, _ in totals.recent), default=now))
    span = max(span, 1.0)
    return StatusReport(
        run_dir=str(path),
        planned=run_dir.planned(),
        plan_complete=(path / "plan.json").is_file(),
        written=totals.written,
        failed=totals.failed,
        skipped=totals.skipped,
        prompt_tokens=totals.prompt_tokens,
        completion_tokens=totals.completion_tokens,
        recent_tok_per_s=tokens / span if totals.recent else 0.0,
        recent_rec_per_s=len(totals.recent) / span if totals.recent else 0.0,
        failure_reasons=totals.failure_reasons,
        quality=totals.quality_line(),
        overall_tok_per_s=_overall_rate(totals.completion_tokens, totals),
        finish_reasons=totals.finish_reasons,
        flags=totals.flags,
        canary=canary_summary(path, manifest),
        load=latest_load(path),
        speculative=totals.acceptance.line(),
        speculative_json=totals.acceptance.to_json(),
    )


def _overall_rate(tokens: int, totals: RunTotals) -> float:
    """Output tokens over the span from the first to the last record's completion."""
    if totals.first_created is None or totals.last_created is None:
        return 0.0
    return tokens / max(totals.last_created - totals.first_created, 1.0)
