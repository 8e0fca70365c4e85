"""Strict settings models, and how a settings error reads: one line per key, naming the flag
that set it or the key a misspelled one may have meant."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


_TYPE_TAGS = frozenset({"int", "str", "float", "bool", "none", "list", "dict"})


def field_key(loc: tuple[int | str, ...]) -> tuple[str, ...]:
    """The settings key of an error: pydantic appends the branch of a union it tried (``int``,
    ``literal['auto']``, ``function-after[...]``), which is no key anyone wrote."""
    parts = [str(part) for part in loc]
    while parts and ("[" in parts[-1] or parts[-1] in _TYPE_TAGS):
        parts.pop()
    return tuple(parts)


def _near_keys(model: type[BaseModel], path: tuple[str, ...]) -> list[str]:
    """The keys a misspelled ``path`` may have meant, from the model's own fields at its level."""
    node: type[BaseModel] = model
    for part in path[:-1]:
        field = node.model_fields.get(part)
        annotation = field.annotation if field is not None else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        node = annotation
    return difflib.get_close_matches(path[-1], list(node.model_fields), n=1, cutoff=0.75)


def format_validation_error(
    error: ValidationError,
    source: str = "",
    flags: Mapping[str, str] | frozenset[str] = frozenset(),
    model: type[BaseModel] | None = None,
) -> str:
    """One line per key in error: ``source: key.path: message``; a key set by a flag names the
    flag (``--concurrency 'abc': ...``, from ``flags``: key -> flag), a misspelled key the key
    it may have meant (from ``model``'s fields). A union's branches are one line, not one each."""
    by_key: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for item in error.errors():
        by_key.setdefault(field_key(item["loc"]), []).append(dict(item))
    lines = []
    for path, items in by_key.items():
        key = ".".join(path)
        messages = list(dict.fromkeys(str(i["msg"]).removeprefix("Value error, ") for i in items))
        message = "; or ".join(messages)
        if any(i["type"] == "extra_forbidden" for i in items) and model is not None:
            near = _near_keys(model, path)
            message = "unknown key" + (f"; did you mean {near[0]!r}?" if near else "")
        flag = (
            flags.get(key)
            if isinstance(flags, Mapping)
            else ("command line" if key in flags else None)
        )
        if flag is not None:
            value = items[0].get("input")
            shown = f" {value!r}" if isinstance(value, str | int | float) else ""
            lines.append(f"{flag}{shown}: {message}")
        else:
            lines.append(f"{source}{key}: {message}" if key else f"{source}{message}")
    return "\n".join(lines)
