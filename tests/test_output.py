"""Issue 20 (a newcomer's first hour), item 5: logs and help that read well. Off a terminal the
progress is one plain line at a time; in a terminal the bar's suffix fits the width; --help is
readable at 80 columns."""

from __future__ import annotations

import asyncio
import io

from typer.testing import CliRunner

import eagledata
from eagledata.cli import app
from eagledata.run.holding import HoldState
from eagledata.run.progress import BAR_MIN_COLUMNS, Progress, fit_suffix

LOAD = {"kv": "85%", "running": "40", "queued": "2"}


def test_off_a_terminal_progress_is_one_plain_line_each_time() -> None:
    log = io.StringIO()  # not a terminal: no bar, no carriage returns
    progress = Progress(total=4, initial=0, stream=log, log_every_s=0.0)
    progress.hold_state = lambda: HoldState(1, "kv check", 2.0)
    for _ in range(4):
        progress.advance(tokens=100, in_flight=3, load=LOAD)
    progress.note("a note")
    progress.close()
    text = log.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert lines[0].startswith("progress: 1/4 records (25.0%) after ")
    assert lines[0].endswith(
        "; eta ?, held 1 (kv check), next check in 2 s, tok/s 100, kv 85%, running 40, "
        "queued 2, in_flight 3"
    )
    assert lines[3].startswith("progress: 4/4 records (100.0%)")
    assert lines[-1] == "a note"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_in_a_narrow_terminal_the_suffix_drops_fields_and_keeps_the_bar() -> None:
    fields = {"held": "held 7 (canary check)", "tok/s": "1,234", **LOAD, "in_flight": 42}
    assert fit_suffix(fields, 200).endswith("in_flight=42")
    short = fit_suffix(fields, 100 - BAR_MIN_COLUMNS)
    assert short.startswith("held 7 (canary check), tok/s=1,234, kv=85%")
    assert len(short) <= 100 - BAR_MIN_COLUMNS and "in_flight" not in short
    assert fit_suffix(fields, 5) == ""
    screen = Terminal()
    progress = Progress(total=10, initial=0, stream=screen)
    progress._bar.ncols = 100
    progress.hold_state = lambda: HoldState(7, "canary check", 12.0)
    progress.advance(tokens=10, in_flight=42, load=LOAD)
    progress._bar.refresh()
    last = screen.getvalue().split("\r")[-1]
    assert len(last.rstrip()) <= 100
    assert ("tok/s=" in last and "█" in last) or "|" in last


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_hold_is_shown_with_its_check_and_the_time_left_leaves_out_the_checks() -> None:
    """34 s of canary start, then 12 answers held for the canary in 2 s: the line says what is
    held and why, counts down to the check, and the time left is not 34 minutes."""
    clock, log = Clock(), io.StringIO()
    progress = Progress(total=60, initial=0, stream=log, log_every_s=30.0, clock=clock)
    progress.phase = "canary start: baseline and first check"
    clock.now += 34.0
    assert progress.fields(clock.now)["held"] == "canary start: baseline and first check"
    assert progress.fields(clock.now)["eta"] == "?"
    progress.generation_started()
    clock.now += 2.0
    progress.hold_state = lambda: HoldState(12, "canary check", 8.0)
    fields = progress.fields(clock.now)
    assert fields["held"] == "held 12 (canary check), next check in 8 s"
    # 12 answers in 2 s of generation: 48 left at 6/s, plus the 8 s the held ones wait
    assert fields["eta"] == "0:16"
    progress.hold_state = lambda: HoldState(12, "canary check", 0.0)
    assert progress.fields(clock.now)["held"] == "held 12 (canary check), checking now"


def test_off_a_terminal_a_heartbeat_line_comes_while_nothing_finishes() -> None:
    clock, log = Clock(), io.StringIO()
    progress = Progress(total=60, initial=0, stream=log, log_every_s=30.0, clock=clock)
    progress.generation_started()
    progress.hold_state = lambda: HoldState(3, "canary check", 20.0)
    clock.now += 29.0
    progress.refresh()
    assert log.getvalue() == ""
    clock.now += 1.0
    progress.refresh()
    clock.now += 30.0
    progress.refresh()
    lines = log.getvalue().splitlines()
    assert lines == [
        "progress: 0/60 records (0.0%) after 30 s; eta 9:50, held 3 (canary check), "
        "next check in 20 s, tok/s 0",
        "progress: 0/60 records (0.0%) after 60 s; eta 19:20, held 3 (canary check), "
        "next check in 20 s, tok/s 0",
    ]


def test_the_heartbeat_task_redraws_until_cancelled() -> None:
    log = io.StringIO()
    progress = Progress(total=5, initial=0, stream=log, log_every_s=0.0)

    async def beat_a_little() -> None:
        task = asyncio.create_task(progress.heartbeat(every_s=0.01))
        # the heartbeat's first wake-up is due before this one, however late both come
        await asyncio.sleep(0.1)
        task.cancel()

    asyncio.run(beat_a_little())
    assert log.getvalue().startswith("progress: 0/5 records (0.0%) after ")


def test_help_is_readable_at_80_columns_with_whole_option_names() -> None:
    runner = CliRunner()
    commands = ("generate", "resume", "status", "canary", "verify", "report", "check-server")
    commands += ("launch-server", "plan", "sim-server", "export")
    for command in commands:
        result = runner.invoke(app, [command, "--help"], env={"COLUMNS": "80"}, terminal_width=80)
        assert result.exit_code == 0, result.output
        for line in result.output.splitlines():
            assert len(line) <= 80, line
            # no word broken at a line's end (``rtx-`` / ``pro-6000x8``, ``no-`` / ``force``)
            assert not line.endswith("-"), (command, line)
        assert "…" not in result.output and "<bool>" not in result.output
        assert "╭" not in result.output  # plain help: no boxes squeezing the option names
        # the values a user types, not Python's types or typer's braces
        assert "<" not in result.output and "{" not in result.output, result.output
    export = runner.invoke(app, ["export", "--help"], terminal_width=80).output
    assert " export [OPTIONS] RUN_DIRS...\n" in export
    assert "  --keep TEXT  " in export and "  --max-length N  " in export
    assert "  --force / --no-force            Replace an existing output\n" in export
    plan = runner.invoke(app, ["plan", "--help"], terminal_width=80).output
    assert "  --profile TEXT  " in plan and "(rtx-pro-6000x8, the reference" in plan


def test_version() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output == f"eagledata {eagledata.__version__}\n"
