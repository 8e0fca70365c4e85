"""Damage moved aside: a line of the run's data that does not read as what its file holds goes to
``quarantine.jsonl`` (one ``QuarantineLine`` each, the line's bytes kept), so that one bad line
never blocks a run for good.

A quarantined record is no longer done: ``resume`` generates its item again. ``eagledata verify
--repair`` moves every such line out of ``shards/``, ``pending/`` and ``failures.jsonl``;
``resume`` moves those of a journal it seals (``run/writer.py``), so that only whole records
ever reach ``shards/``. Each line is written (and fsynced) into the quarantine before its file
is rewritten without it (atomically): a crash in between leaves it in both places, never in
neither.
"""

from __future__ import annotations

import base64
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import orjson

from eagledata.atomic import atomic_write
from eagledata.rundir.journal import Journal, storage_error
from eagledata.rundir.lines import FailureLine, LineError, QuarantineLine, RecordLine

QUARANTINE = "quarantine.jsonl"

Problem = Callable[[bytes], str | None]
"""Why a whole line is not what its file holds; None when it is."""


def record_problem(line: bytes) -> str | None:
    """The record contract (``rundir/lines.py``) and SGLang's own counts against the ids."""
    try:
        record = RecordLine.parse(line)
    except LineError as exc:
        return f"not a record ({exc})"
    if record.prompt_tokens != len(record.input_ids):
        return f"prompt_tokens {record.prompt_tokens} != {len(record.input_ids)} ids"
    if record.completion_tokens != len(record.output_ids):
        return f"completion_tokens {record.completion_tokens} != {len(record.output_ids)} ids"
    return None


def failure_problem(line: bytes) -> str | None:
    try:
        FailureLine.parse(line)
    except LineError as exc:
        return f"not a failure line ({exc})"
    return None


def _id_of(line: bytes) -> str | None:
    with contextlib.suppress(orjson.JSONDecodeError):
        value = orjson.loads(line)
        found = value.get("id") if isinstance(value, dict) else None
        if isinstance(found, str):
            return found
    return None


@dataclass
class Quarantine:
    """The run directory's ``quarantine.jsonl``, opened on the first line moved into it. Use it
    under the run's lock: the files it rewrites must have no other writer."""

    run_dir: Path
    moved: dict[str, int] = field(default_factory=dict)
    """Lines moved, per source file (relative to the run directory)."""
    _journal: Journal | None = None

    @property
    def path(self) -> Path:
        return self.run_dir / QUARANTINE

    @property
    def total(self) -> int:
        return sum(self.moved.values())

    def move_aside(self, path: Path, problem: Problem, *, torn_tail: bool) -> int:
        """Rewrite ``path`` without its lines that ``problem`` refuses, each first appended to the
        quarantine. ``torn_tail``: a last line without its newline is moved too (in a sealed
        shard it is damage; in a journal it is an uncommitted write, cut by its own repair).
        Returns how many lines were moved."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return 0
        except OSError as exc:
            raise storage_error("read", path, exc) from None
        keep = bytearray()
        bad: list[tuple[int, bytes, str]] = []
        for number, line in enumerate(data.splitlines(keepends=True), start=1):
            if not line.endswith(b"\n"):
                if torn_tail:
                    bad.append((number, line, "a torn last line (no newline)"))
                else:
                    keep += line
                continue
            why = problem(line)
            if why is None:
                keep += line
            else:
                bad.append((number, line.removesuffix(b"\n"), why))
        if not bad:
            return 0
        source = path.relative_to(self.run_dir).as_posix()
        for number, line, why in bad:
            self._append(source, number, line, why)
        assert self._journal is not None
        self._journal.sync()
        try:
            atomic_write(path, bytes(keep))
        except OSError as exc:
            raise storage_error("rewrite", path, exc) from None
        self.moved[source] = self.moved.get(source, 0) + len(bad)
        return len(bad)

    def _append(self, source: str, number: int, line: bytes, why: str) -> None:
        if self._journal is None:
            self._journal = Journal(self.path, fsync_interval_s=3600.0)
        encoding: Literal["utf-8", "base64"] = "utf-8"
        try:
            content = line.decode("utf-8")
        except UnicodeDecodeError:
            content, encoding = base64.b64encode(line).decode("ascii"), "base64"
        self._journal.append(
            QuarantineLine(
                time=time.time(),
                source=source,
                line=number,
                problem=why,
                id=_id_of(line),
                encoding=encoding,
                content=content,
            )
        )

    def close(self) -> None:
        if self._journal is not None:
            self._journal.close()
            self._journal = None
