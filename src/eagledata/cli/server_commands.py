"""The commands about servers besides launching one: ``check-server``, ``plan``, ``sim-server``
(``launch-server`` is ``launch_commands``)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from eagledata.cli.shell import (
    ConfigOpt,
    ModelOpt,
    ProfilesDirOpt,
    ServerOpt,
    auth_headers,
    guarded,
    load_app_config,
    server_settings,
)
from eagledata.config import ServerSettings
from eagledata.profiles.releases import release_names


def check_server(
    url: Annotated[str, typer.Argument(help="Server URL, e.g. http://127.0.0.1:30000")],
    config: ConfigOpt = None,
    model: ModelOpt = None,
    expected_model: Annotated[str | None, typer.Option(help="Refuse another model")] = None,
    bf16_bytes_per_token: Annotated[
        int | None, typer.Option(help="The model's bf16 KV bytes/token (Kimi-K2.5: 70272)")
    ] = None,
    timeout: Annotated[
        float,
        typer.Option(min=0.1, help="Seconds for the server's whole answer (not each read)"),
    ] = 30.0,
) -> None:
    """Print a server's facts and the bf16 verdict; exit non-zero if it would be refused."""
    import httpx

    from eagledata.server.facts_report import format_facts
    from eagledata.server.readiness import check_running_server

    def check() -> tuple[Any, Any]:
        server = server_settings(config, model)
        with httpx.Client(
            timeout=httpx.Timeout(30.0, connect=5.0), headers=auth_headers(server)
        ) as http:
            return check_running_server(
                http,
                url.rstrip("/"),
                expected_model=expected_model or server.expected_model,
                bf16_bytes_per_token=bf16_bytes_per_token or server.bf16_kv_bytes_per_token,
                kv_heads=None if bf16_bytes_per_token else server.kv_heads,
                api_key_env=server.api_key_env,
                deadline_s=timeout,
            )

    facts, verdict = guarded(check)
    typer.echo(format_facts(facts, verdict))
    if not verdict.ok:
        raise typer.Exit(4)


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
    model: ModelOpt = None,
) -> None:
    """Compare profiles side by side on a rig: KV tokens, concurrency, tok/s, wall clock.

    With --model: profiles derived for that model on the rig (its layouts, its KV cell, its
    weights), every assumption named, instead of the shipped Kimi-K2.5 profiles."""
    import httpx

    from eagledata.capacity import REFERENCE_WORKLOAD, render_plan_table
    from eagledata.capacity.derived import derive_profiles
    from eagledata.capacity.plan_row import written_for
    from eagledata.capacity.planning import build_plan, measure_workload, profiles_for
    from eagledata.errors import ConfigError
    from eagledata.profiles.loading import load_profiles, shared_prefix
    from eagledata.profiles.profile import Profile
    from eagledata.profiles.rigs import get_rig, reference_rig
    from eagledata.profiles.target import resolve_target
    from eagledata.server.readiness import fetch_server_info
    from eagledata.server.serverfacts import ServerFacts
    from eagledata.source.mix import resolve_mix

    def build() -> str:
        target = get_rig(rig) if rig is not None else reference_rig()
        if model is not None and profile:
            raise ConfigError("plan: --model derives its own profiles; drop --profile")
        if dataset:
            app_config = load_app_config(config, {"generation.turns": turns}, model)
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
        settings = server_settings(config) if server else ServerSettings()
        with httpx.Client(
            timeout=httpx.Timeout(30.0, connect=5.0), headers=auth_headers(settings)
        ) as http:
            for url in server or []:
                info = fetch_server_info(http, url.rstrip("/"), settings.api_key_env)
                live.append((url, ServerFacts.from_server_info(info)))
        elsewhere: list[Profile] = []
        written_here: list[str] = []
        if model is not None:
            planned = derive_profiles(resolve_target(model), target)
        else:
            every = load_profiles(None, profiles_dir)
            here, others = profiles_for(target, every)
            # a profile named by the label this rig's table shows (tp8 under "profiles
            # kimi-k25-*")
            prefix = shared_prefix([p.name for p in here])
            labels = {p.name[len(prefix) :]: p.name for p in here}
            named = [labels.get(name, name) for name in profile or []]
            profiles = load_profiles(named, profiles_dir) if profile else every
            # the profiles named are planned whatever rigs they are written for
            planned, elsewhere = (profiles, []) if profile else (here, others)
            written_here = [
                p.name for p in every if target.name in written_for(p) and not p.plan_only
            ]
        rows = build_plan(planned, workload, live, accept_length=accept_length, rig=target)
        if as_json:
            import json

            from eagledata.capacity.plan_json import plan_document

            document = plan_document(rows, workload, rig=target, elsewhere=elsewhere)
            return json.dumps(document, indent=1)
        return render_plan_table(
            rows, workload=workload, rig=target, elsewhere=elsewhere, written_here=written_here
        )

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
            f"/generate shapes ({', '.join(release_names())})",
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
