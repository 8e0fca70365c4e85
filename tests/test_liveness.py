"""Issue 15: a run ends when its work ends, whatever its tasks do; a run that stops progressing
says where it waits."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any, cast

import pytest

from conftest import SAMPLES, make_config, read_records, sim_config
from eagledata.config import LoadSettings
from eagledata.run import pipeline, session
from eagledata.run.loadcontrol import LoadController
from eagledata.simserver import SimServerThread
from eagledata.tasks import TaskScope, abandoned, run_until_done

DATASET = str(SAMPLES / "sharegpt.jsonl")


def test_an_answer_ending_as_the_run_cancels_the_controller_still_ends_it() -> None:
    """The end-of-run hang: an answer ends (the controller's wake-up is set) in the same step
    as the run cancels the controller. Python 3.11's ``wait_for`` returned the wake-up and
    swallowed the cancel, and the controller's loop went on for ever."""

    async def main() -> bool:
        control = LoadController(
            cast(Any, None),
            LoadSettings(poll_interval_s=30.0),
            fixed=None,
            max_new_tokens=64,
            telemetry=None,
            note=print,
        )
        task = asyncio.create_task(control.run())
        for _ in range(100):  # until it waits for the next poll
            await asyncio.sleep(0)
        control._answer_ended.set()
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=2.0)
        if task not in done:  # the old code: cancel again so the test itself ends
            task.cancel()
            await asyncio.wait({task}, timeout=2.0)
        return task in done

    assert asyncio.run(main()), "the controller swallowed its cancel and kept running"


async def _swallows_one_cancel(started: asyncio.Event) -> None:
    started.set()
    with contextlib.suppress(asyncio.CancelledError):  # what 3.11's wait_for did in the race
        await asyncio.sleep(3600)
    await asyncio.sleep(3600)


async def _never_ends(started: asyncio.Event) -> None:
    started.set()
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            continue


def test_a_scope_ends_a_task_that_swallows_one_cancel() -> None:
    async def main() -> list[str]:
        started = asyncio.Event()
        scope = TaskScope(shutdown_s=5.0)
        async with scope:
            task = scope.create_task(_swallows_one_cancel(started), name="controller")
            await started.wait()
        assert task.cancelled()
        return [t.get_name() for t in scope.stuck]

    assert run_until_done(main()) == []


def test_a_task_that_never_ends_is_reported_and_abandoned_not_awaited() -> None:
    reported: list[str] = []

    async def main() -> float:
        loop = asyncio.get_running_loop()
        started = asyncio.Event()
        scope = TaskScope(
            shutdown_s=0.3, on_stuck=lambda tasks: reported.extend(t.get_name() for t in tasks)
        )
        began = loop.time()
        async with scope:
            scope.create_task(_never_ends(started), name="stubborn")
            await started.wait()
        return loop.time() - began

    waited = run_until_done(main(), shutdown_s=0.3)
    assert reported == ["stubborn"]
    assert waited < 3.0
    assert not abandoned  # the runner forgets what it left behind once its loop is closed


def test_a_child_that_fails_cancels_the_body_and_its_error_is_raised() -> None:
    async def fails() -> None:
        await asyncio.sleep(0.01)
        raise ValueError("the guard refused the server")

    async def main() -> None:
        async with TaskScope(shutdown_s=1.0) as scope:
            scope.create_task(fails(), name="guard")
            await asyncio.sleep(3600)

    with pytest.raises(ValueError, match="refused"):
        run_until_done(main())


def test_a_run_whose_controller_never_ends_still_ends_with_every_record_written(
    tokenizer_dir: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Whatever a background task does, the run ends once its work is done: the task is
    reported in one line and in a dump file, every answer is written, and nothing waits."""

    async def stubborn(self: LoadController) -> None:
        await _never_ends(asyncio.Event())

    monkeypatch.setattr(LoadController, "run", stubborn)
    monkeypatch.setattr(session, "TASK_SHUTDOWN_S", 0.5)
    with SimServerThread(sim_config(tokenizer_dir)) as sim:
        config = make_config([sim.url], tmp_path / "run", run={"limit": 6})
        summary = pipeline.generate(config, DATASET, None, progress=False)
    assert (summary.written, summary.failed, summary.left) == (6, 0, 0)
    assert len(read_records(tmp_path / "run")) == 6
    err = capsys.readouterr().err
    assert "load-controller did not end within 0.5 s of the run's end and was abandoned" in err
    dumps = list((tmp_path / "run").glob("task-dump-stuck-*.txt"))
    assert len(dumps) == 1
    assert "--- task load-controller (cancelling)" in dumps[0].read_text()
