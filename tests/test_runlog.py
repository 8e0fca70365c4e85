"""Every run directory holds ``run.log``: each session's start and end, every check's verdict,
the results released, in standard ``logging`` lines; nothing of it reaches stderr."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from conftest import SAMPLES, make_config
from eagledata.run import pipeline
from eagledata.simserver import SimServerThread


def test_a_run_logs_its_sessions_and_every_checks_verdict(
    sim: SimServerThread, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    config = make_config([sim.url], out)
    pipeline.generate(config, str(SAMPLES / "prompts.jsonl"), None, progress=False)
    pipeline.resume(out, progress=False)
    lines = (out / "run.log").read_text().splitlines()
    assert sum("session started" in line for line in lines) == 2  # one per session, appended
    assert sum("session ended" in line for line in lines) == 2
    assert any("passed the KV check at the start" in line for line in lines)
    assert any("kv check of" in line and "passed" in line for line in lines)
    assert any("results of" in line and "released" in line for line in lines)
    assert capsys.readouterr().err == ""  # the log is the file's, not the terminal's
    assert not logging.getLogger("eagledata").handlers[1:]  # the session took its file away
