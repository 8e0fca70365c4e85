"""How a session stops: on a signal, or with the first fatal error of its task group."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from eagledata.errors import EagledataError
from eagledata.run.embedded import current
from eagledata.run.progress import Progress
from eagledata.run.scheduler import Scheduler
from eagledata.tasks import stacks_on_usr1, task_stacks


def write_task_dump(run_dir: Path, why: str) -> Path | None:
    """Every task's stack into ``RUN_DIR/task-dump-<why>-<time>.txt``; None if it cannot be
    written (the dump is evidence, never a reason to fail the run)."""
    stamp = time.strftime("%Y%m%dT%H%M%S")
    path = run_dir / f"task-dump-{why}-{stamp}.txt"
    try:
        path.write_text(task_stacks())
    except OSError:
        return None
    return path


def first_fatal(group: BaseExceptionGroup[Any]) -> BaseException:
    """The error to report from a task group: ours first, then anything else."""
    leaves: list[BaseException] = []

    def walk(error: BaseException) -> None:
        if isinstance(error, BaseExceptionGroup):
            for inner in error.exceptions:
                walk(inner)
        else:
            leaves.append(error)

    walk(group)
    for leaf in leaves:
        if isinstance(leaf, EagledataError):
            return leaf
    return leaves[0]


@contextlib.contextmanager
def stop_on_signals(
    scheduler: Scheduler[Any], progress: Progress, on_stop: Callable[[], None]
) -> Iterator[None]:
    """SIGINT/SIGTERM once: ``on_stop``, then let in-flight requests finish and take no new work.

    Twice: cancel the task that entered this block (in-flight requests are abandoned). SIGUSR1
    prints every task's stack. Inside another program (run/embedded.py) nothing is installed:
    the host stops the session by cancelling it.
    """
    loop = asyncio.get_running_loop()
    main_task = asyncio.current_task()
    presses = 0

    def on_interrupt() -> None:
        nonlocal presses
        presses += 1
        if presses == 1:
            on_stop()
            progress.note(
                f"stopping: finishing {scheduler.stats.in_flight} in-flight requests "
                "(Ctrl-C again to abandon them)"
            )
            scheduler.stop()
        elif main_task is not None:
            main_task.cancel()

    installed: list[signal.Signals] = []
    if current() is not None:  # inside another program: its signals are its own
        yield
        return
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signum, on_interrupt)
            installed.append(signum)
    try:
        with tasks_on_usr1(loop):
            yield
    finally:
        for signum in installed:
            loop.remove_signal_handler(signum)


@contextlib.contextmanager
def tasks_on_usr1(loop: asyncio.AbstractEventLoop) -> Iterator[None]:
    """While the loop runs: ``kill -USR1 <pid>`` prints every task's stack, where each waits (a
    multi-day run must be debuggable); after, every thread's stack again (``stacks_on_usr1``),
    never the default action that kills the process."""

    def dump_tasks() -> None:
        sys.stderr.write(task_stacks(asyncio.all_tasks(loop)))

    try:
        loop.add_signal_handler(signal.SIGUSR1, dump_tasks)
    except (NotImplementedError, RuntimeError, ValueError):
        yield
        return
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGUSR1)
        stacks_on_usr1()


@contextlib.contextmanager
def cancel_on_signals(on_signal: Callable[[], None]) -> Iterator[None]:
    """Before the work starts (the servers' checks, the canary's baseline): one SIGINT/SIGTERM
    calls ``on_signal`` and cancels the task that entered this block; there is nothing in flight
    to finish. ``stop_on_signals`` takes over once requests are sent. SIGUSR1 prints every
    task's stack, as it does mid-run."""
    loop = asyncio.get_running_loop()
    main_task = asyncio.current_task()

    def on_interrupt() -> None:
        on_signal()
        if main_task is not None:
            main_task.cancel()

    installed: list[signal.Signals] = []
    if current() is not None:  # inside another program: its signals are its own
        yield
        return
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signum, on_interrupt)
            installed.append(signum)
    try:
        with tasks_on_usr1(loop):
            yield
    finally:
        for signum in installed:
            loop.remove_signal_handler(signum)
