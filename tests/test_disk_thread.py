"""The shard writer's slow disk work (fsyncs, seals) runs in its disk thread, off the event loop;
a record is still committed when ``write`` returns (its line is in the open journal), and a seal
that fails is raised, never lost."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from eagledata.errors import StorageError
from eagledata.run import writer as writer_module
from eagledata.run.writer import ShardWriter
from eagledata.rundir.totals import scan_totals
from exportkit import record

SLOW_S = 0.4


def test_a_slow_seal_does_not_hold_up_the_next_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A disk that takes 0.4 s per folder fsync: the writes that fill three shards return at
    once (on the event loop, the client would have read no answer for 1.2 s), every record is
    in the journal as soon as ``write`` returns, and ``close`` leaves complete shards."""
    real = writer_module.fsync_dir

    def slow_fsync_dir(path: Path) -> None:
        time.sleep(SLOW_S)
        real(path)

    monkeypatch.setattr(writer_module, "fsync_dir", slow_fsync_dir)
    writer = ShardWriter(tmp_path, shard_size=4, fsync_interval_s=60)
    started = time.monotonic()
    for n in range(13):
        writer.write(record(f"r{n}", [1, 2], [3, 4]))
    elapsed = time.monotonic() - started
    assert elapsed < SLOW_S, f"the writes waited {elapsed:.2f} s on the seals"
    assert scan_totals(tmp_path).written == 13  # committed: in shards/ or in pending/
    writer.close()
    shards = sorted((tmp_path / "shards").glob("*.jsonl"))
    assert [len(path.read_bytes().splitlines()) for path in shards] == [4, 4, 4, 1]
    assert len(list((tmp_path / "shards").glob("*.idx.json"))) == 4
    assert not list((tmp_path / "pending").iterdir())


def test_a_seal_that_fails_is_raised_and_nothing_committed_is_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full_disk(path: Path) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(writer_module, "fsync_dir", full_disk)
    writer = ShardWriter(tmp_path, shard_size=2, fsync_interval_s=0)
    with pytest.raises(StorageError, match=r"cannot seal .*the disk is full"):
        for n in range(50):
            writer.write(record(f"r{n}", [1], [2]))
            time.sleep(0.01)
        writer.close()
    written = scan_totals(tmp_path).written
    monkeypatch.undo()
    again = ShardWriter(tmp_path, shard_size=2, fsync_interval_s=0)
    again.seal_pending()
    again.close()
    assert scan_totals(tmp_path).written == written > 0  # nothing committed was lost
    assert not list((tmp_path / "pending").iterdir())
