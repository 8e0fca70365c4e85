"""What an export format is: the rows it makes from records, and how it writes them.

A format is one module of this package that declares ``FORMAT = ExportFormat(...)``, registered
in ``export/formats.py``; ``exporter.py`` drives any of them the same way (select, build rows,
write atomically, report). Its row maker turns each selected record into one row, or into a
reason to skip it (a string, counted in the report), and says in ``note`` what the route loses.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from eagledata.export.report import ExportReport
from eagledata.rundir.lines import RecordLine


@dataclass(frozen=True, slots=True)
class RowIdentity:
    """Who a row is in the export: unique across every run exported together."""

    id: str
    primary_id: str
    run: str


class RowMaker(Protocol):
    def row(self, record: RecordLine, who: RowIdentity) -> dict[str, Any] | str:
        """The row of ``record``, or the reason it is skipped."""
        ...

    def note(self, report: ExportReport) -> None:
        """What the route lost, into the report (``lossy``, warnings); nothing for exact ones."""
        ...


@dataclass(frozen=True)
class ExportFormat:
    name: str
    summary: str
    """One line for ``--help``: who reads it, and whether it is exact."""
    rows: Callable[[Any, dict[str, Any]], RowMaker]
    """The row maker, given the runs' tokenizer (None unless ``needs_tokenizer``) and its chat
    template kwargs."""
    write: Callable[[Iterator[dict[str, Any]], Path], None]
    """Write every row to a temporary path (the exporter renames it into place)."""
    writes_folder: bool = False
    needs_tokenizer: bool = False
