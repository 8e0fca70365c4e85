"""``run.log``: what each session of a run did, in standard ``logging`` lines, for the person who
reads the run directory later: its start and end, retries and failed items, held results given
back, every check's verdict (the KV guard's and the canary's), the load controller's and the
watchdog's warnings. Bounded like the telemetry: at ``MAX_BYTES`` it rotates to ``run.1.log``.

Every module logs to its own logger under ``eagledata`` (``logging.getLogger(__name__)``); a
session attaches the file for its life (``run_log``), and nothing else reads it back.
"""

from __future__ import annotations

import logging
import logging.handlers
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOG_FILE = "run.log"
MAX_BYTES = 8 << 20
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


@contextmanager
def run_log(run_dir: Path) -> Iterator[logging.Handler]:
    """Every ``eagledata`` logger's lines of INFO and above go to ``run_dir/run.log`` while the
    block runs (appended: each session adds its own)."""
    handler = logging.handlers.RotatingFileHandler(
        run_dir / LOG_FILE, maxBytes=MAX_BYTES, backupCount=1, encoding="utf-8", delay=True
    )
    handler.namer = lambda name: name.replace(".log.1", ".1.log")
    handler.setFormatter(logging.Formatter(FORMAT))
    handler.setLevel(logging.INFO)
    logger = logging.getLogger("eagledata")
    level = logger.level
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        handler.close()
