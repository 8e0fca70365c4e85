"""Gather, draw, assemble, and write the report atomically (a reader never sees half a file)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from eagledata.report.page import render_page
from eagledata.report.plots_dist import (
    answer_length_plot,
    failures_plot,
    outcomes_plot,
    prompt_answer_plot,
)
from eagledata.report.plots_time import canary_plot, load_plot, throughput_plot
from eagledata.report.plotting import Plot
from eagledata.report.rundata import RunData, gather
from eagledata.run.writer import storage_error


def draw(data: RunData) -> list[list[Plot]]:
    """The report's plots, in reading order; a row of two is shown side by side."""
    return [
        [throughput_plot(data)],
        [load_plot(data)],
        [answer_length_plot(data), prompt_answer_plot(data)],
        [outcomes_plot(data)],
        [canary_plot(data)],
        [failures_plot(data)],
    ]


def report_html(run_dir: Path) -> str:
    data = gather(run_dir)
    return render_page(data, draw(data))


def build_report(run_dir: Path, out: Path | None = None) -> Path:
    """Write the report of ``run_dir`` to ``out`` (default ``RUN_DIR/report.html``)."""
    target = out if out is not None else run_dir / "report.html"
    html = report_html(run_dir)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(html, encoding="utf-8")
        os.replace(tmp, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise storage_error("write the report to", target, exc) from None
    return target
