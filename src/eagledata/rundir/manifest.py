"""Step 7: the run directory's state: frozen settings, lock, what is done, what is left.

Layout of a run directory::

    run.json          schema version, frozen settings + fingerprint, versions, server facts
    shards/*.jsonl    sealed record shards (complete or absent)
    shards/*.idx.json one index per sealed shard (``shardindex``): read instead of the records
    pending/*.jsonl   the open journal of the running (or crashed) process
    failures.jsonl    items that ended without a record, with their reason
    checks.jsonl      every KV-guard check: server, time, verdict
    plan.json         the plan's size (in all and per dataset), once the datasets have been read
                      to their end
    .lock             held (flock) by the one process working on the run

The source of truth for "done" is the set of ids in ``shards/``, ``pending/`` and
``failures.jsonl``: state derived from the committed files, never a separate counter that a crash
could leave out of step. The ids of a sealed shard are read from its index when the index matches
the shard, and from the shard's lines otherwise (``shardindex``).

What other parts read (export, report, status): ``scan_totals`` (counts, tokens, finish reasons,
flags, the done ids), ``shard_indexes`` (per-shard ids and totals), ``sealed_shards`` and
``record_files`` (the files to read records from).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import platform
import time
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from eagledata import __version__
from eagledata.atomic import atomic_write
from eagledata.config import FrozenSettings, format_validation_error
from eagledata.errors import RunDirError
from eagledata.rundir.acceptance import Acceptance
from eagledata.rundir.idset import CompactIdSet
from eagledata.rundir.journal import (
    SHARD_PATTERN,
    Journal,
    iter_jsonl_lines,
    repair_torn_tail,
    storage_error,
)
from eagledata.rundir.lines import FailureLine, LineError, RecordLine, line_schemas
from eagledata.rundir.planstate import PlanStateBuilder
from eagledata.rundir.rates import Rate, run_rates
from eagledata.rundir.shardindex import IndexRead, iter_indexes

SCHEMA_VERSION = 1


def write_json_atomic(path: Path, value: Any) -> None:
    try:
        atomic_write(path, orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
    except OSError as exc:
        raise storage_error("write", path, exc) from None


def library_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    versions = {"eagledata": __version__, "python": platform.python_version()}
    for package in ("transformers", "tokenizers", "datasets", "httpx"):
        try:
            versions[package] = version(package)
        except PackageNotFoundError:
            continue
    return versions


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
        if not self.output_lengths:
            return None
        ordered = sorted(self.output_lengths)
        return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


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


class RunDir:
    """A run directory, held under an exclusive lock while a process works on it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock_fd: int | None = None

    @property
    def run_json(self) -> Path:
        return self.path / "run.json"

    def exists(self) -> bool:
        return self.run_json.is_file()

    def lock(self) -> None:
        """Hold the run directory itself (``flock`` on the folder, not on a file in it: a file
        can be deleted under a running process, and the next one would lock a new one). ``.lock``
        only says which process holds it."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_DIRECTORY)  # opened read-only
        except OSError as exc:
            raise storage_error("create", self.path, exc) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunDirError(
                f"another eagledata process is working on {self.path}; wait for it or stop it"
            ) from None
        self._lock_fd = fd
        with contextlib.suppress(OSError):  # a note for people; the lock does not depend on it
            (self.path / ".lock").write_text(f"{os.getpid()}\n")

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def read(self) -> dict[str, Any]:
        try:
            manifest = orjson.loads(self.run_json.read_bytes())
        except FileNotFoundError:
            raise RunDirError(
                f"{self.path} is not an eagledata run directory (no run.json); "
                "start one with 'eagledata generate --out DIR'"
            ) from None
        except (OSError, orjson.JSONDecodeError) as exc:
            raise RunDirError(f"{self.run_json} is unreadable: {exc}") from None
        version = manifest.get("schema_version") if isinstance(manifest, dict) else None
        if version != SCHEMA_VERSION:
            raise RunDirError(
                f"{self.path} was written with run schema {version}, this eagledata reads "
                f"{SCHEMA_VERSION}; use the eagledata version that made it, or a new --out"
            )
        return dict(manifest)

    def frozen(self) -> FrozenSettings:
        """The run's frozen settings, checked by this release: one it refuses is named."""
        try:
            return FrozenSettings.model_validate(self.read().get("frozen"))
        except ValidationError as exc:
            problems = format_validation_error(exc, f"{self.run_json}: frozen.")
            raise RunDirError(
                f"{problems}; the run was started with a setting this eagledata refuses: "
                "continue it with the eagledata version that started it, or start a new run "
                "with --out"
            ) from None

    def create(self, frozen: FrozenSettings, extra: dict[str, Any]) -> None:
        manifest = {
            "schema_version": SCHEMA_VERSION,
            "fingerprint": frozen.fingerprint(),
            "frozen": frozen.model_dump(mode="json", by_alias=True),
            "created_at": time.time(),
            "versions": library_versions(),
            # each line kind's schema (rundir/lines.py): what a later reader checks it can take
            "line_schemas": line_schemas(),
            **extra,
        }
        write_json_atomic(self.run_json, manifest)

    def update(self, **changes: Any) -> None:
        manifest = self.read()
        manifest.update(changes)
        write_json_atomic(self.run_json, manifest)

    def check_frozen(self, requested: FrozenSettings) -> None:
        """Refuse to continue with settings that differ, naming the keys that differ."""
        stored = self.frozen()
        if stored.fingerprint() == requested.fingerprint():
            return
        old = _flatten(stored.model_dump(mode="json", by_alias=True))
        new = _flatten(requested.model_dump(mode="json", by_alias=True))
        keys = sorted(key for key in old.keys() | new.keys() if old.get(key) != new.get(key))
        if not keys:  # the same datasets, named in another order: the plan would differ
            keys = ["mix (the order of its datasets)"]
        raise RunDirError(
            f"{self.path} was started with other settings ({', '.join(keys)}); resume it with "
            "'eagledata resume RUN_DIR' or pass a new --out"
        )

    def check_adopted(self, totals: RunTotals, fingerprint: str, *, vouched: bool) -> None:
        """Refuse records and failure lines made under other settings than ``fingerprint`` (this
        run's): a new ``run.json`` must never adopt data made under another one. Lines without a
        fingerprint (an earlier eagledata wrote them) are taken only where ``vouched``: the
        ``run.json`` they were written under is still there."""
        foreign = {key: count for key, count in totals.settings.items() if key != fingerprint}
        unmarked = foreign.pop("", 0)
        if foreign:
            count = sum(foreign.values())
            made = ", ".join(sorted(foreign))
            raise RunDirError(
                f"{self.path} holds {count:,} records or failures made under other settings "
                f"(fingerprint {made}; this run's is {fingerprint}); they cannot join this run: "
                "restore the run.json they were made with and 'eagledata resume RUN_DIR', or "
                "pass a new --out"
            )
        if unmarked and not vouched:
            raise RunDirError(
                f"{self.path} holds {unmarked:,} records or failures but no run.json saying "
                "which settings made them; they cannot join a new run: restore its run.json and "
                "'eagledata resume RUN_DIR', or pass a new --out"
            )

    def planned(self) -> int | None:
        path = self.path / "plan.json"
        if path.is_file():
            return int(orjson.loads(path.read_bytes())["planned"])
        estimate = self.read().get("planned_estimate")
        return int(estimate) if estimate is not None else None

    def set_planned(self, planned: int, by_dataset: dict[str, int] | None = None) -> None:
        plan: dict[str, Any] = {"planned": planned}
        if by_dataset is not None:
            plan["datasets"] = dict(by_dataset)
        write_json_atomic(self.path / "plan.json", plan)

    def planned_by_dataset(self) -> dict[str, int] | None:
        """Each dataset's planned items, once the plan is complete (runs since turns existed)."""
        path = self.path / "plan.json"
        if not path.is_file():
            return None
        datasets = orjson.loads(path.read_bytes()).get("datasets")
        if not isinstance(datasets, dict):
            return None
        return {str(name): int(count) for name, count in datasets.items()}

    def requeue_failures(self) -> int:
        """Forget the failed items (not the skipped ones), so this session generates them again.

        The kept lines are written to a temporary file, fsynced and renamed over
        ``failures.jsonl``: a crash leaves either the old file or the new one, never a mix.
        Call it under the lock. Returns how many items were put back in the plan.
        """
        path = self.path / "failures.jsonl"
        if not path.is_file():
            return 0
        try:
            repair_torn_tail(path)
            kept, requeued = [], 0
            for line in iter_jsonl_lines(path):
                if FailureLine.parse(line).status == "skipped":
                    kept.append(line)
                else:
                    requeued += 1
            if requeued:
                atomic_write(path, b"".join(kept))
        except OSError as exc:
            raise storage_error("rewrite", path, exc) from None
        return requeued

    def check_log(self, fsync_interval_s: float) -> Journal:
        return Journal(self.path / "checks.jsonl", fsync_interval_s)


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        flat: dict[str, Any] = {}
        for key, item in value.items():
            flat.update(_flatten(item, f"{prefix}{key}."))
        return flat
    if (
        isinstance(value, list)
        and value
        and all(isinstance(item, dict) and isinstance(item.get("name"), str) for item in value)
    ):  # a run's datasets (``mix``): named by their names, not their positions
        return _flatten({item["name"]: item for item in value}, prefix)
    return {prefix.rstrip("."): value}
