"""The cause first: a dataset whose first rows all fail for one reason stops the run before the
tokenizer, the servers or the canary are touched, with one line that names the reason and the
fields the rows do have. Without it the cause surfaced only in ``failures.jsonl``, after the
canary had complained that it found no usable prompt.
"""

from __future__ import annotations

from eagledata.errors import BadRowError, DatasetError
from eagledata.source.dataset import ResolvedDataset, iter_rows, local_path
from eagledata.source.formats import file_type, one_of
from eagledata.source.prompts import ROW_SCHEMAS, to_messages

PREFLIGHT_ROWS = 20
"""Rows read up front: enough to tell a file of another shape from a few bad rows."""

_FIXES = {
    "bad_schema": "fix the rows' shape, or set the dataset's schema in the config",
    "unknown_role": "give every message a role: user, assistant or system (or human, gpt)",
}


def _prompt_field_fix(dataset: ResolvedDataset, first_row: dict[str, object] | None) -> str:
    """Where the prompt column is named: the dataset's config entry, or one to add."""
    texts = sorted(k for k, v in (first_row or {}).items() if isinstance(v, str))
    column = texts[0] if len(texts) == 1 else "COLUMN"
    return (
        f"add to the config [datasets.{dataset.name}] source = "
        f'"{dataset.settings.source}", prompt_field = "{column}" and pass --dataset '
        f"{dataset.name}, or convert the file to {_shapes()}"
    )


def _shapes() -> str:
    """The row shapes a file may be converted to, as the fix names them (``ROW_SCHEMAS``)."""
    return one_of([shape.field or "a prompt column" for shape in ROW_SCHEMAS.values()])


def check_first_rows(dataset: ResolvedDataset, config_source: str | None = None) -> None:
    """Raise ``DatasetError`` when a local file holds no row, or when every one of its first
    rows fails the same way (a few bad rows among good ones go to the failure file as usual)."""
    if file_type(local_path(dataset.settings)) is None:
        return  # a hub dataset: read once, by the run itself
    reasons: list[tuple[str, str]] = []
    first_row: dict[str, object] | None = None
    read = 0
    first_index = 0
    for row in iter_rows(dataset.settings, limit=PREFLIGHT_ROWS):
        read += 1
        if not reasons:
            first_row, first_index = row.data, row.index
        if row.data is None:
            reasons.append(("unreadable", row.error or "unreadable row"))
            continue
        try:
            to_messages(row.data, dataset.settings)
        except BadRowError as exc:
            reasons.append((exc.reason, str(exc)))
            continue
        return  # one usable row: the rest is the failure file's business
    if not read:  # said here, before a run directory, the tokenizer or a server is touched
        raise DatasetError(
            f"dataset {dataset.name} ({local_path(dataset.settings)}) is empty: it holds no "
            "rows to generate; put rows in it, or pass another --dataset"
        )
    if not reasons or len({reason for reason, _ in reasons}) != 1:
        return
    reason, message = reasons[0]
    # the row is in the file; the fix is in the config only when it is a setting to add
    where = f"{local_path(dataset.settings)}, row {first_index + 1}"
    if reason == "missing_field":
        fix = _prompt_field_fix(dataset, first_row)
        where += f"; the setting goes in {config_source or 'the config'}"
    elif reason == "bad_schema":
        fix = _FIXES[reason]
        where += f"; the schema is set in {config_source or 'the config'}"
    else:
        fix = _FIXES.get(reason, "fix the rows")
    rows = "row fails" if len(reasons) == 1 else f"{len(reasons)} rows all fail the same way"
    raise DatasetError(f"dataset {dataset.name}: its first {rows}: {message}; {fix} (in {where})")
