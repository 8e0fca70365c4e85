"""``turns = "all"``: a conversation split into the turns regenerated one after the other.

A row's messages become *segments*: segment k holds what is sent between the (k-1)-th and the k-th
regenerated answer (a system prompt, one or more user messages), ending with the user message the
k-th answer replies to. Every original assistant message is dropped: turn k's prompt is

    segment 0 + answer 0 + segment 1 + answer 1 + ... + segment k

with the *regenerated* answers in place of the dataset's (``turn_messages``), so the drafter never
sees context the target model did not write. Turn k+1 is built only from turn k's committed
record (``run/turns.py``).
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from eagledata.source.prompts import Message
from eagledata.source.tokenization import LengthLimit

KEY_BYTES = 10
"""A prompt key is 80 bits of blake2b: a false duplicate among a million prompts has a chance
of about 4e-13."""


def split_turns(messages: Sequence[Message]) -> list[list[Message]]:
    """The segments of a conversation (see the module docstring); original answers dropped.

    A segment ends at an assistant message that follows a user message, or at the end of the
    conversation; messages after the last user message that are not user messages (a trailing
    system note) have nothing to prompt and are dropped with the answers.
    """
    segments: list[list[Message]] = []
    current: list[Message] = []
    for message in messages:
        if message["role"] == "assistant":
            if any(m["role"] == "user" for m in current):
                segments.append(current)
                current = []
            continue  # an answer (or a greeting before any user message): never sent
        current.append(message)
    if any(m["role"] == "user" for m in current):
        segments.append(current)
    return segments


def first_empty_turn(segments: Sequence[Sequence[Message]]) -> int | None:
    """The first turn whose user message (the one answered) is empty, or None."""
    for index, segment in enumerate(segments):
        last_user = next(m for m in reversed(segment) if m["role"] == "user")
        if not last_user["content"].strip():
            return index
    return None


def turn_messages(
    previous: Sequence[Message], answer: Message, segment: Sequence[Message]
) -> list[Message]:
    """Turn k+1's messages: turn k's, its regenerated answer, then segment k+1."""
    return [*previous, answer, *segment]


REASONING = "reasoning_content"


def with_reasoning_field(messages: Sequence[Message]) -> list[Message]:
    """``messages`` with ``reasoning_content`` in each ("" where it has none).

    Why: a run that sends thinking answers back holds records whose messages have that key and
    records whose messages do not (a conversation's first turn), and a JSON reader that takes its
    schema from the first file it reads (``datasets.load_dataset("json")`` on ``shards/*.jsonl``)
    fails on the second kind after the first. With one key set for every message of such a run
    (``WorkPlan.reasoning_field``) every shard has one schema. The prompts are rendered from these
    same messages: a template that reads ``reasoning_content`` of an assistant message sees "" for
    an answer that did not think, and user and system messages are rendered as before.
    """
    return [message if REASONING in message else {**message, REASONING: ""} for message in messages]


def prompt_key(input_ids: Sequence[int]) -> str:
    """The key a duplicate prompt is found by: a hash of the prompt ids."""
    return hashlib.blake2b(array("q", input_ids).tobytes(), digest_size=KEY_BYTES).hexdigest()


def conversation_key(first_ids: Sequence[int], later: Sequence[Sequence[Message]]) -> str:
    """The key of a conversation regenerated turn by turn: its first prompt's ids and the
    messages of its later turns (their prompt ids depend on answers not generated yet)."""
    hasher = hashlib.blake2b(array("q", first_ids).tobytes(), digest_size=KEY_BYTES)
    hasher.update(orjson.dumps(list(later)))
    return hasher.hexdigest()


@dataclass(slots=True, eq=False)
class Conversation:
    """One conversation under ``turns = "all"``, shared by the work items of its turns."""

    conversation_id: str
    turns: int
    """Assistant turns regenerated: 0 .. turns - 1."""
    later: list[list[Message]]
    """The segments of turns 1 .. turns - 1 (``later[k - 1]`` is turn k's)."""
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    limit: LengthLimit = field(default_factory=lambda: LengthLimit(None, "none"))

    def segment(self, turn: int) -> list[Message]:
        return self.later[turn - 1]
