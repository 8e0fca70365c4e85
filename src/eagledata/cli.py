"""The typer shell: parse flags, call the library, print one line on failure."""

from __future__ import annotations

import os
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
        help="TOML config (default: $EAGLEDATA_CONFIG, ./configs/eagledata.toml, else shipped)",
        dir_okay=False,
    ),
]
ServerOpt = Annotated[
    list[str] | None, typer.Option("--server", "-s", help="SGLang server URL; repeat for several")
]
ProgressOpt = Annotated[bool, typer.Option("--progress/--no-progress", help="Show the live bar")]
ConcurrencyOpt = Annotated[
    str | None,
    typer.Option(
        metavar="auto|N",
        help="Requests in flight: 'auto' (default) sizes them from the server's KV load; N is a "
        "fixed cap",
    ),
]


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
    concurrency: ConcurrencyOpt = None,
    samples: Annotated[int | None, typer.Option(help="Samples per prompt")] = None,
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
    _finish(summary)


@app.command()
def status(
    run_dir: Annotated[Path, typer.Argument(help="A run directory")],
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON object (schema: docs/run-directory.md)")
    ] = False,
) -> None:
    """Planned, written, failed, skipped and left; tokens; rate; ETA; flags and canary."""
    from eagledata.run.status import run_status

    report = guarded(lambda: run_status(run_dir))
    if as_json:
        import orjson

        typer.echo(orjson.dumps(report.to_json()).decode())
    else:
        typer.echo(report.render())


@app.command()
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
    server: ServerOpt = None,
    tokenizer: Annotated[str | None, typer.Option(help="Tokenizer hub id or local dir")] = None,
) -> None:
    """Record a canary baseline from a server you trust (for --canary-baseline), or score a
    server against one (--against; docs/quality.md, calibration)."""
    from eagledata.errors import ConfigError
    from eagledata.run.canary_cli import record_baseline, score_against

    overrides: dict[str, Any] = {"server.urls": server or None, "tokenizer.name": tokenizer}
    if server:
        overrides["server.simulated.enabled"] = False

    def act() -> str:
        if against is not None:
            return score_against(_load(config, overrides), against, checks, out)
        if dataset is None:
            raise ConfigError("canary: pass --dataset NAME to record a baseline, or --against FILE")
        return record_baseline(_load(config, overrides), dataset, out)

    typer.echo(guarded(act))


@app.command()
def verify(
    run_dir: Annotated[Path, typer.Argument(help="A run directory")],
    full: Annotated[
        bool, typer.Option("--full", help="Read every line of every shard, not their indexes")
    ] = False,
) -> None:
    """Check unique ids, token counts, and that counts reconcile with the plan."""
    from eagledata.run.verify import verify_run

    report = guarded(lambda: verify_run(run_dir, full=full))
    for note in report.notes:
        typer.echo(f"note: {note}")
    for problem in report.problems:
        typer.echo(f"problem: {problem}")
    verdict = "ok" if report.ok else f"{len(report.problems)} problem(s)"
    typer.echo(f"{report.records:,} records, {report.failures:,} failures: {verdict}")
    if not report.ok:
        raise typer.Exit(1)


@app.command()
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


def _guard_targets(config_path: Path | None) -> tuple[str | None, int | None]:
    """The model and bf16 bytes/token the guard expects, from the config when there is one."""
    path = config_path or default_config_path()
    if path is None:
        return None, None
    server = load_config(path).server
    return server.expected_model, server.bf16_kv_bytes_per_token


@app.command("check-server")
def check_server(
    url: Annotated[str, typer.Argument(help="Server URL, e.g. http://127.0.0.1:30000")],
    config: ConfigOpt = None,
    expected_model: Annotated[str | None, typer.Option(help="Refuse another model")] = None,
    bf16_bytes_per_token: Annotated[
        int | None, typer.Option(help="The model's bf16 KV bytes/token (Kimi-K2.5: 70272)")
    ] = None,
) -> None:
    """Print a server's facts and the bf16 verdict; exit non-zero if it would be refused."""
    import httpx

    from eagledata.server.launch import check_running_server
    from eagledata.server.serverfacts import format_facts

    def check() -> tuple[Any, Any]:
        model, bytes_per_token = (None, None)
        if expected_model is None or bf16_bytes_per_token is None:
            model, bytes_per_token = _guard_targets(config)
        with httpx.Client(timeout=httpx.Timeout(30.0, connect=5.0)) as http:
            return check_running_server(
                http,
                url.rstrip("/"),
                expected_model=expected_model or model,
                bf16_bytes_per_token=bf16_bytes_per_token or bytes_per_token,
            )

    facts, verdict = guarded(check)
    typer.echo(format_facts(facts, verdict))
    if not verdict.ok:
        raise typer.Exit(4)


ProfilesDirOpt = Annotated[
    Path | None,
    typer.Option(help="Profiles folder (default: ./configs/profiles, else the shipped profiles)"),
]


@app.command(
    "launch-server",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)
def launch_server(
    ctx: typer.Context,
    profile: Annotated[str | None, typer.Option(help="Profile name or TOML path")] = None,
    dry_run: Annotated[bool, typer.Option(help="Print the exact command, start nothing")] = False,
    profiles_dir: ProfilesDirOpt = None,
    script: Annotated[
        Path | None,
        typer.Option(help="The launch script (default: ./scripts/launch_sglang.sh, else shipped)"),
    ] = None,
    deadline: Annotated[float, typer.Option(help="Seconds to wait for /health")] = 1800.0,
) -> None:
    """Start SGLang from a profile (bf16 KV enforced); extra args after -- pass through."""
    from eagledata.server.launch import (
        build_launch_command,
        default_script,
        format_command,
        launch_and_wait,
    )
    from eagledata.server.profiles import DEFAULT_PROFILE, load_profile
    from eagledata.server.serverfacts import format_facts

    extra = list(ctx.args)
    script = script or default_script()
    chosen = guarded(lambda: load_profile(profile or DEFAULT_PROFILE, profiles_dir))
    if dry_run:
        command = guarded(lambda: build_launch_command(chosen, extra, script=str(script)))
        typer.echo(format_command(command))
        return
    result = guarded(
        lambda: launch_and_wait(
            chosen,
            extra,
            script=script,
            deadline_s=deadline,
            on_progress=lambda line: typer.echo(line, err=True),
        )
    )
    typer.echo(format_facts(result.facts, result.verdict))
    if not result.verdict.ok:
        raise typer.Exit(4)
    typer.echo(f"server ready at {result.base_url}; eagledata generate --server {result.base_url}")
    try:
        result.process.wait()
    except KeyboardInterrupt:
        result.stop()
        raise typer.Exit(EXIT_INTERRUPTED) from None
    if result.process.returncode:
        raise typer.Exit(result.process.returncode)


@app.command()
def plan(
    profile: Annotated[
        list[str] | None, typer.Option(help="Profile to plan; repeat; default: all")
    ] = None,
    dataset: Annotated[
        str | None, typer.Option(help="Measure prompt lengths on this dataset (a sample)")
    ] = None,
    config: ConfigOpt = None,
    server: ServerOpt = None,
    sample_rows: Annotated[int, typer.Option(help="Prompts to tokenize for the sample")] = 2000,
    mean_output_tokens: Annotated[
        float | None, typer.Option(help="Expected mean answer length (default: max_new_tokens)")
    ] = None,
    profiles_dir: ProfilesDirOpt = None,
    accept_length: Annotated[
        float | None,
        typer.Option(
            help="Speculative acceptance (tokens per verify step); default: measured on "
            "--server, else the drafter card's (unverified)"
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object, for scripts")] = False,
) -> None:
    """Compare profiles side by side: KV tokens, concurrency, tok/s, wall clock."""
    import httpx

    from eagledata.capacity import REFERENCE_WORKLOAD, render_plan_table
    from eagledata.run.dataset import resolve_dataset
    from eagledata.run.planning import build_plan, measure_workload
    from eagledata.server.launch import fetch_server_info
    from eagledata.server.profiles import load_profiles
    from eagledata.server.serverfacts import ServerFacts

    def build() -> str:
        if dataset is not None:
            app_config = _load(config, {})
            workload = measure_workload(
                app_config,
                resolve_dataset(dataset, app_config.datasets),
                sample_rows=sample_rows,
                mean_output_tokens=mean_output_tokens,
            )
        elif mean_output_tokens is not None:
            workload = REFERENCE_WORKLOAD.model_copy(
                update={"mean_output_tokens": mean_output_tokens}
            )
        else:
            workload = REFERENCE_WORKLOAD
        live = []
        with httpx.Client(timeout=httpx.Timeout(30.0, connect=5.0)) as http:
            for url in server or []:
                facts = ServerFacts.from_server_info(fetch_server_info(http, url.rstrip("/")))
                live.append((url, facts))
        profiles = load_profiles(profile, profiles_dir)
        rows = build_plan(profiles, workload, live, accept_length=accept_length)
        if as_json:
            import json

            from eagledata.capacity.plan_json import plan_document

            return json.dumps(plan_document(rows, workload), indent=1)
        return render_plan_table(rows, workload=workload)

    typer.echo(guarded(build))


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


@app.command()
def export(
    run_dirs: Annotated[list[Path], typer.Argument(help="Run directories, into one output")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output file (a folder for hf)")],
    format: Annotated[
        str, typer.Option("--format", "-f", help="ids (token-faithful), hf, conversations, text")
    ] = "ids",
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


def main() -> None:
    # transformers warns at import that PyTorch is absent; eagledata needs only its tokenizers.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)


if __name__ == "__main__":
    main()
