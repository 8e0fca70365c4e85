"""``--format text``: preformatted text (SpecForge ``data.is_preformatted: true``), lossy.

``{"id", "text": decode(P + O)}`` with special tokens kept. The trainer re-tokenizes the text and
rebuilds its mask from the template's assistant pattern, so a row is exported only when the text
encodes back to exactly P + O; every other row is skipped and counted (``roundtrip_mismatch``).
What still differs: SpecForge derives the mask from ``data.chat_template``'s regex, not from the
generation boundary (for K2.5 it also supervises the prefilled ``<think>``).
"""

from __future__ import annotations

from typing import Any

from eagledata.export.format import ExportFormat, RowIdentity
from eagledata.export.output import write_jsonl
from eagledata.export.report import ExportReport
from eagledata.rundir.lines import RecordLine

ROUNDTRIP_MISMATCH = "roundtrip_mismatch"


class TextBuilder:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def row(self, record: RecordLine, who: RowIdentity) -> dict[str, Any] | str:
        ids = [*record.input_ids, *record.output_ids]
        text = str(
            self.tokenizer.decode(
                ids, skip_special_tokens=False, clean_up_tokenization_spaces=False
            )
        )
        if list(self.tokenizer.encode(text, add_special_tokens=False)) != ids:
            return ROUNDTRIP_MISMATCH
        return {"id": who.id, "text": text}

    def note(self, report: ExportReport) -> None:
        report.lossy = {
            "route": "text",
            "why": "the trainer re-tokenizes the text and builds its mask from its template's "
            "assistant pattern; rows that do not re-encode to the exact ids were skipped",
        }


FORMAT = ExportFormat(
    name="text",
    summary="preformatted text (SpecForge is_preformatted): lossy, re-tokenized",
    rows=lambda tokenizer, template_kwargs: TextBuilder(tokenizer),
    write=write_jsonl,
    needs_tokenizer=True,
)
