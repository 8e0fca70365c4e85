"""An extension point's help comes from its registry: a format added to ``export/formats.py``
is offered by ``eagledata export --help`` with its one-line summary, with nothing else to edit."""

from __future__ import annotations

from typer.testing import CliRunner

from eagledata.cli import app
from eagledata.export.formats import FORMATS


def test_export_help_offers_every_registered_format_with_its_summary() -> None:
    result = CliRunner().invoke(app, ["export", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    flat = "".join(result.output.split())  # wrapped at any space or hyphen
    for name, form in FORMATS.items():
        assert "".join(f"{name}: {form.summary}".split()) in flat, name


def test_the_cli_reads_the_registry_without_loading_the_exporter() -> None:
    """Every command's start pays for the registry, not for the exporter behind it."""
    import subprocess
    import sys

    code = "import sys, eagledata.cli.commands; print('eagledata.export.exporter' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
