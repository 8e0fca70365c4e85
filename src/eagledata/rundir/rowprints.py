"""The run's dataset, row by row, as it was when the run started: ``rows/NAME.jsonl``.

A run's records name their source row by its id (``dataset/row_id/sample``). Rows without an id
of their own are named by their position, so a row inserted above them renames every row below;
a row edited in place keeps its id and changes its prompt. Either way a resumed run would take
old records for rows they were not made from. So the run keeps, for each dataset, one line per
row the plan reads, in the dataset's order: ``["row_id", "row_hash"]``, where ``row_hash`` is a
short hash of the row's prompt content (``source/fingerprint.py`` computes it; every record
carries its row's as ``row_hash``). About 30 B a row: 3 MB at 88k rows, written and read
streaming, never held whole.

``resume`` compares the dataset with these lines (``source/fingerprint.py``); ``verify`` checks
every record's ``row_hash`` against its row's line (``RowPrints``: 16 B a row in memory).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from urllib.parse import quote

import orjson

from eagledata.atomic import atomic_path
from eagledata.errors import RunDirError
from eagledata.rundir.idset import CompactIdSet
from eagledata.rundir.journal import iter_jsonl_lines, storage_error

ROWS_FOLDER = "rows"
ROW_HASH_BYTES = 8
"""64 bits of blake2b: two different prompts under one row id pass unnoticed with a chance of
about 5e-20."""


def rows_path(run_dir: Path, dataset: str) -> Path:
    """``RUN/rows/NAME.jsonl`` (the name quoted: a dataset name is not always a file name)."""
    return run_dir / ROWS_FOLDER / f"{quote(dataset, safe='')}.jsonl"


def write_row_prints(path: Path, entries: Iterable[tuple[str, str]]) -> int:
    """Write ``(row_id, row_hash)`` lines atomically (the old file stays until the new one is
    whole); returns how many. An exception from ``entries`` leaves the old file as it was."""
    count = 0
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp, tmp.open("wb", buffering=1 << 20) as handle:
            for entry in entries:
                handle.write(orjson.dumps(entry) + b"\n")
                count += 1
    except OSError as exc:
        raise storage_error("write", path, exc) from None
    return count


def iter_row_prints(path: Path) -> Iterator[tuple[str, str]]:
    """The ``(row_id, row_hash)`` lines of one dataset, in the dataset's order."""
    try:
        for line_no, line in enumerate(iter_jsonl_lines(path), start=1):
            try:
                value = orjson.loads(line)
            except orjson.JSONDecodeError:
                value = None
            if not (
                isinstance(value, list)
                and len(value) == 2
                and all(isinstance(part, str) for part in value)
            ):
                raise RunDirError(
                    f"{path}:{line_no} is not a [row_id, row_hash] line; restore the file from "
                    "a copy of the run, or start a new run with --out"
                )
            yield value[0], value[1]
    except FileNotFoundError:
        raise rows_missing(path) from None


def rows_missing(path: Path) -> RunDirError:
    """The refusal for a run whose ``rows/NAME.jsonl`` is gone."""
    return RunDirError(
        f"{path} is missing: the run cannot tell whether its dataset changed; restore it from a "
        "copy of the run, or start a new run with --out"
    )


class RowPrints:
    """Which (dataset, row id, row hash) the run's datasets hold, at 16 B a row."""

    def __init__(self) -> None:
        self._pairs = CompactIdSet()
        self.datasets: set[str] = set()

    @classmethod
    def load(cls, run_dir: Path, datasets: Iterable[str]) -> RowPrints:
        """The datasets that have their lines (a run started before them has none)."""
        prints = cls()
        for name in datasets:
            path = rows_path(run_dir, name)
            if not path.is_file():
                continue
            prints.datasets.add(name)
            prints._pairs.update(
                _key(f"{name}/{row_id}", row) for row_id, row in iter_row_prints(path)
            )
        return prints

    def problem(self, item_id: str, row_hash: str) -> str | None:
        """Why the record ``item_id`` (``dataset/row_id/sample``, ``/turn`` under ``turns =
        "all"``) carrying ``row_hash`` was not made from the row the run holds under its row
        id; None when it was, or when there is nothing to check it against."""
        if not row_hash or not self.datasets:
            return None
        for cut in (1, 2):  # the sample, or the sample and the turn
            parts = item_id.rsplit("/", cut)
            if len(parts) == cut + 1 and _key(parts[0], row_hash) in self._pairs:
                return None
        return (
            f"its row_hash {row_hash} is not the hash of its row in {ROWS_FOLDER}/: the record "
            "was made from another row than the one its id names"
        )


def _key(row: str, row_hash: str) -> str:
    """``dataset/row_id`` and the row's hash."""
    return f"{row}\x00{row_hash}"
