"""Issue 20 (a newcomer's first hour), item 3: one definition of tok/s (output tokens over the
run's active time, rundir/rates.py), the same in the summary line, ``status``, ``status --json``
and the report; a short run says it is too short to rate."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from conftest import SAMPLES, make_config, sim_config
from eagledata.cli import app
from eagledata.report import build_report
from eagledata.run import pipeline
from eagledata.rundir.rates import MIN_RATED_S, TOO_SHORT, Rate, active_seconds, run_rates
from eagledata.simserver import SimServerThread
from report_fixtures import spread_in_time
from report_page import ReportPage


def test_active_time_is_the_union_of_the_requests_in_flight() -> None:
    # two overlapping requests, a gap, one more: (0..10 u 5..12) + (20..25) = 12 + 5
    assert active_seconds([0, 5, 20], [10, 12, 25]) == pytest.approx(17.0)
    # one request inside another adds nothing; clipping to a window
    assert active_seconds([0, 2], [10, 3]) == pytest.approx(10.0)
    assert active_seconds([0, 5, 20], [10, 12, 25], lo=8, hi=22) == pytest.approx(6.0)
    assert active_seconds([], []) == 0.0


def test_a_run_shorter_than_the_bound_is_too_short_to_rate() -> None:
    short = Rate(tokens=5000, records=40, active_s=MIN_RATED_S / 2)
    assert short.tok_s is None and short.text().startswith(TOO_SHORT)
    rated = Rate(tokens=6000, records=40, active_s=60.0)
    assert rated.tok_s == 100.0
    assert rated.text() == "100.0 output tok/s over 1m00s of active time"
    overall, recent = run_rates([0, 100], [50, 200], [1000, 3000], now=200, window_s=60)
    assert overall.tok_s == pytest.approx(4000 / 150)
    assert recent.tokens == 3000 and recent.active_s == pytest.approx(60.0)


@pytest.fixture(scope="module")
def finished(tokenizer_dir: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("rates") / "run"
    with SimServerThread(sim_config(tokenizer_dir, latency_s=0.01)) as sim:
        config = make_config([sim.url], out)
        summary = pipeline.generate(config, str(SAMPLES / "sharegpt.jsonl"), None, progress=False)
    return out, summary.render()


def rate_line(text: str) -> str:
    match = re.search(r"rate:\s+(.*)", text)
    assert match, text
    return match.group(1)


def test_a_short_run_says_so_everywhere_and_a_finished_one_shows_no_question_mark(
    finished: tuple[Path, str],
) -> None:
    run, summary = finished
    runner = CliRunner()
    status = runner.invoke(app, ["status", str(run)]).output
    assert rate_line(summary).startswith(TOO_SHORT)
    assert rate_line(status) == rate_line(summary)  # one definition, one figure
    assert "?" not in status and "None" not in status
    assert "eta:      done" in status
    as_json = orjson.loads(runner.invoke(app, ["status", str(run), "--json"]).output)
    assert as_json["tok_s"]["overall"] is None and as_json["eta_s"] == 0.0
    page = ReportPage(build_report(run).read_text(encoding="utf-8"))
    assert page.headline["tok_s"].startswith(TOO_SHORT)
    assert TOO_SHORT in page.sections["throughput"].missing
    assert "40 answers" in page.sections["throughput"].missing


def test_a_rated_run_shows_one_figure_in_status_json_and_report(
    finished: tuple[Path, str], tmp_path: Path
) -> None:
    source, _ = finished
    run = tmp_path / "run"
    import shutil

    shutil.copytree(source, run)
    spread_in_time(run, step_s=2.0, latency_s=5.0)  # 40 answers over ~83 s of active time
    runner = CliRunner()
    as_json = orjson.loads(runner.invoke(app, ["status", str(run), "--json"]).output)
    overall = as_json["tok_s"]["overall"]
    assert as_json["tok_s"]["active_s"] == pytest.approx(39 * 2.0 + 5.0)
    assert overall == pytest.approx(as_json["output_tokens"] / as_json["tok_s"]["active_s"])
    status = runner.invoke(app, ["status", str(run)]).output
    assert rate_line(status).startswith(f"{overall:,.1f} output tok/s over 1m23s")
    page = ReportPage(build_report(run).read_text(encoding="utf-8"))
    assert page.headline["tok_s"].startswith(f"{overall:,.1f} over the run's")
    assert page.sections["throughput"].images
