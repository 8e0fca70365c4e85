"""Step 1 of the data flow: dataset rows with stable ids, streamed.

Local ``.jsonl`` files are read line by line here (not through ``datasets``) for one reason: a
malformed line or invalid UTF-8 must cost one row, which goes to the failure file, not the whole
file. ``.json``, ``.parquet`` and hub datasets go through ``datasets.load_dataset(streaming=True)``,
so memory never grows with the dataset.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from eagledata.config import DatasetSettings, resolve_bundled
from eagledata.errors import DatasetError
from eagledata.source.formats import FILE_TYPES, file_type, one_of, suffixes
from eagledata.source.hub import unreachable_and_uncached

# Columns that real drafter datasets use for their own stable ids (docs/capacity.md, last table).
KNOWN_ID_FIELDS = ("id", "prompt_id", "uuid", "conversation_id")


@dataclass(frozen=True, slots=True)
class SourceRow:
    """One dataset row. ``data`` is None when the row could not be parsed; ``error`` says why."""

    index: int
    row_id: str
    data: dict[str, Any] | None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class ResolvedDataset:
    name: str
    settings: DatasetSettings


def resolve_dataset(name_or_path: str, table: dict[str, DatasetSettings]) -> ResolvedDataset:
    """Turn ``--dataset`` into settings: a config name, a local file, or a hub id."""
    if name_or_path in table:
        return ResolvedDataset(name_or_path, table[name_or_path])
    looks_local = name_or_path.startswith((".", "/", "~")) or Path(name_or_path).suffix in (
        FILE_TYPES
    )
    if looks_local or name_or_path.startswith("bundled:"):
        path = Path(resolve_bundled(name_or_path)).expanduser()
        if path.is_dir():  # a saved hub dataset or a folder of data files: datasets reads it
            return ResolvedDataset(path.name, DatasetSettings(source=str(path)))
        if not path.exists():
            raise DatasetError(f"dataset file {path} not found; check the path or the name")
        if file_type(path) is None:
            raise DatasetError(
                f"dataset file {path} has unsupported type {path.suffix!r}; "
                f"use {one_of(suffixes())}"
            )
        return ResolvedDataset(path.stem, DatasetSettings(source=str(path)))
    if "/" in name_or_path and not name_or_path.startswith("/"):
        return ResolvedDataset(
            name_or_path.replace("/", "__"), DatasetSettings(source=name_or_path)
        )
    known = ", ".join(sorted(table)) or "none configured"
    raise DatasetError(
        f"unknown dataset {name_or_path!r}; use a name from the config ({known}), "
        f"a {'/'.join(suffixes())} path, or a hub id like org/name"
    )


def local_path(settings: DatasetSettings) -> Path:
    """Where a dataset's ``source`` points on this machine (``bundled:`` and ``~`` resolved);
    for a hub id, a path that does not exist and has no data-file suffix."""
    return Path(resolve_bundled(settings.source)).expanduser()


def check_local_source(dataset: ResolvedDataset, config_source: str | None = None) -> None:
    """Fail fast: a local data file that is not there is reported before anything is loaded.

    Without this, ``--dataset b2`` with no ``data/b2.jsonl`` failed only after the tokenizer was
    fetched (minutes, or a hub error that says nothing about the missing file).
    """
    source = local_path(dataset.settings)
    if file_type(source) is None or source.is_file():
        return
    where = "" if source.is_absolute() else f" (relative to {Path.cwd()})"
    config = config_source or "the config"
    raise DatasetError(
        f"dataset {dataset.name}: file {source} not found{where}; put the file there or set "
        f"datasets.{dataset.name}.source in {config} to its path"
    )


ROW_ID_SCHEME = 2
"""How rows without an id of their own are named: 2, ``#INDEX`` (an own id that starts with ``#``
gets one more ``#``, so the two kinds never meet); 1 (runs started before it), the bare index,
which a later row's own id of the same value took too. ``run.json`` records the scheme a run
started with (``row_id_scheme``) and resume keeps it."""


def fallback_id(index: int, scheme: int = ROW_ID_SCHEME) -> str:
    """The id of a row that has none of its own (or could not be read)."""
    return f"#{index}" if scheme >= 2 else str(index)


def _row_id(data: dict[str, Any], index: int, id_field: str | None, scheme: int) -> str:
    fields = (id_field,) if id_field else KNOWN_ID_FIELDS
    for field in fields:
        value = data.get(field)
        if isinstance(value, str) and value:
            return f"#{value}" if scheme >= 2 and value.startswith("#") else value
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
    return fallback_id(index, scheme)


def _iter_jsonl(path: Path) -> Iterator[tuple[dict[str, Any] | None, str | None]]:
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise DatasetError(f"cannot read dataset file {path}: {exc.strerror}") from None
    with handle:
        try:
            for line_no, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    value = orjson.loads(line)
                except orjson.JSONDecodeError as exc:
                    problem = "invalid UTF-8" if "utf-8" in str(exc).lower() else "malformed JSON"
                    yield None, f"line {line_no}: {problem}: {exc}"
                    continue
                if not isinstance(value, dict):
                    kind = type(value).__name__
                    yield None, f"line {line_no}: expected a JSON object, got {kind}"
                    continue
                yield value, None
        except OSError as exc:  # EIO, a directory, a file pulled from under us
            raise DatasetError(f"cannot read dataset file {path}: {exc.strerror}") from None


def _iter_with_datasets(settings: DatasetSettings) -> Iterator[tuple[dict[str, Any] | None, None]]:
    import datasets  # deferred: importing datasets costs about a second

    source = resolve_bundled(settings.source)
    path = local_path(settings)
    try:
        kind = file_type(path)
        if kind is not None:
            if not path.is_file():
                raise DatasetError(f"dataset file {path} not found; check the path")
            stream = datasets.load_dataset(
                kind.builder, data_files=str(path), split="train", streaming=True
            )
        else:
            unreachable = unreachable_and_uncached(source, "dataset")
            if unreachable is not None:
                raise DatasetError(f"cannot read dataset {source}: {unreachable}")
            stream = datasets.load_dataset(
                source, settings.subset, split=settings.split, streaming=True
            )
        for row in stream:
            yield dict(row), None
    except DatasetError:
        raise
    except Exception as exc:  # datasets raises many unrelated types; translate at this boundary
        hint = ""
        if not path.suffix:
            hint = " (hub dataset: is the hub reachable, or set HF_DATASETS_OFFLINE with a cache?)"
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DatasetError(f"cannot read dataset {source}: {first_line}{hint}") from None


def iter_rows(
    settings: DatasetSettings, limit: int | None = None, *, id_scheme: int = ROW_ID_SCHEME
) -> Iterator[SourceRow]:
    """Stream rows with stable ids: the dataset's own id field where it has one, else ``#INDEX``
    (``ROW_ID_SCHEME``: an own id never meets an index's)."""
    source = local_path(settings)
    raw: Iterator[tuple[dict[str, Any] | None, str | None]]
    kind = file_type(source)
    if kind is not None and kind.by_line:
        if not source.is_file():
            raise DatasetError(f"dataset file {source} not found; check the path")
        raw = _iter_jsonl(source)
    else:
        raw = _iter_with_datasets(settings)
    for index, (data, error) in enumerate(itertools.islice(raw, limit)):
        if data is None:
            row_id = fallback_id(index, id_scheme)
            yield SourceRow(index=index, row_id=row_id, data=None, error=error)
        else:
            row_id = _row_id(data, index, settings.id_field, id_scheme)
            yield SourceRow(index=index, row_id=row_id, data=data)


def count_rows(settings: DatasetSettings, limit: int | None = None) -> int | None:
    """A cheap row count for the progress bar, where one is cheap; None otherwise."""
    source = local_path(settings)
    kind = file_type(source)
    total: int | None = None
    try:
        if kind is not None and kind.count is not None and source.is_file():
            total = kind.count(source)
    except Exception:  # OSError, pyarrow's ArrowInvalid: reading the rows reports it properly
        total = None
    if total is None:
        return limit
    return min(total, limit) if limit is not None else total
