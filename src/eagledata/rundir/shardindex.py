"""Shard indexes: a small sidecar per sealed shard, so reading a run's state never parses records.

``shards/shard-NNNNNN.jsonl`` gets ``shards/shard-NNNNNN.idx.json`` (never matched by
``shards/*.jsonl``, which consumers glob). It holds the shard's record ids, counts, token totals,
finish reasons, flag counts, records per dataset, per-record answer lengths, completion times,
turns left in their conversation and prompt keys, the shard's size, mtime and checksum, and a
digest of the index itself.

An index is a cache, never the truth: it is trusted only when it is whole (parses, right version),
unaltered (its digest matches its body, its counts agree with each other), about its own shard (the
name matches) and current (the shard's size and mtime are those it recorded, or, when only the
mtime differs, as after ``cp -r``, the shard's bytes have the checksum it recorded). Otherwise it is
missing, torn, forged or stale, and is rebuilt from the shard's lines, and written again when the
caller may (``persist``). A run written before indexes existed has none: every index is rebuilt
once, then read. ``verify --full`` also recomputes each shard's checksum and compares the index
with the lines (``index_differences``): that catches an index forged with a fresh digest, or a
shard rewritten in place with its mtime put back.

The index's format (``ShardIndex``, its digest, why one is rejected) is ``shardindex_format.py``;
this module builds indexes, writes them, and decides which to trust.

The writer builds the index while it writes the shard (``IndexBuilder``, the same code that
rebuilds one from a file), and writes it right after the shard is renamed into ``shards/``: a crash
between the two leaves a shard without an index, which is rebuilt.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson

from eagledata.atomic import atomic_write
from eagledata.errors import StorageError
from eagledata.rundir.lines import flag_names
from eagledata.rundir.shardindex_format import (
    FORGED,
    MISSING,
    STALE,
    IndexRejected,
    ShardIndex,
    checksum_label,
    index_path,
    new_checksum,
)


@dataclass
class IndexBuilder:
    """Accumulates a shard's index line by line: while writing it, or while rebuilding it."""

    shard: str
    ids: list[str] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reasons: dict[str, int] = field(default_factory=dict)
    flags: dict[str, int] = field(default_factory=dict)
    completion_lengths: list[int] = field(default_factory=list)
    created_at: list[float] = field(default_factory=list)
    started_at: list[float] = field(default_factory=list)
    spec_verify_ct: list[int] = field(default_factory=list)
    flagged: int = 0
    invalid_lines: int = 0
    settings: dict[str, int] = field(default_factory=dict)
    datasets: dict[str, int] = field(default_factory=dict)
    turns_left: list[int] = field(default_factory=list)
    prompt_keys: list[str] = field(default_factory=list)
    row_hashes: list[str] = field(default_factory=list)
    hasher: Any = field(default_factory=new_checksum)

    def add(self, line: bytes, record: object) -> None:
        """``line`` as written (newline included); ``record`` its parsed object."""
        self.hasher.update(line)
        if not isinstance(record, dict) or not isinstance(record.get("id"), str):
            self.invalid_lines += 1
            return
        completion = _int(record.get("completion_tokens"))
        self.ids.append(record["id"])
        self.prompt_tokens += _int(record.get("prompt_tokens"))
        self.completion_tokens += completion
        self.completion_lengths.append(completion)
        finish = str(record.get("finish_reason", "?"))
        self.finish_reasons[finish] = self.finish_reasons.get(finish, 0) + 1
        # the writer's model, a line's object of booleans, an older line's list; or none at all
        flags = flag_names(record.get("flags")) or ()
        if flags:
            self.flagged += 1
        for flag in flags:
            self.flags[str(flag)] = self.flags.get(str(flag), 0) + 1
        verify_ct = record.get("spec_verify_ct")
        self.spec_verify_ct.append(verify_ct if type(verify_ct) is int and verify_ct > 0 else 0)
        created = record.get("created_at")
        if isinstance(created, bool) or not isinstance(created, int | float):
            created = 0.0
        latency = record.get("e2e_latency")
        if isinstance(latency, bool) or not isinstance(latency, int | float) or latency < 0:
            latency = 0.0
        self.created_at.append(round(float(created), 3))
        self.started_at.append(round(float(created) - float(latency), 3))
        settings = record.get("settings")
        fingerprint = settings if isinstance(settings, str) else ""
        self.settings[fingerprint] = self.settings.get(fingerprint, 0) + 1
        dataset = str(record.get("dataset", "?"))
        self.datasets[dataset] = self.datasets.get(dataset, 0) + 1
        self.turns_left.append(turns_left(record))
        key = record.get("prompt_key")
        self.prompt_keys.append(key if isinstance(key, str) else "")
        row = record.get("row_hash")
        self.row_hashes.append(row if isinstance(row, str) else "")

    def add_unparsable(self, line: bytes) -> None:
        self.hasher.update(line)
        self.invalid_lines += 1

    def finish(self, size: int, mtime_ns: int) -> ShardIndex:
        return ShardIndex(
            shard=self.shard,
            size=size,
            mtime_ns=mtime_ns,
            checksum=checksum_label(self.hasher),
            ids=self.ids,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            finish_reasons=self.finish_reasons,
            flags=self.flags,
            completion_lengths=self.completion_lengths,
            created_at=self.created_at,
            started_at=self.started_at,
            spec_verify_ct=self.spec_verify_ct,
            flagged=self.flagged,
            invalid_lines=self.invalid_lines,
            settings=self.settings,
            datasets=self.datasets,
            turns_left=self.turns_left,
            prompt_keys=self.prompt_keys,
            row_hashes=self.row_hashes,
        )


def turns_left(record: dict[str, Any]) -> int:
    """The turns of its conversation after this record (0: none, or not a conversation turn)."""
    turn, turns = record.get("turn"), record.get("conversation_turns")
    if type(turn) is not int or type(turns) is not int:
        return 0
    return max(turns - turn - 1, 0)


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def build_index(shard: Path) -> ShardIndex:
    """Read every line of ``shard`` into a fresh index (a torn last line is not a record)."""
    builder = IndexBuilder(shard.name)
    with shard.open("rb") as handle:
        before = os.fstat(handle.fileno())
        for line in handle:
            if not line.endswith(b"\n"):
                builder.hasher.update(line)  # in the checksum, not a record
                continue
            try:
                builder.add(line, orjson.loads(line))
            except orjson.JSONDecodeError:
                builder.add_unparsable(line)
    return builder.finish(before.st_size, before.st_mtime_ns)


def write_index(shard: Path, index: ShardIndex) -> None:
    """Write ``index`` next to ``shard`` atomically (a unique temporary name, fsync, rename)."""
    path = index_path(shard)
    try:
        atomic_write(path, index.to_bytes())
    except OSError as exc:
        hint = exc.strerror or str(exc)
        raise StorageError(f"cannot write {path}: {hint} (the shard is intact)") from None


def load_index(shard: Path) -> ShardIndex:
    """The index of ``shard`` if it can be trusted; ``IndexRejected`` says why not."""
    return _load_index(shard)[0]


def _load_index(shard: Path) -> tuple[ShardIndex, bool]:
    """``load_index``, and whether the shard was copied (same bytes, another mtime)."""
    try:
        data = index_path(shard).read_bytes()
        stat = shard.stat()
    except FileNotFoundError:
        raise IndexRejected(MISSING, "no index") from None
    index = ShardIndex.from_bytes(data)
    if index.shard != shard.name:
        raise IndexRejected(FORGED, f"it is the index of {index.shard}")
    if index.size != stat.st_size:
        raise IndexRejected(STALE, "the shard changed after its index was written")
    if index.mtime_ns != stat.st_mtime_ns:
        # A copy (cp -r, rsync without -t, a restore) gives every shard a new mtime: the same
        # bytes are the same shard. The checksum says so at the cost of one read, no parsing.
        if file_checksum(shard) != index.checksum:
            raise IndexRejected(STALE, "the shard changed after its index was written")
        return replace(index, mtime_ns=stat.st_mtime_ns), True
    return index, False


def file_checksum(shard: Path) -> str:
    """The checksum an index records, of ``shard``'s bytes as they are now."""
    hasher = new_checksum()
    with shard.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            hasher.update(chunk)
    return checksum_label(hasher)


@dataclass(frozen=True)
class IndexRead:
    shard: Path
    index: ShardIndex
    rebuilt: str | None = None  # None: trusted as found; else why it was rebuilt
    persisted: bool = False  # the rebuilt index was written back


def read_index(shard: Path, *, persist: bool) -> IndexRead:
    """The trusted index of ``shard``, rebuilt from its lines when it cannot be trusted.

    With ``persist`` a rebuilt index is written back, best effort. The rebuilt content is a
    function of the shard alone, so two processes repairing the same index write the same bytes.
    """
    try:
        found, copied = _load_index(shard)
    except IndexRejected as rejected:
        reason = rejected.kind
    else:
        moved = persist and copied
        if moved:  # a copied shard: record its new mtime, so the next read needs no checksum
            with contextlib.suppress(StorageError, OSError):
                write_index(shard, found)
        return IndexRead(shard, found, persisted=moved)
    index = build_index(shard)
    persisted = False
    if persist:
        # a read-only or full run directory still reads, only slower
        with contextlib.suppress(StorageError):
            write_index(shard, index)
            persisted = True
    return IndexRead(shard, index, rebuilt=reason, persisted=persisted)


def iter_indexes(shards: Iterable[Path], *, persist: bool) -> Iterator[IndexRead]:
    """The trusted index of each sealed shard, in the order given."""
    for shard in shards:
        try:
            yield read_index(shard, persist=persist)
        except FileNotFoundError:
            continue  # a shard removed while we listed (it is not ours to judge here)


INDEXED_FIELDS = (
    "checksum",
    "size",
    "ids",
    "prompt_tokens",
    "completion_tokens",
    "finish_reasons",
    "flags",
    "completion_lengths",
    "created_at",
    "started_at",
    "spec_verify_ct",
    "flagged",
    "invalid_lines",
    "settings",
    "datasets",
    "turns_left",
    "prompt_keys",
    "row_hashes",
)


def index_differences(index: ShardIndex, fresh: ShardIndex) -> list[str]:
    """The fields where ``index`` disagrees with ``fresh``, an index just built from the shard."""
    return [name for name in INDEXED_FIELDS if getattr(index, name) != getattr(fresh, name)]
