"""Ctrl-C while the CLI starts: one line and exit 130, never a traceback out of some import.

A command needs seconds of imports (typer, pydantic, httpx, the library) before its own work
begins. ``quiet_start`` (first thing ``cli.main`` does) makes a Ctrl-C in that time end the
process with ``eagledata: interrupted`` (and a ``kill -USR1`` print every thread's stack);
``hand_back`` (``shell.guarded``, when the command's work
begins) restores Python's own ``KeyboardInterrupt``, which the command turns into its clean stop.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from types import FrameType

EXIT_INTERRUPTED = 130


def _interrupted_while_starting(signum: int, frame: FrameType | None) -> None:
    """Nothing is open yet, nothing to save."""
    sys.stderr.write("eagledata: interrupted\n")
    raise SystemExit(EXIT_INTERRUPTED)


def quiet_start() -> None:
    with contextlib.suppress(ValueError):  # not the main thread: signals are not ours
        signal.signal(signal.SIGINT, _interrupted_while_starting)
    # kill -USR1 shows where the process waits from its first instant (README), never kills it
    from eagledata.tasks import stacks_on_usr1

    stacks_on_usr1()


def hand_back() -> None:
    with contextlib.suppress(ValueError):
        signal.signal(signal.SIGINT, signal.default_int_handler)
