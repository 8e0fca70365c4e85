"""A run's dataset is part of its identity: rows named so they never meet, a dataset edited
under a stopped run refused on resume (appended rows planned), records that name their row's
hash, and counts that never go negative."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest

from conftest import make_config, read_records, run_cli
from eagledata.errors import DatasetError, EagledataError, RunDirError
from eagledata.export import ExportOptions, export_runs
from eagledata.run import pipeline
from eagledata.rundir.status import run_status
from eagledata.rundir.verify import verify_run
from eagledata.simserver import SimServerThread


def write_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    return path


def prompts(count: int, start: int = 0, **extra: Any) -> list[dict[str, Any]]:
    return [{"prompt": f"question {i}", **extra} for i in range(start, start + count)]


def test_a_run_started_with_index_ids_keeps_them(sim: SimServerThread, tmp_path: Path) -> None:
    """A run started before rows without ids were named ``#INDEX`` resumes with its own names:
    its records stay done, nothing is generated twice."""
    dataset = write_rows(tmp_path / "plain.jsonl", prompts(4))
    out = tmp_path / "run"
    pipeline.generate(make_config([sim.url], out), str(dataset), None, progress=False)
    assert sorted(r["row_id"] for r in read_records(out)) == ["#0", "#1", "#2", "#3"]
    # the run as an earlier eagledata left it: index ids, no row_id_scheme in run.json
    for path in [*(out / "shards").glob("shard-*.jsonl"), *(out / "shards").glob("*.idx.json")]:
        path.write_bytes(path.read_bytes().replace(b"/#", b"/").replace(b'"#', b'"'))
    manifest = orjson.loads((out / "run.json").read_bytes())
    del manifest["row_id_scheme"]
    del manifest["datasets"]  # nor did it record its dataset
    shutil.rmtree(out / "rows")
    (out / "run.json").write_bytes(orjson.dumps(manifest))
    summary = pipeline.resume(out, progress=False)
    assert summary.session_records == 0 and summary.left == 0
    assert sorted(r["row_id"] for r in read_records(out)) == ["0", "1", "2", "3"]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args)


def files_of(run: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(run)): path.read_bytes()
        for path in sorted(run.rglob("*"))
        if path.is_file() and path.name != ".lock"
    }


def generated(sim: SimServerThread, dataset: Path, out: Path) -> Any:
    return pipeline.generate(make_config([sim.url], out), str(dataset), None, progress=False)


def stopped(out: Path) -> int:
    """The run as a stop (SIGINT, a crash) leaves it partway: its last shard and the plan's
    end not reached. Returns the records it keeps."""
    shards = sorted((out / "shards").glob("shard-*.jsonl"))
    assert len(shards) > 1
    for shard in shards[1:]:
        shard.unlink()
        shard.with_suffix(".idx.json").unlink(missing_ok=True)
    (out / "plan.json").unlink()
    return len(read_records(out))


def test_an_edited_dataset_is_refused_on_resume(sim: SimServerThread, tmp_path: Path) -> None:
    """A row inserted at the top (renaming every row without an id below it), an unfinished
    row edited, two appended: resume refuses in one line naming the rows and the fix, and
    leaves the run as it was."""
    rows = prompts(10)
    dataset = write_rows(tmp_path / "plain.jsonl", rows)
    out = tmp_path / "run"
    generated(sim, dataset, out)
    kept = stopped(out)
    rows[8] = {"prompt": "question 8, edited"}
    write_rows(dataset, [{"prompt": "inserted"}, *rows, *prompts(2, start=10)])
    before = files_of(out)
    with pytest.raises(RunDirError, match="changed since the run started") as caught:
        pipeline.resume(out, progress=False)
    message = str(caught.value)
    assert "10 row(s) differ" in message and "(row 0 '#0' changed, row 1 '#1' changed" in message
    assert "and 7 more" in message
    assert "restore the file as it was, or start a new run with --out" in message
    assert files_of(out) == before and len(read_records(out)) == kept
    result = cli("resume", str(out), "--no-progress")
    assert result.returncode == RunDirError.exit_code, result.stderr
    assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr
    assert "changed since the run started" in result.stderr


def test_removed_rows_are_refused_and_no_count_goes_negative(
    sim: SimServerThread, tmp_path: Path
) -> None:
    """Rows with their own ids, three finished ones removed: refused (before, the plan read
    9 items against 12 records: left -3, exit 0, and verify and export disagreed)."""
    rows = prompts(12, id="")
    for number, row in enumerate(rows):
        row["id"] = f"r{number:02d}"
    dataset = write_rows(tmp_path / "own-ids.jsonl", rows)
    out = tmp_path / "run"
    generated(sim, dataset, out)
    write_rows(dataset, [row for row in rows if row["id"] not in ("r02", "r05", "r07")])
    with pytest.raises(RunDirError, match="changed since the run started") as caught:
        pipeline.resume(out, progress=False)
    assert "row 2 was 'r02', now 'r03'" in str(caught.value)
    assert "row 9 'r09' removed" not in str(caught.value)  # three named, the rest counted
    assert verify_run(out).ok


def test_reordered_or_replaced_datasets_are_refused(sim: SimServerThread, tmp_path: Path) -> None:
    rows = [{"id": f"r{n}", "prompt": f"question {n}"} for n in range(6)]
    dataset = write_rows(tmp_path / "own-ids.jsonl", rows)
    out = tmp_path / "run"
    generated(sim, dataset, out)
    write_rows(dataset, [rows[1], rows[0], *rows[2:]])
    with pytest.raises(RunDirError, match=r"2 row\(s\) differ"):
        pipeline.resume(out, progress=False)
    write_rows(dataset, [{"id": f"r{n}", "prompt": f"another {n}"} for n in range(6)])
    with pytest.raises(RunDirError, match=r"6 row\(s\) differ.*row 0 'r0' changed"):
        pipeline.resume(out, progress=False)


def test_rows_appended_are_planned(sim: SimServerThread, tmp_path: Path) -> None:
    """Rows added at the end are the one change a run takes: a finished run generates them
    (before, its plan said it was done: left 0, the new rows never generated)."""
    dataset = write_rows(tmp_path / "plain.jsonl", prompts(10))
    out = tmp_path / "run"
    generated(sim, dataset, out)
    with dataset.open("ab") as handle:
        handle.write(b"".join(orjson.dumps(row) + b"\n" for row in prompts(2, start=10)))
    summary = pipeline.resume(out, progress=False)
    assert (summary.session_records, summary.planned, summary.left) == (2, 12, 0)
    assert {r["row_id"] for r in read_records(out)} == {f"#{n}" for n in range(12)}
    assert verify_run(out).ok
    again = pipeline.resume(out, progress=False)  # the new rows are now the run's own
    assert (again.session_records, again.planned, again.left) == (0, 12, 0)


def test_a_stopped_run_with_rows_appended_finishes_them_all(
    sim: SimServerThread, tmp_path: Path
) -> None:
    dataset = write_rows(tmp_path / "plain.jsonl", prompts(10))
    out = tmp_path / "run"
    generated(sim, dataset, out)
    kept = stopped(out)
    write_rows(dataset, prompts(13))
    summary = pipeline.resume(out, progress=False)
    assert summary.session_records == 13 - kept and summary.planned == 13 == summary.written


def test_every_record_names_its_row_and_verify_checks_it(
    sim: SimServerThread, tmp_path: Path
) -> None:
    dataset = write_rows(tmp_path / "plain.jsonl", prompts(10))
    out = tmp_path / "run"
    generated(sim, dataset, out)
    records = read_records(out)
    assert all(len(record["row_hash"]) == 16 for record in records)
    assert len({record["row_hash"] for record in records}) == 10
    assert verify_run(out).ok
    # a row id made to name another row: the stored lines swapped, the indexes still trusted
    rows_file = out / "rows" / "plain.jsonl"
    lines = rows_file.read_bytes().splitlines(keepends=True)
    first, second = orjson.loads(lines[0]), orjson.loads(lines[1])
    lines[0] = orjson.dumps([first[0], second[1]]) + b"\n"
    lines[1] = orjson.dumps([second[0], first[1]]) + b"\n"
    rows_file.write_bytes(b"".join(lines))
    for full in (False, True):
        problems = verify_run(out, full=full).problems
        assert len(problems) == 2, problems
        assert all("made from another row than the one its id names" in p for p in problems)
    rows_file.unlink()
    assert verify_run(out).problems == [
        "rows/plain.jsonl is missing: run.json records dataset plain, but its rows are gone and "
        "its records cannot be checked against them; restore the file from a copy of the run"
    ]
    with pytest.raises(RunDirError, match=r"rows/plain\.jsonl is missing"):
        pipeline.resume(out, progress=False)


def test_more_outcomes_than_planned_is_an_error_not_a_negative_count(
    sim: SimServerThread, tmp_path: Path
) -> None:
    dataset = write_rows(tmp_path / "plain.jsonl", prompts(12))
    out = tmp_path / "run"
    generated(sim, dataset, out)
    (out / "plan.json").write_bytes(orjson.dumps({"planned": 9}))  # a plan out of step
    status = run_status(out)
    assert status.left == 0 and status.mismatch is not None
    assert "holds 12 records and failure lines" in status.mismatch
    assert "3 more than planned" in status.mismatch
    result = cli("status", str(out))
    assert result.returncode == 1 and "problem:  " in result.stdout
    summary = pipeline.resume(out, progress=False)
    assert summary.left == 0 and summary.mismatch is not None
    result = cli("resume", str(out), "--no-progress")
    assert result.returncode == RunDirError.exit_code
    assert "3 more than planned" in result.stderr and "left -" not in result.stdout
    assert not verify_run(out).ok
    exported = export_runs([out], tmp_path / "train.jsonl", ExportOptions())
    assert any("3 more than planned" in warning for warning in exported.warnings)
    # an estimate (a share's expected count) below what the run holds is no mismatch
    (out / "plan.json").unlink()
    manifest = orjson.loads((out / "run.json").read_bytes())
    (out / "run.json").write_bytes(orjson.dumps({**manifest, "planned_estimate": 9}))
    status = run_status(out)
    assert (status.planned, status.plan_complete, status.left) == (9, False, 0)
    assert status.mismatch is None and cli("status", str(out)).returncode == 0


def test_an_empty_dataset_is_said_before_anything_is_created(
    sim: SimServerThread, tmp_path: Path
) -> None:
    dataset = tmp_path / "empty.jsonl"
    dataset.write_text("\n\n")
    out = tmp_path / "runs" / "empty"
    with pytest.raises(DatasetError, match=r"dataset empty \(.*empty.jsonl\) is empty"):
        generated(sim, dataset, out)
    assert not (tmp_path / "runs").exists()
    result = cli("generate", "--dataset", str(dataset), "--out", str(out))  # canary on
    assert result.returncode == DatasetError.exit_code
    assert len(result.stderr.splitlines()) == 1 and "is empty" in result.stderr
    assert "canary" not in result.stderr and not (tmp_path / "runs").exists()


def test_a_failed_start_leaves_no_run_directory_it_created(tmp_path: Path) -> None:
    dataset = write_rows(tmp_path / "plain.jsonl", prompts(3))
    out = tmp_path / "runs" / "plain"
    config = make_config(["http://127.0.0.1:9"], out)  # nothing listens there
    with pytest.raises(EagledataError):
        pipeline.generate(config, str(dataset), None, progress=False)
    assert not (tmp_path / "runs").exists()
    mine = tmp_path / "mine"  # a folder that was there before: kept, as it was
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    with pytest.raises(EagledataError):
        pipeline.generate(make_config(["http://127.0.0.1:9"], mine), str(dataset), None)
    assert (mine / "notes.txt").read_text() == "mine"
