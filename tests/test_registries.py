"""An extension point's help and docs come from its registry: a format added to
``export/formats.py`` is offered by ``eagledata export --help`` with its one-line summary; a data
file type added to ``source/formats.py`` or a row shape to ``source/prompts.py`` is offered by
``--dataset``'s help, the errors and the docs' tables; a load signal added to
``server/load_signals.py`` is asked in its place and named by the docs and messages: nothing
else to edit, and nothing lists one that is not registered."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any, cast, get_args

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from conftest import sim_config
from eagledata.cli import app
from eagledata.cli.data_commands import DATASET_HELP
from eagledata.config import DatasetSettings, Schema
from eagledata.errors import BadRowError, DatasetError
from eagledata.export.formats import FORMATS
from eagledata.server import control
from eagledata.server.client import SGLangClient
from eagledata.server.load_signals import LOAD_SIGNALS, LoadSignal, routes_named
from eagledata.server.loads import LoadSource, RankLoad, ServerLoad
from eagledata.simserver import SimServerThread
from eagledata.source.dataset import resolve_dataset
from eagledata.source.formats import FILE_TYPES, suffixes
from eagledata.source.prompts import ROW_SCHEMAS, detect_schema


def test_export_help_offers_every_registered_format_with_its_summary() -> None:
    result = CliRunner().invoke(app, ["export", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    flat = "".join(result.output.split())  # wrapped at any space or hyphen
    for name, form in FORMATS.items():
        assert "".join(f"{name}: {form.summary}".split()) in flat, name


def test_the_docs_name_exactly_the_registered_export_formats() -> None:
    """docs/export.md's usage line and its table, and guide.md's table of lossy routes."""
    docs = Path(__file__).resolve().parent.parent / "docs"
    export = (docs / "export.md").read_text()
    usage = re.search(r"\[--format ([\w|]+)\]", export)
    assert usage and usage.group(1).split("|") == list(FORMATS)
    for text, header in (
        (export, "| format | PATH |"),
        ((docs / "guide.md").read_text(), "| `--format` |"),
    ):
        table = text[text.index(header) :].split("\n\n")[0]
        assert re.findall(r"^\| `(\w+)`", table, re.M) == list(FORMATS), header


def test_the_cli_reads_the_registry_without_loading_the_exporter() -> None:
    """Every command's start pays for the registry, not for the exporter behind it."""
    import subprocess
    import sys

    code = "import sys, eagledata.cli.commands; print('eagledata.export.exporter' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --- dataset formats: the data files (source/formats.py) and the row shapes (source/prompts.py)

SUFFIX_LIST = re.compile(r"`?\.[a-z]+`?(?:/`?\.[a-z]+`?)+")
"""A list of data-file suffixes as the docs and help write one: ``.jsonl/.json`` or
```.jsonl`/`.json```."""


def _listed_suffixes(text: str) -> list[list[str]]:
    return [re.findall(r"\.[a-z]+", match) for match in SUFFIX_LIST.findall(text)]


def test_dataset_help_offers_exactly_the_registered_file_types() -> None:
    result = CliRunner().invoke(app, ["generate", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    flat = "".join(result.output.split())
    assert "".join(DATASET_HELP.split()) in flat
    assert _listed_suffixes(DATASET_HELP) == [list(FILE_TYPES)]


def test_no_doc_lists_a_data_file_type_that_is_not_registered() -> None:
    root = Path(__file__).resolve().parent.parent
    docs = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    unregistered = [
        f"{doc.name}: {suffix}"
        for doc in docs
        for listed in _listed_suffixes(doc.read_text(encoding="utf-8"))
        for suffix in listed
        if suffix not in FILE_TYPES
    ]
    assert not unregistered


def test_the_docs_table_holds_exactly_the_registered_file_types_and_row_shapes() -> None:
    guide = (Path(__file__).resolve().parent.parent / "docs" / "guide.md").read_text()
    files = re.search(r"<!-- registry: dataset-files -->\n(.*?)<!-- /registry -->", guide, re.S)
    shapes = re.search(r"<!-- registry: row-schemas -->\n(.*?)<!-- /registry -->", guide, re.S)
    assert files and shapes
    assert re.findall(r"^\| `(\.\w+)`", files.group(1), re.M) == list(FILE_TYPES)
    assert re.findall(r"^\| `(\w+)`", shapes.group(1), re.M) == list(ROW_SCHEMAS)


def test_an_unsupported_file_is_refused_naming_exactly_the_registered_types(
    tmp_path: Path,
) -> None:
    odd = tmp_path / "rows.txt"
    odd.write_text("{}\n")
    with pytest.raises(DatasetError) as caught:
        resolve_dataset(str(odd), {})
    named = re.findall(r"\.[a-z]+", str(caught.value).split("; use ")[1])
    assert named == list(FILE_TYPES)


def test_a_mix_count_names_exactly_the_file_types_whose_rows_count_up_front(
    tmp_path: Path,
) -> None:
    from eagledata.config import MixMember
    from eagledata.source.mix import member_rows

    data = tmp_path / "rows.json"
    data.write_text('[{"prompt": "hi"}]')
    member = MixMember(name="rows", dataset=DatasetSettings(source=str(data)), rows=1)
    with pytest.raises(DatasetError) as caught:
        list(member_rows(member, seed=0, row_limit=None))
    countable = [kind.suffix for kind in FILE_TYPES.values() if kind.count is not None]
    assert countable and len(countable) < len(FILE_TYPES)
    assert re.findall(r"\.[a-z]+", str(caught.value).split("use a local ")[1]) == countable


def test_a_file_type_is_one_entry_of_the_registry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A type ``datasets`` can stream needs nothing but its entry: resolved, checked, read."""
    from eagledata.source.dataset import iter_rows
    from eagledata.source.formats import FileType

    monkeypatch.setitem(FILE_TYPES, ".csv", FileType(".csv", "csv", "comma-separated"))
    data = tmp_path / "rows.csv"
    data.write_text("id,prompt\na,hello\nb,world\n")
    resolved = resolve_dataset(str(data), {})
    assert [(row.row_id, row.data) for row in iter_rows(resolved.settings)] == [
        ("a", {"id": "a", "prompt": "hello"}),
        ("b", {"id": "b", "prompt": "world"}),
    ]
    assert ".csv" in _listed_suffixes(f"a {'/'.join(suffixes())} file")[0]


def test_the_settings_accept_exactly_the_registered_row_shapes() -> None:
    assert get_args(Schema) == tuple(ROW_SCHEMAS)
    for name in [*ROW_SCHEMAS, "auto"]:
        assert DatasetSettings.model_validate({"source": "x.jsonl", "schema": name})
    with pytest.raises(ValidationError):
        DatasetSettings.model_validate({"source": "x.jsonl", "schema": "alpaca"})


def test_auto_finds_each_registered_row_shape_by_its_field() -> None:
    settings = DatasetSettings(source="x.jsonl")
    for shape in ROW_SCHEMAS.values():
        field = shape.field or settings.prompt_field
        assert detect_schema({field: []}, settings) == shape.name
    with pytest.raises(BadRowError) as caught:
        detect_schema({"text": "hi"}, settings)
    for shape in ROW_SCHEMAS.values():
        assert (shape.field or repr(settings.prompt_field)) in str(caught.value)


# --- load signals: server/load_signals.py ---------------------------------------------------------


def _read_load(url: str) -> ServerLoad | None:
    async def read() -> ServerLoad | None:
        async with SGLangClient([url], in_flight=1) as client:
            return await client.read_load(url)

    return asyncio.run(read())


def _sim(tokenizer_dir: str, **fields: Any) -> SimServerThread:
    return SimServerThread(sim_config(tokenizer_dir, engine="sglang", **fields))


def test_telemetry_names_exactly_the_registered_load_signals() -> None:
    assert get_args(LoadSource) == tuple(LOAD_SIGNALS)
    root = Path(__file__).resolve().parent.parent
    example = re.search(r'"source": "([\w|]+)"', (root / "docs" / "run-directory.md").read_text())
    assert example and example.group(1).split("|") == [*LOAD_SIGNALS, "none"]


def test_the_docs_table_holds_exactly_the_registered_load_signals() -> None:
    text = (Path(__file__).resolve().parent.parent / "docs" / "sglang.md").read_text()
    table = re.search(r"<!-- registry: load-signals -->\n(.*?)<!-- /registry -->", text, re.S)
    assert table
    listed = re.findall(r"^\| `(\w+)` \| `GET (\S+)`", table.group(1), re.M)
    assert listed == [(signal.name, signal.route) for signal in LOAD_SIGNALS.values()]


def test_the_signals_are_asked_in_the_registrys_order(
    tokenizer_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 0.5.9 server offers all three: the first registered wins, and /metrics still adds the
    retraction counter to it."""
    reordered = {name: LOAD_SIGNALS[name] for name in ("get_load", "loads", "metrics")}
    monkeypatch.setattr(control, "LOAD_SIGNALS", reordered)
    with _sim(tokenizer_dir) as sim:
        load = _read_load(sim.url)
    assert load is not None and load.source == "get_load"
    assert load.retracted_total is not None  # from /metrics, which supplements


def test_a_load_signal_is_one_entry_of_the_registry(
    tokenizer_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server with none of today's signals, read through a new one registered last."""

    def from_server_info(body: Any) -> ServerLoad | None:
        running = body.get("num_running_reqs", 0) if isinstance(body, dict) else None
        return ServerLoad(cast(LoadSource, "server_info"), (RankLoad(rank=0, running=running),))

    added = LoadSignal(
        cast(LoadSource, "server_info"), "/server_info", from_server_info, "any", "a test's"
    )
    monkeypatch.setitem(LOAD_SIGNALS, added.name, added)
    with _sim(tokenizer_dir, hide_load_routes=True) as sim:
        load = _read_load(sim.url)
    assert load is not None and str(load.source) == "server_info"
    assert routes_named().endswith("/get_load and /server_info")


# --- SGLang releases: configs/sglang-releases/ ----------------------------------------------------


def test_sim_server_help_offers_exactly_the_supported_releases() -> None:
    from eagledata.profiles.releases import release_names, supported_versions

    assert release_names() == supported_versions()
    result = CliRunner().invoke(app, ["sim-server", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    shapes = re.search(r"/generate\s+shapes\s+\(([^)]*)\)", result.output)
    assert shapes and re.split(r",\s*", shapes.group(1).strip()) == supported_versions()
