"""run.json and plan.json are read as types (``rundir/runfiles.py``) through one loader each: a
value of the wrong type is one line naming its key, and what an earlier eagledata left out reads
as its none."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from eagledata.errors import RunDirError
from eagledata.rundir.manifest import SCHEMA_VERSION, RunDir


def write_run_json(path: Path, **values: object) -> RunDir:
    path.mkdir(parents=True, exist_ok=True)
    (path / "run.json").write_bytes(orjson.dumps({"schema_version": SCHEMA_VERSION, **values}))
    return RunDir(path)


def test_a_run_from_before_the_canary_and_the_plan_reads_as_their_none(tmp_path: Path) -> None:
    run_dir = write_run_json(tmp_path / "run", fingerprint="abc", planned_estimate=40)
    manifest = run_dir.manifest()
    assert (manifest.canary, manifest.canary_enabled, manifest.config) == (None, False, None)
    assert run_dir.plan_file() is None
    assert run_dir.planned() == 40  # the estimate, until plan.json is written
    run_dir.set_planned(38, {"a": 20, "b": 18})
    assert run_dir.planned() == 38
    assert run_dir.planned_by_dataset() == {"a": 20, "b": 18}


def test_a_value_of_the_wrong_type_is_one_line_naming_its_key(tmp_path: Path) -> None:
    run_dir = write_run_json(tmp_path / "run", canary={"enabled": "perhaps"})
    with pytest.raises(RunDirError, match=r"canary\.enabled") as raised:
        run_dir.manifest()
    assert "\n" not in str(raised.value)
    (tmp_path / "run" / "plan.json").write_bytes(b'{"planned": "many"}')
    with pytest.raises(RunDirError, match="planned") as raised:
        run_dir.plan_file()
    assert "\n" not in str(raised.value)


def test_keys_a_later_release_adds_are_kept(tmp_path: Path) -> None:
    run_dir = write_run_json(tmp_path / "run", added_later={"x": 1})
    assert run_dir.manifest().model_extra == {"added_later": {"x": 1}}
