"""Read a run directory's committed records back, shard by shard, for ``export`` and ``report``.

What is read is exactly what ``status`` counts: every whole line of ``shards/*.jsonl`` and of the
open journal ``pending/*.jsonl`` (a whole line there is a committed record; a torn tail is not).
Records are parsed one line at a time, so memory stays flat however large the run is; a running
``generate`` is never blocked (nothing here takes the run's lock).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from eagledata.config import FrozenSettings
from eagledata.errors import RunDirError
from eagledata.rundir.journal import iter_jsonl_lines
from eagledata.rundir.lines import LineError, RecordLine
from eagledata.rundir.manifest import RunDir
from eagledata.rundir.totals import failure_lines, record_files


@dataclass(frozen=True)
class GenerationOutcomes:
    """How the plan stands besides the records: what ``status`` shows next to ``written``."""

    planned: int | None
    plan_complete: bool
    failed: dict[str, int]
    """Items that ended in ``failures.jsonl`` as failed, by reason."""
    skipped: dict[str, int]
    """Items the run skipped on purpose (bad rows, over-long prompts), by reason."""


class RunRecords:
    """A run directory opened for reading: its manifest, settings, records and outcomes."""

    def __init__(self, path: Path) -> None:
        if not path.is_dir():
            raise RunDirError(
                f"{path} is not a directory; pass a run directory made by 'eagledata generate'"
            )
        self.path = path
        self._run_dir = RunDir(path)
        self.manifest = self._run_dir.manifest()  # refuses a non-run dir or another schema

    def frozen(self) -> FrozenSettings:
        return self._run_dir.frozen()

    def files(self) -> list[Path]:
        return record_files(self.path)

    def records(self) -> Iterator[RecordLine]:
        """Every committed record, in shard order, one parsed line at a time."""
        for path in self.files():
            try:
                for line_no, line in enumerate(iter_jsonl_lines(path), start=1):
                    try:
                        yield RecordLine.parse(line)
                    except LineError as exc:
                        raise RunDirError(
                            f"{path}:{line_no} is not a record ({exc}); run 'eagledata verify "
                            f"{self.path} --repair' to move it aside ('eagledata resume "
                            f"{self.path}' then generates its item again)"
                        ) from None
            except FileNotFoundError:
                # a journal sealed (renamed into shards/) while we listed: read it there
                sealed = self.path / "shards" / path.name
                if path.parent.name == "pending" and sealed.is_file():
                    yield from _records_of(sealed)
                    continue
                raise RunDirError(f"{path} vanished while it was read; try again") from None

    def outcomes(self) -> GenerationOutcomes:
        failed: dict[str, int] = {}
        skipped: dict[str, int] = {}
        failures = self.path / "failures.jsonl"
        if failures.is_file():
            for entry in failure_lines(failures):
                into = skipped if entry.status == "skipped" else failed
                into[entry.reason] = into.get(entry.reason, 0) + 1
        return GenerationOutcomes(
            planned=self._run_dir.planned(),
            plan_complete=self._run_dir.plan_file() is not None,
            failed=failed,
            skipped=skipped,
        )


def _records_of(path: Path) -> Iterator[RecordLine]:
    for line in iter_jsonl_lines(path):
        yield RecordLine.parse(line)
