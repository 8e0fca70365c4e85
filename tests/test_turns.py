"""Issue 24: every assistant turn regenerated in order (``--turns all``), per-dataset settings,
mixes with duplicates removed.

The fixture is a mix of a ShareGPT file and an OpenAI-messages file whose rows hold 1 to 4 user
turns, some with a system prompt, one with two user messages in a row, and original answers
that say ``ORIGINAL``: none of them may reach a prompt. Each turn's prompt must be the chat
template applied once to its messages, and each earlier assistant message exactly the answer
decoded from the previous turn's record (a turn is built only from a committed turn).
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import orjson
import pytest

from conftest import (
    TOKENIZER,
    eagledata_cmd,
    make_config,
    read_failures,
    read_records,
    sim_config,
)
from eagledata.capacity.planning import measure_workload
from eagledata.config import DatasetSettings, TokenizerSettings
from eagledata.errors import ConfigError, RunDirError, ServerRefusedError
from eagledata.export import ExportOptions, export_runs
from eagledata.report import build_report
from eagledata.report.scripts import dominant_script, script_letters
from eagledata.run import pipeline
from eagledata.rundir.manifest import RunDir
from eagledata.rundir.status import run_status
from eagledata.rundir.verify import verify_run
from eagledata.simserver import SimServerThread, expected_output
from eagledata.source.answers import AnswerReader
from eagledata.source.conversations import split_turns
from eagledata.source.mix import resolve_mix
from eagledata.source.prompts import row_messages
from eagledata.source.tokenization import PromptTokenizer

THINK_TOKENIZER = "bundled:tokenizer/tiny-chatml-think"
QUESTIONS = [
    "What is the capital of France?",
    "Explain recursion to a five-year-old.",
    "Write a haiku about the sea.",
    "Why is the sky blue?",
    "How do I reverse a list in Python?",
    "Translate 'good morning' into German.",
    "What is 6 times 7?",
    "Name three prime numbers.",
    "Summarize the plot of Hamlet.",
    "What does a compiler do?",
    "Describe photosynthesis briefly.",
    "Give me a synonym for happy.",
]
FOLLOW_UPS = ["Why?", "Tell me more.", "Can you give an example?", "Say it in one sentence."]


def conversation(index: int, users: int, prefix: str) -> list[tuple[str, str]]:
    """(role, content) pairs: ``users`` user turns, each answered by an original answer; a
    system prompt in every third row."""
    turns: list[tuple[str, str]] = []
    if index % 3 == 0:
        turns.append(("system", f"You are assistant number {index}."))
    for turn in range(users):
        question = QUESTIONS[index % len(QUESTIONS)] if turn == 0 else FOLLOW_UPS[turn - 1]
        turns.append(("user", f"{prefix} {question}" + (f" ({index})" if turn == 0 else "")))
        turns.append(("assistant", f"ORIGINAL answer {prefix}-{index}-{turn}"))
    return turns


def write_sharegpt(path: Path, rows: int) -> Path:
    names = {"system": "system", "user": "human", "assistant": "gpt"}
    lines = []
    for index in range(rows):
        turns = conversation(index, 1 + index % 4, "sg")
        if index == 5:  # ends on a user turn: its last answer is the one to generate
            turns = turns[:-1]
        lines.append(
            {
                "id": f"sg-{index}",
                "conversations": [{"from": names[r], "value": c} for r, c in turns],
            }
        )
    path.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    return path


def write_openai(path: Path, rows: int) -> Path:
    lines = []
    for index in range(rows):
        turns = conversation(index, 1 + (index + 2) % 4, "oa")
        if index == 4:  # two user messages in a row: one turn answers both
            turns.insert(1, ("user", "oa Some context first."))
        lines.append(
            {"prompt_id": f"oa-{index}", "messages": [{"role": r, "content": c} for r, c in turns]}
        )
    path.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    return path


def datasets(tmp_path: Path, rows: int = 10) -> dict[str, dict[str, Any]]:
    return {
        "sg": {"source": str(write_sharegpt(tmp_path / "sg.jsonl", rows)), "schema": "sharegpt"},
        "oa": {"source": str(write_openai(tmp_path / "oa.jsonl", rows)), "schema": "messages"},
    }


def expected_turns(tables: dict[str, dict[str, Any]]) -> dict[str, int]:
    """conversation id -> turns, from the fixture files themselves."""
    found: dict[str, int] = {}
    for name, table in tables.items():
        settings = DatasetSettings(**table)
        for line in Path(table["source"]).read_bytes().splitlines():
            row = orjson.loads(line)
            row_id = row.get("id") or row.get("prompt_id")
            found[f"{name}/{row_id}/0"] = len(split_turns(row_messages(row, settings)))
    return found


GREEDY = {"max_new_tokens": 64, "temperature": 0.0, "top_p": 0.95, "top_k": -1, "min_p": 0.0}
"""``make_config``'s sampling params."""


def check_conversations(
    records: list[dict[str, Any]], tokenizer: PromptTokenizer, server: SimServerThread | None
) -> None:
    """Every turn token-faithful, every earlier answer the one decoded from the turn before."""
    reader = AnswerReader(tokenizer.hf)
    by_id = {record["id"]: record for record in records}
    for record in records:
        messages = record["messages"]
        assert record["input_ids"] == tokenizer.encode(messages), record["id"]
        assert record["id"] == f"{record['conversation_id']}/{record['turn']}"
        text = tokenizer.hf.decode(record["input_ids"])
        assert "ORIGINAL" not in text and "ORIGINAL" not in orjson.dumps(messages).decode()
        if server is not None:
            output, finish = expected_output(
                record["input_ids"], {**GREEDY, "sampling_seed": 0}, server.config
            )
            assert record["output_ids"] == output and record["finish_reason"] == finish["type"]
        if record["turn"] == 0:
            assert not any(m["role"] == "assistant" for m in messages)
            continue
        previous = by_id[f"{record['conversation_id']}/{record['turn'] - 1}"]
        # a tokenizer with think tags: every message carries reasoning_content (one schema)
        uniform = all("reasoning_content" in m for m in messages)
        answer = reader.split(
            previous["input_ids"],
            previous["output_ids"],
            previous["finish_reason"],
            previous["matched_token_id"],
        ).message(reasoning_field=uniform)
        # turn k's messages: turn k-1's, its regenerated answer, then the next user turn
        assert messages[: len(previous["messages"]) + 1] == [*previous["messages"], answer]
        assert messages[-1]["role"] == "user"
        assert sum(m["role"] == "assistant" for m in messages) == record["turn"]


@pytest.fixture
def think_tokenizer() -> PromptTokenizer:
    return PromptTokenizer(TokenizerSettings(name=THINK_TOKENIZER))


def test_every_turn_is_regenerated_in_order_from_the_regenerated_answers(
    sim: SimServerThread, prompt_tokenizer: PromptTokenizer, tmp_path: Path
) -> None:
    tables = datasets(tmp_path)
    out = tmp_path / "run"
    config = make_config([sim.url], out, generation={"turns": "all"}, datasets=tables)
    summary = pipeline.generate(config, ["sg", "oa"], None, progress=False)

    turns = expected_turns(tables)
    planned = sum(turns.values())
    assert planned > 2 * len(turns) - 5  # 1-4 turns a conversation, most with several
    assert (summary.planned, summary.written, summary.failed, summary.left) == (
        planned,
        planned,
        0,
        0,
    )
    records = read_records(out)
    assert sorted(r["id"] for r in records) == sorted(
        f"{conversation_id}/{turn}" for conversation_id, n in turns.items() for turn in range(n)
    )
    for record in records:
        assert record["conversation_turns"] == turns[record["conversation_id"]]
    check_conversations(records, prompt_tokenizer, sim)
    # ids keep their dataset's name; the planner and status count turns
    assert {r["dataset"] for r in records} == {"sg", "oa"}
    status = run_status(out).to_json()
    assert status["planned"] == planned
    assert {name: entry["written"] for name, entry in status["datasets"].items()} == {
        name: sum(n for c, n in turns.items() if c.startswith(f"{name}/")) for name in ("sg", "oa")
    }
    assert status["datasets"]["sg"]["settings"]["turns"] == "all"
    # the progress bar knew the turns before the plan was read to its end
    assert RunDir(out).read()["planned_estimate"] == planned
    assert verify_run(out).ok
    # export: one row per turn, P + O with the loss on O, the conversation and turn named
    report = export_runs([out], tmp_path / "train.jsonl", ExportOptions())
    rows = [orjson.loads(line) for line in (tmp_path / "train.jsonl").read_bytes().splitlines()]
    by_id = {r["id"]: r for r in records}
    assert len(rows) == report.exported == planned - sum(report.skipped.values())
    for row in rows:
        record = by_id[row["metadata"]["record_id"]]
        assert row["input_ids"] == record["input_ids"] + record["output_ids"]
        assert row["loss_mask"] == [0] * len(record["input_ids"]) + [1] * len(record["output_ids"])
        assert row["metadata"]["conversation_id"] == record["conversation_id"]
        assert row["metadata"]["turn"] == record["turn"]


def test_a_later_turn_hits_the_cached_prefix_of_the_turn_before(
    sim: SimServerThread, tmp_path: Path
) -> None:
    tables = datasets(tmp_path)
    out = tmp_path / "run"
    config = make_config([sim.url], out, generation={"turns": "all"}, datasets=tables)
    pipeline.generate(config, ["sg"], None, progress=False)
    records = {r["id"]: r for r in read_records(out)}
    later = [r for r in records.values() if r["turn"] > 0]
    assert later
    checked = 0
    for record in later:
        previous = records[f"{record['conversation_id']}/{record['turn'] - 1}"]
        if previous["flags"]["roundtrip_mismatch"]:
            continue  # its text does not encode back to its ids: the prefix differs there
        checked += 1
        before = previous["prompt_tokens"] + previous["completion_tokens"] - 1
        # the radix cache holds the previous prompt and answer, in pages of 16 ids
        assert record["cached_tokens"] >= min(before, record["prompt_tokens"] - 1) - 16
    assert checked >= len(later) // 2


def test_turns_last_is_todays_behaviour(sim: SimServerThread, tmp_path: Path) -> None:
    tables = datasets(tmp_path)
    out = tmp_path / "run"
    config = make_config([sim.url], out, datasets=tables)
    summary = pipeline.generate(config, "sg", None, progress=False)
    records = read_records(out)
    assert summary.written == len(records) == 10
    for record in records:
        assert record["id"] == record["conversation_id"] and record["turn"] == 0
        assert record["conversation_turns"] == 1
    # the original answers stay as context, cut after the last user turn
    assert any("ORIGINAL" in orjson.dumps(r["messages"]).decode() for r in records)


def test_a_thinking_answer_goes_back_as_reasoning_content(
    tokenizer_dir: str, think_tokenizer: PromptTokenizer, tmp_path: Path
) -> None:
    """The next prompt holds what the template renders of the earlier thinking: all of it (the
    think template's default), or an empty block (``keep_thinking = false``, as Kimi-K2.5)."""
    tables = datasets(tmp_path)
    tables["oa"]["chat_template_kwargs"] = {"keep_thinking": False}
    out = tmp_path / "run"
    with SimServerThread(sim_config(tokenizer_dir, think_share=0.4)) as server:
        config = make_config(
            [server.url],
            out,
            tokenizer={"name": THINK_TOKENIZER},
            generation={"turns": "all", "max_new_tokens": 96},
            datasets=tables,
        )
        summary = pipeline.generate(config, ["sg", "oa"], None, progress=False)
    assert summary.left == 0 and summary.failed == 0
    records = read_records(out)
    by_id = {r["id"]: r for r in records}
    reader = AnswerReader(think_tokenizer.hf)
    kept = dropped = 0
    for record in records:
        kwargs = {"keep_thinking": False} if record["dataset"] == "oa" else {}
        assert record["input_ids"] == think_tokenizer.encode(record["messages"], kwargs)
        assert record["reasoning_tokens"] is not None
        if record["turn"] == 0:
            continue
        previous = by_id[f"{record['conversation_id']}/{record['turn'] - 1}"]
        answer = record["messages"][len(previous["messages"])]
        parts = reader.split(
            previous["input_ids"],
            previous["output_ids"],
            previous["finish_reason"],
            previous["matched_token_id"],
        )
        assert answer == parts.message(reasoning_field=True)
        assert all("reasoning_content" in m for m in record["messages"])
        assert "<think>" not in answer["reasoning_content"] + answer["content"]
        assert previous["reasoning_tokens"] == parts.reasoning_tokens
        if not answer["reasoning_content"]:
            continue  # a very short answer thought nothing
        prompt = think_tokenizer.hf.decode(record["input_ids"])
        rendered = f"<think>{answer['reasoning_content']}</think>{answer['content']}<|im_end|>"
        if record["dataset"] == "oa":
            assert "<think></think>" + answer["content"] in prompt
            assert answer["reasoning_content"] not in prompt
            dropped += 1
        else:
            assert rendered in prompt
            kept += 1
    assert kept and dropped
    # every shard's messages have one Arrow type (a JSON reader that takes its schema from the
    # first file reads the others): first turns and later ones alike
    from pyarrow import json as arrow_json

    shards = sorted(out.glob("shards/*.jsonl"))
    kinds = {str(arrow_json.read_json(path).schema.field("messages").type) for path in shards}
    assert len(shards) > 1 and len(kinds) == 1, kinds
    assert "reasoning_content" in kinds.pop()


def test_a_turn_that_cannot_be_sent_ends_its_conversation_in_the_failure_file(
    sim: SimServerThread, tmp_path: Path
) -> None:
    tables = datasets(tmp_path)
    out = tmp_path / "run"
    # turn 0 prompts fit, later ones (which carry answers of up to 64 ids) do not
    config = make_config(
        [sim.url],
        out,
        generation={"turns": "all", "max_prompt_tokens": 70},
        datasets=tables,
    )
    summary = pipeline.generate(config, "sg", None, progress=False)
    failures = read_failures(out)
    assert summary.left == 0 and summary.failed == len(failures) > 0
    assert summary.planned == summary.written + summary.failed
    reasons = {f["id"]: f["reason"] for f in failures}
    records = {r["id"] for r in read_records(out)}
    for item_id, reason in reasons.items():
        conversation_id, _, turn = item_id.rpartition("/")
        if reason == "prompt_too_long":
            assert int(turn) == 0 or f"{conversation_id}/{int(turn) - 1}" in records
        else:  # the turns after a failed one are never sent
            assert reason == "previous_turn_failed"
            assert f"{conversation_id}/{int(turn) - 1}" in reasons
    assert "previous_turn_failed" in reasons.values()


# --- per-dataset settings and mixes ---------------------------------------------------------


def test_each_dataset_of_a_mix_generates_with_its_own_settings(
    sim: SimServerThread, tmp_path: Path
) -> None:
    tables = datasets(tmp_path)
    tables["sg"].update({"max_new_tokens": 8, "temperature": 0.9, "samples_per_prompt": 2})
    out = tmp_path / "run"
    config = make_config([sim.url], out, datasets=tables)
    summary = pipeline.generate(config, ["sg", "oa"], None, progress=False)
    records = read_records(out)
    assert summary.written == len(records) == 2 * 10 + 10
    base = config.generation
    for record in records:
        own = DatasetSettings(**tables[record["dataset"]]).generation(base)
        params = {**own.sampling_params(), "sampling_seed": record["sample"]}
        output, _ = expected_output(record["input_ids"], params, sim.config)
        assert record["output_ids"] == output
        assert record["completion_tokens"] <= own.max_new_tokens
    status = run_status(out)
    assert status.datasets["sg"]["settings"]["temperature"] == 0.9
    assert status.datasets["sg"]["settings"]["max_new_tokens"] == 8
    assert status.datasets["oa"]["settings"]["temperature"] == 0.0
    assert "dataset:  sg: planned 20, written 20" in status.render()
    # frozen per dataset: resuming with another value is refused, naming the key
    tables["sg"]["temperature"] = 0.5
    changed = make_config([sim.url], out, datasets=tables)
    with pytest.raises(RunDirError, match=r"\(mix\.sg\.dataset\.temperature\)"):
        pipeline.generate(changed, ["sg", "oa"], None, progress=False)


def write_prompts(path: Path, prompts: list[str], prefix: str) -> Path:
    lines = [{"id": f"{prefix}-{i}", "prompt": prompt} for i, prompt in enumerate(prompts)]
    path.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    return path


def shared_mix(tmp_path: Path) -> dict[str, dict[str, Any]]:
    """Two datasets of 50 prompts sharing 5 (10%), the shared ones at different rows."""
    a = [f"alpha question {i}" for i in range(50)]
    b = [f"beta question {i}" for i in range(50)]
    for k in range(5):
        b[10 * k + 3] = a[7 * k + 1]
    return {
        "alpha": {"source": str(write_prompts(tmp_path / "alpha.jsonl", a, "a"))},
        "beta": {"source": str(write_prompts(tmp_path / "beta.jsonl", b, "b"))},
    }


def test_a_prompt_two_datasets_share_is_generated_once(
    sim: SimServerThread, tmp_path: Path
) -> None:
    tables = shared_mix(tmp_path)
    out = tmp_path / "run"
    config = make_config([sim.url], out, datasets=tables)
    summary = pipeline.generate(config, ["alpha", "beta"], None, progress=False)
    assert (summary.planned, summary.written, summary.skipped, summary.left) == (100, 95, 5, 0)
    records = read_records(out)
    prompts = [r["messages"][-1]["content"] for r in records]
    assert len(prompts) == len(set(prompts)) == 95  # every prompt once
    keys = [r["prompt_key"] for r in records]
    assert len(set(keys)) == 95
    skipped = read_failures(out)
    assert {f["reason"] for f in skipped} == {"duplicate"}
    assert {f["status"] for f in skipped} == {"skipped"}
    # the copy that came later in the plan (rows alternate: alpha 0, beta 0, alpha 1, ...) is
    # the one skipped: every shared beta row comes after its alpha twin here
    assert sorted(f["id"] for f in skipped) == sorted(f"beta/b-{10 * k + 3}/0" for k in range(5))
    status = run_status(out).to_json()
    assert status["skipped"] == 5 and status["skipped_reasons"] == {"duplicate": 5}
    assert status["datasets"]["beta"]["skipped_reasons"] == {"duplicate": 5}
    assert status["datasets"]["alpha"]["skipped"] == 0
    assert status["datasets"]["beta"]["planned"] == 50
    assert status["failure_reasons"] == {"duplicate": 5} and status["failed"] == 0
    # a resume plans the same: nothing new, the duplicates stay skipped
    again = pipeline.resume(out, server_urls=[sim.url], progress=False)
    assert (again.written, again.skipped, again.session_records) == (95, 5, 0)


def drop_lines(out: Path, ids: set[str]) -> None:
    """Remove the records and failure lines of ``ids``, as if they had never landed (a shard
    rewritten loses its index's trust: it is rebuilt)."""
    for path in [*out.glob("shards/*.jsonl"), *out.glob("pending/*.jsonl"), out / "failures.jsonl"]:
        lines = path.read_bytes().splitlines(keepends=True)
        kept = [line for line in lines if orjson.loads(line)["id"] not in ids]
        if len(kept) != len(lines):
            path.write_bytes(b"".join(kept))
            path.with_name(path.name.removesuffix(".jsonl") + ".idx.json").unlink(missing_ok=True)
    (out / "plan.json").unlink(missing_ok=True)


def test_a_resumed_run_still_knows_the_prompts_planned_before(
    sim: SimServerThread, tmp_path: Path
) -> None:
    """Duplicates are decided the same in every session: an original generated in an earlier
    session still makes its later copy a duplicate (its key is read back from its record); an
    original lost in flight is generated again, its copy still skipped; a copy whose skips a
    crash cut short is still a duplicate."""
    tables = shared_mix(tmp_path)
    tables["beta"]["samples_per_prompt"] = 2
    out = tmp_path / "run"
    config = make_config([sim.url], out, datasets=tables)
    summary = pipeline.generate(config, ["alpha", "beta"], None, progress=False)
    assert (summary.written, summary.skipped) == (50 + 45 * 2, 5 * 2)
    copies = sorted(f["id"] for f in read_failures(out))
    assert copies == sorted(f"beta/b-{10 * k + 3}/{s}" for k in range(5) for s in (0, 1))
    originals = {f"alpha/a-{7 * k + 1}/0" for k in range(5)}
    # b-3: its skips never written; b-13: its original a-8 was in flight; b-23: one of its
    # two skips written
    drop_lines(out, {"beta/b-3/0", "beta/b-3/1", "alpha/a-8/0", "beta/b-23/1"})
    again = pipeline.resume(out, server_urls=[sim.url], progress=False)
    assert (again.written, again.skipped, again.left) == (140, 10, 0)
    assert again.session_records == 1  # the lost original, nothing else
    assert sorted(f["id"] for f in read_failures(out)) == copies
    assert originals <= {r["id"] for r in read_records(out)}
    prompts = [r["messages"][-1]["content"] for r in read_records(out) if r["sample"] == 0]
    assert len(prompts) == len(set(prompts))


def test_a_mix_table_takes_a_count_or_a_share_of_each_dataset(
    sim: SimServerThread, tmp_path: Path
) -> None:
    tables = shared_mix(tmp_path)
    mixes = {"half-and-twelve": {"seed": 7, "datasets": {"alpha": 12, "beta": 0.5}}}
    out = tmp_path / "run"
    config = make_config([sim.url], out, datasets=tables, mixes=mixes)
    summary = pipeline.generate(config, "half-and-twelve", None, progress=False)
    records = read_records(out)
    alpha = [r for r in records if r["dataset"] == "alpha"]
    beta = [r for r in records if r["dataset"] == "beta"]
    skipped = [f for f in read_failures(out) if f["dataset"] == "alpha"]
    assert len(alpha) + len(skipped) == 12  # a count is exact
    assert 15 <= len(beta) + summary.skipped - len(skipped) <= 35  # a share, by a seeded hash
    assert summary.left == 0
    # the same seed takes the same rows
    again = tmp_path / "again"
    config = make_config([sim.url], again, datasets=tables, mixes=mixes)
    pipeline.generate(config, "half-and-twelve", None, progress=False)
    assert sorted(r["id"] for r in read_records(again)) == sorted(r["id"] for r in records)
    assert run_status(out).datasets["alpha"]["settings"]["rows"] == 12


def test_mix_settings_are_checked_before_anything_runs(tmp_path: Path) -> None:
    tables = shared_mix(tmp_path)
    config = make_config(["http://127.0.0.1:9"], tmp_path / "run", datasets=tables)
    with pytest.raises(ConfigError, match="dataset 'alpha' is given twice"):
        pipeline.generate(config, ["alpha", "alpha"], None, progress=False)
    with pytest.raises(ValueError, match="a share must be in"):
        make_config(["http://x:1"], tmp_path, mixes={"m": {"datasets": {"alpha": 1.5}}})
    with pytest.raises(ValueError, match="may not be empty or hold '/'"):
        make_config(["http://x:1"], tmp_path, datasets={"a/b": {"source": "x.jsonl"}})


# --- kill -9 -----------------------------------------------------------------------------------


def write_config(path: Path, url: str, tables: dict[str, dict[str, Any]]) -> Path:
    lines = [
        "[tokenizer]",
        f'name = "{TOKENIZER}"',
        "[generation]",
        "max_new_tokens = 64",
        "temperature = 0.0",
        'turns = "all"',
        "[server]",
        f'urls = ["{url}"]',
        "guard_interval_s = 0.2",
        "guard_max_held = 8",
        "backoff_base_s = 0.01",
        "backoff_max_s = 0.05",
        "down_deadline_s = 10",
        "request_timeout_s = 10",
        "[run]",
        "shard_size = 7",
        "concurrency = 6",
        "fsync_interval_s = 0.05",
        "[canary]",
        "enabled = false",
    ]
    for name, table in tables.items():
        lines.append(f"[datasets.{name}]")
        lines += [f"{key} = {orjson.dumps(value).decode()}" for key, value in table.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def committed(out: Path) -> list[str]:
    if not (out / "shards").is_dir():
        return []
    return [r["id"] for r in read_records(out)] + [f["id"] for f in read_failures(out)]


@pytest.mark.slow
def test_kill_9_twice_mid_conversation_then_resume_gives_every_turn_once(
    tokenizer_dir: str, prompt_tokenizer: PromptTokenizer, tmp_path: Path
) -> None:
    tables = datasets(tmp_path, rows=12)
    with SimServerThread(sim_config(tokenizer_dir, latency_s=0.03, fail_503_rate=0.05)) as server:
        reference = tmp_path / "reference"
        config = make_config([server.url], reference, generation={"turns": "all"}, datasets=tables)
        pipeline.generate(config, ["sg", "oa"], None, progress=False)
        expected = {r["id"]: r for r in read_records(reference)}
        assert len(expected) == sum(expected_turns(tables).values())

        out = tmp_path / "run"
        toml = write_config(tmp_path / "eagledata.toml", server.url, tables)
        generate = eagledata_cmd(
            "generate", "--config", str(toml), "--dataset", "sg", "--dataset", "oa",
            "--out", str(out), "--no-progress",
        )  # fmt: skip
        resume = eagledata_cmd("resume", str(out), "--no-progress")
        in_progress = 0  # conversations a kill left between two turns, resumed from there
        for kills, target in enumerate((len(expected) // 4, len(expected) // 2)):
            process = subprocess.Popen(
                resume if kills else generate,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            deadline = time.monotonic() + 60
            while len(committed(out)) < target:
                assert process.poll() is None, process.communicate()
                assert time.monotonic() < deadline, "no progress"
                time.sleep(0.005)
            process.send_signal(signal.SIGKILL)
            process.communicate()
            ids = committed(out)
            assert len(ids) == len(set(ids)) and set(ids) <= set(expected)
            # a turn lands only after the turn before it: the chain has no hole
            check_conversations(read_records(out), prompt_tokenizer, None)
            in_progress += sum(
                1
                for r in read_records(out)
                if r["turn"] + 1 < r["conversation_turns"]
                and f"{r['conversation_id']}/{r['turn'] + 1}" not in ids
            )
        assert 0 < len(committed(out)) < len(expected)
        assert in_progress > 0
        finished = subprocess.run(resume, capture_output=True, text=True, timeout=120, check=False)
        assert finished.returncode == 0, finished.stderr
        assert "left 0" in finished.stdout

    records = read_records(out)
    ids = [r["id"] for r in records]
    assert len(ids) == len(set(ids)) == len(expected)
    assert not read_failures(out)
    check_conversations(records, prompt_tokenizer, None)
    for record in records:  # resumed conversations continued exactly as uninterrupted ones
        twin = expected[record["id"]]
        assert record["input_ids"] == twin["input_ids"]
        assert record["output_ids"] == twin["output_ids"]
    assert verify_run(out).ok


# --- the mix in the report ------------------------------------------------------------------


class _MixTable(HTMLParser):
    """The cells of the report's mix table, per dataset."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[str, list[str]] = {}
        self._row: str | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attr = dict(attrs)
        if tag == "tr" and attr.get("data-dataset"):
            self._row = str(attr["data-dataset"])
            self.rows[self._row] = []
        elif tag == "td" and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self._row is not None and self._cell is not None:
            self.rows[self._row].append("".join(self._cell))
            self._cell = None
        elif tag == "tr":
            self._row = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def test_the_report_shows_the_mix(tokenizer_dir: str, tmp_path: Path) -> None:
    tables = datasets(tmp_path, rows=6)
    world = [
        "你好世界。今天天气很好。",
        "Привет, мир! Как дела?",
        "東京は日本の首都です。",
        "北京是中国的首都。",
    ]
    tables["world"] = {
        "source": str(write_prompts(tmp_path / "w.jsonl", world, "w")),
        "turns": "last",
    }
    out = tmp_path / "run"
    with SimServerThread(sim_config(tokenizer_dir, think_share=0.4)) as server:
        config = make_config(
            [server.url],
            out,
            tokenizer={"name": THINK_TOKENIZER},
            generation={"turns": "all"},
            datasets=tables,
        )
        pipeline.generate(config, ["sg", "oa", "world"], None, progress=False)
    table = _MixTable()
    table.feed(build_report(out).read_text(encoding="utf-8"))
    status = run_status(out).to_json()["datasets"]
    records = read_records(out)
    assert set(table.rows) == {"sg", "oa", "world"}
    for name, cells in table.rows.items():
        mine = [r for r in records if r["dataset"] == name]
        assert cells[0] == name
        assert cells[1] == f"{status[name]['planned']:,}" and cells[2] == f"{len(mine):,}"
        assert cells[3] == "0 (0)"
        thinking = sum(r["reasoning_tokens"] for r in mine) / sum(
            r["completion_tokens"] for r in mine
        )
        assert cells[7] == f"{thinking:.1%}"
        turns = Counter(r["conversation_turns"] for r in mine if r["turn"] == 0)
        assert cells[8].endswith(
            "(" + ", ".join(f"{n}: {count:,}" for n, count in sorted(turns.items())) + ")"
        )
    assert table.rows["world"][8] == "1.00 (1: 4)"  # turns = "last" for this one
    assert table.rows["world"][9] == "Han 75%, Cyrillic 25%"
    assert table.rows["sg"][9] == "Latin 100%"


def test_writing_systems_are_counted_by_letters() -> None:
    assert script_letters("Hello, world 42!") == Counter({"Latin": 10})
    assert script_letters("Привет, world") == Counter({"Cyrillic": 6, "Latin": 5})
    assert dominant_script(script_letters("東京は日本の首都です。")) == "Han"
    assert dominant_script(script_letters("こんにちは")) == "Kana"
    assert dominant_script(script_letters("안녕하세요")) == "Hangul"
    assert dominant_script(script_letters("مرحبا")) == "Arabic"
    assert dominant_script(script_letters("ሰላም")) == "other"  # Ethiopic: a letter, no column
    assert dominant_script(script_letters("1 + 2 = 3")) is None


def test_the_planner_counts_turns_not_rows(tmp_path: Path) -> None:
    tables = datasets(tmp_path)
    turns = expected_turns(tables)
    base = make_config(["http://127.0.0.1:9"], tmp_path / "run", datasets=tables)
    last = measure_workload(
        base, resolve_mix(["sg", "oa"], base), sample_rows=100, mean_output_tokens=50
    )
    assert last.num_prompts == len(turns) == 20
    every = make_config(
        ["http://127.0.0.1:9"], tmp_path / "run", generation={"turns": "all"}, datasets=tables
    )
    workload = measure_workload(
        every, resolve_mix(["sg", "oa"], every), sample_rows=100, mean_output_tokens=50
    )
    assert workload.num_prompts == len(workload.prompt_length_sample) == sum(turns.values())
    # a later turn's prompt holds the answers before it: longer prompts than the last-turn plan
    assert workload.mean_prompt_tokens > last.mean_prompt_tokens


def test_turns_held_when_the_server_is_refused_are_dropped_and_nothing_is_built_on_them(
    tokenizer_dir: str, prompt_tokenizer: PromptTokenizer, tmp_path: Path
) -> None:
    """The KV guard refuses the server mid-run (fp8): the turns it held are dropped, never
    written, and no turn built on them is sent; resume generates them against a good server and
    the conversations go on from there."""
    tables = datasets(tmp_path, rows=16)
    out = tmp_path / "run"
    with SimServerThread(sim_config(tokenizer_dir, latency_s=0.08)) as sim:
        switched = threading.Event()

        def switch_after_some_turns() -> None:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    if sum(1 for r in read_records(out) if r["turn"] > 0) >= 3:
                        break
                except FileNotFoundError:  # a journal sealed while we read: look again
                    continue
                time.sleep(0.005)
            sim.control(kv_cache_dtype="fp8_e4m3")
            switched.set()

        switcher = threading.Thread(target=switch_after_some_turns, daemon=True)
        switcher.start()
        config = make_config(
            [sim.url],
            out,
            generation={"turns": "all"},
            server={"guard_interval_s": 0.3, "guard_max_held": 1000},
            run={"concurrency": 4},
            datasets=tables,
        )
        with pytest.raises(ServerRefusedError, match="fp8"):
            pipeline.generate(config, ["sg", "oa"], None, progress=False)
        switcher.join()
        served_under = sim.stats()["rid_kv_dtype"]
    assert switched.is_set()
    records = read_records(out)
    total = sum(expected_turns(tables).values())
    assert 0 < len(records) < total
    fp8 = {rid for rid, dtype in served_under.items() if dtype != "bf16"}
    assert fp8 and not fp8 & {r["rid"] for r in records}
    check_conversations(records, prompt_tokenizer, None)  # every turn's predecessor landed
    with SimServerThread(sim_config(tokenizer_dir)) as good:
        summary = pipeline.resume(out, server_urls=[good.url], progress=False)
        final = read_records(out)
        check_conversations(final, prompt_tokenizer, good)
    assert summary.written == len(final) == total and summary.left == 0


def test_a_mix_named_in_another_order_is_another_run(sim: SimServerThread, tmp_path: Path) -> None:
    tables = shared_mix(tmp_path)
    out = tmp_path / "run"
    config = make_config([sim.url], out, datasets=tables, run={"limit": 3})
    pipeline.generate(config, ["alpha", "beta"], None, progress=False)
    with pytest.raises(RunDirError, match=r"other settings \(dataset_name\)"):
        pipeline.generate(config, ["beta", "alpha"], None, progress=False)
    # a [mixes.NAME] table whose datasets were reordered: the same run name, another plan
    mixes = {"m": {"datasets": {"alpha": 0.5, "beta": 0.5}}}
    first = make_config([sim.url], tmp_path / "mix", datasets=tables, mixes=mixes)
    pipeline.generate(first, "m", None, progress=False)
    reordered = {"m": {"datasets": {"beta": 0.5, "alpha": 0.5}}}
    second = make_config([sim.url], tmp_path / "mix", datasets=tables, mixes=reordered)
    with pytest.raises(RunDirError, match=r"\(mix \(the order of its datasets\)\)"):
        pipeline.generate(second, "m", None, progress=False)
    # the same order continues it
    again = pipeline.generate(config, ["alpha", "beta"], None, progress=False)
    assert again.written == 6 and again.session_records == 0


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_an_answer_ending_on_its_stop_token_at_max_new_tokens_is_stopped_in_every_release(
    tokenizer_dir: str, prompt_tokenizer: PromptTokenizer, tmp_path: Path, version: str
) -> None:
    """0.5.9 checks the length before the stop token: an answer whose stop token is its
    max_new_tokens-th id comes back as ``length``, the stop id its last id. It was flagged
    truncated, and the next turn's history carried the stop token as text, the template adding
    its own: ``<|im_end|><|im_end|>`` in the next turn's input_ids. Read as 0.5.23 reports it,
    the records are the same in both releases."""
    config = sim_config(tokenizer_dir, version=version, stop_at_limit_fraction=1.0)
    config = config.model_copy(update={"length_fraction": 0.0})
    eos = prompt_tokenizer.hf.eos_token_id
    tables = datasets(tmp_path, rows=6)
    out = tmp_path / "run"
    with SimServerThread(config) as server:
        run = make_config(
            [server.url],
            out,
            generation={"turns": "all", "max_new_tokens": 24},
            datasets=tables,
        )
        # the server says what its release says of these answers
        answer, finish = expected_output([1, 2, 3], {"max_new_tokens": 24}, server.config)
        assert len(answer) == 24 and answer[-1] == eos
        assert finish["type"] == ("length" if version == "0.5.9" else "stop")
        summary = pipeline.generate(run, ["sg", "oa"], None, progress=False)
    assert summary.failed == 0 and summary.left == 0
    records = read_records(out)
    assert any(record["turn"] > 0 for record in records)
    for record in records:
        assert record["output_ids"][-1] == eos and len(record["output_ids"]) == 24
        assert record["finish_reason"] == "stop", record["id"]
        assert record["matched_token_id"] == eos
        assert not record["flags"]["truncated"], record["id"]
        pairs = zip(record["input_ids"], record["input_ids"][1:], strict=False)
        assert (eos, eos) not in set(pairs), f"{record['id']}: the stop token twice"
        assert "<|im_end|><|im_end|>" not in prompt_tokenizer.hf.decode(record["input_ids"])
