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

import orjson

MASK = "loss_mask"
IDS = "input_ids"


def carries_mask(row: Mapping[str, Any]) -> bool:
    return MASK in row


def exact_mask_json(prompt_len: int, generated_len: int) -> bytes:
    """The JSON of ``[0]*prompt_len + [1]*generated_len``: only a mask of exactly those ints
    serializes to it (``true`` and ``1.0`` do not)."""
    body = b"0," * prompt_len + b"1," * generated_len
    return b"[" + body[:-1] + b"]"


def mask_problem(
    row: Mapping[str, Any], prompt: Sequence[int], generated: Sequence[int]
) -> str | None:
    """What is wrong with ``row``'s ids and mask for these spans, or None when they are exact."""
    mask, ids = row[MASK], row.get(IDS)
    prompt_len = len(prompt)
    if not isinstance(ids, list):
        return f"{IDS} is missing beside {MASK}" if ids is None else f"{IDS} is not a list"
    if (
        len(ids) != prompt_len + len(generated)
        or ids[:prompt_len] != _as_list(prompt)
        or ids[prompt_len:] != _as_list(generated)
    ):
        return (
            f"{IDS} ({len(ids)} ids) are not the {prompt_len} prompt ids followed by the "
            f"{len(generated)} generated ones"
        )
    if isinstance(mask, list) and orjson.dumps(mask) == exact_mask_json(prompt_len, len(generated)):
        return None  # the common case, at C speed (a few percent of an export's time)
    return _what_differs(mask, prompt_len, len(ids))


def _as_list(ids: Sequence[int]) -> list[int]:
    return ids if isinstance(ids, list) else list(ids)


def _what_differs(mask: Any, prompt_len: int, total: int) -> str:
    if not isinstance(mask, list):
        return f"{MASK} is a {type(mask).__name__}, not a list"
    if len(mask) != total:
        return f"{MASK} has {len(mask)} values for {total} {IDS}"
    for index, value in enumerate(mask):
        if type(value) is not int:
            return f"{MASK}[{index}] is {value!r}, not the integer 0 or 1"
        if index < prompt_len and value != 0:
            return f"{MASK}[{index}] is {value!r} over a prompt token; it must be 0"
        if index >= prompt_len and value != 1:
            return f"{MASK}[{index}] is {value!r} over a generated token; it must be 1"
    raise AssertionError(f"{MASK} differs from its JSON and yet holds the exact values")
