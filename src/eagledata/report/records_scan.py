"""The few fields of every committed record that the report draws, read without parsing ids.

A record of the reference job is ~5k prompt and answer ids plus their text: 30-50 KB of JSON of
which the report needs under 200 bytes (times, lengths, finish reason, flags, dataset, turn, the
newest user message's start for its writing system). Parsing every line
with ``orjson.loads`` builds ~10k Python ints per record only to drop them; this module finds each
wanted top-level key with ``bytes.find`` and parses only its value. That is safe on our own lines:
orjson writes no whitespace, and inside a JSON string every ``"`` is escaped, so ``"key":`` can
only be a key. Records hold no nested object with these keys, so the first match is the top-level
one. A line that does not fit (another writer's spacing, a missing key, a value of another type)
is parsed whole, so an odd line costs time, never a wrong number.

Committed data only, and never a lock: sealed shards whole, the open journal (``pending/``) up to
its last newline. A shard sealed while we read (``pending/NAME`` renamed to ``shards/NAME``) is
found under its new name, and is read once.
"""

from __future__ import annotations

import os
import re
from array import array
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from io import FileIO
from pathlib import Path
from typing import Any

import orjson

from eagledata.report.scripts import dominant_script, script_letters
from eagledata.rundir.journal import SHARD_PATTERN
from eagledata.rundir.lines import flag_names

# A JSON scalar, a flat list of strings (an older record's ``flags``) or a flat object of
# booleans (``flags``), at the start of a value.
_STRING = rb'"(?:[^"\\]|\\.)*"'
_BOOL_MEMBER = _STRING + rb":(?:true|false)"
_VALUE = re.compile(
    rb"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|"
    + _STRING
    + rb"|null|true|false|\[(?:"
    + _STRING
    + rb"(?:,"
    + _STRING
    + rb")*)?\]|\{(?:"
    + _BOOL_MEMBER
    + rb"(?:,"
    + _BOOL_MEMBER
    + rb")*)?\}"
)

_STRING_VALUE = re.compile(_STRING)

# Where each key sits in our records (run/records.py writes the small fields first, then the
# ids and text, then provenance): searched from that end. Only speed depends on it: a key
# occurs once in a line, so find and rfind return the same place.
_HEAD = (
    "dataset",
    "turn",
    "conversation_turns",
    "created_at",
    "prompt_tokens",
    "completion_tokens",
    "finish_reason",
)
_TAIL = ("flags", "reasoning_tokens")
_KEYS = {name: b'"' + name.encode() + b'":' for name in _HEAD + _TAIL}
_REQUIRED = ("created_at", "prompt_tokens", "completion_tokens", "finish_reason")
_OPTIONAL_INTS = ("turn", "conversation_turns", "reasoning_tokens")
# The prompt's newest user message: the last one in ``messages`` (written role first), which
# ends where ``input_ids`` begins.
_MESSAGES = b'"messages":'
_MESSAGES_END = b'],"input_ids":'
_USER = b'{"role":"user","content":'


Buffer = bytes | bytearray


class _Odd(Exception):
    """This line does not fit the fast path: parse it whole."""


def _field(buf: Buffer, start: int, end: int, name: str) -> Any:
    key = _KEYS[name]
    at = buf.find(key, start, end) if name in _HEAD else buf.rfind(key, start, end)
    if at < 0:
        if name in _REQUIRED:
            raise _Odd
        return None
    match = _VALUE.match(buf, at + len(key), end)
    if match is None:
        raise _Odd
    return orjson.loads(match.group())


def _newest_user_text(buf: Buffer, start: int, end: int) -> str | None:
    at = buf.find(_MESSAGES, start, end)
    if at < 0:
        raise _Odd
    stop = buf.find(_MESSAGES_END, at, end)
    user = buf.rfind(_USER, at, end if stop < 0 else stop)
    if user < 0:
        return None  # no user message (or not written our way: nothing drawn from it)
    match = _STRING_VALUE.match(buf, user + len(_USER), end)
    if match is None:
        raise _Odd
    text = orjson.loads(match.group())
    return text if isinstance(text, str) else None


def _newest_user_of(record: dict[str, Any]) -> str | None:
    messages = record.get("messages")
    if not isinstance(messages, list):
        return None
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            return content if isinstance(content, str) else None
    return None


def fields_in(buf: Buffer, start: int, end: int, *, prompt_text: bool = False) -> dict[str, Any]:
    """The report's fields of the record line ``buf[start:end]`` (newline excluded);
    ``flags`` is the list of the flags that fired (from the record's object of booleans, or an
    older record's list), None when the record does not carry it (written before flags
    existed), and so
    are ``dataset``, ``turn``, ``conversation_turns`` and ``reasoning_tokens`` in records
    written before them. ``prompt_text`` adds ``user_text``: the newest user message."""
    try:
        fields = {name: _field(buf, start, end, name) for name in _KEYS}
        if prompt_text:
            fields["user_text"] = _newest_user_text(buf, start, end)
        _check_types(fields)
        return fields
    except (_Odd, orjson.JSONDecodeError):
        record = orjson.loads(buf[start:end])
        fields = {name: record.get(name) for name in _KEYS}
        if prompt_text:
            fields["user_text"] = _newest_user_of(record)
        _check_types(fields, strict=False)
        return fields


def record_fields(line: bytes) -> dict[str, Any]:
    """``fields_in`` for one line on its own."""
    return fields_in(line, 0, len(line) - 1 if line.endswith(b"\n") else len(line))


def _check_types(fields: dict[str, Any], strict: bool = True) -> None:
    ok = (
        isinstance(fields["created_at"], int | float)
        and type(fields["prompt_tokens"]) is int
        and type(fields["completion_tokens"]) is int
        and isinstance(fields["finish_reason"], str)
        and (fields["flags"] is None or isinstance(fields["flags"], list | dict))
        and (fields["dataset"] is None or isinstance(fields["dataset"], str))
        and all(fields[name] is None or type(fields[name]) is int for name in _OPTIONAL_INTS)
    )
    if ok:
        fields["flags"] = flag_names(fields["flags"])
        return
    if strict:
        raise _Odd
    # A record written before a field existed lacks it: keep what the line has.
    fields["created_at"] = _number(fields["created_at"])
    fields["prompt_tokens"] = int(_number(fields["prompt_tokens"]))
    fields["completion_tokens"] = int(_number(fields["completion_tokens"]))
    if not isinstance(fields["finish_reason"], str):
        fields["finish_reason"] = "?"
    fields["flags"] = flag_names(fields["flags"])
    if not isinstance(fields["dataset"], str):
        fields["dataset"] = None
    for name in _OPTIONAL_INTS:
        if type(fields[name]) is not int:
            fields[name] = None


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


BLOCK = 1 << 23  # 8 MB reads: Python's readline crawls on 50 KB lines


def line_spans(handle: FileIO) -> Iterator[tuple[bytearray, int, int]]:
    """``(buffer, start, end)`` of each newline-terminated line of ``handle``, read in blocks
    into one buffer and never copied out; a span is valid until the next one is taken. What
    follows the last newline is not a line: a write in progress, or a torn tail."""
    buf = bytearray(BLOCK)
    filled = 0
    while True:
        if filled == len(buf):  # one line longer than the buffer: grow it
            buf.extend(bytes(len(buf)))
        read = handle.readinto(memoryview(buf)[filled:])
        if not read:
            return
        filled += read
        pos = 0
        while (newline := buf.find(b"\n", pos, filled)) >= 0:
            yield buf, pos, newline
            pos = newline + 1
        buf[: filled - pos] = buf[pos:filled]  # the unfinished line moves to the front
        filled -= pos


def committed_files(run_dir: Path) -> Iterator[FileIO]:
    """Every record file, open: sealed shards, then the open journal (``pending/``).

    Sealing renames ``pending/NAME`` to ``shards/NAME`` (same name, atomic): each name is looked
    for in ``shards/``, then ``pending/``, then ``shards/`` again in case the rename happened in
    between, so a shard sealed while the report reads is read once."""
    shards, pending = run_dir / "shards", run_dir / "pending"
    names: set[str] = set()
    for folder in (shards, pending):
        if folder.is_dir():
            names.update(name for name in os.listdir(folder) if SHARD_PATTERN.match(name))
    for name in sorted(names):
        for path in (shards / name, pending / name, shards / name):
            try:
                handle = path.open("rb", buffering=0)
            except FileNotFoundError:
                continue
            with handle:
                yield handle
            break


def committed_lines(run_dir: Path) -> Iterator[bytes]:
    """Every committed record line, newline excluded (a copy each: for checks, not speed)."""
    for handle in committed_files(run_dir):
        for buf, start, end in line_spans(handle):
            yield bytes(buf[start:end])


@dataclass
class DatasetSeries:
    """One dataset's records, for the report's mix table (``report/mix.py``)."""

    prompt_tokens: array[int] = field(default_factory=lambda: array("q"))
    completion_tokens: array[int] = field(default_factory=lambda: array("q"))
    reasoning_tokens: int = 0
    reasoning_counted: int = 0
    """Output tokens of the records that say how many of them were thinking."""
    conversations: Counter[int] = field(default_factory=Counter)
    """Conversations by their regenerated turns (counted at each conversation's first turn)."""
    letters: Counter[str] = field(default_factory=Counter)
    """Letters of the newest user messages, per script."""
    prompts_by_script: Counter[str] = field(default_factory=Counter)
    """Records by the script most of their newest user message is written in."""

    @property
    def records(self) -> int:
        return len(self.prompt_tokens)

    def add(self, fields: dict[str, Any]) -> None:
        self.prompt_tokens.append(fields["prompt_tokens"])
        self.completion_tokens.append(fields["completion_tokens"])
        reasoning = fields["reasoning_tokens"]
        if reasoning is not None:
            self.reasoning_tokens += reasoning
            self.reasoning_counted += fields["completion_tokens"]
        turn, turns = fields["turn"], fields["conversation_turns"]
        if turn in (None, 0):
            self.conversations[turns or 1] += 1
        text = fields.get("user_text")
        if text:
            letters = script_letters(text)
            self.letters.update(letters)
            script = dominant_script(letters)
            if script is not None:
                self.prompts_by_script[script] += 1


@dataclass
class RecordSeries:
    """Per-record numbers in file order (25 bytes each), and counts.

    Memory is ~25 bytes a record whatever a record's size: 2 MB for the reference job's 88k.
    """

    created_at: array[float] = field(default_factory=lambda: array("d"))
    prompt_tokens: array[int] = field(default_factory=lambda: array("q"))
    completion_tokens: array[int] = field(default_factory=lambda: array("q"))
    # 1 where the answer was cut at max_new_tokens (finish_reason ``length``)
    truncated: array[int] = field(default_factory=lambda: array("B"))
    finish_reasons: Counter[str] = field(default_factory=Counter)
    flags: Counter[str] = field(default_factory=Counter)
    # records that carry ``flags`` (records written before flags existed do not), and those
    # with any flag
    with_flags_field: int = 0
    flagged: int = 0
    datasets: dict[str, DatasetSeries] = field(default_factory=dict)

    @property
    def records(self) -> int:
        return len(self.created_at)

    def add(self, fields: dict[str, Any]) -> None:
        self.created_at.append(float(fields["created_at"]))
        self.prompt_tokens.append(fields["prompt_tokens"])
        self.completion_tokens.append(fields["completion_tokens"])
        self.finish_reasons[fields["finish_reason"]] += 1
        self.truncated.append(fields["finish_reason"] == "length")
        flags = fields["flags"]
        if flags is not None:
            self.with_flags_field += 1
            if flags:
                self.flagged += 1
                self.flags.update(str(flag) for flag in flags)
        name = fields["dataset"] or "?"
        series = self.datasets.get(name)
        if series is None:
            series = self.datasets[name] = DatasetSeries()
        series.add(fields)


def scan_records(run_dir: Path) -> RecordSeries:
    """Stream every committed record once; memory does not grow with a record's size."""
    series = RecordSeries()
    for handle in committed_files(run_dir):
        for buf, start, end in line_spans(handle):
            series.add(fields_in(buf, start, end, prompt_text=True))
    return series
