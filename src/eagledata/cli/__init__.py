"""The typer shell: parse flags, call the library, print one line on failure.

``eagledata.cli:main`` is the console entry point, ``python -m eagledata.cli`` runs it too
(``__main__``); ``app`` (``cli/commands.py``) holds the commands. This module imports nothing
heavy: ``main`` makes a Ctrl-C quiet (``cli/interrupts.py``) before the imports a command needs
begin.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from eagledata.cli.interrupts import EXIT_INTERRUPTED, quiet_start


def main() -> None:
    quiet_start()
    # transformers warns at import that PyTorch is absent; eagledata needs only its tokenizers.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from eagledata.cli.commands import app

    try:
        app()
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)


def __getattr__(name: str) -> Any:
    """``from eagledata.cli import app`` still works, without importing it at package import."""
    if name == "app":
        from eagledata.cli.commands import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
