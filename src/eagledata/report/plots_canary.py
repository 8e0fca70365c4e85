"""The quality canary over time: each statistic against its threshold, verdicts marked."""

from __future__ import annotations

import math

import numpy as np

from eagledata.report.plotting import (
    GREEN,
    GREY,
    ORANGE,
    RED,
    as_datetimes,
    new_figure,
    render,
    styled,
    time_axis,
)
from eagledata.report.rundata import RunData
from eagledata.report.sections import Plot, missing

CANARY_COLOURS = {"pass": GREEN, "drift": RED, "mismatch": RED, "error": ORANGE}
SERVER_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


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
    closest: tuple[float, str, float] | None = None
    with styled():
        figure = new_figure(0.6 + 2.0 * rows)
        axes = figure.subplots(rows, columns, sharex=True, squeeze=False).ravel()
        for ax, name in zip(axes, names, strict=False):
            for marker, server in zip(SERVER_MARKERS * 4, servers, strict=False):
                points = [c for c in data.canary if c.server == server and name in c.stats]
                for verdict in sorted({c.verdict for c in points}):
                    chosen = [c for c in points if c.verdict == verdict]
                    ax.scatter(
                        as_datetimes([c.time for c in chosen]),
                        [c.stats[name] for c in chosen],
                        s=16,
                        marker=marker,
                        color=CANARY_COLOURS.get(verdict, GREY),
                        zorder=3,
                        edgecolors=["black" if c.kind == "baseline" else "none" for c in chosen],
                        label=f"{verdict}" + (f" ({server})" if len(servers) > 1 else ""),
                    )
                ax.plot(
                    as_datetimes([c.time for c in points]),
                    [c.stats[name] for c in points],
                    color=GREY,
                    linewidth=0.6,
                    zorder=2,
                )
            limits = [c for c in data.canary if name in c.thresholds]
            if limits:
                limit_times = as_datetimes([c.time for c in limits])
                values = np.array([c.thresholds[name] for c in limits])
                ax.step(
                    limit_times,
                    values,
                    where="post",
                    color=RED,
                    linestyle="--",
                    linewidth=1,
                    label="threshold",
                )
                if any(c.stats.get(name, 0.0) < 0 for c in limits):
                    ax.step(
                        limit_times, -values, where="post", color=RED, linestyle="--", linewidth=1
                    )
                for check in limits:
                    limit = check.thresholds[name]
                    if name in check.stats and limit > 0 and check.kind != "baseline":
                        ratio = abs(check.stats[name]) / limit
                        if closest is None or ratio > closest[0]:
                            closest = (ratio, name, check.time)
            ax.set_title(name.replace("_", " "), loc="left", fontsize=9)
            ax.set_ylabel("value")
            time_axis(ax)
            handles, labels = ax.get_legend_handles_labels()
            unique = dict(zip(labels, handles, strict=True))
            ax.legend(unique.values(), unique.keys(), loc="upper left", ncols=3)
        for ax in axes[len(names) :]:
            ax.set_visible(False)
        png = render(figure)
    checks = [c for c in data.canary if c.kind != "baseline"]
    failed = [c for c in checks if c.verdict != "pass"]
    caption = f"{len(checks):,} checks after the baseline, {len(failed)} not passed"
    if closest is not None:
        caption += (
            f"; highest against its threshold: {closest[1].replace('_', ' ')} at "
            f"{closest[0]:.0%} of it"
        )
    caption += ". Outlined points are baseline scorings."
    if failed:
        caption += f" Last failure: {failed[-1].verdict} on {failed[-1].server}"
        caption += f" ({failed[-1].reason})." if failed[-1].reason else "."
    return Plot(key, title, caption, png)
