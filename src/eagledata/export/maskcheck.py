"""The export's own check of every loss mask it writes: the trainers do not check it.

speculators 0.9.0's ``prepare-data`` refuses only a mask whose length differs from its ids: a mask
shifted by one, inverted, all ones, or holding 2, -100 or 0.5 (which it then truncates to 0) goes
through silently. SpecForge 0.2.0 refuses values other than 0 and 1, but not a shifted or
inverted mask. A wrong mask trains a drafter on the wrong tokens with no error anywhere, so the
exporter checks each row against the spans it was made from before the row reaches the writer;
one failure stops the export, and the output is never renamed into place.

The rule is per row and knows nothing of a format: a row that carries ``loss_mask`` has
``input_ids`` equal to its prompt's ids followed by its generated ids, and a mask as long, holding
only the integers 0 and 1 (not a bool, not a float), 0 over every prompt token and 1 over every
generated one. The caller names the two spans: a record's ``input_ids`` and ``output_ids``
today; a format that makes several rows of one record (a row per turn) names each row's own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

MASK = "loss_mask"
IDS = "input_ids"


def carries_mask(row: Mapping[str, Any]) -> bool:
    return MASK in row


def _first(values: Sequence[Any], start: int, want: Any) -> int:
    """The first index from ``start`` whose value is not exactly the int ``want``."""
    for index in range(start, len(values)):
        value = values[index]
        if type(value) is not int or value != want:
            return index
    raise AssertionError("no offending value")  # pragma: no cover: callers found one


def mask_problem(
    row: Mapping[str, Any], prompt: Sequence[int], generated: Sequence[int]
) -> str | None:
    """What is wrong with ``row``'s ids and mask for these spans, or None when they are exact."""
    mask = row[MASK]
    ids = row.get(IDS)
    prompt_len, total = len(prompt), len(prompt) + len(generated)
    if not isinstance(mask, list):
        return f"{MASK} is a {type(mask).__name__}, not a list"
    if not isinstance(ids, list):
        return f"{IDS} is missing beside {MASK}" if ids is None else f"{IDS} is not a list"
    if len(ids) != total or ids[:prompt_len] != list(prompt) or ids[prompt_len:] != list(generated):
        return (
            f"{IDS} ({len(ids)} ids) are not the {prompt_len} prompt ids followed by the "
            f"{len(generated)} generated ones"
        )
    if len(mask) != total:
        return f"{MASK} has {len(mask)} values for {total} {IDS}"
    if set(map(type, mask)) - {int}:
        index = next(i for i, value in enumerate(mask) if type(value) is not int)
        return f"{MASK}[{index}] is {mask[index]!r}, not the integer 0 or 1"
    if mask[:prompt_len].count(0) != prompt_len:
        index = _first(mask, 0, 0)
        return f"{MASK}[{index}] is {mask[index]!r} over a prompt token; it must be 0"
    if mask[prompt_len:].count(1) != total - prompt_len:
        index = _first(mask, prompt_len, 1)
        return f"{MASK}[{index}] is {mask[index]!r} over a generated token; it must be 1"
    return None
