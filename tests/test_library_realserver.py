"""The library's example against the real SGLang 0.5.23 on this CPU (the ``realserver`` tier):
a toy head trains on round k while round k+1 regenerates from the real server, the KV guard and
the canary on, as a trainer would run it (docs/library.md, "The example")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

import eagledata
import trainerkit
from realserver import RequestLog, serve
from test_library import EXAMPLE, torch_pythonpath

pytestmark = [pytest.mark.realserver, pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def real_server(
    sglang_cpu_venv: Path, real_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Any:
    with serve(sglang_cpu_venv, real_model_dir, tmp_path_factory.mktemp("server-bf16")) as server:
        yield server


def test_the_example_trains_between_rounds_of_the_real_server(
    real_server: Any, real_model_dir: Path, tmp_path: Path
) -> None:
    trainerkit.trainers_venv()  # the example's torch: built here if the tier runs first
    torch_path = torch_pythonpath(tmp_path)
    assert torch_path is not None
    out = tmp_path / "rounds"
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--server", real_server.url, "--model",
         str(real_model_dir), "--out", str(out), "--rounds", "2", "--prompts", "6",
         "--max-new-tokens", "16", "--small-canary"],
        capture_output=True, text=True, timeout=1500, check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (torch_path, *sys.path) if p)},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    report = orjson.loads(result.stdout.splitlines()[-1])
    assert [r["round"] for r in report["rounds"]] == [0, 1]
    assert all(r["rows"] > 0 for r in report["rounds"])
    assert "0 failed" in result.stdout  # the canary checked round 1 against round 0's baseline

    # what the rounds hold is what the server logged: exact ids, one record per row and round
    received = RequestLog.read(real_server.request_log_dir).received()
    finished = RequestLog.read(real_server.request_log_dir).finished()
    answers: list[dict[str, list[int]]] = []
    for round_index in (0, 1):
        records = list(eagledata.records(out, round=round_index))
        answers.append({r.id: r.output_ids for r in records})
        assert sorted(r.id for r in records) == sorted(f"prompts/{i}/0" for i in range(6))
        for record in records:
            assert record.input_ids == received[record.rid]["obj"]["input_ids"]
            assert record.output_ids == finished[record.rid]["out"]["output_ids"]
    # fresh samples of the same prompts (temperature 0.8)
    assert sum(answers[0][key] != answers[1][key] for key in answers[0]) >= 4, answers
