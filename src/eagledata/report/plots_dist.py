"""The data itself: answer lengths, prompt against answer, finish reasons, flags, failures."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from matplotlib.colors import LogNorm
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

from eagledata.report.plotting import (
    BLUE,
    INK,
    ORANGE,
    PURPLE,
    RED,
    new_figure,
    render,
    styled,
    thousands,
)
from eagledata.report.rundata import RunData
from eagledata.report.sections import Plot, missing, share
from eagledata.rundir.lines import FLAG_NAMES
from eagledata.rundir.percentile import percentile

# Flags a record may carry (docs/run-directory.md), drawn even at zero so a clean run shows it.
KNOWN_FLAGS = FLAG_NAMES
SCATTER_LIMIT = 5000  # above this many records a 2-D histogram says more than dots


def _lengths(data: RunData) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], Any]:
    prompts = np.frombuffer(data.records.prompt_tokens, dtype=np.int64)
    answers = np.frombuffer(data.records.completion_tokens, dtype=np.int64)
    cut = np.frombuffer(data.records.truncated, dtype=np.uint8).astype(bool)
    return prompts, answers, cut


def _log_axis(axis: Any) -> None:
    """Ticks at 1, 2 and 5 of each decade, labelled as plain numbers (1k, not 10^3)."""
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(thousands))
    axis.set_minor_formatter(NullFormatter())


def _log_edges(largest: float, per_decade: int = 12, smallest: float = 1) -> np.ndarray[Any, Any]:
    """Log-spaced bin edges from the decade holding ``smallest`` to just past ``largest``."""
    bottom = math.floor(math.log10(max(smallest, 1)))
    top = math.log10(max(largest, 2) * 1.15)
    return np.logspace(bottom, top, max(int((top - bottom) * per_decade), 8))


def answer_length_plot(data: RunData) -> Plot:
    key, title = "answer_lengths", "Answer length"
    if not data.records.records:
        return missing(key, title, "No records yet.")
    _, answers, cut = _lengths(data)
    limit = data.info.max_new_tokens
    edges = _log_edges(max(float(answers.max()), float(limit or 0)), smallest=answers.min())
    clipped = np.clip(answers, 1, None)
    with styled():
        figure = new_figure(3.2, 6.4)
        ax = figure.add_subplot()
        ax.hist(
            [clipped[~cut], clipped[cut]],
            bins=list(edges),
            stacked=True,
            color=[BLUE, RED],
            label=["stopped on its own", "cut at max_new_tokens"],
        )
        ax.set_xscale("log")
        _log_axis(ax.xaxis)
        ax.set_xlabel("output tokens per answer (log scale)")
        ax.set_ylabel("answers")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        lengths = [int(n) for n in answers]
        median = percentile(lengths, 0.5) or 0  # nearest rank, as status and the table say it
        ax.axvline(max(median, 1), color=INK, linestyle=":", linewidth=1, label=f"p50 {median:,}")
        if limit:
            ax.axvline(
                limit, color=RED, linestyle="--", linewidth=1.2, label=f"max_new_tokens {limit:,}"
            )
        ax.legend(loc="upper left")
        png = render(figure)
    truncated = int(cut.sum())
    p90 = percentile(lengths, 0.9) or 0
    caption = (
        f"{share(truncated, len(answers))} answers cut at max_new_tokens"
        + (f" ({limit:,})" if limit else "")
        + f"; p50 {median:,}, p90 {p90:,}, longest {int(answers.max()):,} tokens."
    )
    return Plot(key, title, caption, png, width_in=6.4)


def prompt_answer_plot(data: RunData) -> Plot:
    key, title = "prompt_vs_answer", "Prompt length against answer length"
    if not data.records.records:
        return missing(key, title, "No records yet.")
    prompts, answers, cut = _lengths(data)
    x, y = np.clip(prompts, 1, None), np.clip(answers, 1, None)
    limit = data.info.max_new_tokens
    with styled():
        figure = new_figure(3.2, 6.4)
        ax = figure.add_subplot()
        ax.set_xscale("log")
        ax.set_yscale("log")
        if len(x) <= SCATTER_LIMIT:
            ax.scatter(
                x[~cut],
                y[~cut],
                s=9,
                color=BLUE,
                alpha=0.6,
                linewidths=0,
                label="stopped on its own",
            )
            ax.scatter(
                x[cut],
                y[cut],
                s=12,
                color=RED,
                alpha=0.8,
                marker="x",
                linewidths=0.9,
                label="cut at max_new_tokens",
            )
        else:
            bins = (
                _log_edges(float(x.max()), 20, smallest=x.min()),
                _log_edges(float(y.max()), 20, smallest=y.min()),
            )
            _, _, _, image = ax.hist2d(x, y, bins=bins, norm=LogNorm(), cmap="viridis")
            figure.colorbar(image, ax=ax, label="answers per cell")
        if limit:
            ax.axhline(
                limit, color=RED, linestyle="--", linewidth=1, label=f"max_new_tokens {limit:,}"
            )
        _log_axis(ax.xaxis)
        _log_axis(ax.yaxis)
        ax.set_xlabel("prompt tokens (log scale)")
        ax.set_ylabel("output tokens (log scale)")
        ax.legend(loc="lower right")
        png = render(figure)
    correlation = (
        float(np.corrcoef(np.log(x), np.log(y))[0, 1])
        if len(x) > 2 and np.std(np.log(x)) > 0 and np.std(np.log(y)) > 0
        else float("nan")
    )
    caption = (
        f"{len(x):,} answers; prompts p50 {percentile(map(int, prompts), 0.5):,}, longest "
        f"{int(prompts.max()):,} tokens"
        + ("" if math.isnan(correlation) else f"; log-log correlation {correlation:.2f}")
        + "."
    )
    return Plot(key, title, caption, png, width_in=6.4)


def _bars(ax: Any, names: list[str], counts: list[int], total: int, colour: str) -> None:
    positions = np.arange(len(names))
    ax.barh(positions, counts, color=colour, height=0.6)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_yticks(positions, names)
    ax.invert_yaxis()
    ax.grid(axis="y", visible=False)
    top = max(counts, default=0) or 1
    ax.set_xlim(0, top * 1.45)
    for position, count in zip(positions, counts, strict=True):
        ax.text(count + top * 0.02, position, share(count, total), va="center", fontsize=8)


def outcomes_plot(data: RunData) -> Plot:
    key, title = "outcomes", "Finish reasons and record flags"
    records = data.records
    if not records.records:
        return missing(key, title, "No records yet.")
    reasons = sorted(records.finish_reasons.items(), key=lambda item: (-item[1], item[0]))
    has_flags = records.with_flags_field > 0
    with styled():
        rows = max(len(reasons), len(KNOWN_FLAGS) if has_flags else 0)
        figure = new_figure(0.9 + 0.3 * rows, 10.0 if has_flags else 6.4)
        axes = figure.subplots(1, 2 if has_flags else 1, squeeze=False)[0]
        _bars(
            axes[0], [name for name, _ in reasons], [n for _, n in reasons], records.records, BLUE
        )
        axes[0].set_title("finish reason", loc="left")
        axes[0].set_xlabel("answers")
        if has_flags:
            names = list(KNOWN_FLAGS) + sorted(set(records.flags) - set(KNOWN_FLAGS))
            _bars(
                axes[1],
                names,
                [records.flags.get(n, 0) for n in names],
                records.with_flags_field,
                PURPLE,
            )
            axes[1].set_title("record flags", loc="left")
            axes[1].set_xlabel("answers carrying the flag")
        png = render(figure)
    caption = "Shares are of all answers. " + (
        f"{share(records.flagged, records.with_flags_field)} answers carry at least one flag."
        if has_flags
        else "Flags: the records carry none (written before record flags existed)."
    )
    if has_flags and records.with_flags_field < records.records:
        caption += (
            f" {records.records - records.with_flags_field:,} older records carry no flags field."
        )
    return Plot(key, title, caption, png, width_in=10.0 if has_flags else 6.4)


def failures_plot(data: RunData) -> Plot:
    key, title = "failures", "Failures and skipped items by reason"
    reasons: dict[str, int] = data.status.get("failure_reasons") or {}
    if not reasons:
        return missing(
            key, title, "No failures and no skipped items: every item done has a record."
        )
    ordered = sorted(reasons.items(), key=lambda item: (-item[1], item[0]))
    total = sum(count for _, count in ordered)
    with styled():
        figure = new_figure(0.8 + 0.32 * len(ordered), 6.4)
        ax = figure.add_subplot()
        _bars(ax, [name for name, _ in ordered], [n for _, n in ordered], total, ORANGE)
        ax.set_xlabel("items")
        png = render(figure)
    failed, skipped = data.status.get("failed", 0), data.status.get("skipped", 0)
    caption = f"{failed:,} failed and {skipped:,} skipped; shares are of the {total:,} together."
    return Plot(key, title, caption, png, width_in=6.4)
