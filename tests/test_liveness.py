"""Issue 15: a run ends when its work ends, whatever its tasks do; a run that stops progressing
says where it waits."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from pathlib import Path
from typing import Any, cast

import pytest

from conftest import SAMPLES, make_config, read_records, sim_config
from eagledata.config import LoadSettings
from eagledata.run import pipeline, session
from eagledata.run.loadcontrol import LoadController
from eagledata.run.watchdog import watchdog_bound
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
    assert waited < 30.0  # bounded (0.3 s and a re-cancel), never waited on for ever
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


# --- the watchdog: a run that stops progressing says where it waits -----------------------------


def test_the_watchdog_bound_comes_from_the_settings_unless_set(tmp_path: Path) -> None:
    config = make_config(["http://127.0.0.1:1"], tmp_path / "run")
    server = config.server
    # a request's whole life (or a server down, if longer), its backoff, a round of the holder
    expected = (
        max(server.connect_timeout_s + server.request_timeout_s, server.down_deadline_s)
        + server.backoff_max_s
        + server.guard_interval_s
    )
    assert watchdog_bound(config) == expected
    longer = make_config(["http://127.0.0.1:1"], tmp_path / "run", server={"down_deadline_s": 600})
    assert watchdog_bound(longer) == 600 + server.backoff_max_s + server.guard_interval_s
    set_by_hand = make_config(["http://127.0.0.1:1"], tmp_path / "run", run={"watchdog_s": 7.5})
    assert watchdog_bound(set_by_hand) == 7.5


@pytest.mark.slow
def test_a_server_that_stops_answering_mid_run_gets_a_dump_and_the_run_goes_on(
    tokenizer_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Mid-run every request stalls in the server. With no answer, record or check for the
    watchdog's bound, the run writes a task dump and one line naming where it waits (the
    requests in flight to that server); it is not stopped, and once the server answers again
    every record lands, exactly once."""
    out = tmp_path / "run"
    with SimServerThread(sim_config(tokenizer_dir, latency_s=0.01)) as sim:
        config = make_config(
            [sim.url],
            out,
            run={"limit": 20, "concurrency": 4, "watchdog_s": 1.0},
            # a stalled request times out and is tried again: nothing waits for the stall's end
            server={"request_timeout_s": 3, "max_attempts": 50},
        )
        stalled = threading.Event()
        dumped: list[Path] = []

        def stall_then_recover() -> None:
            if not wait_until(lambda: len(read_records(out)) >= 4):
                return
            sim.control(stall_rate=1.0, stall_s=600)  # every request from now on hangs
            stalled.set()
            wait_until(lambda: bool(dumped.extend(out.glob("task-dump-stalled-*.txt")) or dumped))
            sim.control(stall_rate=0.0)  # answers again: the timed-out requests are retried

        helper = threading.Thread(target=stall_then_recover, daemon=True)
        helper.start()
        summary = pipeline.generate(config, DATASET, None, progress=False)
        helper.join(timeout=60)
    assert stalled.is_set() and dumped, "the watchdog wrote no dump while the server stalled"
    assert (summary.written, summary.failed, summary.left) == (20, 0, 0)
    records = read_records(out)
    assert len({record["id"] for record in records}) == len(records) == 20
    warnings = [line for line in capsys.readouterr().err.splitlines() if "no progress" in line]
    assert warnings, "the watchdog said nothing on stderr"
    assert any(f"in flight to {sim.url}" in line for line in warnings), warnings
    first = warnings[0]
    assert first.startswith("warning: no progress for ")
    assert "the watchdog's bound is 1 s): waiting on " in first
    assert f"every task's stack is in {out}/task-dump-stalled-" in first
    assert f"the run goes on (Ctrl-C stops it, 'eagledata resume {out}' continues it)" in first
    dump = sorted(out.glob("task-dump-stalled-*.txt"))[0].read_text()
    assert "--- task watchdog" in dump and "--- task checks" in dump
    # each sender's whole chain of awaits, down into the client's request to the server
    assert 'eagledata/run/attempts.py", line ' in dump
    assert 'eagledata/server/client.py", line ' in dump


def wait_until(condition: Any, bound_s: float = 60.0) -> bool:
    """Poll ``condition`` until it holds, for at most a generous ``bound_s``."""
    give_up = time.monotonic() + bound_s
    while not condition():
        if time.monotonic() > give_up:
            return False
        time.sleep(0.01)
    return True
