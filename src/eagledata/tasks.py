"""Task scopes whose end is bounded: every task a run starts ends when the run ends.

``asyncio.TaskGroup`` waits for its children for ever. A child that swallows its cancellation
(Python 3.11's ``wait_for`` does when the inner wait completes as the cancel arrives)
then hangs the run after all its work is done. ``TaskScope`` keeps TaskGroup's fail-fast rule
(a child that fails cancels the body and its error is raised) and bounds the exit: children are
cancelled again and again until ``shutdown_s`` has passed; one still running then is handed to
``on_stuck`` (which reports it: one line, a dump file) and abandoned, never awaited.

``run_until_done`` is ``asyncio.run`` with the same bound on its own shutdown, so an abandoned
task cannot hang the process on its way out either.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import io
import signal
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any, TypeVar

T = TypeVar("T")

RECANCEL_EVERY_S = 0.05
"""How often a child that is still running after its cancel is cancelled again."""

abandoned: set[asyncio.Task[Any]] = set()
"""Tasks a scope gave up on: ``run_until_done`` does not wait for them at shutdown."""


def stacks_on_usr1() -> None:
    """``kill -USR1 <pid>`` prints every thread's Python stack on stderr, whatever the process
    is doing (importing, reading a dataset, loading a tokenizer): installed when the process
    starts, and again whenever a running loop's own handler (every task's stack,
    ``run/signals.py``) is removed, which would otherwise leave the default action (the process
    killed, exit 138)."""
    usr1 = getattr(signal, "SIGUSR1", None)
    if usr1 is None:
        return
    with contextlib.suppress(ValueError, RuntimeError, OSError, AttributeError):
        faulthandler.register(usr1, all_threads=True, chain=False)


def task_stacks(tasks: set[asyncio.Task[Any]] | None = None, limit: int = 32) -> str:
    """Every task's name, state and where it waits, as text (what a dump file or SIGUSR1
    shows): the chain of coroutines it awaits, outermost first, down to the future it waits on
    (``Task.print_stack`` shows only the outermost frame of a suspended task)."""
    out = io.StringIO()
    try:
        current = asyncio.all_tasks() if tasks is None else tasks
    except RuntimeError:  # no running loop
        current = set(tasks or ())
    for task in sorted(current, key=lambda t: t.get_name()):
        state = "cancelling" if task.cancelling() else "running"
        out.write(f"--- task {task.get_name()} ({state})\n")
        out.writelines(f"{line}\n" for line in await_chain(task.get_coro(), limit))
    return out.getvalue()


def await_chain(coro: object, limit: int = 32) -> list[str]:
    """The frames of ``coro`` and of what it awaits, outermost first, then the awaited future."""
    lines: list[str] = []
    while coro is not None and len(lines) < limit:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "ag_frame", None)
        frame = frame or getattr(coro, "gi_frame", None)
        if frame is None:  # a future (its iterator says no more), or a finished coroutine
            what = "a future" if type(coro).__name__ == "FutureIter" else repr(coro)[:300]
            lines.append(f"  waiting on {what}")
            break
        code = frame.f_code
        lines.append(f'  File "{code.co_filename}", line {frame.f_lineno}, in {code.co_name}')
        coro = (
            getattr(coro, "cr_await", None)
            or getattr(coro, "ag_await", None)
            or getattr(coro, "gi_yieldfrom", None)
        )
    return lines


class TaskScope:
    """Own background tasks; on exit cancel them and wait at most ``shutdown_s``.

    ``create_task`` starts a child. A child that ends with an error cancels the body of the
    ``async with`` block and the error is raised from it (the first one, as TaskGroup would).
    """

    def __init__(
        self,
        *,
        shutdown_s: float,
        on_stuck: Callable[[list[asyncio.Task[Any]]], None] | None = None,
    ) -> None:
        self.shutdown_s = shutdown_s
        self.on_stuck = on_stuck
        self.stuck: list[asyncio.Task[Any]] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._parent: asyncio.Task[Any] | None = None
        self._error: BaseException | None = None
        self._cancelled_parent = False
        self._exiting = False

    async def __aenter__(self) -> TaskScope:
        self._parent = asyncio.current_task()
        return self

    def create_task(self, coro: Coroutine[Any, Any, T], *, name: str) -> asyncio.Task[T]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._on_done)
        return task

    def _on_done(self, task: asyncio.Task[Any]) -> None:
        if task.cancelled():
            return
        error = task.exception()
        if error is None or self._error is not None:
            return
        self._error = error
        if not self._exiting and self._parent is not None and not self._parent.done():
            self._cancelled_parent = True
            self._parent.cancel()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        self._exiting = True
        await self._stop_children()
        if self._cancelled_parent and self._parent is not None:
            self._parent.uncancel()
            if exc_type is asyncio.CancelledError and self._parent.cancelling() == 0:
                # the body was cancelled by us, for a child's error: that error is the story
                assert self._error is not None
                raise self._error
        if self._error is not None and exc_type is None:
            raise self._error
        return False

    async def _stop_children(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.shutdown_s
        pending = {task for task in self._tasks if not task.done()}
        while pending:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            for task in pending:
                task.cancel()
            _, pending = await asyncio.wait(pending, timeout=min(RECANCEL_EVERY_S, remaining))
        if pending:
            self.stuck = sorted(pending, key=lambda t: t.get_name())
            abandoned.update(pending)
            if self.on_stuck is not None:
                self.on_stuck(self.stuck)


async def unless_set(
    event: asyncio.Event, coro: Coroutine[Any, Any, T], *, name: str
) -> tuple[bool, T | None]:
    """Await ``coro`` unless ``event`` is set first: ``(True, result)`` if it ended, ``(False,
    None)`` if the event came first (``coro`` is then cancelled, and awaited, in a scope). Its
    error, if it fails, is raised. For a wait a stop must cut short: admission, a server's
    recovery."""
    if event.is_set():
        coro.close()
        return False, None
    async with TaskScope(shutdown_s=UNLESS_SET_SHUTDOWN_S) as scope:
        work = scope.create_task(coro, name=name)
        stop = scope.create_task(event.wait(), name=f"{name}:stop")
        await asyncio.wait({work, stop}, return_when=asyncio.FIRST_COMPLETED)
    if work.done() and not work.cancelled():
        return True, work.result()
    return False, None


UNLESS_SET_SHUTDOWN_S = 5.0


def run_until_done(main: Coroutine[Any, Any, T], *, shutdown_s: float = 5.0) -> T:
    """``asyncio.run`` whose shutdown is bounded: tasks left over are cancelled and waited on
    for at most ``shutdown_s``; tasks a scope abandoned are not waited on at all."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(main)
    finally:
        try:
            left = {task for task in asyncio.all_tasks(loop) if task not in abandoned}
            for task in left:
                task.cancel()
            if left:
                loop.run_until_complete(asyncio.wait(left, timeout=shutdown_s))
            loop.run_until_complete(loop.shutdown_asyncgens())
            # a worker thread (a dataset read) is waited on for the same bound, not for ever
            executor = loop.create_task(loop.shutdown_default_executor())
            loop.run_until_complete(asyncio.wait({executor}, timeout=shutdown_s))
        finally:
            abandoned.difference_update({task for task in abandoned if task.get_loop() is loop})
            loop.close()
