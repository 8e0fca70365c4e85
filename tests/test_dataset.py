"""Dataset resolution and row reading: names, files, folders, hub ids, stable ids, --limit."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from conftest import SAMPLES
from eagledata.config import DatasetSettings
from eagledata.errors import DatasetError
from eagledata.source.dataset import count_rows, iter_rows, resolve_dataset


def test_each_local_format_gives_the_same_prompts() -> None:
    jsonl = [r.data for r in iter_rows(DatasetSettings(source=str(SAMPLES / "prompts.jsonl")))]
    parquet = [r.data for r in iter_rows(DatasetSettings(source=str(SAMPLES / "prompts.parquet")))]
    assert jsonl == parquet and len(jsonl) == 30
    array = [r.data for r in iter_rows(DatasetSettings(source=str(SAMPLES / "sharegpt.json")))]
    lines = [r.data for r in iter_rows(DatasetSettings(source=str(SAMPLES / "sharegpt.jsonl")))]
    assert array == lines[: len(array)]


def test_ids_are_the_dataset_own_or_the_row_index() -> None:
    sharegpt = list(iter_rows(DatasetSettings(source=str(SAMPLES / "sharegpt.jsonl"))))
    assert [r.row_id for r in sharegpt] == [r.data["id"] for r in sharegpt if r.data]
    ultrachat = list(iter_rows(DatasetSettings(source=str(SAMPLES / "ultrachat.jsonl"))))
    assert all(r.data and r.row_id == r.data["prompt_id"] for r in ultrachat)
    plain = list(iter_rows(DatasetSettings(source=str(SAMPLES / "prompts.jsonl"))))
    assert [r.row_id for r in plain] == [f"#{i}" for i in range(30)]


def test_limit_and_count() -> None:
    settings = DatasetSettings(source=str(SAMPLES / "prompts.parquet"))
    assert len(list(iter_rows(settings, limit=7))) == 7
    assert count_rows(settings) == 30 and count_rows(settings, limit=7) == 7


def test_a_dataset_folder_is_read_through_datasets(tmp_path: Path) -> None:
    folder = tmp_path / "my-set"
    (folder / "data").mkdir(parents=True)
    rows = [{"id": f"r{i}", "prompt": f"question {i}"} for i in range(5)]
    (folder / "data" / "train.jsonl").write_bytes(b"\n".join(orjson.dumps(r) for r in rows))
    resolved = resolve_dataset(str(folder), {})
    assert resolved.name == "my-set"
    assert [r.row_id for r in iter_rows(resolved.settings)] == [r["id"] for r in rows]


def test_config_names_win_and_unknown_names_list_the_known_ones() -> None:
    table = {"b2": DatasetSettings(source="data/b2.jsonl")}
    assert resolve_dataset("b2", table).settings.source == "data/b2.jsonl"
    with pytest.raises(
        DatasetError, match=r"unknown dataset 'b3'; use a name from the config \(b2\)"
    ):
        resolve_dataset("b3", table)


def test_missing_file_and_offline_hub_are_one_line_errors() -> None:
    with pytest.raises(DatasetError, match="not found"):
        resolve_dataset("./nope.jsonl", {})
    hub = resolve_dataset("nobody/not-a-dataset", {})
    with pytest.raises(DatasetError) as caught:
        list(iter_rows(hub.settings))
    assert "\n" not in str(caught.value) and "nobody/not-a-dataset" in str(caught.value)


def test_an_index_id_never_meets_an_own_id(tmp_path: Path) -> None:
    """A row without an id and a later row whose own id is that row's index are two rows,
    both planned: neither is taken for a repeat of the other."""
    path = tmp_path / "mixed.jsonl"
    rows = [{"prompt": "no id"}, {"prompt": "has id", "id": 0}, {"prompt": "hash", "id": "#1"}]
    rows.append({"prompt": "no id either"})
    path.write_bytes(b"\n".join(orjson.dumps(row) for row in rows))
    ids = [row.row_id for row in iter_rows(DatasetSettings(source=str(path)))]
    assert len(set(ids)) == 4, ids
    assert ids == ["#0", "0", "##1", "#3"]
    # a run started before this naming keeps its own (resume plans the same ids)
    old_naming = iter_rows(DatasetSettings(source=str(path)), id_scheme=1)
    assert [row.row_id for row in old_naming][:2] == ["0", "0"]
