"""Every export format, registered in one place.

Adding one: a module of this package that declares ``FORMAT = ExportFormat(...)``
(``export/format.py``), listed here; ``--format`` and its help take it from this table.
"""

from __future__ import annotations

from eagledata.export import conversations, hf, ids, text
from eagledata.export.format import ExportFormat

FORMATS: dict[str, ExportFormat] = {
    module.FORMAT.name: module.FORMAT for module in (ids, hf, conversations, text)
}
