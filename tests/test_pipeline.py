"""generate end to end against the simulated server over real loopback HTTP (issue 2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from conftest import SAMPLES, make_config, read_failures, read_records
from eagledata.config import DatasetSettings
from eagledata.errors import RunDirError, ServerUnavailableError
from eagledata.run import pipeline
from eagledata.rundir.verify import verify_run
from eagledata.simserver import SimServerThread
from eagledata.simserver.engine import expected_output
from eagledata.source.prompts import to_messages


def source_rows(path: Path) -> dict[str, dict[str, Any]]:
    rows = {}
    for index, line in enumerate(path.read_bytes().splitlines()):
        row = orjson.loads(line)
        row_id = row.get("id") or row.get("prompt_id") or f"#{index}"
        rows[str(row_id)] = row
    return rows


@pytest.mark.parametrize(
    ("sample", "schema"),
    [("sharegpt.jsonl", "sharegpt"), ("ultrachat.jsonl", "messages"), ("prompts.jsonl", "prompt")],
)
def test_records_are_token_faithful_for_each_schema(
    sim: SimServerThread, prompt_tokenizer: Any, tmp_path: Path, sample: str, schema: str
) -> None:
    out = tmp_path / "run"
    config = make_config([sim.url], out)
    summary = pipeline.generate(config, str(SAMPLES / sample), None, progress=False)

    rows = source_rows(SAMPLES / sample)
    records = read_records(out)
    assert summary.written == len(records) == len(rows)
    assert summary.failed == 0 and summary.left == 0
    settings = DatasetSettings(source=str(SAMPLES / sample))
    params = config.generation.sampling_params()
    for record in records:
        row = rows[record["row_id"]]
        messages = to_messages(row, settings)
        # The prompt is exactly the template applied once to the row's messages, unchanged.
        assert record["messages"] == messages
        assert record["input_ids"] == prompt_tokenizer.encode(messages)
        # The output is exactly what the server produced, stop token included.
        expected_ids, finish = expected_output(
            record["input_ids"], {**params, "sampling_seed": record["sample"]}, sim.config
        )
        assert record["output_ids"] == expected_ids
        assert record["finish_reason"] == finish["type"]
        assert record["prompt_tokens"] == len(record["input_ids"])
        assert record["completion_tokens"] == len(record["output_ids"])
        if finish["type"] == "stop":
            assert record["output_ids"][-1] == record["matched_token_id"]
        assert record["id"] == f"{sample.split('.')[0]}/{record['row_id']}/0"
    assert verify_run(out).ok
    # The quality line counts answers cut at max_new_tokens: weak data for a drafter.
    cut = sum(record["finish_reason"] == "length" for record in records)
    assert f"length {cut:,} ({cut / len(records):.1%}): cut at max_new_tokens" in summary.quality


def test_multi_turn_rows_keep_context_up_to_the_last_user_turn(
    sim: SimServerThread, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    pipeline.generate(
        make_config([sim.url], out), str(SAMPLES / "ultrachat.jsonl"), None, progress=False
    )
    rows = source_rows(SAMPLES / "ultrachat.jsonl")
    multi = [r for r in read_records(out) if len(r["messages"]) > 1]
    assert multi, "the ultrachat sample has multi-turn rows"
    for record in multi:
        source = rows[record["row_id"]]["messages"]
        last_user = max(i for i, m in enumerate(source) if m["role"] == "user")
        assert record["messages"] == source[: last_user + 1]
        assert record["messages"][-1]["role"] == "user"


def test_unicode_and_whitespace_reach_the_template_unchanged(
    sim: SimServerThread, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    pipeline.generate(
        make_config([sim.url], out), str(SAMPLES / "sharegpt.jsonl"), None, progress=False
    )
    rows = source_rows(SAMPLES / "sharegpt.jsonl")
    seen_non_ascii = seen_padded = False
    for record in read_records(out):
        for message, turn in zip(
            record["messages"], rows[record["row_id"]]["conversations"], strict=False
        ):
            assert message["content"] == turn["value"]
            seen_non_ascii |= any(ord(ch) > 127 for ch in turn["value"])
            seen_padded |= turn["value"] != turn["value"].strip()
    assert seen_non_ascii and seen_padded


def test_bad_rows_are_each_accounted_for_and_the_run_goes_on(
    sim: SimServerThread, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    config = make_config([sim.url], out, generation={"max_prompt_tokens": 4000})
    summary = pipeline.generate(config, str(SAMPLES / "bad_rows.jsonl"), None, progress=False)

    records = read_records(out)
    failures = {f["row_id"]: f for f in read_failures(out)}
    assert sorted(r["row_id"] for r in records) == ["good-001", "good-002", "good-003"]
    reasons = {row_id: f["reason"] for row_id, f in failures.items()}
    # Unparseable lines have no id of their own: they are named by their row index (#INDEX).
    assert reasons == {
        "#1": "bad_row",  # malformed JSON
        "#3": "bad_row",  # truncated line
        "bad-empty-conversations": "empty_conversation",
        "bad-no-known-field": "missing_field",
        "bad-unknown-role": "unknown_role",
        "bad-content-number": "bad_content",
        "bad-content-list": "bad_content",
        "bad-content-null": "bad_content",
        "bad-no-user-turn": "no_user_turn",
        "bad-empty-prompt": "empty_prompt",
        "#12": "bad_row",  # invalid UTF-8
        "bad-too-long": "prompt_too_long",
    }
    assert "invalid UTF-8" in failures["#12"]["message"]
    assert "generation.max_prompt_tokens" in failures["bad-too-long"]["message"]
    assert summary.planned == 15 == summary.written + summary.failed + summary.skipped
    assert sim.stats()["requests"] == 3  # nothing bad was ever sent


def test_server_length_limit_keeps_over_long_prompts_from_being_sent(
    tokenizer_dir: str, tmp_path: Path
) -> None:
    from conftest import sim_config

    with SimServerThread(sim_config(tokenizer_dir, context_length=4096)) as server:
        out = tmp_path / "run"
        pipeline.generate(
            make_config([server.url], out), str(SAMPLES / "bad_rows.jsonl"), None, progress=False
        )
        too_long = [f for f in read_failures(out) if f["row_id"] == "bad-too-long"]
        assert too_long and "server" in too_long[0]["message"]
        assert server.stats()["requests"] == 3


def test_samples_per_prompt_gives_one_record_per_sample(
    sim: SimServerThread, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    config = make_config(
        [sim.url], out, generation={"samples_per_prompt": 3, "temperature": 0.7}, run={"limit": 4}
    )
    summary = pipeline.generate(config, str(SAMPLES / "prompts.jsonl"), None, progress=False)
    ids = sorted(r["id"] for r in read_records(out))
    assert summary.planned == 12 and len(ids) == 12 == len(set(ids))
    assert {r["sample"] for r in read_records(out)} == {0, 1, 2}


def test_resume_after_partial_run_is_exactly_once(sim: SimServerThread, tmp_path: Path) -> None:
    out = tmp_path / "run"
    dataset = str(SAMPLES / "sharegpt.jsonl")
    pipeline.generate(make_config([sim.url], out, run={"limit": 15}), dataset, None, progress=False)
    # A resumed run may not widen the plan: the limit is frozen with the rest of the settings.
    with pytest.raises(RunDirError, match=r"run\.limit|limit"):
        pipeline.generate(make_config([sim.url], out), dataset, None, progress=False)

    # Cut the run back as a crash would: drop the last sealed shard, tear the journal.
    shards = sorted((out / "shards").glob("*.jsonl"))
    shards[-1].unlink()
    first = shards[0].read_bytes()
    (out / "pending" / "shard-000099.jsonl").write_bytes(first[: len(first) // 2 + 3])
    shards[0].unlink()

    summary = pipeline.resume(out, progress=False)
    ids = [r["id"] for r in read_records(out)]
    assert len(ids) == len(set(ids)) == 15
    assert summary.planned == 15 and summary.left == 0
    assert verify_run(out).ok


def test_datasets_loads_the_shards(sim: SimServerThread, tmp_path: Path) -> None:
    import datasets

    out = tmp_path / "run"
    pipeline.generate(
        make_config([sim.url], out), str(SAMPLES / "sharegpt.jsonl"), None, progress=False
    )
    loaded = datasets.load_dataset(
        "json",
        data_files=str(out / "shards" / "*.jsonl"),
        split="train",
        cache_dir=str(tmp_path / "cache"),
    )
    assert loaded.num_rows == len(read_records(out))
    assert {"id", "input_ids", "output_ids", "text", "finish_reason", "messages"} <= set(
        loaded.column_names
    )


def test_unreachable_server_is_one_clear_error(tmp_path: Path) -> None:
    config = make_config(["http://127.0.0.1:9"], tmp_path / "run")
    with pytest.raises(ServerUnavailableError, match="cannot reach an SGLang server"):
        pipeline.generate(config, str(SAMPLES / "prompts.jsonl"), None, progress=False)


def test_answers_are_read_as_they_arrive_not_when_a_check_releases_them(
    sim: SimServerThread, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading an answer for its flags decodes and re-encodes it. Done when a check released
    up to ``guard_max_held`` answers at once, it stalled the client for a second every 256 long
    answers (measured: the gate admitted nothing meanwhile, and the server ran down to 2 of 20
    requests). Every answer is read once, before it is held; a release only writes."""
    from eagledata.quality.flags import FlagDetector
    from eagledata.run.records import Recorder

    releasing = False
    read_while_releasing: list[bool] = []
    flags, commit = FlagDetector.flags, Recorder.commit

    def reading(self: FlagDetector, **kwargs: Any) -> list[str]:
        read_while_releasing.append(releasing)
        return flags(self, **kwargs)

    def releasing_one(self: Recorder, *args: Any) -> Any:
        nonlocal releasing
        releasing = True
        try:
            return commit(self, *args)
        finally:
            releasing = False

    monkeypatch.setattr(FlagDetector, "flags", reading)
    monkeypatch.setattr(Recorder, "commit", releasing_one)
    out = tmp_path / "run"
    config = make_config([sim.url], out, server={"guard_max_held": 16})
    summary = pipeline.generate(config, str(SAMPLES / "prompts.jsonl"), None, progress=False)
    records = read_records(out)
    assert summary.written == len(records) > 16
    assert len(read_while_releasing) == len(records), "one reading per answer"
    assert not any(read_while_releasing), "a release read an answer"
