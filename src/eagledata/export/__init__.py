"""``eagledata export``: hand a run's exact ids to a trainer (SpecForge, speculators, HF datasets).

One reader of committed records (``eagledata.rundir.reader``), one selection, one report, and one
module per format: ``ids`` (token-faithful JSONL), ``hf`` (the same rows as an HF dataset),
``conversations`` and ``text`` (lossy routes for trainers that re-render; each says what it loses).

The names below are loaded on first use: the CLI reads the formats' registry
(``export/formats.py``) for ``--format``'s help without loading the exporter.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from eagledata.export.exporter import ExportOptions, export_runs
    from eagledata.export.formats import FORMATS
    from eagledata.export.report import ExportReport

__all__ = ["FORMATS", "ExportOptions", "ExportReport", "export_runs"]

_HOMES = {
    "ExportOptions": "eagledata.export.exporter",
    "export_runs": "eagledata.export.exporter",
    "FORMATS": "eagledata.export.formats",
    "ExportReport": "eagledata.export.report",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'eagledata.export' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
