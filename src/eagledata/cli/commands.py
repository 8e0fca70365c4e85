"""The typer app: every command registered, in the order ``--help`` lists them.

The commands live by what they act on (``data_commands``: work sent to a server;
``run_dir_commands``: run directories read; ``server_commands``: servers checked, planned or
simulated; ``launch_commands``: servers launched); ``shell`` holds what they share.
``eagledata.cli.main`` starts it.
"""

from __future__ import annotations

from typing import Annotated

import typer

from eagledata import __version__
from eagledata.cli.data_commands import canary, generate, resume
from eagledata.cli.launch_commands import launch_server
from eagledata.cli.run_dir_commands import export, report, status, verify
from eagledata.cli.server_commands import check_server, plan, sim_server
from eagledata.cli.shell import PlainHelpCommand

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    # Plain click help: rich's boxed tables squeeze option names and their text into slivers
    # at 80 columns ("--draft-vocab-s…") and print "<bool>" for flags.
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    help="Token-faithful EAGLE-3 drafter data from an SGLang server, bf16 KV cache enforced.",
)


def _version(shown: bool) -> None:
    if shown:
        typer.echo(f"eagledata {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", is_eager=True, callback=_version, help="Print the version and exit"
        ),
    ] = False,
) -> None:
    """Token-faithful EAGLE-3 drafter data from an SGLang server, bf16 KV cache enforced."""


app.command(cls=PlainHelpCommand)(generate)
app.command(cls=PlainHelpCommand)(resume)
app.command(cls=PlainHelpCommand)(status)
app.command(cls=PlainHelpCommand)(canary)
app.command(cls=PlainHelpCommand)(verify)
app.command(cls=PlainHelpCommand)(report)
app.command("check-server", cls=PlainHelpCommand)(check_server)
# extra arguments after -- pass through to SGLang
app.command(
    "launch-server",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    cls=PlainHelpCommand,
)(launch_server)
app.command(cls=PlainHelpCommand)(plan)
app.command("sim-server", cls=PlainHelpCommand)(sim_server)
app.command(cls=PlainHelpCommand)(export)
