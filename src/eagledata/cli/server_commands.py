"""The commands about servers: ``check-server``, ``launch-server``, ``plan``, ``sim-server``."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from eagledata.cli.interrupts import EXIT_INTERRUPTED
from eagledata.cli.shell import (
    ConfigOpt,
    ProfilesDirOpt,
    ServerOpt,
    fail,
    guarded,
    load_app_config,
)
from eagledata.config import ServerSettings, default_config_path, load_config


def _server_settings(config_path: Path | None) -> ServerSettings:
    """The config's server settings (the model and bf16 bytes/token the guard expects, the
    API key's variable), the defaults when there is no config."""
    path = config_path or default_config_path()
    if path is None:
        return ServerSettings()
    return load_config(path).server


def _auth_headers(server: ServerSettings) -> dict[str, str]:
    """The bearer header every command sends (``server.api_key_env``), if the key is set."""
    key = os.environ.get(server.api_key_env)
    return {"Authorization": f"Bearer {key}"} if key else {}


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

    from eagledata.server.facts_report import format_facts
    from eagledata.server.readiness import check_running_server

    def check() -> tuple[Any, Any]:
        server = _server_settings(config)
        with httpx.Client(
            timeout=httpx.Timeout(30.0, connect=5.0), headers=_auth_headers(server)
        ) as http:
            return check_running_server(
                http,
                url.rstrip("/"),
                expected_model=expected_model or server.expected_model,
                bf16_bytes_per_token=bf16_bytes_per_token or server.bf16_kv_bytes_per_token,
                api_key_env=server.api_key_env,
            )

    facts, verdict = guarded(check)
    typer.echo(format_facts(facts, verdict))
    if not verdict.ok:
        raise typer.Exit(4)


def launch_server(
    ctx: typer.Context,
    profile: Annotated[str | None, typer.Option(help="Profile name or TOML path")] = None,
    dry_run: Annotated[bool, typer.Option(help="Print the exact command, start nothing")] = False,
    sglang_version: Annotated[
        str | None,
        typer.Option(
            metavar="V",
            help="Render the profile for this SGLang release (default: the one installed for "
            "$SGLANG_PYTHON; with --dry-run and none installed, the newest the profile runs on)",
        ),
    ] = None,
    profiles_dir: ProfilesDirOpt = None,
    script: Annotated[
        Path | None,
        typer.Option(help="The launch script (default: ./scripts/launch_sglang.sh, else shipped)"),
    ] = None,
    deadline: Annotated[
        float,
        typer.Option(help="Seconds to wait for /health (--router: for every worker's health)"),
    ] = 1800.0,
    node_rank: Annotated[
        int | None,
        typer.Option(
            metavar="R",
            help="A multi-node profile: this node's rank (0 serves HTTP; 1.. join it)",
        ),
    ] = None,
    dist_init_addr: Annotated[
        str | None,
        typer.Option(
            metavar="HOST:PORT",
            help="A multi-node profile: node rank 0's address, the same on every node",
        ),
    ] = None,
    router: Annotated[
        list[str] | None,
        typer.Option(
            "--router",
            metavar="URL",
            help="Start sglang-router in front of these running servers (repeat), check every "
            "one's KV cache, and serve them as one URL",
        ),
    ] = None,
    router_port: Annotated[
        int, typer.Option(metavar="PORT", help="Where --router listens")
    ] = 30100,
    router_host: Annotated[
        str, typer.Option(metavar="HOST", help="Where --router binds")
    ] = "127.0.0.1",
) -> None:
    """Start SGLang from a profile (bf16 KV enforced); extra args after -- pass through.

    With --router URL...: start sglang-router in front of servers already running instead."""
    _stop_on_term()
    if router:
        _launch_router(
            router,
            host=router_host,
            port=router_port,
            dry_run=dry_run,
            deadline=deadline,
            extra=list(ctx.args),
            profile_given=profile is not None,
        )
        return
    from eagledata.profiles.loading import DEFAULT_PROFILE, load_profile
    from eagledata.server.facts_report import format_facts
    from eagledata.server.launch import (
        build_launch_command,
        default_script,
        format_command,
        launch_and_wait,
        node_note,
        start_process,
        stop_process,
    )
    from eagledata.server.launch_release import (
        choose_version,
        installed_sglang_version,
        sglang_python,
    )

    extra = list(ctx.args)
    script = script or default_script()
    chosen = guarded(lambda: load_profile(profile or DEFAULT_PROFILE, profiles_dir))
    node = guarded(lambda: chosen.node(node_rank, dist_init_addr))
    picked = "" if profile else " (the default; --profile NAME picks another)"
    python = sglang_python()
    installed = installed_sglang_version(python)
    version, note = guarded(
        lambda: choose_version(
            chosen, requested=sglang_version, installed=installed, python=python, dry_run=dry_run
        )
    )
    command = guarded(
        lambda: build_launch_command(chosen, extra, version=version, script=str(script), node=node)
    )
    typer.echo(f"profile {chosen.name}{picked}: {chosen.source}; {note}", err=True)
    if node is not None:
        typer.echo(node_note(chosen, node), err=True)
    if dry_run:
        typer.echo(format_command(command))
        return
    if node is not None and not node.serves_http:
        # no /health, no /server_info here: node rank 0 is what is waited on and checked
        typer.echo(f"starting: {format_command(command)}", err=True)
        process = guarded(lambda: start_process(command))
        try:
            process.wait()
        except KeyboardInterrupt:
            stop_process(process)
            raise typer.Exit(EXIT_INTERRUPTED) from None
        if process.returncode:
            raise typer.Exit(process.returncode)
        return
    import httpx

    # the server may be started with --api-key: its checks send the key as every command does
    with httpx.Client(
        timeout=httpx.Timeout(30.0, connect=5.0), headers=_auth_headers(ServerSettings())
    ) as http:
        result = guarded(
            lambda: launch_and_wait(
                chosen,
                extra,
                version=version,
                script=script,
                deadline_s=deadline,
                on_progress=lambda line: typer.echo(line, err=True),
                client=http,
                node=node,
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


def _stop_on_term() -> None:
    """SIGTERM (``kill``, ``scancel``, the end of a SLURM job) stops what launch-server started,
    as Ctrl-C does: a server or router in its own process group would outlive a plain exit."""
    import signal

    with contextlib.suppress(ValueError):  # not the main thread: signals are not ours
        signal.signal(signal.SIGTERM, signal.default_int_handler)


def _launch_router(
    workers: list[str],
    *,
    host: str,
    port: int,
    dry_run: bool,
    deadline: float,
    extra: list[str],
    profile_given: bool,
) -> None:
    """``launch-server --router URL...``: sglang-router in front of running servers, each
    worker's KV cache checked; it serves until Ctrl-C."""
    from eagledata.errors import ConfigError
    from eagledata.server.launch import format_command
    from eagledata.server.router import (
        build_router_command,
        launch_router,
        normalize_worker,
        router_python,
    )

    if profile_given:
        fail(ConfigError("--router starts a router in front of running servers: drop --profile"))
    if dry_run:
        command = guarded(
            lambda: build_router_command(
                [normalize_worker(w) for w in workers],
                host=host,
                port=port,
                python=router_python(),
                extra_args=extra,
            )
        )
        typer.echo(format_command(command))
        return
    import httpx

    settings = ServerSettings()
    with httpx.Client(
        timeout=httpx.Timeout(30.0, connect=5.0), headers=_auth_headers(settings)
    ) as http:
        result = guarded(
            lambda: launch_router(
                workers,
                host=host,
                port=port,
                extra_args=extra,
                deadline_s=deadline,
                client=http,
                on_progress=lambda line: typer.echo(line, err=True),
                api_key_env=settings.api_key_env,
            )
        )
    for worker in result.workers:
        typer.echo(f"worker {worker.url}: {worker.verdict.summary()}")
    typer.echo(
        f"router ready at {result.url} over {len(result.workers)} workers, each checked; "
        f"eagledata generate --server {result.url}"
    )
    try:
        result.process.wait()
    except KeyboardInterrupt:
        result.stop()
        raise typer.Exit(EXIT_INTERRUPTED) from None
    if result.process.returncode:
        raise typer.Exit(result.process.returncode)


def plan(
    profile: Annotated[
        list[str] | None, typer.Option(help="Profile to plan; repeat; default: all")
    ] = None,
    dataset: Annotated[
        list[str] | None,
        typer.Option(
            help="Measure prompt lengths on this dataset or mix (a sample); repeat for several. "
            "A dataset with turns = all counts one request per turn"
        ),
    ] = None,
    config: ConfigOpt = None,
    server: ServerOpt = None,
    sample_rows: Annotated[int, typer.Option(help="Prompts to tokenize for the sample")] = 2000,
    turns: Annotated[
        str | None,
        typer.Option(metavar="last|all", help="Plan for regenerating the last turn or all turns"),
    ] = None,
    mean_output_tokens: Annotated[
        float | None,
        typer.Option(
            metavar="N",
            help="Expected mean answer length (default: 4,500, the reference job's; with "
            "--dataset: that config's max_new_tokens)",
        ),
    ] = None,
    profiles_dir: ProfilesDirOpt = None,
    accept_length: Annotated[
        float | None,
        typer.Option(
            help="Speculative acceptance (tokens per verify step); default: measured on "
            "--server, else the drafter card's (unverified)"
        ),
    ] = None,
    rig: Annotated[
        str | None,
        typer.Option(
            metavar="NAME",
            help="The GPUs to plan for, from configs/rigs.toml (rtx-pro-6000x8, the reference, "
            "by default; also h100x8, h100x16, h200x8, b200x8)",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object, for scripts")] = False,
) -> None:
    """Compare profiles side by side on a rig: KV tokens, concurrency, tok/s, wall clock."""
    import httpx

    from eagledata.capacity import REFERENCE_WORKLOAD, render_plan_table
    from eagledata.capacity.planning import build_plan, measure_workload, profiles_for
    from eagledata.profiles.loading import load_profiles
    from eagledata.profiles.rigs import get_rig, reference_rig
    from eagledata.server.readiness import fetch_server_info
    from eagledata.server.serverfacts import ServerFacts
    from eagledata.source.mix import resolve_mix

    def build() -> str:
        target = get_rig(rig) if rig is not None else reference_rig()
        if dataset:
            app_config = load_app_config(config, {"generation.turns": turns})
            workload = measure_workload(
                app_config,
                resolve_mix(dataset, app_config),
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
        settings = _server_settings(config) if server else ServerSettings()
        with httpx.Client(
            timeout=httpx.Timeout(30.0, connect=5.0), headers=_auth_headers(settings)
        ) as http:
            for url in server or []:
                info = fetch_server_info(http, url.rstrip("/"), settings.api_key_env)
                live.append((url, ServerFacts.from_server_info(info)))
        profiles = load_profiles(profile, profiles_dir)
        # the profiles named are planned whatever rigs they are written for
        planned, elsewhere = (profiles, []) if profile else profiles_for(target, profiles)
        rows = build_plan(planned, workload, live, accept_length=accept_length, rig=target)
        if as_json:
            import json

            from eagledata.capacity.plan_json import plan_document

            document = plan_document(rows, workload, rig=target, elsewhere=elsewhere)
            return json.dumps(document, indent=1)
        return render_plan_table(rows, workload=workload, rig=target, elsewhere=elsewhere)

    typer.echo(guarded(build))


def sim_server(
    host: Annotated[str, typer.Option(help="Bind address (loopback by default)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port; 0 picks a free one")] = 30000,
    tokenizer: Annotated[str | None, typer.Option(help="Tokenizer dir used to decode text")] = None,
    kv_cache_dtype: Annotated[str, typer.Option(help="Reported --kv-cache-dtype")] = "bf16",
    sglang_version: Annotated[
        str,
        typer.Option(
            metavar="V",
            help="The SGLang release it speaks: its /server_info, /v1/loads, /metrics and "
            "/generate shapes (0.5.9, 0.5.15.post1, 0.5.23)",
        ),
    ] = "0.5.9",
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
        fields: dict[str, Any] = {
            "kv_cache_dtype": kv_cache_dtype,
            "latency_s": latency,
            "version": sglang_version,
        }
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
