"""``--format ids``: the token-faithful route, one JSONL file both SpecForge and speculators read.

Each line is ``{"id", "primary_id", "input_ids": P + O, "loss_mask": [0]*|P| + [1]*|O|,
"metadata"}``, P the record's ``input_ids`` (exactly the ids sent), O its ``output_ids`` (exactly
the ids returned, stop token included and supervised). Under ``turns = "all"`` a record is one
turn: one row per turn, its P the conversation so far (earlier answers as the template rendered
them, unsupervised here: each is supervised in its own turn's row). The mask is token-aligned
and unshifted: ``loss_mask[i] == 1`` iff ``input_ids[i]`` was generated; the trainers shift it
themselves.

Readers, from their own source (docs/export.md, "What the trainers read"): SpecForge 0.2.0
``prepare_prompt_tasks`` (``data.prompts_path``) treats a file whose first record has both keys as
pre-tokenized and ignores every other key; speculators ``prepare-data --data`` passes such rows
through and drops the other columns. Both read one file, hence one file for all shards and runs.
The metadata keeps fixed types on every row so Arrow (``datasets.load_dataset("json")``) can
infer one schema.
"""

from __future__ import annotations

from typing import Any

from eagledata.export.format import ExportFormat, RowIdentity
from eagledata.export.output import write_jsonl
from eagledata.export.report import ExportReport
from eagledata.rundir.lines import RecordLine


def ids_row(record: RecordLine, who: RowIdentity) -> dict[str, Any]:
    prompt = record.input_ids
    output = record.output_ids
    return {
        "id": who.id,
        "primary_id": who.primary_id,
        "input_ids": prompt + output,
        "loss_mask": [0] * len(prompt) + [1] * len(output),
        "metadata": {
            "run": who.run,
            "record_id": record.id,
            "finish_reason": record.finish_reason,
            "prompt_tokens": len(prompt),
            "completion_tokens": len(output),
            # the conversation and turn of the row (turns = "all": one row per turn); a record
            # from before turns existed is its own conversation's only turn
            "conversation_id": record.conversation_id or record.id,
            "turn": record.turn or 0,
        },
    }


class IdsRows:
    """The exact route: nothing is lost, nothing to note."""

    def row(self, record: RecordLine, who: RowIdentity) -> dict[str, Any] | str:
        return ids_row(record, who)

    def note(self, report: ExportReport) -> None:
        return None


FORMAT = ExportFormat(
    name="ids",
    summary="token-faithful JSONL: SpecForge data.prompts_path, speculators --data",
    rows=lambda tokenizer, template_kwargs: IdsRows(),
    write=write_jsonl,
)
