"""``eagledata export``: hand a run's exact ids to a trainer (SpecForge, speculators, HF datasets).

One reader of committed records (``eagledata.rundir.reader``), one selection, one report, and one
module per format: ``ids`` (token-faithful JSONL), ``hf`` (the same rows as an HF dataset),
``conversations`` and ``text`` (lossy routes for trainers that re-render; each says what it loses).
"""

from eagledata.export.exporter import ExportOptions, export_runs
from eagledata.export.formats import FORMATS
from eagledata.export.report import ExportReport

__all__ = ["FORMATS", "ExportOptions", "ExportReport", "export_runs"]
