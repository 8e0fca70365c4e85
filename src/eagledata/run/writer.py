"""Step 6: records into sharded JSONL, committed atomically, in completion order.

Commit protocol (invariant 3):

* A record is committed when its whole line, newline included, has been handed to the kernel by
  one ``write(2)`` on the open journal ``pending/shard-NNNNNN.jsonl``. From then on a kill -9 of
  this process cannot lose it (the page cache belongs to the kernel). ``fsync`` runs every
  ``fsync_interval_s`` and at every seal, which bounds what a power cut could take.
* A torn last line (a write cut short by a crash or a full disk) lacks its newline; it is cut off
  when the journal is reopened, and the item is generated again.
* When the journal holds ``shard_size`` records it is fsynced and renamed to ``shards/``: a file
  under ``shards/`` is complete or absent, never half-written, so
  ``load_dataset("json", data_files="RUN_DIR/shards/*.jsonl")`` only ever sees whole shards.
* Right after a shard is sealed its index (``shardindex``) is written next to it, built while the
  shard was written; a shard sealed by ``seal_pending`` gets one built from its lines.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from eagledata.errors import StorageError
from eagledata.run.shardindex import IndexBuilder, build_index, write_index

SHARD_PATTERN = re.compile(r"^shard-(\d{6})\.jsonl$")


def storage_error(action: str, path: Path, exc: OSError) -> StorageError:
    if exc.errno == errno.ENOSPC:
        hint = "the disk is full; free space, then run 'eagledata resume RUN_DIR'"
    elif exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        hint = "the output directory is not writable; fix its permissions or pass another --out"
    else:
        hint = exc.strerror or str(exc)
    return StorageError(f"cannot {action} {path}: {hint} (committed records are intact)")


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def repair_torn_tail(path: Path) -> int:
    """Cut a torn last line (no trailing newline) off ``path``. Returns the bytes removed."""
    size = path.stat().st_size
    if size == 0:
        return 0
    with path.open("rb+") as handle:
        block = 1 << 16
        end = size
        while end > 0:
            start = max(0, end - block)
            handle.seek(start)
            chunk = handle.read(end - start)
            if end == size and chunk.endswith(b"\n"):
                return 0
            cut = chunk.rfind(b"\n")
            if cut >= 0:
                keep = start + cut + 1
                handle.truncate(keep)
                return size - keep
            end = start
        handle.truncate(0)
        return size


def iter_jsonl_lines(path: Path) -> Iterator[bytes]:
    with path.open("rb") as handle:
        for line in handle:
            if line.endswith(b"\n"):
                yield line
            # a line without newline is a torn tail: not committed, never read


class Journal:
    """An append-only JSONL file whose every line is committed by a single ``write(2)``."""

    def __init__(self, path: Path, fsync_interval_s: float = 1.0) -> None:
        self.path = path
        self.fsync_interval_s = fsync_interval_s
        try:
            if path.exists():
                repair_torn_tail(path)
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self.size = os.fstat(self._fd).st_size
        except OSError as exc:
            raise storage_error("open", path, exc) from None
        self.lines = 0
        self._last_sync = time.monotonic()
        self._dirty = False

    def append(self, line: bytes) -> None:
        data = line + b"\n"
        try:
            written = os.write(self._fd, data)
            if written != len(data):  # a short write on a nearly full disk
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError as exc:
            self._truncate_to(self.size)
            raise storage_error("write to", self.path, exc) from None
        self.size += written
        self.lines += 1
        self._dirty = True
        if (
            self.fsync_interval_s == 0
            or time.monotonic() - self._last_sync >= self.fsync_interval_s
        ):
            self.sync()

    def _truncate_to(self, size: int) -> None:
        # on failure, the torn tail is cut again when the journal is reopened
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, size)

    def sync(self) -> None:
        if self._dirty:
            try:
                os.fsync(self._fd)
            except OSError as exc:
                raise storage_error("sync", self.path, exc) from None
            self._dirty = False
        self._last_sync = time.monotonic()

    def close(self) -> None:
        if self._fd >= 0:
            try:
                self.sync()
            finally:
                os.close(self._fd)
                self._fd = -1


class ShardWriter:
    """Writes records in completion order into ``shards/shard-NNNNNN.jsonl``."""

    def __init__(self, run_dir: Path, shard_size: int, fsync_interval_s: float = 1.0) -> None:
        self.shards_dir = run_dir / "shards"
        self.pending_dir = run_dir / "pending"
        self.shard_size = shard_size
        self.fsync_interval_s = fsync_interval_s
        try:
            self.shards_dir.mkdir(parents=True, exist_ok=True)
            self.pending_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise storage_error("create", self.shards_dir, exc) from None
        self._journal: Journal | None = None
        self._index: IndexBuilder | None = None
        self._next_seq = self._scan_next_seq()

    def _scan_next_seq(self) -> int:
        seqs = [
            int(match.group(1))
            for folder in (self.shards_dir, self.pending_dir)
            for name in os.listdir(folder)
            if (match := SHARD_PATTERN.match(name))
        ]
        return max(seqs, default=-1) + 1

    def seal_pending(self) -> int:
        """Repair and seal journals left by an earlier process. Returns how many were sealed."""
        sealed = 0
        for name in sorted(os.listdir(self.pending_dir)):
            if not SHARD_PATTERN.match(name):
                continue
            path = self.pending_dir / name
            try:
                repair_torn_tail(path)
                if path.stat().st_size == 0:
                    path.unlink()
                    continue
                with path.open("rb+") as handle:
                    os.fsync(handle.fileno())
                os.replace(path, self.shards_dir / name)
                fsync_dir(self.shards_dir)
            except OSError as exc:
                raise storage_error("seal", path, exc) from None
            write_index(self.shards_dir / name, build_index(self.shards_dir / name))
            sealed += 1
        return sealed

    def write(self, record: dict[str, Any]) -> None:
        if self._journal is None:
            path = self.pending_dir / f"shard-{self._next_seq:06d}.jsonl"
            self._next_seq += 1
            self._journal = Journal(path, self.fsync_interval_s)
            self._index = IndexBuilder(path.name)
        line = orjson.dumps(record)
        self._journal.append(line)
        if self._index is not None:
            self._index.add(line + b"\n", record)
        if self._journal.lines >= self.shard_size:
            self._seal_current()

    def _seal_current(self) -> None:
        journal, self._journal = self._journal, None
        index, self._index = self._index, None
        if journal is None:
            return
        journal.close()
        if journal.lines == 0 and journal.size == 0:
            journal.path.unlink(missing_ok=True)
            return
        target = self.shards_dir / journal.path.name
        try:
            os.replace(journal.path, target)
            fsync_dir(self.shards_dir)
            stat = target.stat()
        except OSError as exc:
            raise storage_error("seal", journal.path, exc) from None
        if index is None or journal.size != stat.st_size:
            # not the bytes this writer accounted for (an append cut short): read the file
            write_index(target, build_index(target))
        else:
            write_index(target, index.finish(stat.st_size, stat.st_mtime_ns))

    def sync(self) -> None:
        if self._journal is not None:
            self._journal.sync()

    def close(self) -> None:
        """Seal the open journal: at the end of a run every record is in a complete shard."""
        self._seal_current()


class FailureLog:
    """``failures.jsonl``: one line per (prompt, sample) that ended without a record."""

    def __init__(self, run_dir: Path, fsync_interval_s: float = 1.0) -> None:
        self._journal = Journal(run_dir / "failures.jsonl", fsync_interval_s)

    def write(self, entry: dict[str, Any]) -> None:
        self._journal.append(orjson.dumps(entry))

    def close(self) -> None:
        self._journal.close()
