"""A run's dataset is part of its identity: rows named so they never meet, a dataset edited
under a stopped run refused on resume (appended rows planned), records that name their row's
hash, and counts that never go negative."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import orjson

from conftest import eagledata_cmd, make_config, read_records
from eagledata.errors import RunDirError
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
    (out / "run.json").write_bytes(orjson.dumps(manifest))
    summary = pipeline.resume(out, progress=False)
    assert summary.session_records == 0 and summary.left == 0
    assert sorted(r["row_id"] for r in read_records(out)) == ["0", "1", "2", "3"]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        eagledata_cmd(*args), capture_output=True, text=True, timeout=120, check=False
    )


def generated(sim: SimServerThread, dataset: Path, out: Path) -> Any:
    return pipeline.generate(make_config([sim.url], out), str(dataset), None, progress=False)


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
