"""Gather, draw, assemble, and write the report atomically (a reader never sees half a file)."""

from __future__ import annotations

from pathlib import Path

from eagledata.atomic import atomic_path
from eagledata.errors import StorageError
from eagledata.report.page import render_page
from eagledata.report.rundata import RunData, gather
from eagledata.report.sections import Plot
from eagledata.rundir.manifest import RunDir


def draw(data: RunData) -> list[list[Plot]]:
    """The report's plots, in reading order; a row of two is shown side by side."""
    # matplotlib loads here, not at import: a wrong run directory or --out fails in an instant.
    from eagledata.report.plots_canary import canary_plot
    from eagledata.report.plots_dist import (
        answer_length_plot,
        failures_plot,
        outcomes_plot,
        prompt_answer_plot,
    )
    from eagledata.report.plots_time import load_plot, throughput_plot

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
    """Write the report of ``run_dir`` to ``out`` (default ``RUN_DIR/report.html``).

    The run directory and the output path are checked before anything is read or drawn; the
    page is written to a temporary name and renamed, so an open report is never half-written.
    """
    RunDir(run_dir).manifest()
    target = out if out is not None else run_dir / "report.html"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(target) as tmp, tmp.open("w", encoding="utf-8") as handle:
            handle.write(report_html(run_dir))
    except OSError as exc:
        raise _unwritable(target, exc) from None
    return target


def _unwritable(target: Path, exc: OSError) -> StorageError:
    reason = exc.strerror or str(exc)
    return StorageError(f"cannot write the report to {target}: {reason}; pass another --out")
