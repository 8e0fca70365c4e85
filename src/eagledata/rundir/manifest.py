"""Step 7: the run directory's state: frozen settings, lock, what is done, what is left.

Layout of a run directory::

    run.json          schema version, frozen settings + fingerprint, versions, server facts,
                      each dataset's file fingerprint (``datasets``)
    rows/NAME.jsonl   each dataset's row ids and row hashes as the run started (``rowprints``)
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

This module owns ``run.json`` and the lock (``RunDir``). What other parts read of the committed
files (export, report, status) is ``totals.py``: ``scan_totals`` (counts, tokens, finish
reasons, flags, the done ids), ``shard_indexes`` (per-shard ids and totals), ``sealed_shards``
and ``record_files`` (the files to read records from).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import platform
import time
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from eagledata import __version__
from eagledata.atomic import atomic_write
from eagledata.config import FrozenSettings, format_validation_error
from eagledata.errors import RunDirError
from eagledata.rundir.journal import (
    Journal,
    iter_jsonl_lines,
    repair_torn_tail,
    storage_error,
)
from eagledata.rundir.lines import FailureLine, line_schemas
from eagledata.rundir.runfiles import Manifest, PlanFile
from eagledata.rundir.totals import RunTotals

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
            holder = self.lock_holder()
            who = "another eagledata process" if holder is None else f"eagledata (PID {holder})"
            stop = "stop it" if holder is None else f"stop it (kill {holder})"
            raise RunDirError(f"{who} is working on {self.path}; wait for it or {stop}") from None
        self._lock_fd = fd
        with contextlib.suppress(OSError):  # a note for people; the lock does not depend on it
            (self.path / ".lock").write_text(f"{os.getpid()}\n")

    def lock_holder(self) -> int | None:
        """The PID the holder wrote in ``.lock``, or None if it cannot be read."""
        try:
            return int((self.path / ".lock").read_text().strip())
        except (OSError, ValueError):
            return None

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

    def manifest(self) -> Manifest:
        """``run.json`` as its type (``rundir/runfiles.py``): the one way to read it."""
        raw = self.read()
        try:
            return Manifest.model_validate(raw)
        except ValidationError as exc:
            problems = format_validation_error(exc, f"{self.run_json}: ")
            raise RunDirError(
                f"{problems}; restore the run.json the run was started with, or start a new run "
                "with --out"
            ) from None

    def plan_file(self) -> PlanFile | None:
        """``plan.json`` as its type, or None before the plan was read to its end."""
        path = self.path / "plan.json"
        try:
            raw = orjson.loads(path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, orjson.JSONDecodeError) as exc:
            raise RunDirError(f"{path} is unreadable: {exc}") from None
        try:
            return PlanFile.model_validate(raw)
        except ValidationError as exc:
            problems = format_validation_error(exc, f"{path}: ")
            raise RunDirError(
                f"{problems}; delete it and 'eagledata resume RUN_DIR' reads the plan again"
            ) from None

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
        """The plan's size: ``plan.json``'s once it is complete, else the estimate."""
        plan = self.plan_file()
        if plan is not None:
            return plan.planned
        return self.manifest().planned_estimate

    def set_planned(self, planned: int, by_dataset: dict[str, int] | None = None) -> None:
        plan = PlanFile(planned=planned, datasets=None if by_dataset is None else dict(by_dataset))
        write_json_atomic(self.path / "plan.json", plan.model_dump(exclude_none=True))

    def planned_by_dataset(self) -> dict[str, int] | None:
        """Each dataset's planned items, once the plan is complete (runs since turns existed)."""
        plan = self.plan_file()
        return None if plan is None or plan.datasets is None else dict(plan.datasets)

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
