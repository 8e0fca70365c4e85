"""``launch-server``: SGLang started from a profile (or one node of a multi-node server), or
sglang-router started in front of running servers (``--router``); each checked, served until
Ctrl-C or SIGTERM."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from eagledata.cli.interrupts import EXIT_INTERRUPTED
from eagledata.cli.shell import ModelOpt, ProfilesDirOpt, auth_headers, fail, guarded
from eagledata.config import ServerSettings

if TYPE_CHECKING:
    import subprocess


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
    model: ModelOpt = None,
    tp: Annotated[
        int, typer.Option(metavar="N", help="With --model: the TP size (GPUs of the server)")
    ] = 1,
    dp_attention: Annotated[
        int,
        typer.Option(
            metavar="D", help="With --model (MLA models): DP attention over D of the TP ranks"
        ),
    ] = 1,
    nnodes: Annotated[
        int,
        typer.Option(
            metavar="N", help="With --model: the server spans N nodes (TP ranks split evenly)"
        ),
    ] = 1,
) -> None:
    """Start SGLang from a profile (bf16 KV enforced); extra args after -- pass through.

    With --router URL...: start sglang-router in front of servers already running instead."""
    if not dry_run:  # a dry run starts nothing for SIGTERM to stop
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
    from eagledata.capacity.derived import derived_profile
    from eagledata.errors import ConfigError
    from eagledata.profiles.loading import DEFAULT_PROFILE, load_profile
    from eagledata.profiles.rigs import reference_rig
    from eagledata.profiles.target import resolve_target
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
    if model is not None and profile is not None:
        fail(ConfigError("launch-server: --model makes its own profile; drop --profile"))
    chosen = guarded(
        lambda: (
            load_profile(profile or DEFAULT_PROFILE, profiles_dir)
            if model is None
            else derived_profile(resolve_target(model), reference_rig(), tp, dp_attention, nnodes)
        )
    )
    node = guarded(lambda: chosen.node(node_rank, dist_init_addr))
    picked = (
        f" (derived from --model: TP {tp}, bf16 KV, --mem-fraction-static "
        f"{chosen.mem_fraction_static:g}; add SGLang flags after --)"
        if model is not None
        else ""
        if profile
        else " (the default; --profile NAME picks another)"
    )
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
        timeout=httpx.Timeout(30.0, connect=5.0), headers=auth_headers(ServerSettings())
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

    def announce() -> None:
        typer.echo(format_facts(result.facts, result.verdict))
        if not result.verdict.ok:
            raise typer.Exit(4)
        typer.echo(
            f"server ready at {result.base_url}; eagledata generate --server {result.base_url}"
        )

    serve_until_stopped(result.process, result.stop, announce)


def serve_until_stopped(
    process: subprocess.Popen[bytes],
    stop: Callable[[], int | None],
    announce: Callable[[], None],
) -> None:
    """Say what is ready, then serve until the process ends or we are stopped. A stop signal
    at any moment from here on, even while the verdicts print (a SIGTERM sent as soon as
    "ready" is read), stops what was started before launch-server exits."""
    try:
        announce()
        process.wait()
    except KeyboardInterrupt:
        stop()
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except BaseException:
        stop()
        raise
    if process.returncode:
        raise typer.Exit(process.returncode)


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
        timeout=httpx.Timeout(30.0, connect=5.0), headers=auth_headers(settings)
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

    def announce() -> None:
        for worker in result.workers:
            typer.echo(f"worker {worker.url}: {worker.verdict.summary()}")
        typer.echo(
            f"router ready at {result.url} over {len(result.workers)} workers, each checked; "
            f"eagledata generate --server {result.url}"
        )

    serve_until_stopped(result.process, result.stop, announce)
