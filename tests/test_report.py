"""``eagledata report`` (issue 10): the sections a person reads, the headline equal to ``status``,
plots left out with a reason, committed data only, and a record reader that never guesses."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import orjson
import pytest

from conftest import SAMPLES, make_config, read_records, run_cli, sim_config
from eagledata.export.report import ExportReport
from eagledata.report import build_report, records_scan
from eagledata.report.mix import mix_rows
from eagledata.report.page import headline_rows
from eagledata.report.plots_canary import toward_threshold
from eagledata.report.plots_time import (
    MAX_LOAD_POINTS,
    _retraction_events,
    load_columns,
    rate_bins,
)
from eagledata.report.records_scan import committed_lines, record_fields, scan_records
from eagledata.report.rundata import (
    CanaryCheck,
    GuardCheck,
    LoadSeries,
    find_reconnects,
    gather,
)
from eagledata.run import pipeline
from eagledata.rundir.percentile import percentile
from eagledata.rundir.status import run_status
from eagledata.rundir.totals import scan_totals
from eagledata.simserver import SimServerThread
from report_fixtures import spread_in_time, write_canary, write_telemetry
from report_page import PNG_SIGNATURE, ReportPage

SECTIONS = {
    "mix",
    "throughput",
    "load",
    "answer_lengths",
    "prompt_vs_answer",
    "outcomes",
    "canary",
    "failures",
}
DRAWN_FROM_RECORDS = {"throughput", "answer_lengths", "prompt_vs_answer", "outcomes", "failures"}


@pytest.fixture(scope="module")
def sim_run(tokenizer_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run with records, answers cut at max_new_tokens, and failures (bad rows)."""
    base = tmp_path_factory.mktemp("report")
    prompts = base / "prompts.jsonl"
    prompts.write_bytes(
        (SAMPLES / "sharegpt.jsonl").read_bytes() + (SAMPLES / "bad_rows.jsonl").read_bytes()
    )
    with SimServerThread(sim_config(tokenizer_dir, latency_s=0.01)) as server:
        config = make_config(
            [server.url],
            base / "run",
            generation={"max_prompt_tokens": 4000, "max_new_tokens": 48},
            # samples enough for a chart: fewer are shown as numbers (plots_time.MIN_LOAD_SAMPLES)
            load={"poll_interval_s": 0.01, "telemetry_interval_s": 0.01},
        )
        pipeline.generate(config, str(prompts), None, progress=False)
    spread_in_time(base / "run", step_s=1.0, latency_s=4.0)  # a minute of generation
    return base / "run"


def page_of(run_dir: Path, out: Path | None = None) -> ReportPage:
    path = build_report(run_dir, out)
    return ReportPage(path.read_text(encoding="utf-8"))


def copy_run(source: Path, target: Path) -> Path:
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("report.html", ".lock"))
    return target


@pytest.mark.slow
def test_report_holds_every_section_and_the_numbers_of_status(sim_run: Path) -> None:
    page = page_of(sim_run)
    assert (sim_run / "report.html").is_file()
    assert set(page.sections) == SECTIONS
    assert page.external == [] and page.scripts == 0  # self-contained, nothing to load or run
    for key in DRAWN_FROM_RECORDS:
        section = page.sections[key]
        assert len(section.images) == 1, key
        assert section.images[0].startswith(PNG_SIGNATURE) and len(section.images[0]) > 5000
        assert section.caption and section.title and not section.missing
    # Every run samples its servers' load (issue 9): the load section is drawn from it.
    assert len(page.sections["load"].images) == 1 and not page.sections["load"].missing
    # No canary in this run: left out, with the reason, never drawn empty.
    assert page.sections["canary"].images == []
    assert "no quality.jsonl" in page.sections["canary"].missing

    # The headline is `eagledata status --json`, number for number (the rate of the last ten
    # minutes and the ETA move with the clock: the page's own are shown in its table).
    result = cli("status", str(sim_run), "--json")
    assert result.returncode == 0, result.stderr
    status, shown = orjson.loads(result.stdout), page.status
    moving = ("tok_s", "eta_s")
    assert {k: v for k, v in shown.items() if k not in moving} == {
        k: v for k, v in status.items() if k not in moving
    }
    assert shown["tok_s"]["overall"] == status["tok_s"]["overall"]
    totals = scan_totals(sim_run)
    assert status["written"] == totals.written > 0 and status["failed"] > 0
    assert status["finish_reasons"]["length"] > 0 and status["left"] == 0
    # The table shows them as a person reads them.
    for key in ("planned", "written", "failed", "skipped", "left"):
        assert page.headline[key].startswith(f"{status[key]:,}"), (key, page.headline[key])
    assert page.headline["output_tokens"].startswith(f"{status['output_tokens']:,} ")
    assert page.headline["tok_s"].startswith(f"{status['tok_s']['overall']:,.1f} over the run's")
    for reason, count in status["finish_reasons"].items():
        assert (
            f"{reason} {count:,} ({count / status['written']:.1%})"
            in page.headline["finish_reasons"]
        )
    for reason, count in status["failure_reasons"].items():
        assert f"{reason} {count:,}" in page.headline["failure_reasons"]
    for flag, count in status["quality"]["flags"].items():
        assert f"{flag} {count:,}" in page.headline["quality.flags"]
    # The plots count what status counts.
    drawn = scan_records(sim_run)
    assert dict(drawn.finish_reasons) == status["finish_reasons"]
    assert dict(drawn.flags) == status["quality"]["flags"]
    assert sum(drawn.completion_tokens) == status["output_tokens"]
    assert sum(drawn.prompt_tokens) == status["prompt_tokens"]
    cut = status["finish_reasons"]["length"]
    assert page.sections["answer_lengths"].caption.startswith(
        f"{cut:,} ({cut / status['written']:.1%}) answers cut at max_new_tokens (48)"
    )
    failed = page.sections["failures"].caption
    assert failed.startswith(f"{status['failed']:,} failed and {status['skipped']:,} skipped")


@pytest.mark.slow
def test_fixture_canary_and_telemetry_are_drawn_with_their_thresholds(
    sim_run: Path, tmp_path: Path
) -> None:
    run = copy_run(sim_run, tmp_path / "run")
    start = min(r["created_at"] for r in read_records(run))
    # A loaded machine can leave a gap between the fixture run's own KV checks, which reads as
    # a reconnect too: count those, then add the canary's.
    reconnects_before = len(gather(run).reconnects)
    write_canary(run, start)
    write_telemetry(run, start, tail=b"not json\n" + b'{"time": 1')  # a bad line, a torn tail

    page = page_of(run)
    canary, load = page.sections["canary"], page.sections["load"]
    assert len(canary.images) == 1 and len(load.images) == 1
    # How near the canary came to firing, the baseline excluded: 0.03 / 0.01 beats -0.05 / -0.02.
    assert canary.caption.startswith("1 of 2 checks after the baseline did not pass")
    assert "came to its threshold: topk kl 0.03 against 0.01 (300% of the way)" in (canary.caption)
    assert "Last failure: drift on http://a:1 (topk_kl 0.03 > 0.01)." in canary.caption
    assert load.caption.startswith("40 samples from 2 servers; peak KV usage 88%; 4 retractions.")
    assert page.headline["quality.canary"].startswith("2 checks, 1 passed, 1 failed")
    assert "http://a:1: KV 88%, 59 running, 1 queued" in page.headline["load"]
    # The malformed line is counted, the torn tail (no newline: not committed) is not read.
    assert "Lines skipped as malformed: telemetry.jsonl 1." in (run / "report.html").read_text()
    # A rotated file holds the samples before the live one: both are drawn, in time order.
    (run / "telemetry.jsonl").rename(run / "telemetry.1.jsonl")
    write_telemetry(run, start + 100)
    assert page_of(run).sections["load"].caption.startswith("80 samples from 2 servers")
    # The reconnect-triggered canary is marked on the rate plot.
    reconnects = reconnects_before + 1
    marked = f"{reconnects} server reconnect{'' if reconnects == 1 else 's'} marked"
    assert marked in page.sections["throughput"].caption


def test_an_empty_run_gets_a_report_that_says_why_each_plot_is_missing(
    sim_run: Path, tmp_path: Path
) -> None:
    run = copy_run(sim_run, tmp_path / "run")
    for folder in ("shards", "pending"):
        shutil.rmtree(run / folder, ignore_errors=True)
    (run / "failures.jsonl").write_bytes(b"")
    (run / "telemetry.jsonl").unlink(missing_ok=True)
    page = page_of(run, tmp_path / "elsewhere" / "r.html")
    assert set(page.sections) == SECTIONS
    assert all(not s.images and s.missing for s in page.sections.values())
    assert page.sections["throughput"].missing.startswith("No records yet")
    assert page.status["written"] == 0


def test_the_record_reader_finds_exactly_what_a_full_parse_finds(sim_run: Path) -> None:
    lines = list(committed_lines(sim_run))
    assert len(lines) == run_status(sim_run).written
    tricky = dict(orjson.loads(lines[0]))
    tricky["messages"] = [
        {"role": "user", "content": 'say "flags":["x"], "flags":{"empty":true} "created_at":1'}
    ]
    tricky["text"] = '\\"completion_tokens\\":99 \u00e9\U0001f600 "finish_reason":"length"'
    # The run's first record may carry flags of its own (a truncated answer, in one CI run):
    # every flag cleared, then the two this test looks for set.
    cleared = dict.fromkeys(tricky["flags"], False)
    tricky["flags"] = {**cleared, "degenerate": True, "unbalanced_think": True}
    tricky["spec_verify_ct"] = 17
    spaced = json.dumps(tricky, indent=1).replace("\n", " ").encode() + b"\n"
    listed = {**tricky, "flags": ["degenerate", "unbalanced_think"]}  # flags as a list, once
    listed_clean = {**tricky, "flags": []}
    older = {k: v for k, v in tricky.items() if k not in ("flags", "server", "created_at")}
    extra = [tricky, listed, listed_clean, older]
    for line in [*lines, spaced, *(orjson.dumps(record) + b"\n" for record in extra)]:
        record = orjson.loads(line)
        fields = record_fields(line)
        assert fields["prompt_tokens"] == record["prompt_tokens"]
        assert fields["completion_tokens"] == record["completion_tokens"]
        assert fields["finish_reason"] == record["finish_reason"]
        assert fields["created_at"] == record.get("created_at", 0.0)
        flags = record.get("flags")
        if isinstance(flags, dict):
            flags = [name for name, value in flags.items() if value]
        assert fields["flags"] == flags
    assert record_fields(orjson.dumps(tricky))["flags"] == ["degenerate", "unbalanced_think"]


@pytest.mark.slow
def test_reads_committed_lines_only_and_a_shard_sealed_mid_read_once(
    sim_run: Path, tmp_path: Path
) -> None:
    run = copy_run(sim_run, tmp_path / "run")
    shards = sorted((run / "shards").glob("shard-*.jsonl"))
    assert len(shards) >= 3
    expected = sum(len(p.read_bytes().splitlines()) for p in shards)
    # The newest shard is still an open journal, its last write torn.
    journal = run / "pending" / shards[-1].name
    journal.parent.mkdir(exist_ok=True)
    shards[-1].rename(journal)
    whole = journal.read_bytes()
    journal.write_bytes(whole + whole.splitlines(keepends=True)[0][:40])
    reader = committed_lines(run)
    first = next(reader)
    journal.rename(run / "shards" / journal.name)  # sealed while the report reads
    assert len([first, *reader]) == expected
    # Writing the report takes no lock and leaves the run as it found it.
    before = {p: p.stat().st_mtime_ns for p in run.rglob("*")}
    build_report(run)
    after = {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.name != "report.html"}
    assert after == before


@pytest.mark.slow
def test_records_carry_their_completion_time_not_their_release_time(
    tokenizer_dir: str, tmp_path: Path
) -> None:
    """The guard holds results until a later check (0.5 s apart here); created_at must still be
    when each answer completed, or the rate plot bunches at the checks."""
    with SimServerThread(sim_config(tokenizer_dir, latency_s=0.05)) as server:
        config = make_config(
            [server.url],
            tmp_path / "run",
            server={"guard_interval_s": 0.5, "guard_max_held": 1000},
            run={"concurrency": 1},
        )
        pipeline.generate(config, str(SAMPLES / "sharegpt.jsonl"), None, progress=False)
    times = sorted(r["created_at"] for r in read_records(tmp_path / "run"))
    gaps = np.diff(times)
    # One request at a time, 50 ms each: completions are spread, not released in batches.
    assert float(np.median(gaps)) > 0.02


def test_rate_bins_keep_every_token_and_show_a_pause_as_zero() -> None:
    times = np.array([100.0, 100.5, 101.2, 160.0, 161.0])
    tokens = np.array([10.0, 20.0, 30.0, 40.0, 50.0])
    starts, rate, width = rate_bins(times, tokens, 100.0, 161.0)
    assert width == 0.5 and len(starts) == len(rate) == 123  # at most 150 bins
    assert float((rate * width).sum()) == tokens.sum()
    assert list(rate[:3]) == [20, 40, 60] and rate[60] == 0  # a pause is drawn as a pause
    _, rate, width = rate_bins(np.array([0.0, 86400.0 * 3]), np.array([1.0, 1.0]), 0, 86400 * 3)
    assert width == 1800 and len(rate) == 145


def test_retractions_are_the_increases_of_a_counter_that_restarts_with_a_session() -> None:
    series = LoadSeries("a")
    for value in (0, 0, 2, 2, 3, 1, 1, 4):  # a resume after the fifth sample: back to 0, then 1
        series.retracted.append(value)
    assert list(_retraction_events(series)) == [0, 0, 2, 0, 1, 1, 0, 3]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args)


@pytest.mark.slow
def test_cli_writes_the_report_and_fails_in_one_line(sim_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    result = cli("report", str(sim_run), "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"report: {out}"
    assert set(ReportPage(out.read_text()).sections) == SECTIONS

    result = cli("report", str(tmp_path))
    assert result.returncode == 5 and result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"eagledata: error: {tmp_path} is not an eagledata run")

    locked = tmp_path / "ro"
    locked.mkdir()
    os.chmod(locked, 0o500)
    try:
        # root writes anyway: then a path under a file, which nobody can create
        target = str(out / "x.html") if os.access(locked, os.W_OK) else str(locked / "r.html")
        result = cli("report", str(sim_run), "--out", target)
    finally:
        os.chmod(locked, 0o700)
    assert result.returncode == 5 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("eagledata: error: cannot write the report to")
    assert "Traceback" not in result.stderr


def test_a_server_back_after_a_silence_is_a_reconnect() -> None:
    checks = [GuardCheck(t, "http://a:1", True, ()) for t in (0, 30, 60, 300, 330)]
    checks += [GuardCheck(t, "http://b:2", True, ()) for t in (0, 30, 60, 90)]
    canary = [CanaryCheck(400, "http://b:2", "check", "reconnect", "pass", {}, {}, "")]
    found = find_reconnects(sorted(checks, key=lambda c: c.time), canary, guard_interval_s=30)
    assert [(r.time, r.server, r.silent_s, r.source) for r in found] == [
        (300, "http://a:1", 240, "checks"),
        (400, "http://b:2", 0.0, "canary"),
    ]


def test_long_telemetry_is_averaged_into_bins_and_keeps_every_retraction() -> None:
    series = LoadSeries("a")
    for step in range(41_040):  # 57 h of a sample every 5 s
        series.time.append(step * 5.0)
        series.token_usage.append(0.9)
        series.running.append(float(step % 50))
        series.queued.append(float("nan") if step % 2 else 1.0)
        series.target.append(48.0)
        series.retracted.append(1.0 if step % 1000 == 0 else 0.0)
        series.in_flight.append(48.0)
    columns = load_columns(series)
    assert len(columns["time"]) == MAX_LOAD_POINTS
    assert float(columns["retractions"].sum()) == 42
    assert np.allclose(columns["token_usage"], 0.9) and np.allclose(columns["queued"], 1.0)
    assert abs(float(columns["running"].mean()) - 24.5) < 0.5


@pytest.mark.parametrize("block", [1, 7, 64, 1 << 23])
def test_line_spans_across_blocks_and_past_the_buffer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block: int
) -> None:
    monkeypatch.setattr(records_scan, "BLOCK", block)
    lines = [b"a", b"", b"x" * 200, b'{"k":1}', b"tail"]
    path = tmp_path / "f.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\ntorn, no newline")
    with path.open("rb", buffering=0) as handle:
        got = [bytes(buf[start:end]) for buf, start, end in records_scan.line_spans(handle)]
    assert got == lines


def test_the_load_row_reads_the_latest_samples_as_a_list_or_a_mapping() -> None:
    sample = {
        "server": "http://a:1",
        "rank": 0,
        "token_usage": 0.912,
        "num_running_reqs": 45,
        "num_queue_reqs": 2,
    }
    for load in ([sample], {"http://a:1#0": sample}):
        rows = {key: value for key, _, value in headline_rows({"load": load})}
        assert rows["load"] == "http://a:1 rank 0: KV 91%, 45 running, 2 queued"
    assert {k: v for k, _, v in headline_rows({"load": None})}["load"] == "no telemetry"


def test_which_way_each_canary_statistic_fires_is_the_canarys_own() -> None:
    """The plot's directions agree with eagledata.quality.canary_stats.fired."""
    from eagledata.quality.canary_stats import STATS, fired

    limits = {
        "mean_shift": -0.02,
        "trimmed_abs": 0.03,
        "topk_kl": 0.01,
        "top1_flip": 0.01,
        "greedy_divergence": 0.5,
    }
    calm = {
        "mean_shift": 0.0,
        "trimmed_abs": 0.0,
        "topk_kl": 0.0,
        "top1_flip": 0.0,
        "greedy_divergence": 1.0,
    }
    assert fired(calm, limits) == []
    for name in STATS:
        assert toward_threshold(name, calm[name], limits[name]) < 1, name
        for factor in (0.5, 2.0):
            stats = {**calm, name: limits[name] * factor}
            past = toward_threshold(name, stats[name], limits[name])
            assert past is not None
            assert (past > 1) == bool(fired(stats, limits)), (name, factor)


def test_status_the_report_and_export_say_one_p50_and_p90(sim_run: Path) -> None:
    """One percentile (nearest rank, rundir/percentile.py) for the same answers: status's quality
    line, the report's answer-length chart and its per-dataset table; export's summary computes
    its lengths' percentiles with the same function."""
    lengths = scan_records(sim_run).completion_tokens
    p50, p90 = percentile(lengths, 0.5), percentile(lengths, 0.9)
    ordered = sorted(lengths)
    assert p50 == ordered[(len(ordered) + 1) // 2 - 1]  # the lower middle of an even count
    result = cli("status", str(sim_run))
    assert result.returncode == 0, result.stderr
    assert f"output tokens p50 {p50:,}, p90 {p90:,}, max {ordered[-1]:,}" in result.stdout
    page = page_of(sim_run)
    assert f"; p50 {p50:,}, p90 {p90:,}, longest" in page.sections["answer_lengths"].caption
    status = orjson.loads(cli("status", str(sim_run), "--json").stdout)
    (row,) = mix_rows(status, scan_records(sim_run))
    assert row.cells[6] == f"{p50:,} / {p90:,}"
    summary = ExportReport("ids", "out.jsonl", "out.export.json", [], None)
    summary.lengths.extend(lengths)
    assert summary.length_stats()["p50"] == p50
    # the definition, by hand: the ceil(p * n)-th smallest
    assert [percentile(range(1, 11), p) for p in (0.0, 0.5, 0.9, 0.91, 1.0)] == [1, 5, 9, 10, 10]


def test_status_mid_run_gives_the_dataset_the_runs_estimate(sim_run: Path, tmp_path: Path) -> None:
    """Before the plan is read to its end the run's planned line is an estimate; its one
    dataset's line said 'planned ?' beside it."""
    run = copy_run(sim_run, tmp_path / "mid")
    (run / "plan.json").unlink()
    manifest = orjson.loads((run / "run.json").read_bytes())
    manifest["planned_estimate"] = 200
    (run / "run.json").write_bytes(orjson.dumps(manifest))
    result = cli("status", str(run))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "planned:  200 (estimate)" in lines
    (dataset,) = [line for line in lines if line.startswith("dataset:")]
    assert dataset.startswith("dataset:  prompts: planned 200 (estimate), written ")
