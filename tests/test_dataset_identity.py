"""A run's dataset is part of its identity: rows named so they never meet, a dataset edited
under a stopped run refused on resume (appended rows planned), records that name their row's
hash, and counts that never go negative."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from conftest import make_config, read_records
from eagledata.run import pipeline
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
