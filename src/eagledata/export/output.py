"""Where an export goes: the data at PATH, its report and side files beside it, all atomic.

The data is written under a temporary name in PATH's folder and renamed into place only once it
is complete and synced, so a failed or interrupted export never leaves a half-written file (or
dataset folder) where a trainer would find it. Side files (report, token counts, vocab mapping)
sit beside PATH, named after it, never inside a folder a consumer globs.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from eagledata.atomic import atomic_path, atomic_write
from eagledata.errors import ExportError

DATA_SUFFIXES = (".jsonl", ".json")


def side_path(out: Path, kind: str) -> Path:
    """``runs/train.jsonl`` -> ``runs/train.export.json`` (kind ``export.json``)."""
    stem = out.name
    for suffix in DATA_SUFFIXES:
        if stem.endswith(suffix) and len(stem) > len(suffix):
            stem = stem[: -len(suffix)]
            break
    return out.with_name(f"{stem}.{kind}")


def _cannot_write(out: Path, exc: OSError) -> ExportError:
    why = exc.strerror or str(exc)
    return ExportError(f"cannot write {out}: {why}; pass a writable --out")


def check_target(out: Path, *, is_dir: bool, force: bool, run_dirs: list[Path]) -> None:
    """Refuse an output that would clobber data or land where a consumer globs records."""
    resolved = out.resolve()
    for run_dir in run_dirs:
        run = run_dir.resolve()
        if resolved == run or any(
            resolved.is_relative_to(run / inner) for inner in ("shards", "pending")
        ):
            raise ExportError(
                f"--out {out} is inside the run directory's records; write the export elsewhere"
            )
    if out.exists() or out.is_symlink():
        if out.is_dir() != is_dir:
            kind = "a directory" if out.is_dir() else "a file"
            raise ExportError(f"--out {out} is {kind}; pass another path")
        if not force:
            raise ExportError(f"--out {out} exists; pass --force to replace it, or another path")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _cannot_write(out, exc) from None
    if not os.access(out.parent, os.W_OK):
        raise ExportError(f"cannot write {out}: {out.parent} is not writable; pass another --out")


@contextlib.contextmanager
def atomic_target(out: Path, *, is_dir: bool) -> Iterator[Path]:
    """Yield a temporary path beside ``out``; on success rename it over ``out``, else remove it."""
    try:
        with atomic_path(out, is_dir=is_dir) as tmp:
            yield tmp
    except OSError as exc:
        raise _cannot_write(out, exc) from None


def write_bytes_atomic(path: Path, data: bytes) -> None:
    try:
        atomic_write(path, data)
    except OSError as exc:
        raise _cannot_write(path, exc) from None


def write_jsonl(rows: Iterator[dict[str, Any]], path: Path) -> None:
    """One JSON object a line (``atomic_path`` fsyncs the file before it is renamed in)."""
    with path.open("wb", buffering=1 << 20) as handle:
        for row in rows:
            handle.write(orjson.dumps(row))
            handle.write(b"\n")
