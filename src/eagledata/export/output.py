"""Where an export goes: the data at PATH, its report and side files beside it, all atomic.

The data is written under a temporary name in PATH's folder and renamed into place only once it
is complete and synced, so a failed or interrupted export never leaves a half-written file (or
dataset folder) where a trainer would find it. Side files (report, token counts, vocab mapping)
sit beside PATH, named after it, never inside a folder a consumer globs.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
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


def run_dir_holding(path: Path) -> Path | None:
    """The run directory ``path`` is, or lies inside (a folder holding ``run.json``), or None."""
    for folder in (path, *path.parents):
        if (folder / "run.json").is_file():
            return folder
    return None


def _run_dir_within(folder: Path) -> Path | None:
    """A run directory somewhere under ``folder`` (the first one found), or None."""
    for root, dirs, files in os.walk(folder):
        if "run.json" in files:
            return Path(root)
        dirs[:] = [name for name in dirs if not Path(root, name).is_symlink()]
    return None


def made_by_export(out: Path) -> bool:
    """``out`` is an earlier export's data: its report (``side_path(out, "export.json")``, the
    marker every export writes beside its data) names it as its output."""
    try:
        report = orjson.loads(side_path(out, "export.json").read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return False
    if not isinstance(report, dict):
        return False
    output, kind = report.get("output"), report.get("format")
    return isinstance(output, str) and isinstance(kind, str) and Path(output).name == out.name


def check_target(
    out: Path,
    *,
    is_dir: bool,
    force: bool,
    run_dirs: list[Path],
    inputs: Sequence[Path] = (),
) -> None:
    """Refuse an output that would clobber data or land where a consumer globs records.

    An export writes and deletes only what it made: never a run directory, a file of one, a
    folder holding one, or an input dataset file; ``--force`` replaces only an earlier export
    (``made_by_export``), never a file or folder that merely sits at PATH.
    """
    resolved = out.resolve()
    for run_dir in run_dirs:
        run = run_dir.resolve()
        if resolved == run or resolved.is_relative_to(run):
            raise ExportError(
                f"--out {out} is inside the run directory {run_dir}; write the export elsewhere"
            )
    holder = run_dir_holding(resolved)
    if holder is not None:
        raise ExportError(
            f"--out {out} is inside the run directory {holder}; write the export elsewhere"
        )
    for run_dir in run_dirs:
        if run_dir.resolve().is_relative_to(resolved):
            raise ExportError(
                f"--out {out} holds the run directory {run_dir}; write the export elsewhere"
            )
    for source in inputs:
        dataset = source.resolve()
        if resolved == dataset or dataset.is_relative_to(resolved):
            what = "is" if resolved == dataset else "holds"
            raise ExportError(
                f"--out {out} {what} the run's input dataset {source}; write the export elsewhere"
            )
    if out.exists() or out.is_symlink():
        if out.is_dir() != is_dir:
            kind = "a directory" if out.is_dir() else "a file"
            raise ExportError(f"--out {out} is {kind}; pass another path")
        if not force:
            raise ExportError(f"--out {out} exists; pass --force to replace it, or another path")
        if out.is_dir() and not out.is_symlink() and (inner := _run_dir_within(out)) is not None:
            raise ExportError(
                f"--out {out} holds the run directory {inner}; write the export elsewhere"
            )
        if not made_by_export(out):
            report = side_path(out, "export.json")
            raise ExportError(
                f"--out {out} exists and is not an earlier export (no {report.name} beside it "
                "naming it); --force replaces only an export: remove it yourself, or pass "
                "another path"
            )
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
