"""What a library call generates from: a dataset (a path, or a name the config knows), or a list
of prompts written once into ``OUT/prompts.jsonl`` with stable ids; and where each round goes.

A list is the same prompts every round: the file is written by the first call and every later
call must pass the same list (a different one is refused in one line: the rounds of ``OUT`` would
no longer be samples of the same prompts). A row's id is its position in the list.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from eagledata.atomic import atomic_write
from eagledata.errors import DatasetError

PROMPTS_FILE = "prompts.jsonl"
PROMPTS_DATASET = "prompts"
"""The dataset name a list of prompts gets: its record ids read ``prompts/ROW/SAMPLE``."""
ROUND_PREFIX = "round-"

Prompt = str | Sequence[Mapping[str, Any]]
"""A user message's text, or a whole list of chat messages (``{"role", "content"}``)."""
Source = str | os.PathLike[str] | Sequence[Prompt]


def round_dir(out: Path, round_index: int) -> Path:
    """``OUT/round-0003``: one run directory per round."""
    return out / f"{ROUND_PREFIX}{round_index:04d}"


def round_dirs(out: Path) -> dict[int, Path]:
    """The rounds ``out`` holds (a folder with a ``run.json``), by number."""
    found: dict[int, Path] = {}
    if not out.is_dir():
        return found
    for child in out.iterdir():
        number = child.name.removeprefix(ROUND_PREFIX)
        if (
            child.name.startswith(ROUND_PREFIX)
            and number.isdigit()
            and (child / "run.json").is_file()
        ):
            found[int(number)] = child
    return dict(sorted(found.items()))


@dataclass(frozen=True)
class ResolvedSource:
    dataset_arg: str
    """What ``generate`` is given: a dataset path or name."""
    overrides: dict[str, Any]
    """Settings the source adds (the prompts file's dataset entry)."""


def resolve_source(source: Source, out: Path) -> ResolvedSource:
    if isinstance(source, str | os.PathLike):
        return ResolvedSource(os.fspath(source), {})
    if isinstance(source, bytes | Mapping) or not isinstance(source, Sequence):
        raise DatasetError(
            f"source: {type(source).__name__} is neither a dataset path nor a list of prompts"
        )
    path = write_prompts(out, source)
    entry = {"source": str(path.resolve()), "schema": "messages", "id_field": "id"}
    return ResolvedSource(PROMPTS_DATASET, {f"datasets.{PROMPTS_DATASET}": entry})


def prompts_bytes(prompts: Sequence[Prompt]) -> bytes:
    """One JSONL line per prompt: ``{"id": "<position>", "messages": [...]}``."""
    if not prompts:
        raise DatasetError("source: the list of prompts is empty; pass at least one prompt")
    lines = []
    for index, prompt in enumerate(prompts):
        lines.append(orjson.dumps({"id": str(index), "messages": _messages(prompt, index)}))
    return b"\n".join(lines) + b"\n"


def _messages(prompt: Prompt, index: int) -> list[dict[str, Any]]:
    if isinstance(prompt, str):
        if not prompt.strip():
            raise DatasetError(f"source[{index}]: the prompt is empty")
        return [{"role": "user", "content": prompt}]
    if prompt and all(isinstance(m, Mapping) for m in prompt):
        messages = [dict(message) for message in prompt if isinstance(message, Mapping)]
        if all(isinstance(m.get("role"), str) and "content" in m for m in messages):
            return messages
    raise DatasetError(
        f"source[{index}]: a prompt is a string or a non-empty list of "
        '{"role": ..., "content": ...} messages'
    )


def write_prompts(out: Path, prompts: Sequence[Prompt]) -> Path:
    """``OUT/prompts.jsonl``, written by the first call; a later call must pass the same list."""
    data = prompts_bytes(prompts)
    path = out / PROMPTS_FILE
    if path.is_file():
        if path.read_bytes() != data:
            raise DatasetError(
                f"{path} holds other prompts than this call's: every round of {out} samples "
                "the same prompts; pass the same list, or a new out"
            )
        return path
    try:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write(path, data)
    except OSError as error:
        raise DatasetError(f"{path}: cannot write the prompts: {error}") from None
    return path
