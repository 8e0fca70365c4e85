"""``eagledata verify``: checks a run directory's committed data, line by line where needed.

It reads committed data only and writes nothing: a shard index it cannot trust is rebuilt in
memory; the next ``resume`` (which holds the run's lock) writes it back. ``status`` (the run's
counts and rates) is in ``status``.

``verify --repair`` (``repair_run``) is the way back from damage: under the run's lock it moves
every line that does not read as what its file holds (``shards/``, ``pending/``,
``failures.jsonl``) into ``quarantine.jsonl`` (``rundir/quarantine.py``) and rebuilds the shard
indexes; ``resume`` then generates those items again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from eagledata.rundir.idset import CompactIdSet
from eagledata.rundir.journal import iter_jsonl_lines
from eagledata.rundir.lines import FailureLine, LineError, RecordLine
from eagledata.rundir.manifest import RunDir
from eagledata.rundir.quarantine import Quarantine, failure_problem, record_problem
from eagledata.rundir.rowprints import RowPrints, rows_path
from eagledata.rundir.shardindex import (
    IndexBuilder,
    build_index,
    index_differences,
    load_index,
    write_index,
)
from eagledata.rundir.shardindex_format import IndexRejected, ShardIndex, index_path
from eagledata.rundir.totals import pending_journals, sealed_shards, shard_indexes

MAX_LISTED = 50
REPAIR = "run 'eagledata verify RUN_DIR --repair' to move it aside"


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


def _check_record(record: object, where: str, report: VerifyReport, rows: RowPrints) -> str | None:
    """The line against the record contract (``rundir/lines.py``), then SGLang's own counts,
    then its row's hash against the run's rows."""
    try:
        line = RecordLine.from_object(record)
    except LineError as exc:
        report.add(f"{where}: not a record ({exc}); {REPAIR}")
        return None
    if (problem := rows.problem(line.id, line.row_hash)) is not None:
        report.add(f"{where}: {line.id}: {problem}")
    if line.prompt_tokens != len(line.input_ids):
        report.add(
            f"{where}: prompt_tokens {line.prompt_tokens} != {len(line.input_ids)} ids; {REPAIR}"
        )
    if line.completion_tokens != len(line.output_ids):
        report.add(
            f"{where}: completion_tokens {line.completion_tokens} != {len(line.output_ids)} ids; "
            + REPAIR
        )
    elif (
        line.finish_reason == "stop"
        and line.matched is not None
        and (not line.output_ids or line.output_ids[-1] != line.matched)
    ):
        report.add(f"{where}: finish 'stop' but the matched token is not the last output id")
    return line.id


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
    rows: RowPrints,
) -> None:
    """Read every line of a shard or journal: JSON, required keys, token counts, ids."""
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        torn = "a torn last line (repaired by 'eagledata resume')"
        if path.parent.name == "pending":
            report.notes.append(f"{relative}: {torn}")
        else:
            report.add(f"{relative}: sealed shard with a torn last line; {REPAIR}")
        if builder is not None:
            builder.hasher.update(data[data.rfind(b"\n") + 1 :])
        data = data[: data.rfind(b"\n") + 1]
    ids: list[str] = []
    for line_no, line in enumerate(data.splitlines(keepends=True), start=1):
        where = f"{relative}:{line_no}"
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            report.add(f"{where}: invalid JSON ({exc}); {REPAIR}")
            if builder is not None:
                builder.add_unparsable(line)
            continue
        if builder is not None:
            builder.add(line, record)
        report.records += 1
        item_id = _check_record(record, where, report, rows)
        if item_id is not None:
            ids.append(item_id)
    claims.claim_all(ids)


def _check_index(
    index: ShardIndex, relative: Path, report: VerifyReport, claims: _Claims, rows: RowPrints
) -> None:
    """A trusted index stands for its shard: its counts, its finish reasons, its ids, its
    records' row hashes."""
    report.records += index.records
    for item_id, row_hash in zip(index.ids, index.row_hashes, strict=True):
        if (problem := rows.problem(item_id, row_hash)) is not None:
            report.add(f"{relative}: {item_id}: {problem}")
    if index.invalid_lines:
        report.add(f"{relative}: {index.invalid_lines} line(s) that are not records; {REPAIR}")
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
    manifest = run_dir.manifest()  # refuses a non-run directory or another schema with its message
    datasets = manifest.datasets
    rows = RowPrints.load(path, datasets or ())
    report = VerifyReport()
    for name in sorted(set(datasets or ()) - rows.datasets):
        report.add(
            f"{rows_path(path, name).relative_to(path)} is missing: run.json records dataset "
            f"{name}, but its rows are gone and its records cannot be checked against them; "
            "restore the file from a copy of the run"
        )
    claims = _Claims()
    rebuilt: dict[str, list[str]] = {}
    settings: dict[str, dict[str, int]] = {}
    """Lines per settings fingerprint, per file."""
    for shard in sealed_shards(path):
        relative = shard.relative_to(path)
        trusted: ShardIndex | None = None
        try:
            trusted = load_index(shard)
        except IndexRejected as rejected:
            rebuilt.setdefault(rejected.kind, []).append(shard.name)
        if trusted is not None and not full:
            _check_index(trusted, relative, report, claims, rows)
            settings[str(relative)] = dict(trusted.settings)
            continue
        try:
            before = shard.stat()
            builder = IndexBuilder(shard.name)
            _check_lines(shard, relative, report, claims, builder, rows)
        except FileNotFoundError:
            continue
        fresh = builder.finish(before.st_size, before.st_mtime_ns)
        settings[str(relative)] = dict(fresh.settings)
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
        journal_index = IndexBuilder(journal.name)
        _check_lines(journal, journal.relative_to(path), report, claims, journal_index, rows)
        settings[str(journal.relative_to(path))] = journal_index.settings
    failures = path / "failures.jsonl"

    def failure_lines() -> Iterator[tuple[int, bytes]]:
        if failures.is_file():
            yield from enumerate(failures.read_bytes().splitlines(), start=1)

    failure_ids: list[str] = []
    for line_no, line in failure_lines():
        where = f"failures.jsonl:{line_no}"
        problem = failure_problem(line)
        if problem is not None:
            report.add(f"{where}: {problem}; {REPAIR}")
            continue
        entry = FailureLine.parse(line)
        report.failures += 1
        if not entry.reason:
            report.add(f"{where}: failure entry without a reason")
        failure_ids.append(entry.id)
        _count(settings, "failures.jsonl", entry.settings or "")
    claims.claim_all(failure_ids)
    _check_settings(settings, run_dir.manifest().fingerprint, report)
    if claims.has_repeats():
        for problem in _repeats(path)[:MAX_LISTED]:
            report.add(problem)
    planned = run_dir.planned()
    plan_complete = run_dir.plan_file() is not None
    accounted = report.records + report.failures
    if plan_complete and planned is not None and accounted != planned:
        report.add(
            f"plan has {planned} items but {accounted} are accounted for "
            f"({report.records} records + {report.failures} failed/skipped)"
        )
    elif not plan_complete:
        report.notes.append("the run has not finished its plan yet; counts are not reconciled")
    del report.problems[MAX_LISTED:]
    report.problems = [problem.replace("RUN_DIR", str(path)) for problem in report.problems]
    return report


def _count(table: dict[str, dict[str, int]], where: str, key: str) -> None:
    counts = table.setdefault(where, {})
    counts[key] = counts.get(key, 0) + 1


def _check_settings(
    settings: dict[str, dict[str, int]], fingerprint: str, report: VerifyReport
) -> None:
    """Every line made under the run's own settings (``run.json``'s fingerprint); lines
    without a fingerprint were written by an earlier eagledata, under that same run.json."""
    for where, counts in settings.items():
        foreign = {key: n for key, n in counts.items() if key and key != fingerprint}
        if foreign:
            report.add(
                f"{where}: {sum(foreign.values())} line(s) made under other settings "
                f"(fingerprint {', '.join(sorted(foreign))}), not this run's ({fingerprint}): "
                "they are another run's data; move them back to the run they came from"
            )


@dataclass
class RepairReport:
    moved: dict[str, int]
    """Lines moved into the quarantine, per file they were in."""
    quarantine: Path

    @property
    def total(self) -> int:
        return sum(self.moved.values())

    def render(self, path: Path) -> str:
        if not self.total:
            return f"nothing to repair: every line of {path} reads as what its file holds"
        files = ", ".join(f"{source} {count}" for source, count in sorted(self.moved.items()))
        return (
            f"moved {self.total} unreadable line(s) into {self.quarantine} ({files}) and rebuilt "
            f"the shard indexes; 'eagledata resume {path}' will generate their items again"
        )


def repair_run(path: Path) -> RepairReport:
    """Move every line that does not read as what its file holds out of the run's data into
    ``quarantine.jsonl``, and rebuild the shard indexes. Under the run's lock (no process may
    write the files being rewritten)."""
    run_dir = RunDir(path)
    run_dir.manifest()
    run_dir.lock()
    quarantine = Quarantine(path)
    try:
        for shard in sealed_shards(path):
            if quarantine.move_aside(shard, record_problem, torn_tail=True):
                if shard.stat().st_size == 0:  # nothing of it was a record
                    shard.unlink()
                    index_path(shard).unlink(missing_ok=True)
                else:
                    write_index(shard, build_index(shard))
        for journal in pending_journals(path):  # its torn tail is resume's to cut
            quarantine.move_aside(journal, record_problem, torn_tail=False)
        failures = path / "failures.jsonl"
        if failures.is_file():
            quarantine.move_aside(failures, failure_problem, torn_tail=False)
        for _ in shard_indexes(path, persist=True):  # an index not trusted is written again
            pass
    finally:
        quarantine.close()
        run_dir.unlock()
    return RepairReport(dict(quarantine.moved), quarantine.path)
