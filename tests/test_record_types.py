"""Every field of a record has one JSON type in every record of a run, whatever the answers.

The promise: ``datasets.load_dataset("json", data_files="RUN_DIR/shards/*.jsonl")`` loads any run.
datasets infers the columns from the first block of the first shard and casts every later table
to them, so a field null (or an empty list) in every record of that block, and holding a value
later, makes the whole load fail ("Couldn't cast array of type string to null"). A real run's
first shard can be like that: 1,000 clean answers (no flag), answers all cut at
``max_new_tokens`` or ended by a stop string (no matched token id), a server without speculative
decoding or without latency and cache reports, before a resume on another server.
"""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Any, Literal

import orjson
import pytest

from conftest import SAMPLES, make_config, read_records, sim_config
from eagledata.export import ExportOptions, export_runs
from eagledata.quality.flags import FlagDetector
from eagledata.run import pipeline
from eagledata.run.records import ExaminedAnswer, make_record, record_of
from eagledata.run.writer import ShardWriter
from eagledata.rundir.lines import FLAG_NAMES, RecordLine
from eagledata.rundir.manifest import RunDir
from eagledata.server.responses import GenerateResult
from eagledata.simserver import SimServerThread
from eagledata.source.answers import AnswerReader
from eagledata.source.workitem import WorkItem
from exportkit import frozen

STOP = 2  # <|im_end|> in the bundled tokenizer

NULL_FOR_A_WHOLE_RUN = {"reasoning_tokens", "settings"}
"""Fields a new record may write as null, documented as constant per run: ``reasoning_tokens``
is null in every record of a run whose tokenizer has no think tags (the tokenizer is frozen);
``settings`` is stamped by the writer of every run (null only from a writer given no
fingerprint)."""
NULL_ONLY_IN_OLDER_RECORDS = {"conversation_id", "turn", "conversation_turns", "flags"}
"""Fields the model reads as null for records written before they existed; a new record always
holds a value (``make_record`` requires them)."""


def load_shards(run: Path, cache: Path) -> Any:
    import datasets

    return datasets.load_dataset(
        "json", data_files=str(run / "shards" / "*.jsonl"), split="train", cache_dir=str(cache)
    )


class Maker:
    """Records built the way a run builds them: ``record_of`` on a work item and an answer, the
    flags from the run's detector, the thinking count from the run's answer reader."""

    def __init__(self, prompt_tokenizer: Any) -> None:
        self.tokenizer = prompt_tokenizer
        self.detector = FlagDetector.from_vocab(
            prompt_tokenizer.token_id, prompt_tokenizer.roundtrip
        )
        self.answers = AnswerReader(prompt_tokenizer.hf)
        self.rows = 0

    def ids(self, text: str) -> list[int]:
        return list(self.tokenizer.hf.encode(text, add_special_tokens=False))

    def record(
        self,
        output_ids: list[int],
        finish: Literal["stop", "length"],
        matched: int | str | None,
        *,
        speculative: bool = False,
        reported: bool = False,
    ) -> RecordLine:
        """``reported``: the server said its cached tokens, latency and weight version."""
        self.rows += 1
        row = f"row-{self.rows:03d}"
        messages = [{"role": "user", "content": f"Question {self.rows}?"}]
        input_ids = self.tokenizer.encode(messages, {})
        item = WorkItem(f"hand/{row}/0", row, 0, messages, input_ids, dataset="hand")
        item.prompt_key = f"key-{self.rows}"
        result = GenerateResult(
            rid=f"rid-{self.rows}",
            server="http://127.0.0.1:30000",
            output_ids=output_ids,
            text=self.tokenizer.hf.decode(output_ids),
            finish_reason=finish,
            matched=matched,
            prompt_tokens=len(input_ids),
            completion_tokens=len(output_ids),
            cached_tokens=5 if reported else None,
            e2e_latency=1.5 if reported else None,
            weight_version="v7" if reported else None,
            spec_verify_ct=3 if speculative else None,
        )
        flags = self.detector.flags(
            input_ids=input_ids, output_ids=output_ids, finish_reason=finish, matched=matched
        )
        reasoning = self.answers.reasoning_tokens(input_ids, output_ids, finish, matched)
        return record_of(ExaminedAnswer(item, result, flags, reasoning))


@pytest.mark.parametrize("first", ["stop_string", "cut"])
def test_a_run_whose_first_shard_lacks_what_later_shards_hold_loads_whole(
    first: str, prompt_tokenizer: Any, tmp_path: Path
) -> None:
    """First shard: answers ended by a stop string (clean: no flag) or cut at max_new_tokens
    (only ``truncated``), none ending on a stop token id, none speculative, from a server that
    reports neither cache, latency nor weight version. Later shard: flagged, stop-ended,
    speculative answers with every report. Every one loads, with its own values."""
    make = Maker(prompt_tokenizer)
    if first == "stop_string":
        quiet = [make.record(make.ids(f"All good number {n}."), "stop", "\n\n") for n in range(4)]
    else:
        quiet = [make.record(make.ids(f"Once upon a time {n}"), "length", None) for n in range(4)]
    loop = make.ids(" ab cd") * 24
    loud = [
        make.record([*make.ids("Sure."), STOP], "stop", STOP, speculative=True, reported=True),
        make.record([*loop, STOP], "stop", STOP, speculative=True, reported=True),
        make.record([STOP], "stop", STOP, speculative=True, reported=True),
        make.record([*make.ids("Let me think"), STOP], "stop", STOP, reported=True),
    ]
    run = tmp_path / "run"
    run.mkdir()
    settings = frozen()
    RunDir(run).create(settings, {})
    fingerprint = settings.fingerprint()
    writer = ShardWriter(run, shard_size=len(quiet), fsync_interval_s=0, fingerprint=fingerprint)
    for line in [*quiet, *loud]:
        writer.write(line)
    writer.close()
    RunDir(run).set_planned(len(quiet) + len(loud))
    shards = sorted((run / "shards").glob("*.jsonl"))
    assert [len(p.read_bytes().splitlines()) for p in shards] == [len(quiet), len(loud)]

    loaded = load_shards(run, tmp_path / "cache")

    assert loaded.num_rows == len(quiet) + len(loud)
    rows = {row["id"]: row for row in loaded}
    written = [orjson.loads(line) for p in shards for line in p.read_bytes().splitlines()]
    assert [row["id"] for row in written] == [line.id for line in [*quiet, *loud]]
    for row, line in zip(written, [*quiet, *loud], strict=True):
        assert rows[line.id] == row  # every value as written, none cast away
        assert line.flags is not None
        assert row["flags"] == {name: name in line.flags.names() for name in FLAG_NAMES}
    quiet_rows = [rows[line.id] for line in quiet]
    loud_rows = [rows[line.id] for line in loud]
    assert all(row["matched_token_id"] == -1 for row in quiet_rows)
    assert all(row["matched_token_id"] == STOP for row in loud_rows)
    assert all(row["spec_verify_ct"] == 0 for row in quiet_rows)
    assert [row["spec_verify_ct"] for row in loud_rows] == [3, 3, 3, 0]
    assert all(
        (row["cached_tokens"], row["e2e_latency"], row["weight_version"]) == (-1, 0.0, "")
        for row in quiet_rows
    )
    assert all(
        (row["cached_tokens"], row["e2e_latency"], row["weight_version"]) == (5, 1.5, "v7")
        for row in loud_rows
    )
    expected_first = {"truncated": first == "cut"}
    assert all(
        {name: value for name, value in row["flags"].items() if value}
        == {name: True for name, value in expected_first.items() if value}
        for row in quiet_rows
    )
    assert loud_rows[1]["flags"]["degenerate"] and loud_rows[2]["flags"]["empty"]
    assert all(row["settings"] == fingerprint for row in rows.values())

    # the export rows of the same run load as well, with fixed metadata types
    out = tmp_path / "train.jsonl"
    export_runs([run], out, ExportOptions(format="ids", keep=("empty", "degenerate"), force=True))
    import datasets

    exported = datasets.load_dataset(
        "json", data_files=str(out), split="train", cache_dir=str(tmp_path / "cache-ids")
    )
    assert exported.num_rows == len(quiet) + len(loud)
    assert exported.features["metadata"]["turn"].dtype == "int64"


def test_a_new_record_has_no_null_and_no_empty_list_whatever_the_server_left_out(
    prompt_tokenizer: Any, tmp_path: Path
) -> None:
    """A result missing every optional piece (no matched id, no cached tokens, latency, weight
    version or verify count), written by a run's writer: every field of the contract is there,
    typed, and null only where documented as constant per run."""
    bare = GenerateResult(
        rid="rid-1",
        server="http://127.0.0.1:30000",
        output_ids=[7, 8],
        text="hi",
        finish_reason="length",
        matched=None,
        prompt_tokens=3,
        completion_tokens=2,
        cached_tokens=None,
        e2e_latency=None,
        weight_version=None,
        spec_verify_ct=None,
    )
    built = make_record(
        item_id="d/1/0",
        dataset="d",
        row_id="1",
        sample=0,
        messages=[{"role": "user", "content": "hello"}],
        input_ids=[1, 2, 3],
        result=bare,
        flags=[],
        conversation_id="d/1/0",
        turn=0,
        conversation_turns=1,
        reasoning_tokens=None,  # a tokenizer without think tags: null in every record
        prompt_key="k",
    )
    run = tmp_path / "run"
    run.mkdir()
    writer = ShardWriter(run, shard_size=10, fsync_interval_s=0, fingerprint="f" * 16)
    writer.write(built)
    writer.close()
    (line,) = (run / "shards" / "shard-000000.jsonl").read_bytes().splitlines()
    written = orjson.loads(line)
    assert list(written) == list(RecordLine.model_fields)  # every field, in declared order
    nulls = {name for name, value in written.items() if value is None}
    assert nulls == {"reasoning_tokens"}
    assert not [name for name, value in written.items() if value == []]
    assert written["flags"] == dict.fromkeys(FLAG_NAMES, False)
    assert {name: written[name] for name in ("matched_token_id", "cached_tokens")} == {
        "matched_token_id": -1,
        "cached_tokens": -1,
    }
    assert type(written["e2e_latency"]) is float and written["spec_verify_ct"] == 0
    assert written["weight_version"] == "" and written["settings"] == "f" * 16


def test_every_field_that_may_be_null_is_one_the_contract_names() -> None:
    """A field added as ``X | None`` fails here until it gets a typed none (``NONE_VALUES``)
    or is documented as null for a whole run, or only in older records."""
    nullable = {
        name
        for name, info in RecordLine.model_fields.items()
        if type(None) in typing.get_args(info.annotation)
        or isinstance(info.annotation, types.NoneType)
    }
    assert nullable == NULL_FOR_A_WHOLE_RUN | NULL_ONLY_IN_OLDER_RECORDS
    lists = {
        name
        for name, info in RecordLine.model_fields.items()
        if typing.get_origin(info.annotation) is list
    }
    # never empty: a prompt has a message and ids, an answer its ids
    assert lists == {"messages", "input_ids", "output_ids"}


def test_a_record_written_with_nulls_reads_as_the_typed_nones() -> None:
    old = {
        "id": "d/1/0", "dataset": "d", "row_id": "1", "sample": 0, "finish_reason": "length",
        "prompt_tokens": 1, "completion_tokens": 1, "messages": [], "input_ids": [5],
        "output_ids": [9], "text": "", "flags": ["truncated"], "matched_token_id": None,
        "cached_tokens": None, "server": None, "rid": None, "weight_version": None,
        "e2e_latency": None, "spec_verify_ct": None, "settings": None, "prompt_key": None,
    }  # fmt: skip
    record = RecordLine.parse(orjson.dumps(old))
    assert (record.matched_token_id, record.matched) == (-1, None)
    assert (record.cached_tokens, record.e2e_latency, record.spec_verify_ct) == (-1, 0.0, 0)
    assert (record.server, record.rid, record.weight_version, record.prompt_key) == ("",) * 4
    assert record.flags is not None and record.flags.names() == ["truncated"]
    ended = RecordLine.parse(orjson.dumps({**old, "finish_reason": "stop", "matched_token_id": 9}))
    assert ended.matched == 9


def test_a_real_run_resumed_on_a_speculative_server_loads_whole(
    tokenizer_dir: str, tmp_path: Path
) -> None:
    """A run whose first shard came from a server without speculative decoding, resumed on
    one with it (the later shards' answers have a verify count): the shards load as one."""
    out = tmp_path / "run"
    with SimServerThread(sim_config(tokenizer_dir)) as plain:
        config = make_config([plain.url], out)
        pipeline.generate(config, str(SAMPLES / "sharegpt.jsonl"), None, progress=False)
    shards = sorted((out / "shards").glob("*.jsonl"))
    assert len(shards) > 2
    for shard in shards[1:]:  # as if the first server went away after one shard
        shard.unlink()
        shard.with_name(shard.name.removesuffix(".jsonl") + ".idx.json").unlink()
    first = read_records(out)
    assert all(r["spec_verify_ct"] == 0 for r in first)
    spec = sim_config(tokenizer_dir, speculative={"algorithm": "EAGLE3"})
    with SimServerThread(spec) as speculative:
        pipeline.resume(out, server_urls=[speculative.url], progress=False)
    records = read_records(out)
    assert len(records) > len(first)
    assert all(r["spec_verify_ct"] > 0 for r in records[len(first) :])
    loaded = load_shards(out, tmp_path / "cache")
    assert loaded.num_rows == len(records)
    by_id = {row["id"]: row["spec_verify_ct"] for row in loaded}
    assert by_id == {r["id"]: r["spec_verify_ct"] for r in records}
