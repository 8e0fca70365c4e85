"""Issue 20 (a newcomer's first hour), item 5: logs and help that read well. Off a terminal the
progress is one plain line at a time; in a terminal the bar's suffix fits the width; --help is
readable at 80 columns."""

from __future__ import annotations

import io

from typer.testing import CliRunner

from eagledata.cli import app
from eagledata.run.progress import BAR_MIN_COLUMNS, Progress, fit_suffix

LOAD = {"kv": "85%", "running": "40", "queued": "2"}


def test_off_a_terminal_progress_is_one_plain_line_each_time() -> None:
    log = io.StringIO()  # not a terminal: no bar, no carriage returns
    progress = Progress(total=4, initial=0, stream=log, log_every_s=0.0)
    for _ in range(4):
        progress.advance(tokens=100, in_flight=3, held=1, load=LOAD)
    progress.note("a note")
    progress.close()
    text = log.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert lines[0].startswith("progress: 1/4 records (25.0%) after ")
    assert "kv 85%, running 40, queued 2, in_flight 3, held 1" in lines[0]
    assert lines[3].startswith("progress: 4/4 records (100.0%)")
    assert lines[-1] == "a note"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_in_a_narrow_terminal_the_suffix_drops_fields_and_keeps_the_bar() -> None:
    fields = {"tok/s": "1,234", **LOAD, "in_flight": 42, "held": 7}
    assert fit_suffix(fields, 200).endswith("held=7")
    short = fit_suffix(fields, 100 - BAR_MIN_COLUMNS)
    assert short.startswith("tok/s=1,234") and len(short) <= 100 - BAR_MIN_COLUMNS
    assert "held" not in short
    assert fit_suffix(fields, 5) == ""
    screen = Terminal()
    progress = Progress(total=10, initial=0, stream=screen)
    progress._bar.ncols = 100
    progress.advance(tokens=10, in_flight=42, held=7, load=LOAD)
    progress._bar.refresh()
    last = screen.getvalue().split("\r")[-1]
    assert len(last.rstrip()) <= 100
    assert ("tok/s=" in last and "█" in last) or "|" in last


def test_help_is_readable_at_80_columns_with_whole_option_names() -> None:
    runner = CliRunner()
    for command in ("generate", "resume", "export", "plan", "launch-server", "canary"):
        result = runner.invoke(app, [command, "--help"], env={"COLUMNS": "80"}, terminal_width=80)
        assert result.exit_code == 0, result.output
        for line in result.output.splitlines():
            assert len(line) <= 80, line
        assert "…" not in result.output and "<bool>" not in result.output
        assert "╭" not in result.output  # plain help: no boxes squeezing the option names
