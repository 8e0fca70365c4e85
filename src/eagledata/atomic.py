"""The one atomic write: a file (or folder) appears whole under its name, or not at all.

Write to a unique temporary name beside the target, fsync it, rename it over the target, fsync
the folder: a crash leaves the old file or the new one, never a mix, and the rename survives a
power cut. Every file eagledata replaces (``run.json``, ``plan.json``, shard indexes, the failure
file after ``--retry-failed``, the canary baseline, an export, the report) goes through here.
``OSError`` reaches the caller, which names the file and the fix in its own error.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Make a rename or a new file in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temporary_beside(target: Path) -> Path:
    """A name beside ``target`` no other process or thread uses, hidden from consumers' globs."""
    return target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


@contextlib.contextmanager
def atomic_path(target: Path, *, is_dir: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside ``target`` to fill; on success it replaces ``target``.

    A file is fsynced before the rename (a folder's files are the writer's to sync). On any error
    the temporary path is removed and the target is left as it was.
    """
    tmp = temporary_beside(target)
    try:
        yield tmp
        if not is_dir:
            with tmp.open("rb+") as handle:
                os.fsync(handle.fileno())
        if is_dir and target.exists():
            old = temporary_beside(target)
            os.replace(target, old)
            os.replace(tmp, target)
            _remove(old)
        else:
            os.replace(tmp, target)
        fsync_dir(target.parent)
    except BaseException:
        _remove(tmp)
        raise


def atomic_write(target: Path, data: bytes) -> None:
    """Replace ``target`` with ``data``, atomically and durably."""
    with atomic_path(target) as tmp:
        tmp.write_bytes(data)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
