"""Issue 3, item 8: a full disk or an unwritable output directory (invariants 3 and 5).

The disk fills up at the journal boundary: ``os.write`` as seen by ``eagledata.rundir.journal``
writes part of a line and fails with ENOSPC (what a nearly full disk does), after some records.
The run stops with one clear line, every committed record is intact, no torn line is left, and
``resume`` finishes the run exactly once when there is space again.
"""

from __future__ import annotations

import errno
import os
import types
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from conftest import SAMPLES, make_config, read_failures, read_records
from eagledata.cli import app
from eagledata.errors import StorageError
from eagledata.run import pipeline
from eagledata.rundir import journal
from eagledata.rundir.verify import verify_run
from eagledata.simserver import SimServerThread, expected_output

DATASET = str(SAMPLES / "bad_rows.jsonl")  # good rows and failure entries both
SHAREGPT = str(SAMPLES / "sharegpt.jsonl")
GENERATION = {"samples_per_prompt": 3, "temperature": 0.7, "max_prompt_tokens": 4000}


class FillingDisk:
    """Stands in for ``os`` inside ``eagledata.rundir.journal`` (every appended line): writes to
    files whose path contains ``target`` go through until ``room`` of them have; the next one
    writes half its bytes, then fails with ``error``, and so does every one after it."""

    def __init__(self, target: str, room: int, error: int = errno.ENOSPC) -> None:
        self.target, self.room, self.error = target, room, error
        self.failed = 0

    def write(self, fd: int, data: bytes) -> int:
        if self.target in os.readlink(f"/proc/self/fd/{fd}"):
            if self.room <= 0:
                self.failed += 1
                os.write(fd, data[: len(data) // 2])
                raise OSError(self.error, os.strerror(self.error))
            self.room -= 1
        return os.write(fd, data)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        fake = types.ModuleType("os")
        fake.__dict__.update(os.__dict__)
        fake.write = self.write  # type: ignore[attr-defined]
        monkeypatch.setattr(journal, "os", fake)


def no_torn_lines(out: Path) -> None:
    for path in [*out.glob("shards/*.jsonl"), *out.glob("pending/*.jsonl"), *out.glob("*.jsonl")]:
        data = path.read_bytes()
        assert not data or data.endswith(b"\n"), f"{path} ends in a torn line"


def assert_complete(out: Path, config: Any, server: SimServerThread, planned: int) -> None:
    records, failures = read_records(out), read_failures(out)
    ids = [r["id"] for r in records] + [f["id"] for f in failures]
    assert len(ids) == len(set(ids)) == planned
    params = config.generation.sampling_params()
    for record in records:
        output, _ = expected_output(
            record["input_ids"], {**params, "sampling_seed": record["sample"]}, server.config
        )
        assert record["output_ids"] == output
    report = verify_run(out)
    assert report.ok, report.problems


@pytest.mark.parametrize(
    ("target", "room"),
    [("/pending/shard-", 4), ("/failures.jsonl", 5), ("/checks.jsonl", 1)],
    ids=["shard", "failure-file", "check-log"],
)
def test_a_full_disk_stops_the_run_clearly_and_resume_finishes_it(
    sim: SimServerThread, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: str, room: int
) -> None:
    out = tmp_path / "run"
    config = make_config([sim.url], out, generation=GENERATION, run={"concurrency": 4})
    disk = FillingDisk(target, room)
    with monkeypatch.context() as patch:
        disk.install(patch)
        with pytest.raises(StorageError) as caught:
            pipeline.generate(config, DATASET, None, progress=False)
    assert disk.failed >= 1
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("cannot write to ") and target.strip("/") in message
    assert message.endswith(
        f"the disk is full; free space, then run 'eagledata resume {out}' "
        "(committed records are intact)"
    )
    no_torn_lines(out)  # the half-written line was cut back
    kept = {r["id"] for r in read_records(out)}
    assert verify_run(out).ok

    summary = pipeline.resume(out, progress=False)  # space again: no patch
    assert summary.left == 0
    assert kept <= {r["id"] for r in read_records(out)}
    assert_complete(out, config, sim, 45)


def test_an_output_dir_that_turns_read_only_mid_run(
    sim: SimServerThread, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "run"
    config = make_config([sim.url], out, generation=GENERATION)
    with monkeypatch.context() as patch:
        FillingDisk("/pending/shard-", 10, errno.EROFS).install(patch)
        with pytest.raises(StorageError) as caught:
            pipeline.generate(config, SHAREGPT, None, progress=False)
    assert str(caught.value).endswith(
        "the output directory is not writable; fix its permissions or pass another --out "
        "(committed records are intact)"
    )
    no_torn_lines(out)
    pipeline.resume(out, progress=False)
    assert_complete(out, config, sim, 120)


def test_a_full_disk_through_the_cli_is_one_line_and_exit_5(
    sim: SimServerThread, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "run"
    config = tmp_path / "eagledata.toml"
    config.write_text(
        '[tokenizer]\nname = "bundled:tokenizer/tiny-chatml"\n'
        f'[server]\nurls = ["{sim.url}"]\nguard_interval_s = 0.2\nguard_max_held = 8\n'
        "[generation]\nmax_new_tokens = 64\n[canary]\nenabled = false\n"
    )
    FillingDisk("/pending/shard-", 5).install(monkeypatch)
    result = CliRunner().invoke(
        app,
        [
            "generate",
            "--config",
            str(config),
            "--dataset",
            SHAREGPT,
            "--out",
            str(out),
            "--no-progress",
        ],
    )
    assert result.exit_code == 5
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("eagledata: error: cannot write to ")
    assert "the disk is full" in lines[0] and "Traceback" not in result.output


def unwritable_dir(tmp_path: Path) -> Path:
    if os.geteuid() != 0:
        parent = tmp_path / "locked"
        parent.mkdir()
        parent.chmod(0o500)
        return parent / "run"
    # root writes through mode bits: sysfs refuses mkdir to everyone
    if not Path("/sys").is_dir() or (os.access("/sys", os.W_OK) and _mkdir_works("/sys")):
        pytest.skip("no unwritable directory available to root here")
    return Path("/sys/eagledata-run")


def _mkdir_works(parent: str) -> bool:
    probe = Path(parent) / "eagledata-probe"
    try:
        probe.mkdir()
    except OSError:
        return False
    probe.rmdir()
    return True


def test_an_unwritable_output_dir_is_one_clear_error(sim: SimServerThread, tmp_path: Path) -> None:
    out = unwritable_dir(tmp_path)
    with pytest.raises(StorageError) as caught:
        pipeline.generate(make_config([sim.url], out), SHAREGPT, None, progress=False)
    assert str(caught.value) == (
        f"cannot create {out}: the output directory is not writable; fix its permissions or "
        "pass another --out (committed records are intact)"
    )
    assert sim.stats()["requests"] == 0
