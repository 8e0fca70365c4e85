"""What a resumed plan needs from the committed files besides the done ids.

* The prompt keys already planned (``generation.dedupe``): a row whose key an earlier row planned
  is a duplicate, also when that earlier row was done in another session and is not read again.
  Keys come from records and failures; never from items skipped as duplicates (a copy skipped in
  one session must not make its original a duplicate when the original is planned again after a
  crash). The ids skipped as duplicates are kept too: a row whose only done items are such skips
  was a duplicate whose skips a crash cut short.
* The conversations to continue (``turns = "all"``): the last committed turn of every
  conversation whose next turn is neither a record nor a failure. Found from the shard indexes'
  ``turns_left`` without reading records; only those records are read back, from their shards.
  A turn lands after the turn before it, so a conversation is waited on only while it is in
  progress in the files' order: memory is bounded by the conversations that were open at once.

Memory: 16 B a planned prompt (``idset``), plus the records of the conversations in progress.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from eagledata.rundir.idset import CompactIdSet
from eagledata.rundir.lines import FailureLine, RecordLine
from eagledata.rundir.records import next_turn_id
from eagledata.rundir.shardindex import turns_left
from eagledata.rundir.shardindex_format import ShardIndex

DUPLICATE = "duplicate"
"""The failure-file reason of a prompt skipped because an earlier row planned the same ids."""


@dataclass
class PlanState:
    keys: CompactIdSet = field(default_factory=CompactIdSet)
    """Prompt keys of the items planned before this session (records, failures)."""
    duplicates: CompactIdSet = field(default_factory=CompactIdSet)
    """Ids skipped as ``duplicate``."""
    tails: dict[str, RecordLine] = field(default_factory=dict)
    """conversation_id -> its last committed turn, whose next turn is not done yet."""


@dataclass
class PlanStateBuilder:
    """Fed by ``scan_totals`` while it reads the run's indexes, journal and failures."""

    state: PlanState = field(default_factory=PlanState)
    _waiting: dict[str, tuple[Path, int] | RecordLine] = field(default_factory=dict)
    """next turn's id -> where the turn before it is: (sealed shard, record position), or the
    record itself (read from the open journal)."""

    def add_index(self, shard: Path, index: ShardIndex) -> None:
        self.state.keys.update(key for key in index.prompt_keys if key)
        if not any(index.turns_left) and not self._waiting:
            return
        waiting = self._waiting
        for position, (item_id, left) in enumerate(zip(index.ids, index.turns_left, strict=True)):
            waiting.pop(item_id, None)
            if left > 0:
                waiting[next_turn_id(item_id)] = (shard, position)

    def add_record(self, record: RecordLine) -> None:
        if record.prompt_key:
            self.state.keys.add(record.prompt_key)
        self._waiting.pop(record.id, None)
        if turns_left(record.__dict__) > 0:
            self._waiting[next_turn_id(record.id)] = record

    def add_failure(self, entry: FailureLine) -> None:
        if entry.status == "skipped" and entry.reason == DUPLICATE:
            self.state.duplicates.add(entry.id)
        elif entry.prompt_key:
            self.state.keys.add(entry.prompt_key)

    def finish(self, done: Container[str]) -> PlanState:
        """Resolve the conversations in progress against ``done`` and read their last turns."""
        by_shard: dict[Path, dict[int, str]] = {}
        for next_id, where in self._waiting.items():
            if next_id in done:
                continue
            if isinstance(where, RecordLine):
                self._keep(where)
            else:
                shard, position = where
                by_shard.setdefault(shard, {})[position] = next_id
        for shard, positions in by_shard.items():
            for record in _records_at(shard, positions):
                self._keep(record)
        self._waiting = {}
        return self.state

    def _keep(self, record: RecordLine) -> None:
        if record.conversation_id is not None:
            self.state.tails[record.conversation_id] = record


def _records_at(shard: Path, positions: dict[int, str]) -> list[RecordLine]:
    """The records at ``positions`` of a sealed shard, counted as its index counts them (lines
    that are a JSON object with a string id)."""
    found: list[RecordLine] = []
    position = 0
    with shard.open("rb") as handle:
        for line in handle:
            if not line.endswith(b"\n"):
                break
            try:
                value = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if not isinstance(value, dict) or not isinstance(value.get("id"), str):
                continue
            if position in positions:
                found.append(RecordLine.from_object(value))
                if len(found) == len(positions):
                    break
            position += 1
    return found
