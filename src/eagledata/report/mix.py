"""The report's mix table: per dataset of the run, what it planned and wrote, what it skipped as
duplicates, its prompt and answer lengths, how much of its output is thinking, its turns per
conversation, and the writing systems of its prompts.

Counts come from ``status --json`` (``datasets``), everything else from the records
(``records_scan.DatasetSeries``); a run of one dataset gets a table of one row.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from typing import Any

from eagledata.report.records_scan import DatasetSeries, RecordSeries
from eagledata.rundir.percentile import percentile

COLUMNS = (
    "dataset",
    "planned",
    "written",
    "skipped (duplicate)",
    "failed",
    "prompt tokens p50 / p90",
    "answer tokens p50 / p90",
    "thinking share of output",
    "turns per conversation",
    "writing systems of prompts",
)


@dataclass(frozen=True)
class MixRow:
    dataset: str
    cells: tuple[str, ...]


def _count(value: Any) -> str:
    return "?" if value is None else f"{value:,}"


def _percentiles(values: Any) -> str:
    if not len(values):
        return "-"
    lengths = [int(value) for value in values]
    return f"{percentile(lengths, 0.5):,} / {percentile(lengths, 0.9):,}"


def _thinking(series: DatasetSeries | None) -> str:
    if series is None or not series.reasoning_counted:
        return "-" if series is None or not series.records else "no think tags"
    return f"{series.reasoning_tokens / series.reasoning_counted:.1%}"


def _turns(series: DatasetSeries | None) -> str:
    if series is None or not series.conversations:
        return "-"
    total = sum(series.conversations.values())
    mean = sum(turns * count for turns, count in series.conversations.items()) / total
    spread = ", ".join(
        f"{turns}: {count:,}" for turns, count in sorted(series.conversations.items())
    )
    return f"{mean:.2f} ({spread})"


def _scripts(series: DatasetSeries | None) -> str:
    if series is None or not series.prompts_by_script:
        return "-"
    total = sum(series.prompts_by_script.values())
    top = series.prompts_by_script.most_common(4)
    shown = ", ".join(f"{name} {count / total:.0%}" for name, count in top)
    rest = total - sum(count for _, count in top)
    return shown + (f", others {rest / total:.0%}" if rest else "")


def mix_rows(status: dict[str, Any], records: RecordSeries) -> list[MixRow]:
    """One row per dataset: those the run froze (``status``), then any only records name."""
    datasets: dict[str, Any] = dict(status.get("datasets") or {})
    names = [*datasets, *(name for name in records.datasets if name not in datasets)]
    rows = []
    for name in names:
        counts = datasets.get(name) or {}
        series = records.datasets.get(name)
        duplicates = (counts.get("skipped_reasons") or {}).get("duplicate", 0)
        skipped = counts.get("skipped")
        rows.append(
            MixRow(
                name,
                (
                    name,
                    _count(counts.get("planned")),
                    _count(counts.get("written", series.records if series else None)),
                    f"{_count(skipped)} ({duplicates:,})" if skipped is not None else "?",
                    _count(counts.get("failed")),
                    _percentiles(series.prompt_tokens) if series else "-",
                    _percentiles(series.completion_tokens) if series else "-",
                    _thinking(series),
                    _turns(series),
                    _scripts(series),
                ),
            )
        )
    return rows


def mix_table(status: dict[str, Any], records: RecordSeries) -> str:
    """The section's HTML: a table, or one line saying there is nothing to show yet."""
    rows = mix_rows(status, records)
    caption = (
        "Per dataset of the run. Skipped counts what the plan left out, duplicates (a prompt "
        "an earlier row had planned) in brackets. Lengths in tokens; the thinking share is "
        "output ids inside think blocks; turns are the assistant turns regenerated per "
        "conversation (mean, then conversations by turns); writing systems are the shares of "
        "prompts by the script most of the newest user message's letters are in."
    )
    if not records.records:
        return '<p class="missing">No record yet: nothing to measure per dataset.</p>'
    head = "".join(f"<th>{escape(column)}</th>" for column in COLUMNS)
    body = "".join(
        f'<tr data-dataset="{escape(row.dataset)}">'
        + "".join(f"<td>{escape(cell)}</td>" for cell in row.cells)
        + "</tr>"
        for row in rows
    )
    return (
        f'<p class="caption">{escape(caption)}</p>'
        f'<table class="mix"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
    )
