"""Streaming for both scheduler models, and the request states they share: a request handler
waits until its answer has ``mark`` tokens decoded (or it ends), and the engine wakes it as
tokens are decoded."""

from __future__ import annotations

import asyncio
from typing import Any

QUEUED_STATE = 0
RUNNING_STATE = 1
"""A request's states as ``scheduler.py`` numbers them (``QUEUED``, ``RUNNING``), for the two
engines: not imported from there, since the scheduler imports the engines."""


def wake_waiter(item: Any, force: bool = False) -> None:
    """Wake the handler waiting on ``item`` once its mark is decoded (``force``: it ended)."""
    waiter = item.waiter
    if waiter is not None and (force or item.generated >= waiter[0]):
        item.waiter = None
        if not waiter[1].done():
            waiter[1].set_result(None)


async def until_generated(item: Any, mark: int) -> None:
    """Wait until ``mark`` tokens of ``item`` are decoded (or it ends)."""
    if item.generated >= mark or item.state not in (QUEUED_STATE, RUNNING_STATE):
        return
    fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    item.waiter = (mark, fut)
    await fut
