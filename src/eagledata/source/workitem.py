"""What the work plan yields, and what it is made with: a request to send (``WorkItem``), a
committed turn whose conversation goes on (``Answered``), an entry that ends without a request
(``Outcome``), and one dataset of the plan with its own settings (``PlanDataset``). The plan
itself, rows in and these out, is ``workplan.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from eagledata.config import GenerationSettings, MixMember
from eagledata.rundir.lines import FailureLine
from eagledata.source.conversations import (
    Conversation,
)
from eagledata.source.prompts import Message
from eagledata.source.tokenization import LengthLimit

PREVIOUS_TURN_FAILED = "previous_turn_failed"
"""A turn never sent because the turn before it ended without a record."""


@dataclass(slots=True)
class WorkItem:
    item_id: str
    row_id: str
    sample: int
    messages: list[Message]
    input_ids: list[int]
    dataset: str = ""
    params: dict[str, Any] | None = None
    """The dataset's ``sampling_params`` (shared by its items); None: the run's."""
    prompt_key: str | None = None
    turn: int = 0
    conversation: Conversation | None = None
    """Under ``turns = "all"``: the conversation this turn belongs to."""
    row_hash: str = ""
    """Its source row's hash (``source/fingerprint.py``): the record carries it."""

    @property
    def conversation_id(self) -> str:
        if self.conversation is not None:
            return self.conversation.conversation_id
        return self.item_id

    @property
    def conversation_turns(self) -> int:
        return 1 if self.conversation is None else self.conversation.turns


@dataclass(slots=True)
class Answered:
    """A committed turn whose conversation goes on: the next turn is built from its answer (the
    plan yields one for each conversation a resumed run continues; ``run/turns.py`` makes one
    whenever a turn lands)."""

    item: WorkItem
    output_ids: list[int]
    finish_reason: str
    matched: int | str | None


@dataclass(slots=True)
class Outcome:
    """A plan entry that ends without a request: a bad row, an over-long prompt, a duplicate."""

    entry: FailureLine


@dataclass(frozen=True)
class PlanDataset:
    """One dataset of the plan with the settings its items are made with."""

    name: str
    member: MixMember
    generation: GenerationSettings
    params: dict[str, Any]
    template_kwargs: dict[str, Any]
    limit: LengthLimit

    @classmethod
    def of(
        cls,
        member: MixMember,
        generation: GenerationSettings,
        template_kwargs: dict[str, Any],
        limit: LengthLimit,
    ) -> PlanDataset:
        own = member.dataset.generation(generation)
        return cls(
            name=member.name,
            member=member,
            generation=own,
            params=own.sampling_params(),
            template_kwargs=member.dataset.template_kwargs(template_kwargs),
            limit=limit.for_max_new_tokens(own.max_new_tokens),
        )

    @property
    def samples(self) -> int:
        return self.generation.samples_per_prompt

    @property
    def all_turns(self) -> bool:
        return self.generation.turns == "all"
