"""The contract of every line eagledata writes into a run directory, in one place.

This module is the data contract, kept in one module on purpose (over the 400 lines other
modules stay under): one class per kind of line, so that a reader finds every field any file of
a run directory holds, its type and its description in one file, and the generated
``docs/run-directory.md`` follows it. Do not split it by line kind.

Each kind of line is one frozen pydantic model: writers build it (a misspelled or mistyped field
fails where it is built, and mypy sees the keywords), ``dump`` turns it into the bytes of one line,
and readers ``parse`` those bytes back into the same model, or get ``LineError`` naming the line's
problem. The field descriptions here are the schema's documentation:
``docs/run-directory.md``'s field lists are generated from them (``scripts/gen_docs.py``; a test
fails when the doc and the models disagree).

Adding a field: add it here with a description (and a default, so the lines of older runs still
parse), set it where the line is built, run ``python scripts/gen_docs.py``. A record field that
some answers lack gets a typed none (``NONE_VALUES``), not null: ``tests/test_record_types.py``
fails for a nullable record field it does not know. A change that older readers cannot take (a
field removed, renamed or retyped) also raises that line's ``SCHEMA``, which ``run.json``
records (``line_schemas``) for every run it starts.

| line | file | written by |
|---|---|---|
| ``RecordLine`` | ``shards/*.jsonl`` (``pending/`` while open) | ``run/records.py`` |
| ``FailureLine`` | ``failures.jsonl`` | ``rundir/records.py`` (``failure_line``) |
| ``CheckLine`` | ``checks.jsonl`` | ``server/guard.py`` |
| ``QualityLine`` | ``quality.jsonl`` | ``quality/canary.py`` |
| ``TelemetryLine`` | ``telemetry.jsonl`` | ``run/telemetry.py`` |
| ``ShardIndexLine`` | ``shards/*.idx.json`` | ``rundir/shardindex.py`` |
| ``QuarantineLine`` | ``quarantine.jsonl`` | ``rundir/quarantine.py`` |
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar, Literal, Self

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)


class LineError(ValueError):
    """A line that does not parse as its model: not JSON, a field missing, mistyped or unknown."""


class Line(BaseModel):
    """One line of a run-directory file: frozen, and no field the contract does not name."""

    # strict: an id is an int, never "12" or 12.0 coerced into one
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    SCHEMA: ClassVar[int] = 1
    FILE: ClassVar[str] = ""
    """Where lines of this kind live, relative to the run directory (a glob for shards)."""

    def dump(self) -> bytes:
        """The line's bytes, without the newline: fields in their declared order."""
        return orjson.dumps(self.__dict__, default=_nested)

    @classmethod
    def parse(cls, data: bytes | str) -> Self:
        """The line as its model; ``LineError`` with the first problem if it is not one."""
        try:
            return cls.model_validate_json(data)
        except ValidationError as exc:
            raise LineError(_first_problem(exc)) from None

    @classmethod
    def from_object(cls, value: object) -> Self:
        """An already-parsed JSON object as the model; ``LineError`` if it is not one."""
        try:
            return cls.model_validate(value)
        except ValidationError as exc:
            raise LineError(_first_problem(exc)) from None


def _nested(value: object) -> object:
    if isinstance(value, BaseModel):
        return value.__dict__
    raise TypeError(f"{type(value).__name__} is not part of a run-directory line")


def _first_problem(exc: ValidationError) -> str:
    error = exc.errors(include_url=False)[0]
    if error["type"] == "json_invalid":
        return "not valid JSON"
    if error["type"] == "model_type":  # valid JSON, but not an object
        return "not a JSON object"
    where = ".".join(str(part) for part in error["loc"]) or "the line"
    return f"{where}: {error['msg']}"


# --- records and failures: what the plan's items ended as -----------------------------------


class RecordFlags(BaseModel):
    """What a trainer should know of an answer (``quality/flags.py`` computes them): every
    flag, always present, ``true`` where it fired. An object of booleans rather than a list of
    names, so the column has one Arrow type in every record (a list empty in every clean record
    of a shard is typed ``list<null>`` by ``datasets``, which then refuses the first flagged
    one)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    truncated: bool = Field(
        default=False, description="`finish_reason` is `length`: cut at `max_new_tokens`"
    )
    empty: bool = Field(default=False, description="no token but the stop token")
    degenerate: bool = Field(
        default=False, description="the answer ends in a repeated loop (found on `output_ids`)"
    )
    roundtrip_mismatch: bool = Field(
        default=False,
        description="decoding the output and re-encoding it does not give the ids back",
    )
    unbalanced_think: bool = Field(
        default=False, description="a think block opened and never closed"
    )

    @classmethod
    def of(cls, names: Iterable[str]) -> RecordFlags:
        """The flags named (an older record's list); ``ValueError`` for a name not known."""
        fired = dict.fromkeys(names, True)
        unknown = sorted(set(fired) - set(FLAG_NAMES))
        if unknown:
            raise ValueError(f"unknown flag {unknown[0]!r}; known: {', '.join(FLAG_NAMES)}")
        return cls(**fired)

    def names(self) -> list[str]:
        """The flags that fired, in declared order; empty for a clean answer."""
        return [name for name in FLAG_NAMES if getattr(self, name)]


FLAG_NAMES: tuple[str, ...] = tuple(RecordFlags.model_fields)
"""Every record flag, in the order a record writes them."""


def flag_names(value: object) -> list[str] | None:
    """The flags that fired, from a record's ``flags`` in any form a run has held: the model
    (the writer's record), an object of booleans (a parsed line), an older line's list of
    names; None where the record carries none (written before flags existed) or something
    else."""
    if isinstance(value, RecordFlags):
        return value.names()
    if isinstance(value, dict):
        return [str(name) for name, fired in value.items() if fired is True]
    if isinstance(value, list):
        return [str(name) for name in value]
    return None


NONE_VALUES: dict[str, object] = {
    "matched_token_id": -1,
    "cached_tokens": -1,
    "server": "",
    "rid": "",
    "weight_version": "",
    "e2e_latency": 0.0,
    "spec_verify_ct": 0,
    "prompt_key": "",
    "row_hash": "",
}
"""The typed "none" of each record field an answer may lack, written instead of null: a column
null in every record of a consumer's first block is typed ``null`` by ``datasets.load_dataset``,
which then refuses the first record holding a value. A null in an older record parses as it."""


class RecordLine(Line):
    """One generated answer: exactly the ids sent and the ids returned, and where they came
    from. ``id`` comes first, so a reader that wants only ids can stop parsing early.

    Every field a new record writes has one JSON type in every record of a run, whatever the
    answer (``datasets.load_dataset("json")`` infers the columns from the first records of the
    first shard and casts every later one to them): an answer without a value gets the field's
    typed none (``NONE_VALUES``). Two fields may be null, each for a whole run:
    ``reasoning_tokens`` (null under a tokenizer without think tags: the run's tokenizer is
    frozen) and ``settings`` (stamped by the writer of every run; null only where a writer is
    given no fingerprint)."""

    SCHEMA: ClassVar[int] = 2
    """2: ``flags`` an object of booleans (a list of names before), typed nones for
    ``matched_token_id`` (-1), ``cached_tokens`` (-1), ``e2e_latency`` (0.0),
    ``spec_verify_ct`` (0), ``weight_version``, ``server``, ``rid`` and ``prompt_key`` ("")
    where null was written. Lines of schema 1 still parse, as the same values."""
    FILE: ClassVar[str] = "shards/*.jsonl"

    id: str = Field(
        description="`dataset/row_id/sample` (`dataset/row_id/sample/turn` under `turns = "
        '"all"`): stable and unique in the run'
    )
    dataset: str = Field(description="the dataset's name, as in the config or the file's stem")
    row_id: str = Field(description="the source row's stable id within its dataset")
    sample: int = Field(description="the sample index, 0 to `samples_per_prompt - 1`")
    conversation_id: str | None = Field(
        default=None,
        description="`dataset/row_id/sample`: the conversation this answer belongs to (each "
        "sample is a conversation of its own); null only in records written before turns "
        "existed",
    )
    turn: int | None = Field(
        default=None,
        description="0-based among the conversation's regenerated assistant turns (always 0 "
        'under `turns = "last"`); null only in records written before turns existed',
    )
    conversation_turns: int | None = Field(
        default=None,
        description="how many of the conversation's assistant turns are regenerated (1 under "
        '`turns = "last"`): `turn` runs from 0 to `conversation_turns - 1`; null only in '
        "records written before turns existed",
    )
    finish_reason: Literal["stop", "length"] = Field(
        description="`stop` (the model ended it) or `length` (cut at `max_new_tokens`)"
    )
    prompt_tokens: int = Field(description="SGLang's count of the prompt: `len(input_ids)`")
    completion_tokens: int = Field(description="SGLang's count of the answer: `len(output_ids)`")
    created_at: float = Field(
        default=0.0, description="unix seconds when the response completed (not when written)"
    )
    messages: list[dict[str, Any]] = Field(
        description="the prompt's messages, exactly as rendered into `input_ids`; under `turns "
        '= "all"` the earlier assistant messages are the regenerated answers (content and '
        "`reasoning_content` from the previous turns' `output_ids`; with a tokenizer that has "
        'think tags every message carries `reasoning_content`, "" where none)'
    )
    input_ids: list[int] = Field(description="exactly the ids sent")
    output_ids: list[int] = Field(description="exactly the ids returned, stop token included")
    text: str = Field(description="the answer's text as the server decoded it")
    flags: RecordFlags | None = Field(
        default=None,
        description="what a trainer should know of the answer: an object holding every flag "
        "(`truncated`, `empty`, `degenerate`, `roundtrip_mismatch`, `unbalanced_think`), "
        "`true` where it fired, all `false` when clean. Records written before it was an "
        "object hold a list of the names that fired (read as the same flags); absent only in "
        "records written before flags existed",
    )
    matched_token_id: int = Field(
        default=-1,
        description="the stop token id that ended it; -1 when none did (cut at "
        "`max_new_tokens`, or ended by a stop string)",
    )
    cached_tokens: int = Field(
        default=-1,
        description="prompt tokens the server found in its prefix cache; -1 when the server "
        "did not say (0 is a miss)",
    )
    server: str = Field(default="", description="the server URL that answered")
    rid: str = Field(default="", description="the request id sent to SGLang")
    weight_version: str = Field(
        default="", description='SGLang\'s `weight_version`; "" when the server did not say'
    )
    e2e_latency: float = Field(
        default=0.0,
        description="SGLang's end-to-end latency of the request, seconds; 0.0 when the "
        "server did not say (the send time is then unknown)",
    )
    spec_verify_ct: int = Field(
        default=0,
        description="SGLang's speculative verify steps for this answer; 0 without speculative "
        "decoding (or when no verify step ran)",
    )
    settings: str | None = Field(
        default=None,
        description="the fingerprint of the frozen settings it was made under (`run.json`'s "
        "`fingerprint`): a run never adopts a record made under other settings; set on every "
        "record a run writes, null in records written before it existed",
    )
    reasoning_tokens: int | None = Field(
        default=None,
        description="output ids spent thinking (inside the think block, tags excluded); null "
        "in every record of a run whose tokenizer has no think tags, an int in every record "
        "of any other",
    )
    prompt_key: str = Field(
        default="",
        description="the hash a duplicate prompt is found by (of the prompt ids; under `turns "
        '= "all"` of the first prompt\'s ids and the later user messages); "" where none',
    )
    row_hash: str = Field(
        default="",
        description="the hash of the source row's prompt content it was made from "
        "(`rows/NAME.jsonl` holds every row's, as the run started): a row id never silently "
        'names another row, and `verify` checks it; "" in records written before it existed',
    )

    @field_validator("flags", mode="before")
    @classmethod
    def _flags_of_a_list(cls, value: object) -> object:
        """An older record's list of flag names: the same flags."""
        if isinstance(value, list) and all(isinstance(name, str) for name in value):
            return RecordFlags.of(value)
        return value

    @field_validator(*NONE_VALUES, mode="before")
    @classmethod
    def _null_as_none_value(cls, value: object, info: ValidationInfo) -> object:
        """An older record's null: the field's typed none."""
        return NONE_VALUES[info.field_name] if value is None else value  # type: ignore[index]

    @property
    def matched(self) -> int | None:
        """The stop token id that ended the answer, None when none did (as ``GenerateResult``
        has it, less a stop string)."""
        return self.matched_token_id if self.matched_token_id >= 0 else None


class FailureLine(Line):
    """One (prompt, sample) that ended without a record, and why."""

    FILE: ClassVar[str] = "failures.jsonl"

    id: str = Field(description="the item's record id (`dataset/row_id/sample`)")
    status: Literal["failed", "skipped"] = Field(
        default="failed",
        description="`failed` (counted as failed; `resume --retry-failed` tries it again) or "
        "`skipped` (the plan leaves it out on purpose: a `duplicate` prompt, a `duplicate_id`)",
    )
    reason: str = Field(
        description="the short cause: `bad_row`, `prompt_too_long`, `previous_turn_failed`, "
        "`duplicate`, ..."
    )
    message: str = Field(description="one line saying what went wrong")
    dataset: str = Field(description="the dataset's name")
    row_id: str = Field(description="the source row's id")
    sample: int = Field(description="the sample index")
    attempts: int = Field(description="requests sent for it (0: it never reached a server)")
    time: float = Field(description="unix seconds when it ended")
    settings: str | None = Field(
        default=None,
        description="the fingerprint of the frozen settings it ended under, as in a record",
    )
    prompt_key: str | None = Field(
        default=None,
        description="its prompt's `prompt_key`, when the prompt was templated (a later copy of "
        "it is still a `duplicate`)",
    )


# --- checks of the servers ----------------------------------------------------------------


class CheckLine(Line):
    """One KV-guard check of one server (a router's workers are checked one by one)."""

    FILE: ClassVar[str] = "checks.jsonl"

    time: float = Field(description="unix seconds of the check")
    server: str = Field(description="the server (or worker) URL checked")
    via: str | None = Field(default=None, description="the router it was checked behind")
    ok: bool = Field(description="the bf16 verdict")
    problems: list[str] = Field(description="why it was refused; empty when ok")
    model_path: str | None = Field(default=None, description="the model the server serves")
    kv_cache_dtype: str | None = Field(default=None, description="the requested KV dtype")
    internal_kv_dtypes: list[str] = Field(
        default=[], description="every `internal_states[i].kv_cache_dtype` the server reported"
    )
    bytes_per_token: float | None = Field(
        default=None, description="KV bytes per token measured from the server's memory report"
    )
    max_total_num_tokens: int | None = Field(default=None, description="the KV pool, in tokens")


class RankLine(BaseModel):
    """One DP rank's own verdict inside a canary check."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    rank: int = Field(description="the DP rank")
    stats: dict[str, float] = Field(description="its references against its baseline share")
    thresholds: dict[str, float] = Field(description="the thresholds of its share")
    fired: list[str] = Field(description="its statistics past their thresholds (empty: none)")


class QualityLine(Line):
    """One canary scoring: a baseline run, or a check against the baseline."""

    FILE: ClassVar[str] = "quality.jsonl"

    time: float = Field(description="unix seconds")
    server: str = Field(description="the server URL scored")
    kind: Literal["baseline", "check"] = Field(description="`baseline` or `check`")
    trigger: str = Field(
        description="baseline: `idle` or `load`; check: `start`, `period`, `reconnect`, "
        "`server_info`, `held`, `hold_time`, `end` or `rerun`"
    )
    verdict: str = Field(
        description="`pass`, `fired`, `drift`, `mismatch` or `error`; a baseline's: `pass` or "
        "`refused` (the server changed while it was measured)"
    )
    stats: dict[str, float] = Field(description="the statistics against the baseline")
    thresholds: dict[str, float] = Field(description="one threshold per statistic")
    reason: str = Field(default="", description="what fired, or the error")
    requests: int = Field(default=0, description="requests the scoring sent")
    prompt_tokens: int = Field(default=0, description="prompt tokens it sent")
    seconds: float = Field(default=0.0, description="how long it took")
    cold: int = Field(default=0, description="references scored without their prefix cached")
    ranks: list[RankLine] = Field(
        default=[], description="per DP rank verdicts (a check of a server with several)"
    )
    via: str | None = Field(
        default=None, description="the router it was checked behind (each worker is scored)"
    )


class TelemetryLine(Line):
    """One lane's load sample: a server, or one DP rank of it."""

    FILE: ClassVar[str] = "telemetry.jsonl"

    time: float = Field(description="unix seconds of the sample")
    server: str = Field(description="the server URL (a router: its workers together)")
    rank: int | None = Field(default=None, description="the DP rank; null for a whole server")
    source: str = Field(
        description="the load signal read, by its name in docs/sglang.md's table of them, or "
        "`none` (the server offers none)"
    )
    token_usage: float | None = Field(default=None, description="the KV pool's used share")
    num_running_reqs: int | None = Field(default=None, description="requests decoding")
    num_queue_reqs: int | None = Field(default=None, description="requests in the server queue")
    gen_throughput: float | None = Field(default=None, description="the server's output tok/s")
    num_retracted_reqs: int = Field(
        default=0,
        description="retractions the controller has backed off for on the lane this run "
        "(retractions within 2 s of one another count once)",
    )
    num_retracted_requests_total: float | None = Field(
        default=None,
        description="the server's own retraction counter as last read (`/metrics` "
        "`sglang:num_retracted_requests_total`, since the server started; a DP server's split "
        "evenly over its lanes); null while the server reports none (SGLang creates the counter "
        "at its first retraction)",
    )
    in_flight: int = Field(default=0, description="our requests in flight on the lane")
    target: int | None = Field(
        default=None,
        description="requests the lane holds at its target usage (fixed: `--concurrency`)",
    )
    target_usage: float | None = Field(
        default=None, description="the controller's `u*` (null under a fixed concurrency)"
    )
    usage_ceiling: float | None = Field(
        default=None, description="the `u*` the last retraction happened at, while it holds"
    )
    forecast_usage: float | None = Field(
        default=None, description="the peak pool share forecast for what is in flight"
    )
    queue_full: int = Field(default=0, description="503s the lane has had")
    queue_cap: int | None = Field(
        default=None,
        description="the server queue the gate never reaches: its `max_queued_requests` less a "
        "spare, or a cap a 503 taught (null under a fixed concurrency)",
    )
    held_by: dict[str, int] = Field(
        default={},
        description="times each gate rule held a request back since the previous line",
    )
    spec_accept_length: float | None = Field(
        default=None, description="the server's measured speculative acceptance length"
    )


# --- the shard index ------------------------------------------------------------------------


class ShardIndexLine(Line):
    """What a run's readers need of one sealed shard, without its records' token ids: a cache,
    trusted only when it matches its shard (``rundir/shardindex.py``). Lists are per record, in
    file order. Written with sorted keys and a ``digest`` of the rest."""

    FILE: ClassVar[str] = "shards/*.idx.json"

    version: int = Field(description="the index format's version")
    shard: str = Field(description="the shard's file name")
    size: int = Field(description="the shard's size in bytes when indexed")
    mtime_ns: int = Field(description="the shard's mtime when indexed")
    checksum: str = Field(description="`blake2b-128:` of the shard's bytes")
    records: int = Field(description="records in the shard")
    prompt_tokens: int = Field(description="their prompt tokens")
    completion_tokens: int = Field(description="their completion tokens")
    finish_reasons: dict[str, int] = Field(description="records per finish reason")
    flags: dict[str, int] = Field(description="records carrying each flag")
    flagged: int = Field(default=0, description="records carrying at least one flag")
    invalid_lines: int = Field(
        default=0, description="lines that are not a record with an id (verify reports them)"
    )
    ids: list[str] = Field(description="each record's id")
    completion_lengths: list[int] = Field(description="each record's answer length")
    created_at: list[float] = Field(description="each record's completion time")
    started_at: list[float] = Field(
        description="each record's send time: completion minus SGLang's e2e latency (its "
        "completion time when the latency is unknown); the run's active time is their union"
    )
    spec_verify_ct: list[int] = Field(description="each record's verify count, 0 where none")
    settings: dict[str, int] = Field(
        default={},
        description='records per settings fingerprint (`""`: records without one)',
    )
    datasets: dict[str, int] = Field(default={}, description="records per dataset")
    turns_left: list[int] = Field(
        default=[],
        description="each record's turns after it in its conversation (`conversation_turns - "
        "turn - 1`, 0 where none): what resume continues",
    )
    prompt_keys: list[str] = Field(
        default=[], description="each record's `prompt_key`, empty where none (dedupe on resume)"
    )
    row_hashes: list[str] = Field(
        default=[], description="each record's `row_hash`, empty where none (verify checks them)"
    )
    digest: str = Field(default="", description="blake2b-128 of the object without it")


# --- damage moved aside -------------------------------------------------------------------


class QuarantineLine(Line):
    """One line moved out of the run's data by ``eagledata verify --repair`` (or by ``resume``,
    sealing a journal) because it does not read as what its file holds. Its item, if it had
    one, is no longer done: ``resume`` generates it again."""

    FILE: ClassVar[str] = "quarantine.jsonl"

    time: float = Field(description="unix seconds when it was moved")
    source: str = Field(
        description="the file it was in, relative to the run directory "
        "(`shards/shard-000003.jsonl`, `pending/...`, `failures.jsonl`)"
    )
    line: int = Field(description="its line number in that file (1 for the first)")
    problem: str = Field(description="why it could not be read, e.g. `not valid JSON`")
    id: str | None = Field(default=None, description="the item id it named, when one could be read")
    encoding: Literal["utf-8", "base64"] = Field(
        description="how `content` holds the line: as text, or base64 when not UTF-8"
    )
    content: str = Field(description="the line's bytes, without its newline")


LINE_MODELS: tuple[type[Line], ...] = (
    RecordLine,
    FailureLine,
    CheckLine,
    QualityLine,
    TelemetryLine,
    ShardIndexLine,
    QuarantineLine,
)


def line_schemas() -> dict[str, int]:
    """Each line model's schema version, as ``run.json`` records them."""
    return {model.__name__: model.SCHEMA for model in LINE_MODELS}
