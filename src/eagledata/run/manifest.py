"""Step 7: the run directory's state: frozen settings, lock, what is done, what is left.

Layout of a run directory::

    run.json          schema version, frozen settings + fingerprint, versions, server facts
    shards/*.jsonl    sealed record shards (complete or absent)
    pending/*.jsonl   the open journal of the running (or crashed) process
    failures.jsonl    items that ended without a record, with their reason
    checks.jsonl      every KV-guard check: server, time, verdict
    plan.json         the plan's size, once the dataset has been read to its end
    .lock             held (flock) by the one process working on the run

The source of truth for "done" is the set of ids in ``shards/``, ``pending/`` and
``failures.jsonl``: state derived from the committed files, never a separate counter that a crash
could leave out of step.
"""

from __future__ import annotations

import fcntl
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from eagledata import __version__
from eagledata.config import FrozenSettings
from eagledata.errors import RunDirError
from eagledata.run.acceptance import Acceptance
from eagledata.run.writer import (
    SHARD_PATTERN,
    Journal,
    fsync_dir,
    iter_jsonl_lines,
    repair_torn_tail,
    storage_error,
)

SCHEMA_VERSION = 1


def write_json_atomic(path: Path, value: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        with tmp.open("wb") as handle:
            handle.write(orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
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
class RunTotals:
    """Counts over a run directory's committed files."""

    written: int = 0
    failed: int = 0
    skipped: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    done_ids: set[str] = field(default_factory=set)
    # (completion time, completion tokens) of records, for the recent rate in ``status``
    recent: list[tuple[float, int]] = field(default_factory=list)
    failure_reasons: dict[str, int] = field(default_factory=dict)
    # Quality, not speed: an answer cut at max_new_tokens teaches a drafter to never stop.
    finish_reasons: dict[str, int] = field(default_factory=dict)
    output_lengths: list[int] = field(default_factory=list)
    # Quality flags (quality/flags.py): records carrying each flag.
    flags: dict[str, int] = field(default_factory=dict)
    flagged: int = 0
    # The span of completion times, for the overall rate in ``status --json``.
    first_created: float | None = None
    last_created: float | None = None
    # Speculative decoding: completion tokens over verify counts (run/acceptance.py)
    acceptance: Acceptance = field(default_factory=Acceptance)

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
    files: list[Path] = []
    for folder in (run_dir / "shards", run_dir / "pending"):
        if folder.is_dir():
            files.extend(
                folder / name for name in sorted(os.listdir(folder)) if SHARD_PATTERN.match(name)
            )
    return files


def scan_totals(run_dir: Path, recent_window_s: float = 600.0) -> RunTotals:
    """Read every committed line once. Memory: the ids, O(records), about 100 B each."""
    totals = RunTotals()
    horizon = time.time() - recent_window_s
    for path in record_files(run_dir):
        for line in iter_jsonl_lines(path):
            record = orjson.loads(line)
            totals.done_ids.add(record["id"])
            totals.written += 1
            totals.prompt_tokens += record["prompt_tokens"]
            totals.completion_tokens += record["completion_tokens"]
            totals.output_lengths.append(record["completion_tokens"])
            finish = record.get("finish_reason", "?")
            totals.finish_reasons[finish] = totals.finish_reasons.get(finish, 0) + 1
            flags = record.get("flags") or ()
            if flags:
                totals.flagged += 1
                for flag in flags:
                    totals.flags[flag] = totals.flags.get(flag, 0) + 1
            created = record.get("created_at", 0.0)
            if totals.first_created is None or created < totals.first_created:
                totals.first_created = created
            if totals.last_created is None or created > totals.last_created:
                totals.last_created = created
            if created >= horizon:
                totals.recent.append((created, record["completion_tokens"]))
            totals.acceptance.add(record, recent=created >= horizon)
    failures = run_dir / "failures.jsonl"
    if failures.is_file():
        for line in iter_jsonl_lines(failures):
            entry = orjson.loads(line)
            totals.done_ids.add(entry["id"])
            if entry.get("status") == "skipped":
                totals.skipped += 1
            else:
                totals.failed += 1
            reason = entry.get("reason", "error")
            totals.failure_reasons[reason] = totals.failure_reasons.get(reason, 0) + 1
    return totals


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
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise storage_error("create", self.path, exc) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunDirError(
                f"another eagledata process is working on {self.path}; wait for it or stop it"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

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
        return FrozenSettings.model_validate(self.read()["frozen"])

    def create(self, frozen: FrozenSettings, extra: dict[str, Any]) -> None:
        manifest = {
            "schema_version": SCHEMA_VERSION,
            "fingerprint": frozen.fingerprint(),
            "frozen": frozen.model_dump(mode="json", by_alias=True),
            "created_at": time.time(),
            "versions": library_versions(),
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
        raise RunDirError(
            f"{self.path} was started with other settings ({', '.join(keys)}); resume it with "
            "'eagledata resume RUN_DIR' or pass a new --out"
        )

    def planned(self) -> int | None:
        path = self.path / "plan.json"
        if path.is_file():
            return int(orjson.loads(path.read_bytes())["planned"])
        estimate = self.read().get("planned_estimate")
        return int(estimate) if estimate is not None else None

    def set_planned(self, planned: int) -> None:
        write_json_atomic(self.path / "plan.json", {"planned": planned})

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
                if orjson.loads(line).get("status") == "skipped":
                    kept.append(line)
                else:
                    requeued += 1
            if requeued:
                tmp = path.with_name(path.name + ".tmp")
                with tmp.open("wb") as handle:
                    handle.writelines(kept)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(tmp, path)
                fsync_dir(self.path)
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
    return {prefix.rstrip("."): value}
