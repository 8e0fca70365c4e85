"""A shard index's format: ``ShardIndex`` (its fields, its bytes, the digest over them, the checks
that its counts agree), where it lives (``index_path``), its version, and why one is not
trusted (``IndexRejected``: missing, torn, forged, stale). Building, reading and trusting
indexes is ``shardindex.py``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from eagledata.rundir.lines import LineError, ShardIndexLine

INDEX_VERSION = 4
"""4: each record's ``row_hash`` (``verify`` checks it against the run's rows). 3:
``started_at`` per record (the run's active time, ``rundir/rates.py``), ``settings``
(records per settings fingerprint), records per dataset, turns left and prompt keys. An older
index is rebuilt from its shard like any index it cannot trust: in memory by a reader, written
back by the next ``resume``."""


INDEX_SUFFIX = ".idx.json"


# Why an index was not trusted (``IndexRead.rebuilt``).
MISSING = "missing"


TORN = "torn"  # unreadable, truncated, not an index of this version


FORGED = "forged"  # its digest, its own counts, or its shard name disagree with its body


STALE = "stale"  # the shard's size or mtime changed after the index was written


def index_path(shard: Path) -> Path:
    """``shards/shard-000001.jsonl`` -> ``shards/shard-000001.idx.json``."""
    return shard.with_name(shard.name.removesuffix(".jsonl") + INDEX_SUFFIX)


@dataclass(frozen=True)
class ShardIndex:
    """What a run's readers need from one sealed shard, without its records' token ids."""

    shard: str
    size: int
    mtime_ns: int
    checksum: str
    ids: list[str]
    prompt_tokens: int
    completion_tokens: int
    finish_reasons: dict[str, int]
    flags: dict[str, int]
    completion_lengths: list[int]  # per record, in file order (answer-length percentiles)
    created_at: list[float]  # per record, in file order (the rates)
    started_at: list[float]  # per record, in file order: when its request was sent
    # per record, in file order: SGLang's speculative verify count, 0 where the record has none
    spec_verify_ct: list[int]
    flagged: int = 0  # records carrying at least one flag
    invalid_lines: int = 0  # lines that are not a JSON object with an id: verify reports them
    # records per settings fingerprint ("" for records without one): a run adopts no other
    settings: dict[str, int] = field(default_factory=dict)
    datasets: dict[str, int] = field(default_factory=dict)  # records per dataset
    # per record, in file order: turns after it in its conversation (what resume continues)
    turns_left: list[int] = field(default_factory=list)
    # per record, in file order: its prompt key, "" where none (dedupe on resume)
    prompt_keys: list[str] = field(default_factory=list)
    # per record, in file order: its row's hash, "" where none (verify checks them)
    row_hashes: list[str] = field(default_factory=list)

    @property
    def records(self) -> int:
        return len(self.ids)

    def line(self) -> ShardIndexLine:
        """The index as its run-directory line (``rundir/lines.py``), without its digest."""
        return ShardIndexLine(
            version=INDEX_VERSION,
            shard=self.shard,
            size=self.size,
            mtime_ns=self.mtime_ns,
            checksum=self.checksum,
            records=self.records,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            finish_reasons=self.finish_reasons,
            flags=self.flags,
            flagged=self.flagged,
            invalid_lines=self.invalid_lines,
            ids=self.ids,
            completion_lengths=self.completion_lengths,
            created_at=self.created_at,
            started_at=self.started_at,
            spec_verify_ct=self.spec_verify_ct,
            settings=self.settings,
            datasets=self.datasets,
            turns_left=self.turns_left,
            prompt_keys=self.prompt_keys,
            row_hashes=self.row_hashes,
        )

    def to_bytes(self) -> bytes:
        body = _body(self.line())
        return orjson.dumps({**body, "digest": _digest(body)}, option=orjson.OPT_SORT_KEYS)

    @classmethod
    def from_bytes(cls, data: bytes) -> ShardIndex:
        """Parse and check an index on its own. Raises ``IndexRejected`` (TORN or FORGED)."""
        try:
            raw = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise IndexRejected(TORN, "not valid JSON") from None
        if not isinstance(raw, dict) or raw.get("version") != INDEX_VERSION:
            raise IndexRejected(TORN, f"not a version {INDEX_VERSION} index")
        try:
            line = ShardIndexLine.from_object(raw)
        except LineError as exc:
            raise IndexRejected(FORGED, f"a field is missing or mistyped ({exc})") from None
        if line.digest != _digest(_body(line)):
            raise IndexRejected(FORGED, "its digest does not match its content")
        index = cls(
            shard=line.shard,
            size=line.size,
            mtime_ns=line.mtime_ns,
            checksum=line.checksum,
            ids=line.ids,
            prompt_tokens=line.prompt_tokens,
            completion_tokens=line.completion_tokens,
            finish_reasons=line.finish_reasons,
            flags=line.flags,
            completion_lengths=line.completion_lengths,
            created_at=line.created_at,
            started_at=line.started_at,
            spec_verify_ct=line.spec_verify_ct,
            flagged=line.flagged,
            invalid_lines=line.invalid_lines,
            settings=line.settings,
            datasets=line.datasets,
            turns_left=line.turns_left,
            prompt_keys=line.prompt_keys,
            row_hashes=line.row_hashes,
        )
        index.check_consistent(line.records)
        return index

    def check_consistent(self, records: int) -> None:
        """Counts that must agree with each other: an edited index rarely keeps them all."""
        lengths_ok = (
            len(self.completion_lengths)
            == len(self.created_at)
            == len(self.started_at)
            == len(self.spec_verify_ct)
            == len(self.turns_left)
            == len(self.prompt_keys)
            == len(self.row_hashes)
            == records
        )
        if not (
            len(self.ids) == records
            and lengths_ok
            and sum(self.finish_reasons.values()) == records
            and sum(self.datasets.values()) == records
            and self.flagged <= records
            and sum(self.completion_lengths) == self.completion_tokens
            and sum(self.settings.values()) == records
            and all(isinstance(item_id, str) for item_id in self.ids)
        ):
            raise IndexRejected(FORGED, "its counts disagree with each other")


class IndexRejected(Exception):
    """An index that must not be trusted; ``kind`` is TORN, FORGED or STALE."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail


def _body(line: ShardIndexLine) -> dict[str, Any]:
    """What the digest covers: every field but the digest."""
    return {name: value for name, value in line.__dict__.items() if name != "digest"}


def _digest(body: dict[str, Any]) -> str:
    blob = orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(blob, digest_size=16).hexdigest()


def new_checksum() -> Any:
    return hashlib.blake2b(digest_size=16)


def checksum_label(hasher: Any) -> str:
    return f"blake2b-128:{hasher.hexdigest()}"
