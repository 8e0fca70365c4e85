"""``--format hf``: the ``ids`` rows as an HF dataset folder in the Hub's layout,
``PATH/data/train-00000-of-00001.parquet``: ``datasets.load_dataset(PATH, split="train")`` reads
it, so does speculators' ``prepare-data --data hf:PATH``, and it uploads as it is.

Typed features (int32 ids: Kimi's ~164k vocabulary fits; int8 mask), plus ``seq_len``, the column
speculators' training reader sorts batches by; they travel in the parquet schema's ``huggingface``
metadata. Written with ``Dataset.from_generator`` into a private cache, then ``to_parquet``: rows
never all sit in memory, and the folder holds only the dataset's own file (a consumer may glob
it). Not a ``save_to_disk`` folder: ``load_dataset``, hence speculators' ``hf:`` source, refuses
any folder holding ``state.json``, and a plain folder path makes speculators read its
``dataset_info.json`` and ``state.json`` as data. SpecForge reads only JSONL: use ``ids`` for it.
"""

from __future__ import annotations

import inspect
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from eagledata.atomic import fsync_dir
from eagledata.errors import EagledataError
from eagledata.export.format import ExportFormat, RowIdentity
from eagledata.export.ids import IdsRows, ids_row
from eagledata.export.report import ExportReport
from eagledata.rundir.lines import RecordLine

# Rows per Arrow record batch: a row of ~5k tokens costs ~200 kB as Python objects, so 64 rows
# keep the writer's buffer around 13 MB (datasets' default of 1,000 would hold ~200 MB).
WRITER_BATCH_SIZE = 64
# The Hub's own layout (what push_to_hub writes): load_dataset(PATH) finds the train split by name.
DATA_FOLDER = "data"
PARQUET_NAME = "train-00000-of-00001.parquet"


def hf_features() -> Any:
    from datasets import Features, Sequence, Value

    return Features(
        {
            "id": Value("string"),
            "primary_id": Value("string"),
            "input_ids": Sequence(Value("int32")),
            "loss_mask": Sequence(Value("int8")),
            "seq_len": Value("int32"),
            "metadata": {
                "run": Value("string"),
                "record_id": Value("string"),
                "finish_reason": Value("string"),
                "prompt_tokens": Value("int32"),
                "completion_tokens": Value("int32"),
                "conversation_id": Value("string"),
                "turn": Value("int32"),
            },
        }
    )


def hf_row(ids_row: dict[str, Any]) -> dict[str, Any]:
    return {**ids_row, "seq_len": len(ids_row["input_ids"])}


def write_hf_dataset(rows: Iterator[dict[str, Any]], target: Path) -> None:
    """Write ``rows`` (``hf_row``s) as ``target/data/PARQUET_NAME`` (``target`` must not exist)."""
    from datasets import Dataset
    from datasets.exceptions import DatasetGenerationError
    from datasets.utils.logging import disable_progress_bar

    disable_progress_bar()  # the export prints its own report; datasets' bars go to a log

    def generate() -> Iterator[dict[str, Any]]:
        yield from rows

    cache = Path(tempfile.mkdtemp(prefix=".eagledata-hf-cache-", dir=target.parent))
    try:
        # A fresh cache folder means no earlier build is ever reused. Where datasets takes a
        # fingerprint (3.x+), give one so it does not try to hash the generator's closure.
        extra: dict[str, Any] = {}
        if "fingerprint" in inspect.signature(Dataset.from_generator).parameters:
            extra["fingerprint"] = uuid.uuid4().hex
        dataset = Dataset.from_generator(
            generate,
            features=hf_features(),
            cache_dir=str(cache),
            writer_batch_size=WRITER_BATCH_SIZE,
            **extra,
        )
        parquet = target / DATA_FOLDER / PARQUET_NAME
        parquet.parent.mkdir(parents=True)
        dataset.to_parquet(str(parquet))
        del dataset
        _sync(parquet)
    except DatasetGenerationError as exc:
        # datasets wraps what the row generator raised: let our own one-line error through
        if isinstance(exc.__cause__, EagledataError):
            raise exc.__cause__ from None
        raise
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def _sync(parquet: Path) -> None:
    """The file and both folders durable before the exporter renames the folder into place."""
    with parquet.open("rb+") as handle:
        os.fsync(handle.fileno())
    fsync_dir(parquet.parent)
    fsync_dir(parquet.parent.parent)


class HfRows(IdsRows):
    """The ``ids`` rows, with ``seq_len``: exact; only a path speculators cannot name is noted."""

    def row(self, record: RecordLine, who: RowIdentity) -> dict[str, Any] | str:
        return hf_row(ids_row(record, who))

    def note(self, report: ExportReport) -> None:
        if ":" in report.output:
            report.warnings.append(
                f"{report.output} holds a ':', and speculators splits --data hf:PATH at colons: "
                "move the folder, or link it, to a path without one"
            )


FORMAT = ExportFormat(
    name="hf",
    summary="the ids rows as a Hub-layout parquet folder (load_dataset, speculators --data hf:)",
    rows=lambda tokenizer, template_kwargs: HfRows(),
    write=write_hf_dataset,
    writes_folder=True,
)
