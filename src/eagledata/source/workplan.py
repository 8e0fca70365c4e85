"""The work plan: dataset rows turned into requests to send, or into failure-file entries.

Each row becomes ``samples_per_prompt`` work items (messages and prompt token ids), minus those
whose ids a run directory already holds. A row that cannot be sent (unreadable, no valid
messages, a prompt over the length limit) becomes one failure-file entry per sample instead; a
row that repeats an earlier row's id is disambiguated as ``id@index`` and skipped.

The plan is a plain, blocking iterator: the pipeline pulls it in batches from a worker thread.
"""

from __future__ import annotations

from collections.abc import Container, Iterator
from dataclasses import dataclass
from typing import Literal

from eagledata.errors import ItemError
from eagledata.rundir.idset import CompactIdSet
from eagledata.rundir.lines import FailureLine
from eagledata.rundir.records import failure_line, record_id
from eagledata.source.dataset import ResolvedDataset, iter_rows
from eagledata.source.prompts import Message, to_messages
from eagledata.source.tokenization import LengthLimit, PromptTokenizer, check_length


@dataclass(slots=True)
class WorkItem:
    item_id: str
    row_id: str
    sample: int
    messages: list[Message]
    input_ids: list[int]


@dataclass(slots=True)
class Outcome:
    """A plan entry that ends without a request: a bad row, an over-long prompt, a duplicate."""

    entry: FailureLine


class WorkPlan(Iterator[WorkItem | Outcome]):
    """The plan of one session, consumed once.

    ``enumerated`` counts every sample of every row read so far, done or not; ``complete`` turns
    true once the dataset has been read to its end (or to ``row_limit``): only then is
    ``enumerated`` the run's planned total.
    """

    def __init__(
        self,
        dataset: ResolvedDataset,
        *,
        samples_per_prompt: int,
        row_limit: int | None,
        tokenizer: PromptTokenizer,
        limit: LengthLimit,
        done: Container[str],
    ) -> None:
        self.dataset = dataset
        self.samples_per_prompt = samples_per_prompt
        self.row_limit = row_limit
        self.tokenizer = tokenizer
        self.limit = limit
        self.done = done
        self.enumerated = 0
        self.complete = False
        self._entries = self._plan()

    def __next__(self) -> WorkItem | Outcome:
        return next(self._entries)

    def _plan(self) -> Iterator[WorkItem | Outcome]:
        name = self.dataset.name
        samples = self.samples_per_prompt
        # every row id read so far, to find repeats: 16 B a row, not a set of strings (``idset``)
        seen_rows = CompactIdSet()
        for row in iter_rows(self.dataset.settings, self.row_limit):
            row_id = row.row_id
            duplicate = row_id in seen_rows
            seen_rows.add(row_id)
            if duplicate:
                row_id = f"{row.row_id}@{row.index}"
            ids = [record_id(name, row_id, sample) for sample in range(samples)]
            self.enumerated += samples
            todo = [
                (sample, ids[sample]) for sample in range(samples) if ids[sample] not in self.done
            ]
            if not todo:
                continue
            if duplicate:
                message = f"row {row.index} repeats the id {row.row_id!r} of an earlier row"
                yield from self._outcomes(row_id, todo, "duplicate_id", message, status="skipped")
                continue
            try:
                if row.data is None:
                    raise ItemError(row.error or "unreadable row", reason="bad_row")
                messages = to_messages(row.data, self.dataset.settings)
                input_ids = self.tokenizer.encode(messages)
                check_length(input_ids, self.limit)
            except ItemError as exc:
                yield from self._outcomes(row_id, todo, exc.reason, str(exc))
                continue
            for sample, item_id in todo:
                yield WorkItem(item_id, row_id, sample, messages, input_ids)
        self.complete = True

    def _outcomes(
        self,
        row_id: str,
        todo: list[tuple[int, str]],
        reason: str,
        message: str,
        status: Literal["failed", "skipped"] = "failed",
    ) -> Iterator[Outcome]:
        """One failure-file entry per sample of a row that will not be sent."""
        for sample, item_id in todo:
            entry = failure_line(
                item_id=item_id,
                dataset=self.dataset.name,
                row_id=row_id,
                sample=sample,
                reason=reason,
                message=message,
                attempts=0,
                status=status,
            )
            yield Outcome(entry)
