"""Every type of local data file a dataset may be, registered in one place.

Adding one is one entry of ``FILE_TYPES``: its suffix, the ``datasets`` builder that streams it,
and, where its rows can be counted without reading them, how (a mix's row count needs that,
``source/mix.py``). ``--dataset``'s help, the errors that name the types, the docs' table
(``scripts/gen_docs.py``) and the checks of ``source/dataset.py`` and ``source/preflight.py``
all read this table. The row shapes inside a file are ``source/prompts.py``'s ``ROW_SCHEMAS``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


def _count_lines(path: Path) -> int:
    with path.open("rb") as handle:
        return sum(1 for line in handle if line.strip())


def _count_parquet(path: Path) -> int:
    import pyarrow.parquet as pq  # deferred: only a mix's row count of a parquet file needs it

    rows: int = pq.ParquetFile(path).metadata.num_rows
    return rows


@dataclass(frozen=True, slots=True)
class FileType:
    suffix: str
    builder: str
    """The ``datasets.load_dataset`` builder that streams it."""
    summary: str
    """One line for the docs: what a row is in it."""
    count: Callable[[Path], int] | None = None
    """Its rows, counted without parsing them (None: only by reading them all)."""
    by_line: bool = False
    """Read line by line by ``source/dataset.py``, so a malformed line costs one row, not the
    file."""


FILE_TYPES: dict[str, FileType] = {
    kind.suffix: kind
    for kind in (
        FileType(
            ".jsonl",
            "json",
            "one JSON object a line; a malformed line is one failed row",
            count=_count_lines,
            by_line=True,
        ),
        FileType(".json", "json", "JSON: an array of objects, or one object a line"),
        FileType(".parquet", "parquet", "a Parquet table, one row a row", count=_count_parquet),
    )
}


def file_type(path: Path) -> FileType | None:
    """The registered type of ``path``, by its suffix; None for any other."""
    return FILE_TYPES.get(path.suffix)


def suffixes(*, countable: bool = False) -> list[str]:
    """The registered suffixes, or only those whose rows can be counted without reading them."""
    return [kind.suffix for kind in FILE_TYPES.values() if kind.count is not None or not countable]


def one_of(names: list[str]) -> str:
    """``a, b or c``: a list as an error message says it."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
