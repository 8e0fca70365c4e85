"""Step 2: a dataset row becomes the chat messages the model is prompted with.

Contents pass through untouched (no strip, no normalization): the drafter must learn from exactly
what the target model saw. Under ``turns = "last"`` a multi-turn row is cut after its last user
turn; the dataset's own assistant turns before it stay as context. Under ``turns = "all"`` the
whole conversation is read (``row_messages``) and ``source/conversations.py`` splits it into the
turns regenerated one after the other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from eagledata.config import DatasetSettings, Schema
from eagledata.errors import BadRowError

Message = dict[str, str]

# ShareGPT speaker names seen in the drafter datasets (SpecForge prepare_data.py and Magpie).
SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "assistant": "assistant",
    "model": "assistant",
    "system": "system",
}
OPENAI_ROLES = {"user", "assistant", "system"}


def _turns(data: dict[str, Any], field: str) -> list[Any]:
    turns = data.get(field)
    if turns is None:
        raise BadRowError(f"missing field {field!r}", reason="missing_field")
    if not isinstance(turns, list):
        raise BadRowError(f"{field} is {type(turns).__name__}, not a list", reason="bad_schema")
    if not turns:
        raise BadRowError(f"{field} is empty", reason="empty_conversation")
    return turns


def _message(turn: Any, where: str, role_key: str, text_key: str, roles: dict[str, str]) -> Message:
    if not isinstance(turn, dict):
        raise BadRowError(f"{where} is {type(turn).__name__}, not an object", reason="bad_schema")
    role = turn.get(role_key)
    if role is None:
        raise BadRowError(
            f"{where} has no {role_key!r} (one of {', '.join(sorted(roles))})",
            reason="unknown_role",
        )
    if role not in roles:
        raise BadRowError(f"{where}.{role_key}: unknown role {role!r}", reason="unknown_role")
    content = turn.get(text_key)
    if not isinstance(content, str):
        kind = "missing" if content is None else type(content).__name__
        raise BadRowError(
            f"{where}.{text_key}: content is {kind}, not a string", reason="bad_content"
        )
    return {"role": roles[role], "content": content}


def _prompt_column(data: dict[str, Any], settings: DatasetSettings) -> list[Message]:
    prompt = data.get(settings.prompt_field)
    if not isinstance(prompt, str):
        kind = "missing" if prompt is None else type(prompt).__name__
        raise BadRowError(f"{settings.prompt_field}: {kind}, not a string", reason="bad_content")
    return [{"role": "user", "content": prompt}]


def _sharegpt(data: dict[str, Any], settings: DatasetSettings) -> list[Message]:
    turns = _turns(data, "conversations")
    return [
        _message(turn, f"conversations[{i}]", "from", "value", SHAREGPT_ROLES)
        for i, turn in enumerate(turns)
    ]


def _openai_messages(data: dict[str, Any], settings: DatasetSettings) -> list[Message]:
    turns = _turns(data, "messages")
    identity = {role: role for role in OPENAI_ROLES}
    return [
        _message(turn, f"messages[{i}]", "role", "content", identity)
        for i, turn in enumerate(turns)
    ]


@dataclass(frozen=True, slots=True)
class RowSchema:
    name: Schema
    field: str | None
    """The field whose presence tells this shape under ``schema = "auto"`` (None: the dataset's
    ``prompt_field``)."""
    summary: str
    """One line for the docs: what a row of this shape holds."""
    messages: Callable[[dict[str, Any], DatasetSettings], list[Message]]
    """The row's messages, as the dataset has them, or ``BadRowError`` naming what is wrong."""


ROW_SCHEMAS: dict[Schema, RowSchema] = {
    shape.name: shape
    for shape in (
        RowSchema(
            "sharegpt",
            "conversations",
            "ShareGPT: `conversations: [{from, value}]` (`human`, `gpt`, `system`, ...)",
            _sharegpt,
        ),
        RowSchema(
            "messages",
            "messages",
            "OpenAI-style: `messages: [{role, content}]` (`user`, `assistant`, `system`)",
            _openai_messages,
        ),
        RowSchema(
            "prompt",
            None,
            "one user prompt in the column `prompt_field` names (`prompt` by default)",
            _prompt_column,
        ),
    )
}
"""Every row shape, tried in this order under ``schema = "auto"``. Adding one: its name in
``config``'s ``Schema`` (the settings' check) and one entry here; the docs' table
(``scripts/gen_docs.py``) and the error naming the fields read it."""


def detect_schema(data: dict[str, Any], settings: DatasetSettings) -> Schema:
    if settings.schema_ != "auto":
        return settings.schema_
    for shape in ROW_SCHEMAS.values():
        if (shape.field or settings.prompt_field) in data:
            return shape.name
    names = [shape.field or repr(settings.prompt_field) for shape in ROW_SCHEMAS.values()]
    fields = ", ".join(sorted(data)) or "none"
    raise BadRowError(
        f"no {', '.join(names[:-1])} or {names[-1]} field (fields: {fields})",
        reason="missing_field",
    )


def row_messages(data: dict[str, Any], settings: DatasetSettings) -> list[Message]:
    """Every message of one row, as the dataset has them (the configured system prompt first
    where the row has none), or ``BadRowError`` naming what is wrong with it."""
    messages = ROW_SCHEMAS[detect_schema(data, settings)].messages(data, settings)
    if not any(m["role"] == "user" for m in messages):
        raise BadRowError("no user turn to answer", reason="no_user_turn")
    if settings.system_prompt is not None and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": settings.system_prompt})
    return messages


def to_messages(data: dict[str, Any], settings: DatasetSettings) -> list[Message]:
    """The prompt messages for one row under ``turns = "last"``: cut after its last user turn."""
    messages = row_messages(data, settings)
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    messages = messages[: last_user + 1]
    if not messages[-1]["content"].strip():
        raise BadRowError("the last user turn is empty", reason="empty_prompt")
    return messages
