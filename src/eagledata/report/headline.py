"""The report's headline: exactly the object ``eagledata status --json`` prints.

It comes from ``eagledata.rundir.status.run_status``, the function behind ``status``, so the two can
never disagree, and whatever makes ``status`` faster (shard indexes) makes the report faster too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eagledata.rundir.status import run_status


def status_snapshot(path: Path) -> dict[str, Any]:
    return run_status(path).to_json()
