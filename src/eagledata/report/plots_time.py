"""The run over time: output tok/s with KV checks and reconnects, and server load."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from eagledata.report.plotting import (
    BLUE,
    GREEN,
    INK,
    ORANGE,
    PURPLE,
    RED,
    SKY,
    RunClock,
    new_figure,
    render,
    styled,
    thousands,
)
from eagledata.report.rundata import LoadSeries, RunData
from eagledata.report.sections import Plot, duration, missing
from eagledata.rundir.rates import MIN_RATED_S, TOO_SHORT
from eagledata.server.load_signals import routes_named

# Bin widths for the rate plot, seconds: the smallest that leaves at most MAX_BINS bins.
BIN_WIDTHS = (
    0.01,
    0.02,
    0.05,
    0.1,
    0.2,
    0.5,
    1,
    2,
    5,
    10,
    15,
    30,
    60,
    120,
    300,
    600,
    900,
    1800,
    3600,
    7200,
    10800,
    21600,
    43200,
)
MAX_BINS = 150
MAX_LOAD_PANELS = 8
MIN_LOAD_SAMPLES = 3
"""Fewer samples than this draw no picture: their numbers say more than a chart of a point."""


def rate_bins(
    times: np.ndarray[Any, Any], tokens: np.ndarray[Any, Any], start: float, end: float
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], float]:
    """Output tokens per second in fixed bins of completion time: (bin starts, tok/s, width).

    A record counts in the bin where it completed; a bin in which nothing completed (the run
    paused, a server down) shows 0, not a line drawn across the gap.
    """
    span = max(end - start, 1e-9)
    width = next((w for w in BIN_WIDTHS if span / w <= MAX_BINS), None)
    if width is None:
        width = math.ceil(span / MAX_BINS / 86400) * 86400
    origin = math.floor(start / width) * width  # bins on round clock times
    count = int((end - origin) // width) + 1
    index = ((times - origin) // width).astype(np.int64)
    sums = np.bincount(index, weights=tokens, minlength=count)[:count]
    return origin + np.arange(count) * width, sums / width, float(width)


def throughput_plot(data: RunData) -> Plot:
    key, title = "throughput", "Output tokens per second"
    times = np.frombuffer(data.records.created_at, dtype=np.float64)
    tokens = np.frombuffer(data.records.completion_tokens, dtype=np.int64).astype(np.float64)
    dated = times > 0
    if dated.sum() < 2:
        why = (
            "No records yet: the rate is drawn once two answers have completed."
            if data.records.records < 2
            else "The records carry no completion time (created_at): written before it existed."
        )
        return missing(key, title, why)
    times, tokens = times[dated], tokens[dated]
    first, last = float(times.min()), float(times.max())
    rates = data.status.get("tok_s") or {}
    overall = rates.get("overall")
    if overall is None:  # the one definition (rundir/rates.py) says the run is too short
        active = float(rates.get("active_s") or 0.0)
        return missing(
            key,
            title,
            f"{data.records.records:,} answers, {int(tokens.sum()):,} output tokens over "
            f"{active:,.1f} s of active time: {TOO_SHORT} (rates need {MIN_RATED_S:g} s), so no "
            "rate is drawn.",
        )
    # From the first answer (what precedes it is start-up: the KV checks and the canary's
    # baseline) to the last answer or the last event after it: a server that came back, or was
    # refused, after the last answer is part of the story.
    events = [c.time for c in data.checks] + [r.time for r in data.reconnects]
    start, end = first, max([last, *events])
    starts, rate, width = rate_bins(times, tokens, start, end)
    clock = RunClock.spanning(*data.span())
    with styled():
        figure = new_figure(3.3)
        ax = figure.add_subplot()
        edges = clock.x(np.append(starts, starts[-1] + width))
        ax.stairs(rate, edges, fill=True, color=BLUE, alpha=0.25, linewidth=0)
        ax.stairs(rate, edges, color=BLUE, linewidth=1.2, label=f"output tok/s per {width:g} s")
        if overall > 0:
            ax.axhline(
                overall,
                color=INK,
                linestyle="--",
                linewidth=1,
                label=f"run {overall:,.0f} tok/s (over its active time)",
            )
        ax.set_ylabel("output tokens / s")
        ax.yaxis.set_major_formatter(thousands)
        ax.set_ylim(bottom=0, top=max(float(rate.max()), overall) * 1.25 or 1.0)
        _mark_checks(ax, data, clock, start - width, end + width)
        ax.set_xlim(edges[0], edges[-1])
        clock.axis(ax)
        ax.legend(loc="upper left", ncols=4)
        png = render(figure)
    refused = sum(1 for c in data.checks if not c.ok)
    caption = (
        f"{data.records.records:,} answers completed over {duration(last - first)}; "
        f"each bar is the output tokens of the answers that completed in it. "
        f"{len(data.checks):,} KV checks ({refused} refused), "
        f"{len(data.reconnects)} server reconnect{'' if len(data.reconnects) == 1 else 's'} marked."
    )
    return Plot(key, title, caption, png)


def _mark_checks(ax: Any, data: RunData, clock: RunClock, start: float, end: float) -> None:
    """KV checks as ticks along the bottom (green passed, red refused), reconnects as lines."""
    checks = [c for c in data.checks if start <= c.time <= end]
    passed = [c.time for c in checks if c.ok]
    refused = [c.time for c in checks if not c.ok]
    transform = ax.get_xaxis_transform()  # x in data, y in axes fraction
    if passed:
        ax.vlines(
            clock.x(passed),
            0,
            0.04,
            transform=transform,
            color=GREEN,
            linewidth=0.8,
            label="KV check passed",
        )
    if refused:
        ax.vlines(
            clock.x(refused),
            0,
            1,
            transform=transform,
            color=RED,
            linewidth=1.5,
            label="KV check refused",
        )
    back = [r for r in data.reconnects if start <= r.time <= end]
    if back:
        ax.vlines(
            clock.x([r.time for r in back]),
            0,
            1,
            transform=transform,
            color=ORANGE,
            linestyle=":",
            linewidth=1.5,
            label="server back / restart",
        )


def load_plot(data: RunData) -> Plot:
    key, title = "load", "Server load: KV cache usage, running and queued requests"
    if not data.load:
        return missing(
            key,
            title,
            "No server load samples: the run directory has no telemetry.jsonl "
            "(a run made before load telemetry existed).",
        )
    labels = sorted(data.load)
    usable = [
        label
        for label in labels
        if _has_any(data.load[label].token_usage) or _has_any(data.load[label].running)
    ]
    if not usable:
        return missing(
            key,
            title,
            "telemetry.jsonl holds no KV usage or running counts: the servers exported no load "
            f"endpoint ({routes_named(last='or')}).",
        )
    samples = sum(len(data.load[label].time) for label in usable)
    if samples < MIN_LOAD_SAMPLES * len(usable):
        return missing(key, title, _few_samples(data, usable))
    shown = usable[:MAX_LOAD_PANELS]
    clock = RunClock.spanning(*data.span())
    with styled():
        figure = new_figure(1.0 + 2.1 * len(shown))
        axes = figure.subplots(len(shown), 1, sharex=True, squeeze=False)[:, 0]
        for ax, label in zip(axes, shown, strict=True):
            _load_panel(ax, data.load[label], label, clock)
        clock.axis(axes[-1])
        png = render(figure)
    retractions = sum(_retractions(data.load[label]) for label in labels)
    peak = max(_peak(data.load[label].token_usage) for label in labels)
    samples = sum(len(data.load[label].time) for label in labels)
    caption = (
        f"{samples:,} sample{'s' if samples != 1 else ''} from "
        f"{len(labels)} server{'s' if len(labels) != 1 else ''}; peak KV usage {peak:.0%}; "
        f"{retractions:,.0f} retraction{'s' if retractions != 1 else ''}."
    )
    if len(usable) > len(shown):
        caption += f" Showing the first {len(shown)} of {len(usable)} servers/ranks."
    return Plot(key, title, caption, png)


def _few_samples(data: RunData, labels: list[str]) -> str:
    """Too few samples for a chart: their numbers, and why there is no picture."""
    parts = []
    for label in labels:
        series = data.load[label]
        last = len(series.time) - 1
        usage, running, queued = (
            series.token_usage[last],
            series.running[last],
            series.queued[last],
        )
        numbers = [f"KV {usage:.0%}" if math.isfinite(usage) else "KV unknown"]
        numbers += [f"{running:.0f} running"] if math.isfinite(running) else []
        numbers += [f"{queued:.0f} queued"] if math.isfinite(queued) else []
        samples = f"{len(series.time)} sample{'s' if len(series.time) != 1 else ''}"
        parts.append(f"{label}: {samples}, last {', '.join(numbers)}")
    return (
        "; ".join(parts)
        + f". Too few samples to draw (a chart needs {MIN_LOAD_SAMPLES} per server): the run "
        "was shorter than a few sample periods (load.telemetry_interval_s)."
    )


def _has_any(values: Any) -> bool:
    return bool(np.isfinite(np.frombuffer(values, dtype=np.float64)).any())


def _peak(values: Any) -> float:
    array = np.frombuffer(values, dtype=np.float64)
    finite = array[np.isfinite(array)]
    return float(finite.max()) if finite.size else 0.0


def _retraction_events(series: LoadSeries) -> np.ndarray[Any, Any]:
    """Retractions per sample. ``num_retracted_reqs`` counts a lane's retractions since its
    session started: each sample adds its increase, and a drop means a new session (a resume),
    whose count started again from zero."""
    values = np.nan_to_num(np.frombuffer(series.retracted, dtype=np.float64))
    if not values.size:
        return values
    steps = np.diff(values, prepend=0.0)
    return np.where(steps < 0, values, steps)


def _retractions(series: LoadSeries) -> float:
    return float(_retraction_events(series).sum())


MAX_LOAD_POINTS = 1500  # per panel: more than a 1000-pixel-wide axis can show


def load_columns(series: LoadSeries) -> dict[str, np.ndarray[Any, Any]]:
    """A series' columns in time order, averaged into at most MAX_LOAD_POINTS time bins (a
    sample every 5 s for 57 h is 41k points); retractions are summed per bin, not averaged."""
    order = np.argsort(np.frombuffer(series.time, dtype=np.float64), kind="stable")
    columns = {
        name: np.frombuffer(getattr(series, name), dtype=np.float64)[order]
        for name in ("time", "token_usage", "running", "queued", "target")
    }
    columns["retractions"] = _retraction_events(series)[order]
    times = columns["time"]
    if len(times) <= MAX_LOAD_POINTS:
        return columns
    width = max((times[-1] - times[0]) / MAX_LOAD_POINTS, 1e-9)
    index = np.minimum(((times - times[0]) / width).astype(np.int64), MAX_LOAD_POINTS - 1)
    counts = np.bincount(index, minlength=MAX_LOAD_POINTS)
    binned = {"time": times[0] + np.arange(MAX_LOAD_POINTS) * width}
    binned["retractions"] = np.bincount(
        index, weights=columns["retractions"], minlength=MAX_LOAD_POINTS
    )
    for name in ("token_usage", "running", "queued", "target"):
        values = columns[name]
        finite = np.isfinite(values)
        sums = np.bincount(index[finite], weights=values[finite], minlength=MAX_LOAD_POINTS)
        seen = np.bincount(index[finite], minlength=MAX_LOAD_POINTS)
        with np.errstate(invalid="ignore", divide="ignore"):
            binned[name] = np.where(seen > 0, sums / np.maximum(seen, 1), np.nan)
    keep = counts > 0
    return {name: values[keep] for name, values in binned.items()}


def _load_panel(ax: Any, series: LoadSeries, label: str, clock: RunClock) -> None:
    columns = load_columns(series)
    times = clock.x(columns["time"])
    usage = columns["token_usage"] * 100
    ax.fill_between(times, usage, color=SKY, alpha=0.35, linewidth=0, step="post")
    ax.step(times, usage, where="post", color=BLUE, linewidth=1, label="KV usage %")
    ax.set_ylim(0, 105)
    ax.set_ylabel("KV usage (%)")
    ax.set_title(label, loc="left", fontsize=9)
    twin = ax.twinx()
    twin.grid(False)
    twin.spines["right"].set_visible(True)
    for name, colour, text, style in (
        ("running", GREEN, "running requests", "-"),
        ("queued", ORANGE, "queued requests", "-"),
        ("target", PURPLE, "eagledata's target in flight", "--"),
    ):
        values = columns[name]
        if np.isfinite(values).any():
            twin.step(
                times, values, where="post", color=colour, linewidth=1, linestyle=style, label=text
            )
    twin.set_ylabel("requests")
    twin.set_ylim(bottom=0)
    hit = columns["retractions"] > 0
    if hit.any():
        ax.scatter(
            times[hit],
            np.full(int(hit.sum()), 100.0),
            marker="v",
            color=RED,
            s=18,
            zorder=5,
            label="retraction",
            clip_on=False,
        )
    handles, labels = ax.get_legend_handles_labels()
    more_handles, more_labels = twin.get_legend_handles_labels()
    ax.legend(handles + more_handles, labels + more_labels, loc="lower left", ncols=5)
