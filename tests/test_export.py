"""``eagledata export`` (issue 8): the exact ids reach the trainer; lossy routes say so."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from conftest import SAMPLES, make_config, run_cli, sim_config
from eagledata.config import TokenizerSettings
from eagledata.errors import ExportError, RunDirError
from eagledata.export import ExportOptions, export_runs
from eagledata.export.vocab import draft_vocab_mapping
from eagledata.run import pipeline
from eagledata.rundir.status import run_status
from eagledata.simserver import SimServerThread
from exportkit import make_run, read_jsonl, record

THINK, END_THINK, IM_END = 3, 4, 2  # the bundled tokenizer's <think>, </think>, <|im_end|>


@pytest.fixture(scope="module")
def real_runs(tokenizer_dir: str, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Two finished runs of the same dataset (same record ids), one with failed rows."""
    base = tmp_path_factory.mktemp("export")
    runs = []
    with SimServerThread(sim_config(tokenizer_dir)) as server:
        for name, sample in (("mix-a", "bad_rows.jsonl"), ("mix-b", "bad_rows.jsonl")):
            config = make_config([server.url], base / name, generation={"max_prompt_tokens": 4000})
            pipeline.generate(config, str(SAMPLES / sample), None, progress=False)
            runs.append(base / name)
    return runs


def records_of(run: Path) -> list[dict[str, Any]]:
    rows = []
    for folder in ("shards", "pending"):
        for path in sorted((run / folder).glob("shard-*.jsonl")):
            rows.extend(read_jsonl(path))
    return rows


def export(runs: list[Path], out: Path, **options: Any) -> Any:
    return export_runs(runs, out, ExportOptions(**options))


# --- ids -------------------------------------------------------------------------------------


def test_ids_rows_are_prompt_plus_output_with_the_generation_boundary_as_mask(
    real_runs: list[Path], tmp_path: Path
) -> None:
    run = real_runs[0]
    out = tmp_path / "train.jsonl"
    report = export([run], out)
    records = {r["id"]: r for r in records_of(run)}
    rows = read_jsonl(out)
    assert len(rows) == len(records) == report.exported > 0
    for row in rows:
        source = records[row["id"]]
        prompt, output = source["input_ids"], source["output_ids"]
        assert row["input_ids"] == prompt + output
        assert row["loss_mask"] == [0] * len(prompt) + [1] * len(output)
        assert row["primary_id"] == f"{source['dataset']}/{source['row_id']}"
        assert row["metadata"]["finish_reason"] == source["finish_reason"]
    assert len({row["id"] for row in rows}) == len(rows)


def test_the_report_reconciles_with_status(real_runs: list[Path], tmp_path: Path) -> None:
    run = real_runs[0]
    out = tmp_path / "train.jsonl"
    report = export([run], out)
    status = run_status(run)
    assert status.failed + status.skipped > 0  # bad_rows.jsonl: the plan has items with no record
    written = json.loads((tmp_path / "train.export.json").read_text())
    assert written["planned"] == status.planned
    assert written["exported"] + written["skipped_total"] == status.planned
    assert written["reconciled"] is True
    generation = {k: v for k, v in written["skipped"].items() if k.startswith("generation_")}
    assert sum(generation.values()) == status.failed + status.skipped
    assert written["finish_reasons"] == {
        k: v for k, v in Counter(r["finish_reason"] for r in records_of(run)).items()
    }
    lengths = sorted(r["prompt_tokens"] + r["completion_tokens"] for r in records_of(run))
    assert written["sequence_length"]["max"] == lengths[-1]
    assert written["sequence_length"]["p99"] == lengths[-(-len(lengths) * 99 // 100) - 1]
    text = report.render()
    assert f"planned  {status.planned:,} = exported" in text
    assert f"max_length >= {lengths[-1]:,}" in text
    assert f"use      SpecForge: data.prompts_path: {out}, data.max_length: {lengths[-1]}" in text
    assert f"speculators: prepare-data --data {out} --seq-length {lengths[-1]}" in text


def test_several_runs_go_into_one_file_with_unique_ids_and_per_run_counts(
    real_runs: list[Path], tmp_path: Path
) -> None:
    out = tmp_path / "mix.jsonl"
    report = export(real_runs, out)
    rows = read_jsonl(out)
    ids = [row["id"] for row in rows]
    assert len(set(ids)) == len(ids)  # both runs hold the same record ids
    counted = Counter(row["metadata"]["run"] for row in rows)
    per_run = {run["label"]: run for run in report.to_json()["runs"]}
    assert set(per_run) == {"mix-a", "mix-b"}
    for label, run in per_run.items():
        assert run["exported"] == counted[label] == run["records"]
        assert run["planned"] == run["exported"] + run["skipped_total"]
    assert report.planned == sum(run_status(r).planned or 0 for r in real_runs)
    assert report.reconciled
    assert rows[0]["id"] == f"mix-a/{rows[0]['metadata']['record_id']}"


# --- selection --------------------------------------------------------------------------------


@pytest.fixture
def flagged_run(tmp_path: Path) -> Path:
    records = [
        record("clean", [1, 10, 11], [20, 21, IM_END], flags=[]),
        record("old", [1, 10, 12], [22, IM_END]),  # made before flags: flags null
        record("empty", [1, 10, 13], [IM_END], flags=["empty"]),
        record("loop", [1, 10, 14], [30, 30, 30, IM_END], flags=["degenerate"]),
        record("cut", [1, 10, 15], [40, 41, 42], finish="length", flags=["truncated"]),
        record("long", [1, *range(100, 130)], [50, 51, IM_END], flags=[]),
        # made before flags: the export finds these two from their ids
        record("old-empty", [1, 10, 16], [IM_END]),
        record("old-loop", [1, 10, 17], [60, 61, 62, 63] * 10 + [IM_END]),
    ]
    return make_run(
        tmp_path / "flagged",
        records,
        failures=[("bad", "skipped", "bad_row"), ("down", "failed", "transient")],
        planned=11,  # 8 records + 2 failure entries + 1 never generated
    )


def test_empty_and_degenerate_are_left_out_by_default_and_every_item_is_counted(
    flagged_run: Path, tmp_path: Path
) -> None:
    report = export([flagged_run], tmp_path / "t.jsonl")
    exported = {row["metadata"]["record_id"] for row in read_jsonl(tmp_path / "t.jsonl")}
    assert exported == {"hand/clean/0", "hand/old/0", "hand/cut/0", "hand/long/0"}
    assert report.skipped == {
        "flag:empty": 2,
        "flag:degenerate": 2,
        "generation_skipped:bad_row": 1,
        "generation_failed:transient": 1,
        "not_generated": 1,
    }
    assert report.planned == 11 == report.exported + sum(report.skipped.values())
    skipped_ids = report.to_json()["skipped_ids"]
    assert skipped_ids["flag:empty"] == ["hand/empty/0", "hand/old-empty/0"]
    assert skipped_ids["flag:degenerate"] == ["hand/loop/0", "hand/old-loop/0"]
    assert report.finish_reasons == {"stop": 3, "length": 1}


def test_keep_and_max_length(flagged_run: Path, tmp_path: Path) -> None:
    report = export(
        [flagged_run], tmp_path / "t.jsonl", keep=("empty", "degenerate"), max_length=40
    )
    exported = {row["metadata"]["record_id"] for row in read_jsonl(tmp_path / "t.jsonl")}
    assert exported == {
        "hand/clean/0",
        "hand/old/0",
        "hand/empty/0",
        "hand/loop/0",
        "hand/cut/0",
        "hand/long/0",
        "hand/old-empty/0",
    }
    assert report.skipped["too_long"] == 1
    assert report.to_json()["skipped_ids"]["too_long"] == ["hand/old-loop/0"]  # 3 + 41 tokens
    assert report.reconciled
    assert report.length_stats()["max"] == 34  # the long prompt: 31 + 3


def test_an_unknown_flag_is_refused(flagged_run: Path, tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="--keep emtpy: unknown flag; use one of truncated"):
        export([flagged_run], tmp_path / "t.jsonl", keep=("emtpy",))


# --- hf ---------------------------------------------------------------------------------------


def test_hf_round_trips_the_ids_export_with_typed_features(
    real_runs: list[Path], tmp_path: Path
) -> None:
    from datasets import load_dataset

    export(real_runs, tmp_path / "train.jsonl")
    report = export(real_runs, tmp_path / "train-hf", format="hf")
    # the Hub's layout: what load_dataset, and so speculators' --data hf:PATH, reads (the real
    # prepare-data on it: tests/test_export_consumers.py)
    dataset = load_dataset(str(tmp_path / "train-hf"), split="train")
    assert dataset.features["input_ids"].feature.dtype == "int32"
    assert dataset.features["loss_mask"].feature.dtype == "int8"
    assert dataset.features["seq_len"].dtype == "int32"
    expected = read_jsonl(tmp_path / "train.jsonl")
    got = list(dataset)
    assert len(got) == len(expected)
    for row, want in zip(got, expected, strict=True):
        assert row.pop("seq_len") == len(want["input_ids"])
        assert row == want
    # the report sits beside the dataset folder, never inside it
    assert sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "train-hf").rglob("*")) == [
        "train-hf/data",
        "train-hf/data/train-00000-of-00001.parquet",
    ]
    assert report.hand_off() == [
        f"speculators: prepare-data --data hf:{tmp_path / 'train-hf'} --seq-length "
        f"{report.length_stats()['max']}"
    ]
    assert (tmp_path / "train-hf.export.json").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert report.warnings == []
    # speculators cannot name a folder whose path holds a colon: the report says so
    colon = export(real_runs, tmp_path / "a:b", format="hf")
    assert colon.warnings == [
        f"{tmp_path / 'a:b'} holds a ':', and speculators splits --data hf:PATH at colons: "
        "move the folder, or link it, to a path without one"
    ]


# --- the mask check -------------------------------------------------------------------------

# The mistakes speculators' prepare-data passes silently (a length mismatch is the one it refuses).
PROMPT, GENERATED = [1, 10, 11], [20, 21, IM_END]
GOOD = [0, 0, 0, 1, 1, 1]
WRONG_MASKS = {
    "shifted right": ([0, 0, 0, 0, 1, 1], "loss_mask[3] is 0 over a generated token; it must be 1"),
    "shifted left": ([0, 0, 1, 1, 1, 0], "loss_mask[2] is 1 over a prompt token; it must be 0"),
    "inverted": ([1, 1, 1, 0, 0, 0], "loss_mask[0] is 1 over a prompt token; it must be 0"),
    "all ones": ([1] * 6, "loss_mask[0] is 1 over a prompt token; it must be 0"),
    "no supervised token": ([0] * 6, "loss_mask[3] is 0 over a generated token; it must be 1"),
    "twos": ([0, 0, 0, 2, 2, 2], "loss_mask[3] is 2 over a generated token; it must be 1"),
    "labels-style -100": ([-100] * 3 + [1] * 3, "loss_mask[0] is -100 over a prompt token"),
    "halves": ([0, 0, 0, 0.5, 0.5, 0.5], "loss_mask[3] is 0.5, not the integer 0 or 1"),
    "floats": ([0.0, 0.0, 0.0, 1.0, 1.0, 1.0], "loss_mask[0] is 0.0, not the integer 0 or 1"),
    "bools": ([False] * 3 + [True] * 3, "loss_mask[0] is False, not the integer 0 or 1"),
    "one short": (GOOD[:-1], "loss_mask has 5 values for 6 input_ids"),
    "one long": ([*GOOD, 1], "loss_mask has 7 values for 6 input_ids"),
}


@pytest.mark.parametrize("kind", list(WRONG_MASKS))
def test_the_mask_check_names_the_first_wrong_value(kind: str) -> None:
    from eagledata.export.maskcheck import mask_problem

    mask, problem = WRONG_MASKS[kind]
    row = {"input_ids": PROMPT + GENERATED, "loss_mask": mask}
    found = mask_problem(row, PROMPT, GENERATED)
    assert found is not None and found.startswith(problem), found
    assert mask_problem({**row, "loss_mask": list(GOOD)}, PROMPT, GENERATED) is None


def test_the_mask_check_holds_the_ids_to_the_spans_too() -> None:
    from eagledata.export.maskcheck import mask_problem

    def problem(ids: Any) -> str | None:
        return mask_problem({"input_ids": ids, "loss_mask": GOOD}, PROMPT, GENERATED)

    assert problem(PROMPT + GENERATED) is None
    # the boundary moved, a token changed, the answer first: the mask no longer marks the answer
    moved = [*PROMPT[:-1], GENERATED[0], PROMPT[-1], *GENERATED[1:]]
    for ids in (moved, [*PROMPT, 99, 21, IM_END], GENERATED + PROMPT):
        assert (
            problem(ids)
            == "input_ids (6 ids) are not the 3 prompt ids followed by the 3 generated ones"
        )
    assert (
        mask_problem({"loss_mask": GOOD}, PROMPT, GENERATED)
        == "input_ids is missing beside loss_mask"
    )
    assert mask_problem({"input_ids": PROMPT + GENERATED, "loss_mask": tuple(GOOD)}, PROMPT,
                        GENERATED) == "loss_mask is a tuple, not a list"  # fmt: skip


def faulty(base: str, spoil: Any, victim: str) -> Any:
    """A format like ``base`` whose row maker spoils the mask of one row (``victim``'s)."""
    import dataclasses

    from eagledata.export.formats import FORMATS

    chosen = FORMATS[base]

    class Spoiled:
        def __init__(self, tokenizer: Any, template_kwargs: dict[str, Any]) -> None:
            self.inner = chosen.rows(tokenizer, template_kwargs)

        def row(self, record: Any, who: Any) -> dict[str, Any] | str:
            row = self.inner.row(record, who)
            if isinstance(row, dict) and who.id.endswith(victim):
                row = {**row, "loss_mask": spoil(row["loss_mask"])}
            return row

        def note(self, report: Any) -> None:
            self.inner.note(report)

    return dataclasses.replace(chosen, name=f"faulty-{base}", rows=Spoiled)


def files_under(folder: Path) -> list[tuple[Path, bytes]]:
    return sorted((p.relative_to(folder), p.read_bytes()) for p in folder.rglob("*") if p.is_file())


@pytest.mark.parametrize("base", ["ids", "hf"])
def test_a_wrong_mask_stops_the_export_and_nothing_is_renamed_in(
    flagged_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, base: str
) -> None:
    """On the write path, for every writer: a faulty row maker is caught before the rename."""
    from eagledata.export.formats import FORMATS

    out = tmp_path / ("t.jsonl" if base == "ids" else "t-hf")
    export([flagged_run], out, format=base)
    before = files_under(tmp_path)
    spoils = {"shift": lambda m: [0, *m[:-1]], "twos": lambda m: [2 * v for v in m],
              "halves": lambda m: [v / 2 for v in m]}  # fmt: skip
    for name, spoil in spoils.items():
        fmt = faulty(base, spoil, "cut/0")
        monkeypatch.setitem(FORMATS, fmt.name, fmt)
        with pytest.raises(ExportError) as caught:
            export([flagged_run], out, format=fmt.name, force=True)
        message = str(caught.value)
        assert message.startswith(f"--format faulty-{base}: row hand/cut/0: loss_mask["), name
        assert message.endswith("the export stopped and wrote nothing (a bug in this format's "
                                "rows: please report it)")  # fmt: skip
        # the previous export and its report untouched, no temporary file or cache left
        assert files_under(tmp_path) == before, name
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    # the real formats pass the same records through the same check
    assert export([flagged_run], out, format=base, force=True).exported == 4


# --- conversations ----------------------------------------------------------------------------


def encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


@pytest.fixture
def thinking_run(tmp_path: Path, prompt_tokenizer: Any) -> Path:
    """K2.5-style records: the generation prompt ends in an open <think>."""
    tok = prompt_tokenizer.hf
    system = {"role": "system", "content": "You are a careful assistant."}

    def prompt(question: str, think: bool = True) -> tuple[list[dict[str, str]], list[int]]:
        messages = [system, {"role": "user", "content": question}]
        return messages, prompt_tokenizer.encode(messages) + ([THINK] if think else [])

    reasoning = encode(tok, "\nLet me think about this. Six times seven.\n")
    answer = encode(tok, "\n\nThe answer is 42.")
    m1, p1 = prompt("What is six times seven?")
    m2, p2 = prompt("What is the capital of France?", think=False)
    m3, p3 = prompt("Write a short poem about the sea.")
    m4, p4 = prompt("Explain gradient descent.")
    records = [
        record("prefilled", p1, [*reasoning, END_THINK, *answer, IM_END], messages=m1),
        # the model opens the think block itself
        record("opened", p2, [THINK, *reasoning, END_THINK, *answer, IM_END], messages=m2),
        # cut inside its thinking: no answer to train a conversation on
        record("cut", p3, reasoning, finish="length", messages=m3),
        # no thinking at all
        record("plain", p4[:-1], [*answer, IM_END], messages=[m4[1]]),
    ]
    return make_run(tmp_path / "thinking", records, planned=4)


def test_conversations_split_thinking_at_the_think_end_token(
    thinking_run: Path, tmp_path: Path
) -> None:
    out = tmp_path / "conv.jsonl"
    report = export([thinking_run], out, format="conversations")
    rows = {row["id"]: row for row in read_jsonl(out)}
    assert set(rows) == {"hand/prefilled/0", "hand/opened/0", "hand/plain/0"}
    assert report.skipped == {"no_answer": 1}
    for row_id in ("hand/prefilled/0", "hand/opened/0"):
        conversation = rows[row_id]["conversations"]
        assert conversation[0] == {"role": "system", "content": "You are a careful assistant."}
        assert conversation[1]["role"] == "user"
        assert conversation[-1] == {
            "role": "assistant",
            "content": "The answer is 42.",
            "reasoning_content": "Let me think about this. Six times seven.",
        }
        assert rows[row_id]["status"] == "success"
    plain = rows["hand/plain/0"]["conversations"]
    assert plain[-1] == {
        "role": "assistant",
        "content": "The answer is 42.",
        "reasoning_content": "",
    }
    for row in rows.values():
        for message in row["conversations"]:
            for field in ("content", "reasoning_content"):
                text = message.get(field, "")
                assert "<think>" not in text and "</think>" not in text
                assert "<|im_end|>" not in text


def test_conversations_warn_when_the_template_drops_reasoning(
    thinking_run: Path, tmp_path: Path, tokenizer_dir: str
) -> None:
    # The bundled template renders only ``content``: like Kimi-K2.5's history branch, it loses
    # ``reasoning_content``.
    report = export([thinking_run], tmp_path / "conv.jsonl", format="conversations")
    assert report.lossy["template_drops_reasoning"] is True
    assert report.lossy["rows_with_reasoning"] == 2
    assert any("trains on none of the" in w and "--format ids" in w for w in report.warnings)
    assert any("1 rows were generated without a system message" in w for w in report.warnings)
    written = json.loads((tmp_path / "conv.export.json").read_text())
    assert written["lossy"]["template_drops_reasoning"] is True

    # A template that renders reasoning_content: no such warning.
    keeping = tmp_path / "keeping-tokenizer"
    shutil.copytree(tokenizer_dir, keeping)
    config_path = keeping / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = (
        "{%- for message in messages -%}"
        "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
        "{%- if message.reasoning_content is defined and message.reasoning_content -%}"
        "{{- '<think>' + message.reasoning_content + '</think>' -}}"
        "{%- endif -%}"
        "{{- message['content'] + '<|im_end|>\\n' -}}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
    )
    config_path.write_text(json.dumps(config))
    report = export(
        [thinking_run], tmp_path / "conv2.jsonl", format="conversations", tokenizer=str(keeping)
    )
    assert report.lossy["template_drops_reasoning"] is False
    assert not any("trains on none of the" in w for w in report.warnings)


# --- text -------------------------------------------------------------------------------------


def test_text_skips_exactly_the_rows_whose_round_trip_fails(
    tmp_path: Path, prompt_tokenizer: Any
) -> None:
    tok = prompt_tokenizer.hf
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = prompt_tokenizer.encode(messages)
    answer = encode(tok, "The capital of France is Paris.")
    # the same text split into single characters: decodes the same, re-encodes differently
    spelled = [t for ch in "The capital" for t in encode(tok, ch)]
    assert encode(tok, tok.decode(spelled)) != spelled
    records = [
        record("clean", prompt, [*answer, IM_END], messages=messages),
        record("spelled", prompt, [*spelled, IM_END], messages=messages),
        record("clean2", prompt, answer, finish="length", messages=messages),
    ]
    run = make_run(tmp_path / "text-run", records, planned=3)
    out = tmp_path / "text.jsonl"
    report = export([run], out, format="text")
    rows = read_jsonl(out)
    assert [row["id"] for row in rows] == ["hand/clean/0", "hand/clean2/0"]
    for row, source in zip(rows, (records[0], records[2]), strict=True):
        ids = source.input_ids + source.output_ids
        assert encode(tok, row["text"]) == ids
        assert set(row) == {"id", "text"}
    assert report.skipped == {"roundtrip_mismatch": 1}
    assert report.to_json()["skipped_ids"] == {"roundtrip_mismatch": ["hand/spelled/0"]}
    assert report.reconciled


# --- token counts and the draft vocabulary ----------------------------------------------------


def test_token_counts_are_the_supervised_ids(flagged_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    export([flagged_run], out, token_counts=True)
    counts = json.loads((tmp_path / "t.token_counts.json").read_text())
    expected: Counter[int] = Counter()
    for row in read_jsonl(out):
        expected.update(i for i, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m)
    assert {int(k): v for k, v in counts.items()} == dict(expected)


def test_draft_vocab_mapping_follows_specforge() -> None:
    counts = Counter({7: 5, 3: 5, 9: 1, 1: 2})
    d2t, t2d = draft_vocab_mapping(counts, 3, 12)
    # top 3 by count, ties in first-seen order: 7, 3 (5 each), then 1 (2); sorted: 1, 3, 7
    assert d2t == [1 - 0, 3 - 1, 7 - 2]
    assert [i for i, used in enumerate(t2d) if used] == [1, 3, 7]
    # fewer counted ids than the draft size: the lowest missing ids fill it up
    d2t, t2d = draft_vocab_mapping(Counter({5: 1}), 3, 8)
    assert [i for i, used in enumerate(t2d) if used] == [0, 1, 5]
    with pytest.raises(ExportError, match="--draft-vocab-size 9"):
        draft_vocab_mapping(counts, 9, 8)


# --- bad input and atomicity -------------------------------------------------------------------


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args)


def one_error_line(result: subprocess.CompletedProcess[str], code: int) -> str:
    assert result.returncode == code, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0].removeprefix("eagledata: error: ")


def test_bad_input_is_one_line_and_leaves_nothing(flagged_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "o" / "t.jsonl"
    message = one_error_line(cli("export", str(tmp_path), "--out", str(out)), 5)
    assert message == (
        f"{tmp_path} is not an eagledata run directory (no run.json); "
        "start one with 'eagledata generate --out DIR'"
    )
    message = one_error_line(
        cli("export", str(flagged_run), "--format", "csv", "--out", str(out)), 2
    )
    assert message == "--format csv: unknown format; use one of ids, hf, conversations, text"
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    message = one_error_line(cli("export", str(flagged_run), "--out", str(blocker / "t.jsonl")), 2)
    assert message.startswith(f"cannot write {blocker / 't.jsonl'}: ")
    assert message.endswith("; pass a writable --out")
    inside = flagged_run / "shards" / "export.jsonl"
    message = one_error_line(cli("export", str(flagged_run), "--out", str(inside)), 2)
    assert f"is inside the run directory {flagged_run}; write the export elsewhere" in message
    assert not out.exists() and not inside.exists()


def test_an_existing_output_is_kept_unless_forced(flagged_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    export([flagged_run], out)
    out.write_text("an edited export\n")
    with pytest.raises(ExportError, match="exists; pass --force"):
        export([flagged_run], out)
    assert out.read_text() == "an edited export\n"
    export([flagged_run], out, force=True)  # an earlier export: its report names it
    assert len(read_jsonl(out)) == 4


def test_force_replaces_only_an_earlier_export(flagged_run: Path, tmp_path: Path) -> None:
    """A file or folder that merely sits at PATH is never replaced, whatever --force says."""
    mine = tmp_path / "mine.jsonl"
    mine.write_text("mine\n")
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine\n")
    for target, fmt in ((mine, "ids"), (folder, "hf")):
        with pytest.raises(ExportError, match="is not an earlier export") as caught:
            export([flagged_run], target, format=fmt, force=True)
        assert "--force replaces only an export" in str(caught.value)
    assert mine.read_text() == "mine\n"
    assert (folder / "notes.txt").read_text() == "mine\n"
    hf = tmp_path / "train-hf"
    export([flagged_run], hf, format="hf")
    assert export([flagged_run], hf, format="hf", force=True).exported == 4


def test_export_never_writes_into_a_run_directory(flagged_run: Path, tmp_path: Path) -> None:
    """--out a run's own file, --force or not: refused, the run's files as they were."""
    before = files_under(flagged_run)
    for name in ("run.json", "failures.jsonl", "plan.json", "export.jsonl", "sub/t.jsonl"):
        with pytest.raises(ExportError, match="is inside the run directory"):
            export([flagged_run], flagged_run / name, force=True)
    other = make_run(tmp_path / "other", [record("x", [1, 10], [20, IM_END], flags=[])])
    with pytest.raises(ExportError, match=f"is inside the run directory {other}"):
        export([flagged_run], other / "run.json", force=True)  # a run not exported too
    assert files_under(flagged_run) == before


def test_export_never_replaces_a_folder_holding_runs(flagged_run: Path, tmp_path: Path) -> None:
    """--format hf --out the folder holding the run (or another run) --force: refused, the
    runs and every other file kept."""
    sibling = make_run(tmp_path / "sibling", [record("x", [1, 10], [20, IM_END], flags=[])])
    (tmp_path / "notes.txt").write_text("unrelated\n")
    elsewhere = tmp_path / "elsewhere"
    make_run(elsewhere / "deep" / "run", [record("y", [1, 10], [21, IM_END], flags=[])])
    before = files_under(tmp_path)
    for target in (tmp_path, elsewhere):
        with pytest.raises(ExportError, match="holds the run directory"):
            export([flagged_run], target, format="hf", force=True)
    assert files_under(tmp_path) == before
    assert (sibling / "run.json").is_file()
    assert (tmp_path / "notes.txt").read_text() == "unrelated\n"


def test_export_never_writes_over_an_input_dataset(tmp_path: Path) -> None:
    dataset = tmp_path / "data" / "hand.jsonl"
    dataset.parent.mkdir()
    dataset.write_text('{"prompt": "question"}\n')
    run = make_run(tmp_path / "run", [record("x", [1, 10], [20, IM_END], flags=[])])
    manifest = orjson.loads((run / "run.json").read_bytes())
    manifest["frozen"]["dataset"]["source"] = str(dataset)
    (run / "run.json").write_bytes(orjson.dumps(manifest))
    for target, fmt, what in ((dataset, "ids", "is"), (dataset.parent, "hf", "holds")):
        with pytest.raises(ExportError, match=f"{what} the run's input dataset"):
            export([run], target, format=fmt, force=True)
    assert dataset.read_text() == '{"prompt": "question"}\n'


def test_a_failed_export_leaves_no_partial_file(flagged_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    export([flagged_run], out)
    out.write_text("the previous export\n")
    shards = sorted((flagged_run / "shards").glob("shard-*.jsonl"))
    with shards[-1].open("ab") as handle:  # a damaged line after good ones
        handle.write(b"{not json\n")
    for fmt, target in (("ids", out), ("hf", tmp_path / "hf")):
        damaged = r"is not a record \(not valid JSON\); run 'eagledata verify"
        with pytest.raises(RunDirError, match=damaged):
            export([flagged_run], target, format=fmt, force=True)
    assert out.read_text() == "the previous export\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["flagged", "t.export.json", "t.jsonl"]


def test_the_cli_prints_the_report(flagged_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    result = cli("export", str(flagged_run), "--out", str(out), "--keep", "empty")
    assert result.returncode == 0, result.stderr
    assert "exported 6 rows" in result.stdout
    assert "planned  11 = exported 6 + skipped 5" in result.stdout
    assert f"report   {tmp_path / 't.export.json'}" in result.stdout
    assert orjson.loads((tmp_path / "t.export.json").read_bytes())["exported"] == 6


def test_runs_with_different_tokenizers_need_an_explicit_one(
    flagged_run: Path, tmp_path: Path, tokenizer_dir: str
) -> None:
    other = make_run(
        tmp_path / "other",
        [record("x", [1, 10], [20, IM_END])],
        tokenizer=TokenizerSettings(name=tokenizer_dir),
    )
    with pytest.raises(ExportError, match="different tokenizers"):
        export([flagged_run, other], tmp_path / "c.jsonl", format="text")
    report = export(
        [flagged_run, other], tmp_path / "c.jsonl", format="text", tokenizer=tokenizer_dir
    )
    assert report.exported + sum(report.skipped.values()) == 11 + 1


def specforge_validate_row(row: dict[str, Any]) -> list[str]:
    """The rules of SpecForge's ``scripts/validate_regenerated_data.py`` ``validate_row`` with
    ``--expect-reasoning`` off and ``--strict-think-markers`` on, as its source states them (the
    script is not in the wheel): a non-empty string id, status success, a system message only
    first, then user and assistant alternating with non-empty string content, an assistant last,
    no think markers in content or reasoning_content."""
    problems = []
    if not (isinstance(row.get("id"), str) and row["id"]):
        problems.append("id")
    if row.get("status") != "success":
        problems.append("status")
    messages = row.get("conversations") or []
    roles = [m.get("role") for m in messages]
    if roles and roles[0] == "system":
        roles = roles[1:]
    if "system" in roles:
        problems.append("system not first")
    expected = ["user", "assistant"] * (len(roles) // 2 + 1)
    if roles != expected[: len(roles)]:
        problems.append(f"role order {roles}")
    if not roles or roles[-1] != "assistant":
        problems.append("last message is not the assistant's")
    for message in messages:
        if not (isinstance(message.get("content"), str) and message["content"].strip()):
            problems.append("empty content")
        for field in ("content", "reasoning_content"):
            if any(m in str(message.get(field, "")) for m in ("<think>", "</think>")):
                problems.append(f"think marker in {field}")
    return problems


def test_conversations_of_a_real_run_pass_specforges_row_validation(
    real_runs: list[Path], thinking_run: Path, tmp_path: Path
) -> None:
    out = tmp_path / "conv.jsonl"
    report = export([real_runs[0], thinking_run], out, format="conversations")
    rows = read_jsonl(out)
    assert len(rows) == report.exported > 0
    assert {row["id"]: specforge_validate_row(row) for row in rows} == {
        row["id"]: [] for row in rows
    }
    # the prompt messages are the ones sent, unchanged
    records = {r["id"]: r for r in records_of(real_runs[0])}
    for row in rows:
        source = records.get(row["id"].removeprefix(f"{real_runs[0].name}/"))
        if source is not None:
            assert row["conversations"][:-1] == source["messages"]


def test_a_running_run_exports_its_committed_lines_only(tmp_path: Path) -> None:
    """A journal still open (``pending/``) holds committed whole lines and maybe a torn tail:
    the export takes exactly what ``status`` counts, and says the plan is not finished."""
    from eagledata.run.writer import ShardWriter

    run = make_run(tmp_path / "running", [record("a", [1, 10], [20, IM_END])])
    writer = ShardWriter(run, shard_size=100, fsync_interval_s=0)
    writer.write(record("b", [1, 11], [21, IM_END]))
    writer.write(record("c", [1, 12], [22, IM_END]))
    writer.sync()  # left open, as by a running generate
    journal = next((run / "pending").glob("shard-*.jsonl"))
    with journal.open("ab") as handle:
        handle.write(b'{"id": "hand/d/0", "input_')  # a write cut short
    report = export([run], tmp_path / "t.jsonl")
    ids = [row["id"] for row in read_jsonl(tmp_path / "t.jsonl")]
    assert ids == ["hand/a/0", "hand/b/0", "hand/c/0"]
    assert run_status(run).written == report.exported == 3
    assert any("has not finished its plan" in w for w in report.warnings)


def test_every_registered_format_is_named_in_the_help_of_export() -> None:
    """The CLI imports the export package only when it runs (a fast --help): its help text
    names the formats by hand, so it must follow the registry."""
    from typer.testing import CliRunner

    from eagledata.cli import app
    from eagledata.export.formats import FORMATS

    result = CliRunner().invoke(app, ["export", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for name in FORMATS:
        assert name in result.output
