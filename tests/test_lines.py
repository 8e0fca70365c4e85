"""The line contract (rundir/lines.py): every line a run writes parses back as its model, a
line that is not one is named, and the documentation is the contract's own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from conftest import REPO, SAMPLES, make_config, sim_config
from eagledata.run import pipeline
from eagledata.rundir.lines import (
    LINE_MODELS,
    CheckLine,
    FailureLine,
    LineError,
    QualityLine,
    RecordLine,
    ShardIndexLine,
    TelemetryLine,
)
from eagledata.simserver import SimServerThread


@pytest.mark.slow
def test_every_file_of_a_real_run_parses_line_by_line_as_its_model(
    tokenizer_dir: str, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    with SimServerThread(sim_config(tokenizer_dir)) as sim:
        config = make_config(
            [sim.url],
            out,
            canary={"enabled": True, "prompts": 4, "reference_tokens": 16, "probes": 1},
            run={"concurrency": "auto"},
            load={"poll_interval_s": 0.05, "telemetry_interval_s": 0.05},
        )
        pipeline.generate(config, str(SAMPLES / "bad_rows.jsonl"), None, progress=False)
    files = {
        RecordLine: sorted((out / "shards").glob("*.jsonl")),
        FailureLine: [out / "failures.jsonl"],
        CheckLine: [out / "checks.jsonl"],
        QualityLine: [out / "quality.jsonl"],
        TelemetryLine: [out / "telemetry.jsonl"],
    }
    for model, paths in files.items():
        lines = [line for path in paths for line in path.read_bytes().splitlines()]
        assert lines, f"{model.__name__}: no lines written"
        for line in lines:
            parsed = model.parse(line)
            assert orjson.loads(parsed.dump()) == orjson.loads(line)  # nothing lost or added
    # every record holds every field, none null: the bundled tokenizer has think tags (an int
    # of reasoning_tokens) and the run's writer stamps its settings (test_record_types.py)
    for path in files[RecordLine]:
        for line in path.read_bytes().splitlines():
            record = orjson.loads(line)
            assert list(record) == list(RecordLine.model_fields)
            assert [name for name, value in record.items() if value is None] == []
    for index in (out / "shards").glob("*.idx.json"):
        ShardIndexLine.parse(index.read_bytes())
    manifest = orjson.loads((out / "run.json").read_bytes())
    # RecordLine 2: flags an object of booleans, typed nones instead of null
    assert manifest["line_schemas"] == {
        model.__name__: 2 if model is RecordLine else 1 for model in LINE_MODELS
    }


RECORD = {
    "id": "d/1/0", "dataset": "d", "row_id": "1", "sample": 0, "finish_reason": "stop",
    "prompt_tokens": 1, "completion_tokens": 1, "messages": [], "input_ids": [5],
    "output_ids": [2], "text": "",
}  # fmt: skip


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "not a JSON object"),
        (orjson.dumps({**RECORD, "output_ids": [2, "7"]}), "output_ids.1: Input should be"),
        (orjson.dumps({**RECORD, "output_ids": [2, 7.0]}), "output_ids.1: Input should be"),
        (orjson.dumps({**RECORD, "finish_reason": "abort"}), "finish_reason: Input should be"),
        (orjson.dumps({**RECORD, "colour": "red"}), "colour: Extra inputs are not permitted"),
        (orjson.dumps({k: v for k, v in RECORD.items() if k != "input_ids"}), "input_ids: Field"),
    ],
)
def test_a_line_that_is_not_a_record_is_named_with_its_first_problem(
    line: bytes, problem: str
) -> None:
    with pytest.raises(LineError, match="^" + problem.replace("(", r"\(")):
        RecordLine.parse(line)


def test_a_record_of_a_run_made_before_flags_existed_still_parses() -> None:
    old = RecordLine.parse(orjson.dumps(RECORD))
    assert old.flags is None and old.created_at == 0.0


def test_the_run_directory_doc_is_generated_from_the_contract() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gen_docs.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    doc = (REPO / "docs" / "run-directory.md").read_text()
    for model in LINE_MODELS:
        assert f"<!-- fields: {model.__name__} -->" in doc
