"""eagledata: token-faithful EAGLE-3 drafter training data from an SGLang server (bf16 KV only).

The library a trainer calls (``eagledata.regenerate``, ``aregenerate``, ``records``, ``dataset``:
docs/library.md) lives in ``eagledata.library``; its names are loaded here on first use, so
``import eagledata`` stays light and the package's lower layers never import the upper ones.
"""

from __future__ import annotations

import logging as _logging
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# A library logs, the application decides where: nothing reaches stderr from eagledata's loggers
# unless a handler is added (a session adds its run directory's run.log, rundir/runlog.py).
_logging.getLogger("eagledata").addHandler(_logging.NullHandler())

LIBRARY_NAMES = (
    "ProgressEvent",
    "RunSummary",
    "aregenerate",
    "dataset",
    "records",
    "regenerate",
    "rounds",
)
__all__ = [
    "ProgressEvent",
    "RunSummary",
    "__version__",
    "aregenerate",
    "dataset",
    "records",
    "regenerate",
    "rounds",
]

if TYPE_CHECKING:
    from eagledata.library import (
        ProgressEvent,
        RunSummary,
        aregenerate,
        dataset,
        records,
        regenerate,
        rounds,
    )


def __getattr__(name: str) -> Any:
    if name in LIBRARY_NAMES:
        import eagledata.library

        return getattr(eagledata.library, name)
    raise AttributeError(f"module 'eagledata' has no attribute {name!r}")
