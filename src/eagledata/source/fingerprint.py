"""The dataset is part of a run's identity: each row's hash, recorded when the run starts and
compared when it resumes.

``row_hash`` is a short hash of a row's prompt content: its messages as the run reads them
(``row_messages``: a configured system prompt included); for a row that has none, its fields;
for a line that could not be read, its error. Every record carries its row's hash, and the run
keeps every row's, in the dataset's order, in ``rows/NAME.jsonl`` (``rundir/rowprints.py``), with
a fingerprint of the file itself in ``run.json`` (``datasets``: its size and blake2b).

On resume (``check_datasets``) a local file whose bytes are unchanged is taken at once. Otherwise
its rows are read again and compared with the stored lines, position by position: rows only
added after the last stored one are planned (the lines and the fingerprint are updated, the plan
is read to its end again); any other difference (a row edited, inserted, removed, reordered, a
file replaced) refuses the run in one line naming the rows and the fix. Without it a row inserted
at the top renamed every row without an id below it, and resume took their old records for rows
they were not made from.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from itertools import zip_longest
from pathlib import Path
from typing import Any

import orjson

from eagledata.config import DatasetSettings, MixMember
from eagledata.errors import BadRowError, DatasetError, RunDirError
from eagledata.rundir.rowprints import (
    ROW_HASH_BYTES,
    iter_row_prints,
    rows_missing,
    rows_path,
    write_row_prints,
)
from eagledata.source.dataset import SourceRow, iter_rows, local_path
from eagledata.source.prompts import row_messages

LISTED = 3
"""Changed rows named in the refusal; the rest are counted."""
FILE_CHUNK = 1 << 20


def row_hash(row: SourceRow, settings: DatasetSettings) -> str:
    """The short hash of one row's prompt content (see the module docstring)."""
    if row.data is None:
        content = b"unreadable\x00" + (row.error or "").encode()
    else:
        try:
            content = b"messages\x00" + orjson.dumps(row_messages(row.data, settings))
        except BadRowError:
            content = b"row\x00" + orjson.dumps(
                row.data, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS, default=str
            )
    return hashlib.blake2b(content, digest_size=ROW_HASH_BYTES).hexdigest()


def file_print(settings: DatasetSettings) -> dict[str, Any] | None:
    """A local file's size and blake2b (read at about a GB/s); None for a hub dataset or a
    folder, whose rows are compared one by one."""
    path = local_path(settings)
    if not path.is_file():
        return None
    hasher = hashlib.blake2b(digest_size=16)
    try:
        with path.open("rb") as handle:
            while chunk := handle.read(FILE_CHUNK):
                hasher.update(chunk)
        size = path.stat().st_size
    except OSError as exc:
        raise DatasetError(f"cannot read dataset file {path}: {exc.strerror}") from None
    return {"size": size, "blake2b": hasher.hexdigest()}


def _entries(
    member: MixMember, row_limit: int | None, id_scheme: int, counted: list[int]
) -> Iterator[tuple[str, str]]:
    for row in iter_rows(member.dataset, row_limit, id_scheme=id_scheme):
        counted[0] += 1
        yield row.row_id, row_hash(row, member.dataset)


def record_datasets(
    run_dir: Path, members: list[MixMember], row_limit: int | None, id_scheme: int
) -> dict[str, dict[str, Any]]:
    """Write every dataset's row lines into the run directory; return ``run.json``'s
    ``datasets``. An empty dataset is refused here, before anything is generated."""
    found: dict[str, dict[str, Any]] = {}
    for member in members:
        rows = write_row_prints(
            rows_path(run_dir, member.name), _entries(member, row_limit, id_scheme, [0])
        )
        if rows == 0:
            raise DatasetError(
                f"dataset {member.name} ({member.dataset.source}) is empty: it holds no rows "
                "to generate; put rows in it, or pass another --dataset"
            )
        found[member.name] = _entry(member, rows)
    return found


def _entry(member: MixMember, rows: int) -> dict[str, Any]:
    return {"source": member.dataset.source, "rows": rows, "file": file_print(member.dataset)}


def check_datasets(
    run_dir: Path,
    members: list[MixMember],
    stored: dict[str, Any],
    row_limit: int | None,
    id_scheme: int,
) -> tuple[dict[str, Any] | None, bool]:
    """Compare each dataset with what the run recorded (``stored``: ``run.json``'s
    ``datasets``). Raise ``RunDirError`` naming the changed rows. Returns the ``datasets`` to
    record when they differ (their lines already written), and whether rows were added."""
    updated = dict(stored)
    grew = False
    for member in members:
        entry = stored.get(member.name)
        if not isinstance(entry, dict):
            continue  # recorded before this eagledata, or a run without it
        if not rows_path(run_dir, member.name).is_file():
            raise rows_missing(rows_path(run_dir, member.name))
        if entry.get("file") is not None and file_print(member.dataset) == entry["file"]:
            continue
        rows = _compare(run_dir, member, row_limit, id_scheme)
        grew = grew or rows != entry.get("rows")
        updated[member.name] = _entry(member, rows)
    return (updated if updated != stored else None), grew


def _compare(run_dir: Path, member: MixMember, row_limit: int | None, id_scheme: int) -> int:
    """Read the dataset against its stored lines; write them anew if only rows were added.
    Returns the dataset's rows now."""
    path = rows_path(run_dir, member.name)
    stored_rows = iter_row_prints(path)
    current = (
        (row.row_id, row_hash(row, member.dataset))
        for row in iter_rows(member.dataset, row_limit, id_scheme=id_scheme)
    )
    changes: list[str] = []
    changed = 0
    added = 0
    rows = 0

    def merged() -> Iterator[tuple[str, str]]:
        nonlocal changed, added, rows
        for position, (old, new) in enumerate(zip_longest(stored_rows, current)):
            if new is not None:
                rows += 1
                yield new
            if old is None:
                added += 1
                continue
            if new == old:
                continue
            changed += 1
            if len(changes) < LISTED:
                changes.append(_change(position, old, new))
        if changed:  # the old lines stay: the refusal below leaves the run as it was
            raise _Changed

    with contextlib.suppress(_Changed):
        write_row_prints(path, merged())
    if changed:
        more = f" and {changed - len(changes)} more" if changed > len(changes) else ""
        raise RunDirError(
            f"dataset {member.name} ({member.dataset.source}) changed since the run started: "
            f"{changed:,} row(s) differ from those the run planned ({', '.join(changes)}{more}); "
            "restore the file as it was, or start a new run with --out (rows added at its end "
            "are the only change a run takes)"
        )
    if added and member.rows is not None:
        raise RunDirError(
            f"dataset {member.name} ({member.dataset.source}) has {added:,} row(s) more than "
            f"when the run started, and the run takes {member.rows:,} of its rows: more rows "
            "would change which; restore the file as it was, or start a new run with --out"
        )
    return rows


class _Changed(Exception):
    """Stops rewriting the lines of a dataset that changed."""


def _change(position: int, old: tuple[str, str], new: tuple[str, str] | None) -> str:
    if new is None:
        return f"row {position} {old[0]!r} removed"
    if new[0] == old[0]:
        return f"row {position} {old[0]!r} changed"
    return f"row {position} was {old[0]!r}, now {new[0]!r}"
