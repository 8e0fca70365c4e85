"""What every command shares: one stderr line per error and its exit code, the common
options, the config a command loads (and its server settings, the API key's header), and the end
of a run's output."""

from __future__ import annotations

import os
import re
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from typer.core import TyperCommand

from eagledata.cli.interrupts import EXIT_INTERRUPTED, hand_back
from eagledata.config import (
    DEFAULT_CONFIG_ENV,
    AppConfig,
    ServerSettings,
    default_config_path,
    load_config,
)
from eagledata.errors import ConfigError, EagledataError, RunDirError

T = TypeVar("T")


def fail(error: EagledataError) -> None:
    typer.echo(f"eagledata: error: {error}", err=True)
    raise typer.Exit(error.exit_code)


def guarded(action: Callable[[], T]) -> T:
    """Run ``action``; our errors become one line on stderr and their exit code. A Ctrl-C is
    the action's own again (``cli.main`` made it quiet while the command started)."""
    hand_back()
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
        metavar="FILE",
        help="TOML config (default: $EAGLEDATA_CONFIG, ./configs/eagledata.toml, else shipped)",
        dir_okay=False,
    ),
]
ServerOpt = Annotated[
    list[str] | None,
    typer.Option("--server", "-s", metavar="URL", help="SGLang server URL; repeat for several"),
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
ModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        metavar="DIR|NAME",
        help="The target model: its folder (config.json and tokenizer files) or a hub name in the "
        "local cache. Gives the tokenizer, the expected model and the KV bytes per token; a config "
        "file read with it (--config, $EAGLEDATA_CONFIG) still overrides each of them",
    ),
]
ChatTemplateOpt = Annotated[
    Path | None,
    typer.Option(
        "--chat-template",
        metavar="FILE",
        help="A Jinja chat template instead of the tokenizer's own (a model without one); "
        "frozen with the run",
        dir_okay=False,
    ),
]
ProfilesDirOpt = Annotated[
    Path | None,
    typer.Option(
        metavar="DIR",
        help="Profiles folder (default: ./configs/profiles, else the shipped profiles)",
    ),
]


FLAG_NAMES = {
    "canary.enabled": "--no-canary",
    "canary.baseline": "--canary-baseline",
    "server.urls": "--server",
    "tokenizer.name": "--tokenizer",
    "tokenizer.chat_template": "--chat-template",
    "run.limit": "--limit",
    "generation.max_new_tokens": "--max-new-tokens",
    "generation.samples_per_prompt": "--samples",
    "generation.turns": "--turns",
    "run.concurrency": "--concurrency",
}
"""The flag that sets each override, so a bad value is blamed on the flag, not the file."""


def config_path_for(config_path: Path | None, model: str | None) -> Path | None:
    """The config file a command reads: ``--config``; else ``$EAGLEDATA_CONFIG``; else, without
    ``--model``, ``./configs/eagledata.toml`` or the shipped one (both are the Kimi-K2.5
    reference job's). With ``--model`` and neither named, no file: the model says the rest."""
    if config_path is not None:
        return config_path
    if model is not None:
        env = os.environ.get(DEFAULT_CONFIG_ENV)
        return Path(env) if env else None
    return default_config_path()


def model_settings(model: str | None) -> dict[str, Any]:
    """What ``--model`` gives a run (dotted keys, beneath the config file's own)."""
    if model is None:
        return {}
    from eagledata.profiles.target import resolve_target

    return resolve_target(model).settings()


def read_chat_template(path: Path | None) -> str | None:
    """The text of ``--chat-template FILE``; ``ConfigError`` naming the file if unreadable."""
    if path is None:
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"--chat-template {path}: cannot read it: {error}") from None
    if not text.strip():
        raise ConfigError(f"--chat-template {path}: the file is empty")
    return text


def load_app_config(
    config_path: Path | None, overrides: dict[str, Any], model: str | None = None
) -> AppConfig:
    return load_config(
        config_path_for(config_path, model), overrides, FLAG_NAMES, model_settings(model)
    )


def server_settings(config_path: Path | None, model: str | None = None) -> ServerSettings:
    """The config's server settings (the model and bf16 bytes/token the guard expects, the
    API key's variable) over what ``--model`` says, the defaults when there is neither."""
    path = config_path_for(config_path, model)
    defaults = model_settings(model)
    if path is None and not defaults:
        return ServerSettings()
    server_keys = {k: v for k, v in defaults.items() if k.startswith("server.")}
    # the tokenizer is not read here: only [server] is wanted of the file
    placeholder = {"tokenizer.name": "-"}
    return load_config(path, defaults=server_keys | placeholder).server


def auth_headers(server: ServerSettings) -> dict[str, str]:
    """The bearer header every command sends (``server.api_key_env``), if the key is set."""
    key = os.environ.get(server.api_key_env)
    return {"Authorization": f"Bearer {key}"} if key else {}


EXIT_NOTHING_WRITTEN = 7


def finish_run(summary: Any) -> None:
    typer.echo(summary.render())
    if summary.mismatch:
        typer.echo(f"eagledata: error: {summary.mismatch}", err=True)
        raise typer.Exit(RunDirError.exit_code)
    if summary.interrupted:
        raise typer.Exit(EXIT_INTERRUPTED)
    if summary.all_failed:
        typer.echo(f"eagledata: error: {summary.all_failed}", err=True)
        raise typer.Exit(EXIT_NOTHING_WRITTEN)


TYPE_METAVARS = {"int": "N", "float": "NUMBER", "str": "TEXT", "path": "PATH", "file": "FILE"}
"""The value a user types, by typer's type label (``<int>``, ``<list[Path]>``); an option's own
metavar wins."""


class PlainHelpCommand(TyperCommand):
    """Help in a user's words: ``RUN_DIR...`` and ``--profile TEXT``, not typer's
    ``{run_dirs}...`` and ``<list[str]>`` (Python types); a --flag/--no-flag pair shows no
    default, which at 80 columns broke as ``[default: no-`` / ``force]``."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if param.param_type_name == "argument":
                label = argument_label(param)
                pieces.append(label if param.required else f"[{label}]")
        return pieces

    def format_options(self, ctx: Any, formatter: Any) -> None:
        arguments: list[tuple[str, str]] = []
        options: list[tuple[str, str]] = []
        for param in self.get_params(ctx):
            if param.param_type_name == "argument":
                text = getattr(param, "help", None) or ""
                if param.required:
                    text = f"{text}  [required]" if text else "[required]"
                arguments.append((argument_label(param), text))
            elif param.param_type_name == "option":
                record = param.get_help_record(ctx)
                if record is not None:
                    options.append(plain_option_record(param, record))
        if arguments:
            with formatter.section("Arguments"):
                write_dl(formatter, arguments)
        if options:
            with formatter.section("Options"):
                write_dl(formatter, options)


def write_dl(formatter: Any, rows: list[tuple[str, str]], col_max: int = 30) -> None:
    """click's definition list, wrapped at spaces only: click's wrapper breaks at hyphens too,
    and a name like ``rtx-pro-6000x8`` came out as ``rtx-`` / ``pro-6000x8``."""
    first_col = min(max(len(first) for first, _ in rows), col_max) + 2
    indent = " " * formatter.current_indent
    width = max(formatter.width - first_col - 2, 10)
    for first, second in rows:
        formatter.write(f"{indent}{first}")
        if not second:
            formatter.write("\n")
            continue
        if len(first) <= first_col - 2:
            formatter.write(" " * (first_col - len(first)))
        else:
            formatter.write("\n" + " " * (first_col + formatter.current_indent))
        lines = textwrap.wrap(second, width, break_on_hyphens=False, break_long_words=False)
        formatter.write(f"{lines[0] if lines else ''}\n")
        for line in lines[1:]:
            formatter.write(f"{indent}{' ' * first_col}{line}\n")


def argument_label(param: Any) -> str:
    label = str(param.metavar or param.name or "").upper()
    return f"{label}..." if param.nargs != 1 else label


def user_words(label: str) -> str:
    """typer's type label in a user's words: ``list[Path]`` -> ``PATH``, ``int`` -> ``N``."""
    inner = re.fullmatch(r"list\[(.*)\]", label)
    bare = inner.group(1) if inner else label
    return TYPE_METAVARS.get(bare.lower(), bare.upper() if "|" not in bare else bare)


def plain_option_record(param: Any, record: tuple[str, str]) -> tuple[str, str]:
    """typer's record with the user's words: ``<list[str]>`` -> ``TEXT``; a flag pair's default
    left out (the pair says both ways)."""
    names, text = record
    names = re.sub(r" <([^>]*)>(\.\.\.)?$", lambda m: " " + user_words(m.group(1)), names)
    if param.is_flag and param.secondary_opts:
        text = re.sub(r"\s*\[default: [^\]]*\]", "", text)
    return names, text
