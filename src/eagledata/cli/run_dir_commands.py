"""The commands that read run directories: ``status``, ``verify``, ``report``, ``export``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from eagledata.cli.shell import guarded
from eagledata.export.formats import FORMATS

FORMAT_HELP = "; ".join(f"{name}: {form.summary}" for name, form in FORMATS.items())
"""``--format``'s help, from the formats' registry (``export/formats.py``)."""


def status(
    run_dir: Annotated[Path, typer.Argument(help="A run directory")],
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON object (schema: docs/run-directory.md)")
    ] = False,
) -> None:
    """Planned, written, failed, skipped and left; tokens; rate; ETA; flags and canary."""
    from eagledata.rundir.status import run_status

    report = guarded(lambda: run_status(run_dir))
    if as_json:
        import orjson

        typer.echo(orjson.dumps(report.to_json()).decode())
    else:
        typer.echo(report.render())
    if report.mismatch:  # the counts cannot be trusted: say so in the exit code too
        raise typer.Exit(1)


def verify(
    run_dir: Annotated[Path, typer.Argument(help="A run directory")],
    full: Annotated[
        bool, typer.Option("--full", help="Read every line of every shard, not their indexes")
    ] = False,
    repair: Annotated[
        bool,
        typer.Option(
            "--repair",
            help="Move every unreadable line into RUN_DIR/quarantine.jsonl and rebuild the "
            "indexes; resume then generates those items again",
        ),
    ] = False,
) -> None:
    """Check unique ids, token counts, and that counts reconcile with the plan."""
    from eagledata.rundir.verify import repair_run, verify_run

    if repair:
        repaired = guarded(lambda: repair_run(run_dir))
        typer.echo(repaired.render(run_dir))
        return
    report = guarded(lambda: verify_run(run_dir, full=full))
    for note in report.notes:
        typer.echo(f"note: {note}")
    for problem in report.problems:
        typer.echo(f"problem: {problem}")
    verdict = "ok" if report.ok else f"{len(report.problems)} problem(s)"
    typer.echo(f"{report.records:,} records, {report.failures:,} failures: {verdict}")
    if not report.ok:
        raise typer.Exit(1)


def report(
    run_dir: Annotated[Path, typer.Argument(help="A run directory (in progress or finished)")],
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="HTML file (default: RUN_DIR/report.html)")
    ] = None,
) -> None:
    """Draw the run: tok/s, KV usage, answer lengths, flags, canary, failures, in one HTML file."""
    from eagledata.report import build_report

    written = guarded(lambda: build_report(run_dir, out))
    typer.echo(f"report: {written}")


def export(
    run_dirs: Annotated[list[Path], typer.Argument(help="Run directories, into one output")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output file (a folder for hf)")],
    format: Annotated[str, typer.Option("--format", "-f", help=FORMAT_HELP)] = "ids",
    keep: Annotated[
        list[str] | None,
        typer.Option(help="Keep records with this flag (empty, degenerate are left out); repeat"),
    ] = None,
    max_length: Annotated[
        int | None, typer.Option(help="Leave out (and count) rows longer than this")
    ] = None,
    tokenizer: Annotated[
        str | None, typer.Option(help="Tokenizer for conversations/text (default: the run's)")
    ] = None,
    force: Annotated[bool, typer.Option(help="Replace an existing output")] = False,
    token_counts: Annotated[
        bool, typer.Option(help="Also write counts of the supervised token ids")
    ] = False,
    draft_vocab_size: Annotated[
        int | None,
        typer.Option(help="Also write SpecForge's d2t/t2d vocab mapping (needs torch)"),
    ] = None,
) -> None:
    """Hand the exact ids to a trainer: SpecForge, speculators, HF datasets."""
    from eagledata.export import ExportOptions, export_runs

    options = ExportOptions(
        format=format,
        keep=tuple(keep or ()),
        max_length=max_length,
        tokenizer=tokenizer,
        force=force,
        token_counts=token_counts,
        draft_vocab_size=draft_vocab_size,
    )
    report = guarded(lambda: export_runs(run_dirs, out, options))
    typer.echo(report.render())
