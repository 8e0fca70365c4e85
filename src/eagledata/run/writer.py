"""Step 6: records into sharded JSONL, committed atomically, in completion order.

Commit protocol (invariant 3):

* A record is committed when its whole line, newline included, has been handed to the kernel by
  one ``write(2)`` on the open journal ``pending/shard-NNNNNN.jsonl``. From then on a kill -9 of
  this process cannot lose it (the page cache belongs to the kernel). ``fsync`` runs every
  ``fsync_interval_s`` and at every seal, which bounds what a power cut could take.
* A torn last line (a write cut short by a crash or a full disk) lacks its newline; it is cut off
  when the journal is reopened, and the item is generated again.
* When the journal holds ``shard_size`` records it is fsynced and renamed to ``shards/``: a file
  under ``shards/`` is complete or absent, never half-written, so
  ``load_dataset("json", data_files="RUN_DIR/shards/*.jsonl")`` only ever sees whole shards.
* Right after a shard is sealed its index (``shardindex``) is written next to it, built while the
  shard was written; a shard sealed by ``seal_pending`` gets one built from its lines.
* ``seal_pending`` (a journal an earlier process left open) seals only lines that read as whole
  records: any other line is moved into ``quarantine.jsonl`` (``rundir/quarantine.py``) and its
  item generated again, never moved into ``shards/``.
* The slow disk work of the records, each fsync and each seal (fsync, rename, the folder's fsync,
  the index), runs in the writer's disk thread (``DiskThread``), in the order it was queued, off
  the event loop: a seal took the client off its answers for as long as the disk took. The
  ``write(2)`` of each line stays where the record is written, so a record is committed when
  ``write`` returns, as before; a journal waiting for its seal is whole in ``pending/``, and
  ``seal_pending`` seals it if the process dies first. The queue is bounded (a disk slower than
  the answers holds the writer back, it does not pile up), and the thread's first failure is
  raised by the next ``write`` or by ``close``.
* Every record and failure line carries the fingerprint of the run's frozen settings
  (``settings``): a run never adopts lines made under other settings (``RunDir.check_adopted``).
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from pathlib import Path

from eagledata.atomic import fsync_dir
from eagledata.rundir.journal import (
    SHARD_PATTERN,
    Journal,
    repair_torn_tail,
    storage_error,
)
from eagledata.rundir.lines import FailureLine, RecordLine
from eagledata.rundir.quarantine import Quarantine, record_problem
from eagledata.rundir.shardindex import IndexBuilder, build_index, write_index

DISK_QUEUE = 8
"""Disk jobs (fsyncs, seals) that may wait for the disk thread before ``write`` waits too."""


class DiskThread:
    """One thread that runs disk jobs in the order they were queued; ``close`` waits for them.
    A job's failure stops the rest (they are skipped) and is raised to the owner. The thread
    starts with the first job: a writer that never writes (or fails before) leaves none."""

    def __init__(self, name: str, bound: int = DISK_QUEUE) -> None:
        self._jobs: queue.Queue[Callable[[], None] | None] = queue.Queue(maxsize=bound)
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            if self._failure is None:
                try:
                    job()
                except BaseException as exc:  # raised to the owner: raise_failure
                    self._failure = exc

    def submit(self, job: Callable[[], None]) -> None:
        """Queue ``job``; blocks while ``bound`` jobs wait (the disk is the bottleneck)."""
        self.raise_failure()
        if self._thread.ident is None:  # not started yet
            self._thread.start()
        self._jobs.put(job)

    def raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    def close(self) -> None:
        """Run every queued job, end the thread, raise the first failure."""
        if self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join()
        self.raise_failure()


class ShardWriter:
    """Writes records in completion order into ``shards/shard-NNNNNN.jsonl``."""

    def __init__(
        self,
        run_dir: Path,
        shard_size: int,
        fsync_interval_s: float = 1.0,
        *,
        fingerprint: str | None = None,
    ) -> None:
        """``fingerprint``: the run's frozen settings', stamped on every record written."""
        self.run_dir = run_dir
        self.fingerprint = fingerprint
        self.shards_dir = run_dir / "shards"
        self.pending_dir = run_dir / "pending"
        self.shard_size = shard_size
        self.fsync_interval_s = fsync_interval_s
        try:
            self.shards_dir.mkdir(parents=True, exist_ok=True)
            self.pending_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise storage_error("create", self.shards_dir, exc) from None
        self._journal: Journal | None = None
        self._index: IndexBuilder | None = None
        self._next_seq = self._scan_next_seq()
        self._disk = DiskThread(f"shard-writer:{run_dir.name}")

    def _scan_next_seq(self) -> int:
        seqs = [
            int(match.group(1))
            for folder in (self.shards_dir, self.pending_dir)
            for name in os.listdir(folder)
            if (match := SHARD_PATTERN.match(name))
        ]
        return max(seqs, default=-1) + 1

    def seal_pending(self) -> int:
        """Repair and seal journals left by an earlier process: a torn tail is cut, a whole line
        that is not a record is moved into the quarantine. Returns how many were sealed."""
        sealed = 0
        quarantine = Quarantine(self.run_dir)
        try:
            for name in sorted(os.listdir(self.pending_dir)):
                if SHARD_PATTERN.match(name):
                    sealed += self._seal_left_open(self.pending_dir / name, quarantine)
        finally:
            quarantine.close()
        return sealed

    def _seal_left_open(self, path: Path, quarantine: Quarantine) -> int:
        """Seal one journal left open; 0 if nothing of it was left to seal."""
        target = self.shards_dir / path.name
        try:
            repair_torn_tail(path)
            quarantine.move_aside(path, record_problem, torn_tail=False)
            if path.stat().st_size == 0:
                path.unlink()
                return 0
            with path.open("rb+") as handle:
                os.fsync(handle.fileno())
            os.replace(path, target)
            fsync_dir(self.shards_dir)
        except OSError as exc:
            raise storage_error("seal", path, exc) from None
        write_index(target, build_index(target))
        return 1

    def write(self, record: RecordLine) -> None:
        self._disk.raise_failure()  # a seal that failed stops the writing before, not after
        if self.fingerprint is not None and record.settings != self.fingerprint:
            record = record.model_copy(update={"settings": self.fingerprint})
        if self._journal is None:
            path = self.pending_dir / f"shard-{self._next_seq:06d}.jsonl"
            self._next_seq += 1
            self._journal = Journal(path, self.fsync_interval_s, syncs_itself=False)
            self._index = IndexBuilder(path.name)
        # the commit: one write(2), here; what makes it durable goes to the disk thread
        line = self._journal.append(record)
        if self._index is not None:
            self._index.add(line, record.__dict__)
        if self._journal.lines >= self.shard_size:
            self._seal_current()
        elif self._journal.sync_due():
            self._disk.submit(self._journal.take_sync())

    def _seal_current(self) -> None:
        """Hand the open journal to the disk thread to seal; the next record opens another."""
        journal, self._journal = self._journal, None
        index, self._index = self._index, None
        if journal is not None:
            self._disk.submit(lambda: self._seal(journal, index))

    def _seal(self, journal: Journal, index: IndexBuilder | None) -> None:
        """Fsync, close and rename a full journal into ``shards/``, then write its index (in
        the disk thread)."""
        journal.close()
        if journal.lines == 0 and journal.size == 0:
            journal.path.unlink(missing_ok=True)
            return
        target = self.shards_dir / journal.path.name
        try:
            os.replace(journal.path, target)
            fsync_dir(self.shards_dir)
            stat = target.stat()
        except OSError as exc:
            raise storage_error("seal", journal.path, exc) from None
        if index is None or journal.size != stat.st_size:
            # not the bytes this writer accounted for (an append cut short): read the file
            write_index(target, build_index(target))
        else:
            write_index(target, index.finish(stat.st_size, stat.st_mtime_ns))

    def sync(self) -> None:
        """Every record written so far fsynced, and every queued seal done."""
        if self._journal is not None:
            self._disk.submit(self._journal.take_sync())
        self._drain()

    def _drain(self) -> None:
        done = threading.Event()
        self._disk.submit(done.set)
        while not done.wait(0.05):
            self._disk.raise_failure()  # a failed job skips the rest: done is never set

    def close(self) -> None:
        """Seal the open journal: at the end of a run every record is in a complete shard."""
        try:
            self._seal_current()
        finally:
            self._disk.close()


class FailureLog:
    """``failures.jsonl``: one line per (prompt, sample) that ended without a record."""

    def __init__(
        self, run_dir: Path, fsync_interval_s: float = 1.0, *, fingerprint: str | None = None
    ) -> None:
        self._journal = Journal(run_dir / "failures.jsonl", fsync_interval_s)
        self.fingerprint = fingerprint

    def write(self, entry: FailureLine) -> None:
        if self.fingerprint is not None and entry.settings != self.fingerprint:
            entry = entry.model_copy(update={"settings": self.fingerprint})
        self._journal.append(entry)

    def close(self) -> None:
        self._journal.close()
