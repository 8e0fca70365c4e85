"""What every plot shares: the look, time axes relative to the run's start, PNG rendering.

matplotlib through its object API (``Figure``, rendered by the Agg canvas), never ``pyplot``: no
global state, no GUI backend, nothing that needs a display.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
from matplotlib import rc_context
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from eagledata.report.sections import WIDTH_IN

# Colours that stay apart for colour-blind readers (Okabe-Ito), one meaning each in every plot.
BLUE = "#0072B2"
ORANGE = "#E69F00"
GREEN = "#009E73"
RED = "#D55E00"
PURPLE = "#CC79A7"
SKY = "#56B4E9"
GREY = "#7f7f7f"
INK = "#222222"

STYLE: dict[str, Any] = {
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.labelsize": 9,
    "axes.edgecolor": "#999999",
    "axes.labelcolor": INK,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#dddddd",
    "grid.linewidth": 0.6,
    "xtick.color": "#444444",
    "ytick.color": "#444444",
    "legend.fontsize": 8,
    "legend.frameon": False,
}
DPI = 144  # drawn at twice the CSS size they are shown at: sharp on a laptop's screen


def styled() -> AbstractContextManager[None]:
    """The report's look, for the figures drawn inside it (matplotlib's rc_context)."""
    return rc_context(cast(Any, STYLE))


def new_figure(height_in: float, width_in: float = WIDTH_IN) -> Figure:
    figure = Figure(figsize=(width_in, height_in), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def render(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI, facecolor="white", metadata={"Software": None})
    return buffer.getvalue()


@dataclass(frozen=True)
class RunClock:
    """Time axes in the run's own time: seconds, minutes or hours since it started (a wall
    clock's dates say little about a run of seconds, and nothing shared across runs)."""

    origin: float
    """Unix seconds of the run's start: every plot of one report counts from it."""
    unit_s: float
    unit: str

    @classmethod
    def spanning(cls, origin: float, end: float) -> RunClock:
        span = max(end - origin, 0.0)
        if span < 300:
            return cls(origin, 1.0, "seconds")
        if span < 5 * 3600:
            return cls(origin, 60.0, "minutes")
        return cls(origin, 3600.0, "hours")

    def x(self, times: Sequence[float] | np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        return (np.asarray(times, dtype=np.float64) - self.origin) / self.unit_s

    def axis(self, ax: Axes) -> None:
        ax.set_xlabel(f"{self.unit} since the run started")


def thousands(value: float, _position: object = None) -> str:
    if abs(value) >= 1e6:
        return f"{value / 1e6:g}M"
    if abs(value) >= 1e4:
        return f"{value / 1e3:g}k"
    return f"{value:,.0f}" if value == int(value) else f"{value:g}"
