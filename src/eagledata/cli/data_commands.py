"""The commands that send work to a server: ``generate``, ``resume`` and ``canary``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from eagledata.cli.shell import (
    ChatTemplateOpt,
    ConcurrencyOpt,
    ConfigOpt,
    ModelOpt,
    ProgressOpt,
    ServerOpt,
    finish_run,
    guarded,
    load_app_config,
    read_chat_template,
)
from eagledata.source.formats import suffixes

DATASET_HELP = (
    f"Config dataset or mix name, a {'/'.join(suffixes())} file, or a hub id; repeat it for one "
    "run of several datasets"
)
"""``--dataset``'s help, from the data files' registry (``source/formats.py``)."""


def generate(
    dataset: Annotated[
        list[str],
        typer.Option(
            "--dataset",
            "-d",
            metavar="NAME|PATH",
            help=DATASET_HELP,
        ),
    ],
    config: ConfigOpt = None,
    model: ModelOpt = None,
    server: ServerOpt = None,
    tokenizer: Annotated[
        str | None, typer.Option(metavar="NAME|DIR", help="Tokenizer hub id or local dir")
    ] = None,
    chat_template: ChatTemplateOpt = None,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", metavar="DIR", help="Run directory")
    ] = None,
    limit: Annotated[
        int | None, typer.Option(metavar="N", help="Use only the first N rows")
    ] = None,
    max_new_tokens: Annotated[
        int | None, typer.Option(metavar="N", help="Tokens to generate at most")
    ] = None,
    concurrency: ConcurrencyOpt = None,
    samples: Annotated[int | None, typer.Option(metavar="N", help="Samples per prompt")] = None,
    turns: Annotated[
        str | None,
        typer.Option(
            metavar="last|all",
            help="Regenerate the last assistant turn of each conversation (default), or all of "
            "them in order, each prompted with the regenerated answers before it",
        ),
    ] = None,
    progress: ProgressOpt = True,
    no_canary: Annotated[
        bool, typer.Option("--no-canary", help="No logprob canary (frozen for the run)")
    ] = False,
    canary_baseline: Annotated[
        Path | None,
        typer.Option(help="A shared canary baseline (eagledata canary) instead of a new one"),
    ] = None,
) -> None:
    """Generate completions for a dataset into a run directory (continues it if it exists)."""
    from eagledata.run import pipeline

    overrides = {
        "canary.enabled": False if no_canary else None,
        "canary.baseline": str(canary_baseline) if canary_baseline else None,
        "server.urls": server or None,
        "tokenizer.name": tokenizer,
        "tokenizer.chat_template": guarded(lambda: read_chat_template(chat_template)),
        "run.limit": limit,
        "generation.max_new_tokens": max_new_tokens,
        "generation.samples_per_prompt": samples,
        "generation.turns": turns,
        "run.concurrency": concurrency,
    }
    if server:  # an explicit --server replaces the simulated one of a demo config
        overrides["server.simulated.enabled"] = False
    summary = guarded(
        lambda: pipeline.generate(
            load_app_config(config, overrides, model), dataset, out, progress=progress
        )
    )
    finish_run(summary)


def resume(
    run_dir: Annotated[Path, typer.Argument(help="The run directory to continue")],
    server: ServerOpt = None,
    concurrency: ConcurrencyOpt = None,
    retry_failed: Annotated[
        bool, typer.Option(help="Generate the items in failures.jsonl again (not the skipped)")
    ] = False,
    progress: ProgressOpt = True,
) -> None:
    """Continue a run with its frozen settings; only servers and concurrency may change."""
    from eagledata.run import pipeline

    summary = guarded(
        lambda: pipeline.resume(
            run_dir,
            server_urls=server,
            concurrency=concurrency,
            retry_failed=retry_failed,
            progress=progress,
        )
    )
    finish_run(summary)


def canary(
    out: Annotated[Path, typer.Option("--out", "-o", help="Where to write the baseline/results")],
    dataset: Annotated[
        str | None,
        typer.Option("--dataset", "-d", help="Draw the canary's prompts from this dataset"),
    ] = None,
    against: Annotated[
        Path | None,
        typer.Option(help="Score the server against this baseline instead (calibration)"),
    ] = None,
    checks: Annotated[int, typer.Option(help="With --against: how many checks")] = 6,
    config: ConfigOpt = None,
    model: ModelOpt = None,
    server: ServerOpt = None,
    tokenizer: Annotated[
        str | None, typer.Option(metavar="NAME|DIR", help="Tokenizer hub id or local dir")
    ] = None,
    chat_template: ChatTemplateOpt = None,
) -> None:
    """Record a canary baseline from a server you trust (for --canary-baseline), or score a
    server against one (--against; docs/quality.md, calibration)."""
    from eagledata.errors import ConfigError
    from eagledata.quality.canary_cli import record_baseline, score_against

    overrides: dict[str, Any] = {
        "server.urls": server or None,
        "tokenizer.name": tokenizer,
        "tokenizer.chat_template": guarded(lambda: read_chat_template(chat_template)),
    }
    if server:
        overrides["server.simulated.enabled"] = False

    def act() -> str:
        if against is not None:
            return score_against(load_app_config(config, overrides, model), against, checks, out)
        if dataset is None:
            raise ConfigError("canary: pass --dataset NAME to record a baseline, or --against FILE")
        return record_baseline(load_app_config(config, overrides, model), dataset, out)

    typer.echo(guarded(act))
