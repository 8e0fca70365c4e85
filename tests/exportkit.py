"""Run directories for the export tests: real ones (the simulated server) and hand-built ones
(records with chosen ids, flags and outcomes, written by the real writer and manifest)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import orjson

from conftest import TOKENIZER
from eagledata.config import DatasetSettings, FrozenSettings, GenerationSettings, TokenizerSettings
from eagledata.run.writer import FailureLog, ShardWriter
from eagledata.rundir.lines import RecordFlags, RecordLine
from eagledata.rundir.manifest import RunDir
from eagledata.rundir.records import failure_line, record_id


def frozen(dataset: str = "hand", tokenizer: TokenizerSettings | None = None) -> FrozenSettings:
    return FrozenSettings(
        dataset_name=dataset,
        dataset=DatasetSettings(source=f"{dataset}.jsonl"),
        tokenizer=tokenizer or TokenizerSettings(name=TOKENIZER),
        generation=GenerationSettings(max_new_tokens=64),
        limit=None,
        shard_size=3,
        expected_model=None,
        bf16_kv_bytes_per_token=None,
    )


def record(
    row: str,
    input_ids: list[int],
    output_ids: list[int],
    *,
    dataset: str = "hand",
    sample: int = 0,
    finish: Literal["stop", "length"] = "stop",
    flags: list[str] | None = None,
    messages: list[dict[str, str]] | None = None,
    text: str = "",
) -> RecordLine:
    """A record as the writer stores it; ``flags=None`` is a run made before flags existed."""
    return RecordLine(
        id=record_id(dataset, row, sample),
        dataset=dataset,
        row_id=row,
        sample=sample,
        finish_reason=finish,
        prompt_tokens=len(input_ids),
        completion_tokens=len(output_ids),
        created_at=0.0,
        messages=list(messages or [{"role": "user", "content": f"question {row}"}]),
        input_ids=input_ids,
        output_ids=output_ids,
        text=text,
        flags=None if flags is None else RecordFlags.of(flags),
        matched_token_id=output_ids[-1] if finish == "stop" and output_ids else -1,
    )


def make_run(
    path: Path,
    records: list[RecordLine],
    *,
    failures: list[tuple[str, str, str]] = (),  # type: ignore[assignment]
    planned: int | None = None,
    dataset: str = "hand",
    tokenizer: TokenizerSettings | None = None,
) -> Path:
    """Write a run directory; ``failures`` are (row, status, reason); ``planned`` ends the plan."""
    run = RunDir(path)
    path.mkdir(parents=True)
    run.create(frozen(dataset, tokenizer), {})
    writer = ShardWriter(path, shard_size=3, fsync_interval_s=0)
    for item in records:
        writer.write(item)
    writer.close()
    log = FailureLog(path, fsync_interval_s=0)
    for row, status, reason in failures:
        log.write(
            failure_line(
                item_id=record_id(dataset, row, 0),
                dataset=dataset,
                row_id=row,
                sample=0,
                reason=reason,
                message=reason,
                attempts=1,
                status=status,
            )
        )
    log.close()
    if planned is not None:
        run.set_planned(planned)
    return path


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]
