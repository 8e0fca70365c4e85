"""The work plan: dataset rows turned into requests to send, or into failure-file entries.

Each row becomes ``samples_per_prompt`` work items (messages and prompt token ids), minus those
whose ids a run directory already holds; under ``turns = "all"`` each sample is a conversation
whose turns are items, of which the plan yields the first (or, on resume, the last committed
turn to continue from: ``Answered``); the next turns are built as the turns before them land
(``run/turns.py``). A row that cannot be sent (unreadable, no valid messages, a prompt over the
length limit) becomes one failure-file entry per item instead; a row that repeats an earlier
row's id is disambiguated as ``id@index`` and skipped; a row whose prompt an earlier row already
planned (the same prompt ids: its ``prompt_key``) is skipped as a ``duplicate``.

Each dataset of the run (``source/mix.py``) has its own generation settings, template kwargs
and length limit (``PlanDataset``).

The plan is a plain, blocking iterator: the pipeline pulls it in batches from a worker thread.
What it yields (``WorkItem``, ``Answered``, ``Outcome``) and ``PlanDataset`` are
``source/workitem.py``.
"""

from __future__ import annotations

from collections.abc import Container, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from eagledata.config import GenerationSettings
from eagledata.errors import BadRowError, ItemError
from eagledata.rundir.idset import CompactIdSet
from eagledata.rundir.lines import RecordLine
from eagledata.rundir.planstate import DUPLICATE, PlanState
from eagledata.rundir.records import failure_line, record_id, turn_id
from eagledata.source.answers import AnswerReader
from eagledata.source.conversations import (
    Conversation,
    conversation_key,
    first_empty_turn,
    prompt_key,
    split_turns,
    with_reasoning_field,
)
from eagledata.source.dataset import SourceRow
from eagledata.source.fingerprint import row_hash
from eagledata.source.mix import Mix, mix_rows
from eagledata.source.prompts import Message, row_messages, to_messages
from eagledata.source.tokenization import LengthLimit, PromptTokenizer, check_length, check_size
from eagledata.source.workitem import (
    PREVIOUS_TURN_FAILED,
    Answered,
    Outcome,
    PlanDataset,
    WorkItem,
)


@dataclass(slots=True)
class _Row:
    """One row being planned: its dataset, id, and the ids of its items not done yet."""

    dataset: PlanDataset
    row: SourceRow
    row_id: str
    ids: list[str] = field(default_factory=list)
    """Every item id of the row, done or not."""
    todo: list[tuple[int, int, str]] = field(default_factory=list)
    """(sample, turn, item id) of the items not done, in order."""


class WorkPlan(Iterator[WorkItem | Answered | Outcome]):
    """The plan of one session, consumed once.

    ``enumerated`` counts every item of every row read so far, done or not (``by_dataset``: per
    dataset); ``complete`` turns true once every dataset has been read to its end (or to
    ``row_limit``): only then is ``enumerated`` the run's planned total.
    """

    def __init__(
        self,
        mix: Mix,
        *,
        generation: GenerationSettings,
        template_kwargs: dict[str, Any],
        row_limit: int | None,
        tokenizer: PromptTokenizer,
        limit: LengthLimit,
        done: Container[str],
        state: PlanState | None = None,
    ) -> None:
        self.mix = mix
        self.datasets = {
            member.name: PlanDataset.of(member, generation, template_kwargs, limit)
            for member in mix.members
        }
        self.dedupe = generation.dedupe
        self.row_limit = row_limit
        self.tokenizer = tokenizer
        self.done = done
        self.state = state or PlanState()
        self.reasoning_field = any(d.all_turns for d in self.datasets.values()) and (
            tokenizer is not None and AnswerReader(tokenizer.hf).has_thinking
        )
        """Every message carries ``reasoning_content``: a run that sends thinking answers back
        (``turns = "all"``, a tokenizer with think tags) keeps one key set for every record's
        messages (``with_reasoning_field``)."""
        self.enumerated = 0
        self.by_dataset = dict.fromkeys(self.datasets, 0)
        self.complete = False
        self._entries = self._plan()

    def __next__(self) -> WorkItem | Answered | Outcome:
        return next(self._entries)

    def _plan(self) -> Iterator[WorkItem | Answered | Outcome]:
        # every row id read so far, per dataset, to find repeats: 16 B a row (``idset``)
        seen_rows = {name: CompactIdSet() for name in self.datasets}
        for member, row in mix_rows(self.mix, self.row_limit):
            dataset = self.datasets[member.name]
            row_id = row.row_id
            duplicate_id = row_id in seen_rows[dataset.name]
            seen_rows[dataset.name].add(row_id)
            if duplicate_id:
                row_id = f"{row.row_id}@{row.index}"
            if dataset.all_turns:
                yield from self._conversations(_Row(dataset, row, row_id), duplicate_id)
            else:
                yield from self._last_turns(_Row(dataset, row, row_id), duplicate_id)
        self.complete = True

    def _count(self, dataset: PlanDataset, items: int) -> None:
        self.enumerated += items
        self.by_dataset[dataset.name] += items

    # --- turns = "last": one item per sample ------------------------------------------------

    def _last_turns(self, plan: _Row, duplicate_id: bool) -> Iterator[WorkItem | Outcome]:
        dataset = plan.dataset
        name, samples = dataset.name, dataset.samples
        self._count(dataset, samples)
        for sample in range(samples):
            item_id = record_id(name, plan.row_id, sample)
            plan.ids.append(item_id)
            if item_id not in self.done:
                plan.todo.append((sample, 0, item_id))
        if not plan.todo:
            return
        if duplicate_id:
            yield from self._skip_repeated_id(plan)
            return
        try:
            if plan.row.data is None:
                raise ItemError(plan.row.error or "unreadable row", reason="bad_row")
            messages = to_messages(plan.row.data, dataset.member.dataset)
            if self.reasoning_field:
                messages = with_reasoning_field(messages)
            check_size(messages, dataset.limit)
            input_ids = self.tokenizer.encode(messages, dataset.template_kwargs)
            key = prompt_key(input_ids)
            check_length(input_ids, dataset.limit)
        except ItemError as exc:
            yield from self._outcomes(plan, plan.todo, exc.reason, str(exc))
            return
        if self._is_duplicate(plan, key):
            yield from self._skip_duplicate(plan)
            return
        hashed = row_hash(plan.row, dataset.member.dataset)
        for sample, _, item_id in plan.todo:
            yield WorkItem(
                item_id,
                plan.row_id,
                sample,
                messages,
                input_ids,
                dataset=name,
                params=dataset.params,
                prompt_key=key,
                row_hash=hashed,
            )

    # --- turns = "all": one conversation per sample, one item per turn ----------------------

    def _conversations(
        self, plan: _Row, duplicate_id: bool
    ) -> Iterator[WorkItem | Answered | Outcome]:
        dataset = plan.dataset
        name, samples = dataset.name, dataset.samples
        segments: list[list[Message]] = []
        problem: ItemError | None = None
        if plan.row.data is None:
            problem = ItemError(plan.row.error or "unreadable row", reason="bad_row")
        else:
            try:
                segments = split_turns(row_messages(plan.row.data, dataset.member.dataset))
            except BadRowError as exc:
                problem = exc
        if self.reasoning_field:
            segments = [with_reasoning_field(segment) for segment in segments]
        turns = max(len(segments), 1)  # an unreadable row plans (and fails) one turn
        self._count(dataset, samples * turns)
        for sample in range(samples):
            conversation_id = record_id(name, plan.row_id, sample)
            for turn in range(turns):
                item_id = turn_id(conversation_id, turn)
                plan.ids.append(item_id)
                if item_id not in self.done:
                    plan.todo.append((sample, turn, item_id))
        if not plan.todo:
            return
        if duplicate_id:
            yield from self._skip_repeated_id(plan)
            return
        if problem is not None:
            yield from self._outcomes(plan, plan.todo, problem.reason, str(problem))
            return
        empty = first_empty_turn(segments)
        sent = segments if empty is None else segments[:empty]
        if not sent:
            message = "the first user message is empty"
            yield from self._outcomes(plan, plan.todo, "empty_prompt", message)
            return
        try:
            first = sent[0]
            check_size(first, dataset.limit)
            input_ids = self.tokenizer.encode(first, dataset.template_kwargs)
            key = conversation_key(input_ids, sent[1:])
            check_length(input_ids, dataset.limit)
        except ItemError as exc:
            # turn 0 cannot be sent: its later turns never will be
            first_turns = [entry for entry in plan.todo if entry[1] == 0]
            later = [entry for entry in plan.todo if entry[1] > 0]
            yield from self._outcomes(plan, first_turns, exc.reason, str(exc))
            yield from self._outcomes(plan, later, PREVIOUS_TURN_FAILED, f"turn 0: {exc}")
            return
        if self._is_duplicate(plan, key):
            yield from self._skip_duplicate(plan)
            return
        if empty is not None:  # the turns from the first empty user message on are not sent
            cut = [entry for entry in plan.todo if entry[1] >= empty]
            plan.todo = [entry for entry in plan.todo if entry[1] < empty]
            message = f"turn {empty}'s user message is empty: the conversation stops before it"
            yield from self._outcomes(plan, cut, "empty_prompt", message, key=key)
        hashed = row_hash(plan.row, dataset.member.dataset)
        for sample in range(samples):
            todo = [entry for entry in plan.todo if entry[0] == sample]
            if not todo:
                continue
            conversation = Conversation(
                conversation_id=record_id(name, plan.row_id, sample),
                turns=len(sent),
                later=sent[1:],
                template_kwargs=dataset.template_kwargs,
                limit=dataset.limit,
            )
            next_turn = todo[0][1]
            if next_turn == 0:
                yield WorkItem(
                    todo[0][2],
                    plan.row_id,
                    sample,
                    first,
                    input_ids,
                    dataset=name,
                    params=dataset.params,
                    prompt_key=key,
                    conversation=conversation,
                    row_hash=hashed,
                )
                continue
            tail = self.state.tails.get(conversation.conversation_id)
            if tail is None or tail.turn != next_turn - 1:
                yield from self._outcomes(
                    plan,
                    todo,
                    PREVIOUS_TURN_FAILED,
                    f"turn {next_turn - 1} has no record to continue the conversation from",
                    key=key,
                )
                continue
            yield self._continue_from(tail, conversation, plan, sample, key, hashed)

    def _continue_from(
        self,
        tail: RecordLine,
        conversation: Conversation,
        plan: _Row,
        sample: int,
        key: str,
        hashed: str,
    ) -> Answered:
        """Resume: the conversation goes on from its last committed turn's record."""
        dataset = plan.dataset
        previous = WorkItem(
            tail.id,
            plan.row_id,
            sample,
            list(tail.messages),
            tail.input_ids,
            dataset=dataset.name,
            params=dataset.params,
            prompt_key=key,
            turn=tail.turn or 0,
            conversation=conversation,
            row_hash=hashed,
        )
        return Answered(previous, tail.output_ids, tail.finish_reason, tail.matched)

    # --- duplicates and failures ------------------------------------------------------------

    def _is_duplicate(self, plan: _Row, key: str) -> bool:
        """An earlier row planned the same prompt. A row some of whose items are done already
        is the one that planned it, unless all it has done are duplicate skips (a crash cut
        its skips short)."""
        if not self.dedupe:
            return False
        keys = self.state.keys
        if key not in keys:
            keys.add(key)
            return False
        started = [item_id for item_id in plan.ids if item_id in self.done]
        return not started or all(item_id in self.state.duplicates for item_id in started)

    def _skip_duplicate(self, plan: _Row) -> Iterator[Outcome]:
        message = "an earlier row planned the same prompt ids: it is generated once"
        yield from self._outcomes(plan, plan.todo, DUPLICATE, message, status="skipped")

    def _skip_repeated_id(self, plan: _Row) -> Iterator[Outcome]:
        message = f"row {plan.row.index} repeats the id {plan.row.row_id!r} of an earlier row"
        yield from self._outcomes(plan, plan.todo, "duplicate_id", message, status="skipped")

    def _outcomes(
        self,
        plan: _Row,
        todo: list[tuple[int, int, str]],
        reason: str,
        message: str,
        status: Literal["failed", "skipped"] = "failed",
        key: str | None = None,
    ) -> Iterator[Outcome]:
        """One failure-file entry per item of a row that will not be sent."""
        for sample, _, item_id in todo:
            entry = failure_line(
                item_id=item_id,
                dataset=plan.dataset.name,
                row_id=plan.row_id,
                sample=sample,
                reason=reason,
                message=message,
                attempts=0,
                status=status,
                prompt_key=key,
            )
            yield Outcome(entry)
