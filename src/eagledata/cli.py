"""The typer shell: parse flags, call the library, print one line on failure."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from eagledata.config import AppConfig, default_config_path, load_config
from eagledata.errors import EagledataError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Token-faithful EAGLE-3 drafter data from an SGLang server, bf16 KV cache enforced.",
)

T = TypeVar("T")
EXIT_INTERRUPTED = 130


def fail(error: EagledataError) -> None:
    typer.echo(f"eagledata: error: {error}", err=True)
    raise typer.Exit(error.exit_code)


def guarded(action: Callable[[], T]) -> T:
    """Run ``action``; our errors become one line on stderr and their exit code."""
    try:
        return action()
    except EagledataError as error:
        fail(error)
        raise AssertionError("unreachable") from None
    except KeyboardInterrupt:
        typer.echo("eagledata: interrupted", err=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None


ConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        help="TOML config (default: $EAGLEDATA_CONFIG or ./configs/eagledata.toml)",
        dir_okay=False,
    ),
]
ServerOpt = Annotated[
    list[str] | None, typer.Option("--server", "-s", help="SGLang server URL; repeat for several")
]
ProgressOpt = Annotated[bool, typer.Option("--progress/--no-progress", help="Show the live bar")]


def _load(config_path: Path | None, overrides: dict[str, Any]) -> AppConfig:
    return load_config(config_path or default_config_path(), overrides)


def _finish(summary: Any) -> None:
    typer.echo(summary.render())
    if summary.interrupted:
        raise typer.Exit(EXIT_INTERRUPTED)


@app.command()
def generate(
    dataset: Annotated[
        str,
        typer.Option(
            "--dataset", "-d", help="Config dataset name, a .jsonl/.json/.parquet file, or a hub id"
        ),
    ],
    config: ConfigOpt = None,
    server: ServerOpt = None,
    tokenizer: Annotated[str | None, typer.Option(help="Tokenizer hub id or local dir")] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Run directory")] = None,
    limit: Annotated[int | None, typer.Option(help="Use only the first N rows")] = None,
    max_new_tokens: Annotated[int | None, typer.Option(help="Tokens to generate at most")] = None,
    concurrency: Annotated[int | None, typer.Option(help="Requests in flight")] = None,
    samples: Annotated[int | None, typer.Option(help="Samples per prompt")] = None,
    progress: ProgressOpt = True,
) -> None:
    """Generate completions for a dataset into a run directory (continues it if it exists)."""
    from eagledata import pipeline

    overrides = {
        "server.urls": server or None,
        "tokenizer.name": tokenizer,
        "run.limit": limit,
        "generation.max_new_tokens": max_new_tokens,
        "generation.samples_per_prompt": samples,
        "run.concurrency": concurrency,
    }
    if server:  # an explicit --server replaces the simulated one of a demo config
        overrides["server.simulated.enabled"] = False
    summary = guarded(
        lambda: pipeline.generate(_load(config, overrides), dataset, out, progress=progress)
    )
    _finish(summary)


@app.command()
def resume(
    run_dir: Annotated[Path, typer.Argument(help="The run directory to continue")],
    server: ServerOpt = None,
    concurrency: Annotated[int | None, typer.Option(help="Requests in flight")] = None,
    progress: ProgressOpt = True,
) -> None:
    """Continue a run with its frozen settings; only servers and concurrency may change."""
    from eagledata import pipeline

    summary = guarded(
        lambda: pipeline.resume(
            run_dir, server_urls=server, concurrency=concurrency, progress=progress
        )
    )
    _finish(summary)


@app.command()
def status(run_dir: Annotated[Path, typer.Argument(help="A run directory")]) -> None:
    """Planned, written, failed, skipped and left; tokens; recent rate; ETA."""
    from eagledata.verify import run_status

    typer.echo(guarded(lambda: run_status(run_dir)).render())


@app.command()
def verify(run_dir: Annotated[Path, typer.Argument(help="A run directory")]) -> None:
    """Check every line, unique ids, token counts, and that counts reconcile with the plan."""
    from eagledata.verify import verify_run

    report = guarded(lambda: verify_run(run_dir))
    for note in report.notes:
        typer.echo(f"note: {note}")
    for problem in report.problems:
        typer.echo(f"problem: {problem}")
    verdict = "ok" if report.ok else f"{len(report.problems)} problem(s)"
    typer.echo(f"{report.records:,} records, {report.failures:,} failures: {verdict}")
    if not report.ok:
        raise typer.Exit(1)


@app.command("sim-server")
def sim_server(
    host: Annotated[str, typer.Option(help="Bind address (loopback by default)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port; 0 picks a free one")] = 30000,
    tokenizer: Annotated[str | None, typer.Option(help="Tokenizer dir used to decode text")] = None,
    kv_cache_dtype: Annotated[str, typer.Option(help="Reported --kv-cache-dtype")] = "bf16",
    latency: Annotated[float, typer.Option(help="Seconds per request")] = 0.0,
    option: Annotated[
        list[str] | None,
        typer.Option("--set", help="Any SimConfig field as KEY=JSON, e.g. --set fail_503_rate=0.1"),
    ] = None,
) -> None:
    """Run the simulated SGLang server (tests, demo, benchmarks)."""
    import orjson

    from eagledata.config import resolve_bundled
    from eagledata.simserver import SimConfig, run_sim_server

    def build() -> SimConfig:
        fields: dict[str, Any] = {"kv_cache_dtype": kv_cache_dtype, "latency_s": latency}
        if tokenizer:
            fields["tokenizer_path"] = resolve_bundled(tokenizer)
        for pair in option or []:
            key, _, raw = pair.partition("=")
            try:
                fields[key] = orjson.loads(raw)
            except orjson.JSONDecodeError:
                fields[key] = raw
        try:
            return SimConfig(**fields)
        except ValueError as exc:
            from eagledata.errors import ConfigError

            raise ConfigError(f"sim-server: {exc}".replace("\n", " ")) from None

    sim_config = guarded(build)
    run_sim_server(sim_config, host, port)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)


if __name__ == "__main__":
    main()
