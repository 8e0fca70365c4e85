"""What a run directory holds, counted from its committed files: the record files and shard
indexes to read (``record_files``, ``sealed_shards``, ``pending_journals``, ``shard_indexes``),
the failure lines, and ``scan_totals`` (counts, tokens, finish reasons, flags, the done ids, per
dataset: ``RunTotals``). The source of truth for "done" is these files, never a counter
(``manifest.py``: the run directory's layout).
"""

from __future__ import annotations

import os
import time
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from eagledata.errors import RunDirError
from eagledata.rundir.acceptance import Acceptance
from eagledata.rundir.idset import CompactIdSet
from eagledata.rundir.journal import (
    SHARD_PATTERN,
    iter_jsonl_lines,
)
from eagledata.rundir.lines import FailureLine, LineError, RecordLine
from eagledata.rundir.percentile import percentile
from eagledata.rundir.planstate import PlanStateBuilder
from eagledata.rundir.rates import Rate, run_rates
from eagledata.rundir.shardindex import IndexRead, iter_indexes


@dataclass
class DatasetTotals:
    """One dataset's share of a run's counts (a run of several datasets: ``--dataset`` repeated
    or a ``[mixes.NAME]``)."""

    written: int = 0
    failed: int = 0
    skipped: int = 0
    failure_reasons: dict[str, int] = field(default_factory=dict)
    skipped_reasons: dict[str, int] = field(default_factory=dict)


@dataclass
class RunTotals:
    """Counts over a run directory's committed files."""

    written: int = 0
    failed: int = 0
    skipped: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # 16 B an id (``idset``): a million done ids cost 16 MB, not 100
    done_ids: CompactIdSet = field(default_factory=CompactIdSet)
    # Per record, aligned with ``output_lengths``: when its request was sent and when it
    # completed, for the run's active time (rundir/rates.py): 16 B a record.
    starts: array[float] = field(default_factory=lambda: array("d"))
    ends: array[float] = field(default_factory=lambda: array("d"))
    failure_reasons: dict[str, int] = field(default_factory=dict)
    """Every failure-file entry by reason (failed and skipped)."""
    skipped_reasons: dict[str, int] = field(default_factory=dict)
    """The skipped entries alone, by reason (``duplicate``, ``duplicate_id``)."""
    datasets: dict[str, DatasetTotals] = field(default_factory=dict)
    # Quality, not speed: an answer cut at max_new_tokens teaches a drafter to never stop.
    finish_reasons: dict[str, int] = field(default_factory=dict)
    output_lengths: array[int] = field(default_factory=lambda: array("l"))
    # Quality flags (quality/flags.py): records carrying each flag.
    flags: dict[str, int] = field(default_factory=dict)
    flagged: int = 0
    # The span of completion times.
    first_created: float | None = None
    last_created: float | None = None
    # Speculative decoding: completion tokens over verify counts (rundir/acceptance.py)
    acceptance: Acceptance = field(default_factory=Acceptance)
    # shard indexes that could not be trusted and were rebuilt from their shard, by reason
    indexes_rebuilt: dict[str, int] = field(default_factory=dict)
    # records and failure lines per settings fingerprint ("": lines without one)
    settings: dict[str, int] = field(default_factory=dict)

    def rates(self, now: float, window_s: float) -> tuple[Rate, Rate]:
        """The run's output rate and the last ``window_s``'s (rundir/rates.py)."""
        return run_rates(self.starts, self.ends, self.output_lengths, now=now, window_s=window_s)

    def dataset(self, name: str) -> DatasetTotals:
        found = self.datasets.get(name)
        if found is None:
            found = self.datasets[name] = DatasetTotals()
        return found

    def flags_line(self) -> str:
        """``flags: degenerate 3 (0.3%), truncated 12 (1.2%)``, or ``flags: none``."""
        if not self.flags:
            return "flags: none"
        parts = [
            f"{name} {count:,} ({count / max(self.written, 1):.1%})"
            for name, count in sorted(self.flags.items(), key=lambda kv: (-kv[1], kv[0]))
        ]
        return "flags: " + ", ".join(parts)

    def quality_line(self) -> str:
        """Finish reasons and answer lengths: the numbers that say whether data is usable."""
        if not self.written:
            return "no records yet"
        parts = []
        for reason, count in sorted(self.finish_reasons.items(), key=lambda kv: -kv[1]):
            share = f"{count:,} ({count / self.written:.1%})"
            parts.append(
                f"{reason} {share}" + (": cut at max_new_tokens" if reason == "length" else "")
            )
        p50 = self.output_length_percentile(0.5)
        p90 = self.output_length_percentile(0.9)
        longest = max(self.output_lengths)
        return (
            f"{', '.join(parts)}; output tokens p50 {p50:,}, p90 {p90:,}, max {longest:,}; "
            + self.flags_line()
        )

    def output_length_percentile(self, fraction: float) -> int | None:
        """The answers' nearest-rank percentile (rundir/percentile.py: the report's and
        export's too)."""
        return percentile(self.output_lengths, fraction)


def count_mismatch(
    run_dir: Path | str,
    planned: int | None,
    written: int,
    failed: int,
    skipped: int,
    *,
    plan_complete: bool,
) -> str | None:
    """Why ``planned = written + failed + skipped + left`` cannot hold with ``left >= 0``: the
    run holds more outcomes than its plan, read to its end, has items. None when it holds, or
    when ``planned`` is only an estimate (a share of a dataset's rows is its expected count)."""
    done = written + failed + skipped
    if planned is None or not plan_complete or done <= planned:
        return None
    return (
        f"{run_dir} holds {done:,} records and failure lines (written {written:,} + failed "
        f"{failed:,} + skipped {skipped:,}) but its plan has {planned:,} items: "
        f"{done - planned:,} more than planned, so its dataset or its files changed under it; "
        f"run 'eagledata verify {run_dir}' to find them"
    )


def record_files(run_dir: Path) -> list[Path]:
    """Every file that holds records: sealed shards, then the open journal."""
    return sealed_shards(run_dir) + pending_journals(run_dir)


def sealed_shards(run_dir: Path) -> list[Path]:
    folder = run_dir / "shards"
    if not folder.is_dir():
        return []
    return [folder / name for name in sorted(os.listdir(folder)) if SHARD_PATTERN.match(name)]


def pending_journals(run_dir: Path) -> list[Path]:
    folder = run_dir / "pending"
    if not folder.is_dir():
        return []
    return [folder / name for name in sorted(os.listdir(folder)) if SHARD_PATTERN.match(name)]


def shard_indexes(run_dir: Path, *, persist: bool = False) -> Iterator[IndexRead]:
    """The trusted index of every sealed shard (rebuilt from the shard where it must be).

    ``persist`` writes rebuilt indexes back (best effort), so the next reader finds them: only
    the process holding the run's lock (``generate``, ``resume``) does; readers (``status``,
    ``verify``, export, report) leave the run directory as they found it.
    """
    return iter_indexes(sealed_shards(run_dir), persist=persist)


def _count(table: dict[str, int], key: str, count: int = 1) -> None:
    table[key] = table.get(key, 0) + count


def scan_totals(
    run_dir: Path,
    recent_window_s: float = 600.0,
    *,
    persist_indexes: bool = False,
    plan_state: PlanStateBuilder | None = None,
) -> RunTotals:
    """Counts over the committed files: shard indexes, the open journal's lines, the failures.
    ``plan_state`` is fed what a resumed plan needs from the same reads (``planstate``).

    Memory: about 16 B per done id and 8 B per record (answer lengths), whatever the record size.
    """
    totals = RunTotals()
    horizon = time.time() - recent_window_s
    for read in shard_indexes(run_dir, persist=persist_indexes):
        index = read.index
        if read.rebuilt is not None:
            _count(totals.indexes_rebuilt, read.rebuilt)
        if plan_state is not None:
            plan_state.add_index(read.shard, index)
        for name, count in index.datasets.items():
            totals.dataset(name).written += count
        totals.done_ids.update(index.ids)
        totals.written += index.records
        totals.prompt_tokens += index.prompt_tokens
        totals.completion_tokens += index.completion_tokens
        totals.output_lengths.extend(index.completion_lengths)
        totals.starts.extend(index.started_at)
        totals.ends.extend(index.created_at)
        for finish, count in index.finish_reasons.items():
            _count(totals.finish_reasons, finish, count)
        for flag, count in index.flags.items():
            _count(totals.flags, flag, count)
        totals.flagged += index.flagged
        for fingerprint, count in index.settings.items():
            _count(totals.settings, fingerprint, count)
        if not index.created_at:
            continue
        first, last = min(index.created_at), max(index.created_at)
        if totals.first_created is None or first < totals.first_created:
            totals.first_created = first
        if totals.last_created is None or last > totals.last_created:
            totals.last_created = last
        if any(index.spec_verify_ct):  # speculative decoding: per record, as the lines would
            for created, tokens, verify_ct in zip(
                index.created_at, index.completion_lengths, index.spec_verify_ct, strict=True
            ):
                totals.acceptance.add(verify_ct, tokens, recent=created >= horizon)
    for path in pending_journals(run_dir):  # the open journal: at most shard_size lines
        for line_no, line in enumerate(iter_jsonl_lines(path), start=1):
            try:
                record = RecordLine.parse(line)
            except LineError as exc:
                raise RunDirError(
                    f"{path}:{line_no} is not a record ({exc}); run 'eagledata verify RUN_DIR "
                    "--repair' to move it aside ('eagledata resume RUN_DIR' then generates its "
                    "item again)"
                ) from None
            _count(totals.settings, record.settings or "")
            if plan_state is not None:
                plan_state.add_record(record)
            totals.dataset(record.dataset).written += 1
            totals.done_ids.add(record.id)
            totals.written += 1
            totals.prompt_tokens += record.prompt_tokens
            totals.completion_tokens += record.completion_tokens
            totals.output_lengths.append(record.completion_tokens)
            _count(totals.finish_reasons, record.finish_reason)
            fired = record.flags.names() if record.flags is not None else ()
            if fired:  # flags None: a record written before flags existed
                totals.flagged += 1
                for flag in fired:
                    _count(totals.flags, flag)
            created = record.created_at
            if totals.first_created is None or created < totals.first_created:
                totals.first_created = created
            if totals.last_created is None or created > totals.last_created:
                totals.last_created = created
            totals.ends.append(created)
            totals.starts.append(created - max(record.e2e_latency, 0.0))  # 0.0: not reported
            totals.acceptance.add(
                record.spec_verify_ct, record.completion_tokens, recent=created >= horizon
            )
    failures = run_dir / "failures.jsonl"
    if failures.is_file():
        for entry in failure_lines(failures):
            _count(totals.settings, entry.settings or "")
            if plan_state is not None:
                plan_state.add_failure(entry)
            totals.done_ids.add(entry.id)
            of_dataset = totals.dataset(entry.dataset)
            if entry.status == "skipped":
                totals.skipped += 1
                of_dataset.skipped += 1
                _count(totals.skipped_reasons, entry.reason)
                _count(of_dataset.skipped_reasons, entry.reason)
            else:
                totals.failed += 1
                of_dataset.failed += 1
                _count(of_dataset.failure_reasons, entry.reason)
            _count(totals.failure_reasons, entry.reason)
    return totals


def failure_lines(path: Path) -> Iterator[FailureLine]:
    """Every whole line of a failure file (``failures.jsonl``), as its contract."""
    for line_no, line in enumerate(iter_jsonl_lines(path), start=1):
        try:
            yield FailureLine.parse(line)
        except LineError as exc:
            raise RunDirError(
                f"{path}:{line_no} is not a failure line ({exc}); run 'eagledata verify "
                "RUN_DIR --repair' to move it aside ('eagledata resume RUN_DIR' then "
                "generates its item again)"
            ) from None
