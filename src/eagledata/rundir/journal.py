"""The run directory's append-only files: one whole line per ``write(2)``, torn tails cut.

Every JSONL file eagledata appends to (a shard's journal, ``failures.jsonl``, ``checks.jsonl``,
``quality.jsonl``) is a ``Journal``; readers take only lines that end in a newline
(``iter_jsonl_lines``). A torn last line (a write cut short by a crash or a full disk) is not
committed: it is cut off when the journal is reopened (``repair_torn_tail``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from eagledata.errors import StorageError
from eagledata.rundir.lines import Line

SHARD_PATTERN = re.compile(r"^shard-(\d{6})\.jsonl$")


def storage_error(action: str, path: Path, exc: OSError) -> StorageError:
    if exc.errno == errno.ENOSPC:
        hint = "the disk is full; free space, then run 'eagledata resume RUN_DIR'"
    elif exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        hint = "the output directory is not writable; fix its permissions or pass another --out"
    else:
        hint = exc.strerror or str(exc)
    return StorageError(f"cannot {action} {path}: {hint} (committed records are intact)")


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

    def __init__(
        self, path: Path, fsync_interval_s: float = 1.0, *, syncs_itself: bool = True
    ) -> None:
        """``syncs_itself``: ``append`` fsyncs once ``fsync_interval_s`` has passed since the
        last fsync. Without it, the owner fsyncs when ``sync_due`` says so (the shard writer
        does it in its disk thread, off the event loop)."""
        self.path = path
        self.fsync_interval_s = fsync_interval_s
        self.syncs_itself = syncs_itself
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

    def append(self, line: Line) -> bytes:
        """Commit ``line`` (one of the line contract's kinds, ``rundir/lines.py``): its JSON
        and newline by one ``write(2)``. Returns the bytes written, newline included."""
        data = line.dump() + b"\n"
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
        if self.syncs_itself and self.sync_due():
            self.sync()
        return data

    def sync_due(self) -> bool:
        """Lines were written and ``fsync_interval_s`` has passed since the last fsync."""
        return self._dirty and (
            self.fsync_interval_s == 0
            or time.monotonic() - self._last_sync >= self.fsync_interval_s
        )

    def take_sync(self) -> Callable[[], None]:
        """Count the lines written so far as synced, and return the fsync that makes them so:
        for an owner that runs it elsewhere (a disk thread), before anything that relies on it
        (a seal queued after it)."""
        fd, path = self._fd, self.path
        self._dirty = False
        self._last_sync = time.monotonic()

        def fsync() -> None:
            try:
                os.fsync(fd)
            except OSError as exc:
                raise storage_error("sync", path, exc) from None

        return fsync

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
