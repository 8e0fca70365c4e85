"""The quality canary over time: each statistic against its threshold, verdicts marked."""

from __future__ import annotations

import math

import numpy as np

from eagledata.report.plotting import (
    GREEN,
    GREY,
    ORANGE,
    RED,
    RunClock,
    new_figure,
    render,
    styled,
)
from eagledata.report.rundata import CanaryCheck, RunData
from eagledata.report.sections import Plot, missing

CANARY_COLOURS = {"pass": GREEN, "drift": RED, "mismatch": RED, "error": ORANGE}
# The statistics that fire when they fall below their threshold (eagledata.quality.canary_stats
# .fired: a logprob drop, greedy probes diverging sooner); the others fire above it.
FIRES_BELOW = frozenset({"mean_shift", "greedy_divergence"})


def toward_threshold(name: str, value: float, limit: float) -> float | None:
    """How far a statistic has gone toward firing: 1.0 at its threshold, above 1 past it, 0 or
    less on the safe side. None when the threshold is 0 (nothing to compare against)."""
    if limit == 0:
        return None
    if name in FIRES_BELOW and limit > 0:  # healthy values are high: firing is falling to limit
        return limit / value if value > 0 else math.inf
    return value / limit  # a signed limit (mean_shift's is negative) keeps its direction


SERVER_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
MIN_POINTS = 3
"""Fewer scorings than this draw no picture: their verdicts are listed instead."""


def _verdicts(checks: list[CanaryCheck], failed: list[CanaryCheck]) -> str:
    if not checks:
        return "No check after the baseline yet"
    if not failed:
        return f"All {len(checks):,} checks after the baseline passed"
    return f"{len(failed):,} of {len(checks):,} checks after the baseline did not pass"


def _few_checks(data: RunData) -> str:
    checks = [c for c in data.canary if c.kind != "baseline"]
    failed = [c for c in checks if c.verdict != "pass"]
    baseline = len(data.canary) - len(checks)
    return (
        f"{_verdicts(checks, failed)}; {baseline} baseline scoring{'s' if baseline != 1 else ''}. "
        f"Too few scorings to draw (a chart needs {MIN_POINTS})."
    )


def canary_plot(data: RunData) -> Plot:
    key, title = "canary", "Quality canary: statistics against their thresholds"
    if not data.canary:
        return missing(
            key,
            title,
            "No canary checks: the run has no quality.jsonl (run with --no-canary, or made before "
            "the canary existed).",
        )
    names = sorted(
        {name for check in data.canary for name in check.thresholds}
        | {name for check in data.canary for name in check.stats}
    )
    if not names:
        return missing(key, title, "quality.jsonl holds verdicts but no statistics to draw.")
    servers = sorted({check.server for check in data.canary})
    columns = 2 if len(names) > 1 else 1
    rows = math.ceil(len(names) / columns)
    checks = [c for c in data.canary if c.kind != "baseline"]
    if len(data.canary) < MIN_POINTS:
        return missing(key, title, _few_checks(data))
    closest: tuple[float, str, float, float] | None = None
    clock = RunClock.spanning(*data.span())
    with styled():
        figure = new_figure(0.6 + 2.0 * rows)
        axes = figure.subplots(rows, columns, squeeze=False).ravel()
        for ax, name in zip(axes, names, strict=False):
            for marker, server in zip(SERVER_MARKERS * 4, servers, strict=False):
                points = [c for c in data.canary if c.server == server and name in c.stats]
                for verdict in sorted({c.verdict for c in points}):
                    chosen = [c for c in points if c.verdict == verdict]
                    ax.scatter(
                        clock.x([c.time for c in chosen]),
                        [c.stats[name] for c in chosen],
                        s=16,
                        marker=marker,
                        color=CANARY_COLOURS.get(verdict, GREY),
                        zorder=3,
                        edgecolors=["black" if c.kind == "baseline" else "none" for c in chosen],
                        label=f"{verdict}" + (f" ({server})" if len(servers) > 1 else ""),
                    )
                ax.plot(
                    clock.x([c.time for c in points]),
                    [c.stats[name] for c in points],
                    color=GREY,
                    linewidth=0.6,
                    zorder=2,
                )
            limits = [c for c in data.canary if name in c.thresholds]
            if limits:
                limit_times = clock.x([c.time for c in limits])
                values = np.array([c.thresholds[name] for c in limits])
                below = name in FIRES_BELOW
                ax.step(
                    limit_times,
                    values,
                    where="post",
                    color=RED,
                    linestyle="--",
                    linewidth=1,
                    label=f"threshold (fires {'below' if below else 'above'})",
                )
                for check in limits:
                    limit = check.thresholds[name]
                    if name not in check.stats or check.kind == "baseline":
                        continue
                    ratio = toward_threshold(name, check.stats[name], limit)
                    if ratio is not None and (closest is None or ratio > closest[0]):
                        closest = (ratio, name, check.stats[name], limit)
            ax.set_title(name.replace("_", " "), loc="left", fontsize=9)
            ax.set_ylabel("value")
            clock.axis(ax)
            handles, labels = ax.get_legend_handles_labels()
            unique = dict(zip(labels, handles, strict=True))
            ax.legend(unique.values(), unique.keys(), loc="best", ncols=3)
        for ax in axes[len(names) :]:
            ax.set_visible(False)
        png = render(figure)
    failed = [c for c in checks if c.verdict != "pass"]
    caption = _verdicts(checks, failed)
    if closest is not None:
        ratio, name, value, limit = closest
        caption += (
            f"; the closest any statistic came to its threshold: {name.replace('_', ' ')} "
            f"{value:.3g} against {limit:.3g} ({ratio:.0%} of the way)"
        )
    caption += ". Outlined points are baseline scorings."
    if failed:
        caption += f" Last failure: {failed[-1].verdict} on {failed[-1].server}"
        caption += f" ({failed[-1].reason})." if failed[-1].reason else "."
    return Plot(key, title, caption, png)
