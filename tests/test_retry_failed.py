"""resume --retry-failed: failures are final by default, and can be put back in the plan."""

from __future__ import annotations

from pathlib import Path

import orjson

from conftest import make_config, read_failures, read_records
from eagledata.run import pipeline
from eagledata.rundir.verify import verify_run
from eagledata.simserver import SimServerThread


def test_retry_failed_regenerates_failures_and_keeps_skips(
    sim: SimServerThread, tmp_path: Path
) -> None:
    rows = [{"id": "a", "prompt": "one"}, {"id": "b", "prompt": "two"}, {"id": "a", "prompt": "3"}]
    dataset = tmp_path / "rows.jsonl"
    dataset.write_bytes(b"\n".join(orjson.dumps(row) for row in rows) + b"\n")
    out = tmp_path / "run"
    # Every answer breaks the token contract: each sent item goes to the failure file at once.
    sim.control(bad_count_rate=1.0)
    first = pipeline.generate(make_config([sim.url], out), str(dataset), None, progress=False)
    assert (first.written, first.failed, first.skipped) == (0, 2, 1)

    # Without the flag a resume leaves failures alone: they are final.
    sim.control(bad_count_rate=0.0)
    again = pipeline.resume(out, progress=False)
    assert (again.written, again.failed, again.skipped) == (0, 2, 1)

    retried = pipeline.resume(out, retry_failed=True, progress=False)
    assert (retried.written, retried.failed, retried.skipped, retried.left) == (2, 0, 1, 0)
    assert [entry["reason"] for entry in read_failures(out)] == ["duplicate_id"]
    assert sorted(record["row_id"] for record in read_records(out)) == ["a", "b"]
    assert verify_run(out).ok
