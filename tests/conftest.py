"""Shared fixtures: offline hub settings, the bundled tokenizer, the simulated server."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# No machine here reaches a model or dataset hub; make every library fail fast instead of hanging.
_HF_HOME = tempfile.mkdtemp(prefix="eagledata-hf-")
os.environ.update(
    HF_HUB_OFFLINE="1",
    HF_DATASETS_OFFLINE="1",
    HF_HOME=_HF_HOME,
    TRANSFORMERS_VERBOSITY="error",
    TOKENIZERS_PARALLELISM="false",
)

import orjson  # noqa: E402
import pytest  # noqa: E402

from eagledata.config import AppConfig, resolve_bundled  # noqa: E402
from eagledata.simserver import SimConfig, SimServerThread  # noqa: E402
from realserver import real_model_dir, sglang_cpu_venv  # noqa: E402, F401 (the real-server tier's)

REPO = Path(__file__).resolve().parents[1]
TOKENIZER = "bundled:tokenizer/tiny-chatml"
SAMPLES = Path(resolve_bundled("bundled:samples"))


@pytest.fixture(scope="session")
def tokenizer_dir() -> str:
    return resolve_bundled(TOKENIZER)


@pytest.fixture(scope="session")
def prompt_tokenizer() -> Any:
    from eagledata.config import TokenizerSettings
    from eagledata.source.tokenization import PromptTokenizer

    return PromptTokenizer(TokenizerSettings(name=TOKENIZER))


def sim_config(tokenizer_dir: str, **overrides: Any) -> SimConfig:
    fields: dict[str, Any] = {"tokenizer_path": tokenizer_dir, "context_length": 32768}
    fields.update(overrides)
    return SimConfig(**fields)


@pytest.fixture
def sim(tokenizer_dir: str) -> Iterator[SimServerThread]:
    with SimServerThread(sim_config(tokenizer_dir)) as server:
        yield server


def make_config(urls: list[str], out_dir: Path, **sections: dict[str, Any]) -> AppConfig:
    """A config for tests: fast timeouts and backoff, the bundled tokenizer, no fsync pauses."""
    raw: dict[str, Any] = {
        "tokenizer": {"name": TOKENIZER},
        "generation": {"max_new_tokens": 64, "temperature": 0.0},
        "server": {
            "urls": urls,
            "guard_interval_s": 0.2,
            "guard_max_held": 8,
            "backoff_base_s": 0.01,
            "backoff_max_s": 0.05,
            "down_deadline_s": 5,
            "request_timeout_s": 10,
            "connect_timeout_s": 2,
        },
        "run": {"out_dir": str(out_dir), "shard_size": 7, "concurrency": 8},
        # The canary has its own tests (test_canary.py); the others test other things.
        "canary": {"enabled": False},
    }
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    return AppConfig.model_validate(raw)


def read_records(run_dir: Path) -> list[dict[str, Any]]:
    # A run in progress may seal a journal (rename pending/ -> shards/) between the glob and the
    # read: read again. It may also be mid-write: only whole lines are committed records.
    for _ in range(20):
        try:
            return _read_records_once(run_dir)
        except FileNotFoundError:
            continue
    return _read_records_once(run_dir)


def _read_records_once(run_dir: Path) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    for folder in ("shards", "pending"):
        for path in sorted((run_dir / folder).glob("shard-*.jsonl")):
            data = path.read_bytes()
            whole = data[: data.rfind(b"\n") + 1]
            records.extend(orjson.loads(line) for line in whole.splitlines())
    return records


def read_failures(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "failures.jsonl"
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


async def until(condition: Callable[[], object], bound_s: float = 60.0) -> None:
    """Poll ``condition`` until it holds, within a generous ``bound_s`` (TimeoutError past it):
    what a test waits for instead of a sleep standing for "enough time"."""
    async with asyncio.timeout(bound_s):
        while True:
            if condition():
                return
            await asyncio.sleep(0.01)


def eagledata_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "eagledata.cli", *args]


def run_cli(
    *args: str, env: dict[str, str | None] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``eagledata ARGS`` in this process (typer's runner), answered as a finished subprocess:
    exit code, stdout, stderr. A child process pays ~1 s of CPU importing transformers and
    datasets before it starts; a test about what a command says and leaves needs none of it
    (a test about the process itself — signals, a kill, the interpreter's exit — uses
    ``eagledata_cmd``). An exception the command let escape is raised here with its
    traceback, so a test that asserts "no traceback" fails on it as it would on a child's."""
    from typer.testing import CliRunner

    from eagledata.cli.commands import app

    previous = Path.cwd()
    # commands set their own SIGINT and SIGTERM handlers (launch-server's stop its servers):
    # in a process of their own; here they would outlive the command
    handlers = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    if cwd is not None:
        os.chdir(cwd)
    try:
        result = CliRunner().invoke(app, list(args), env=env)
    finally:
        os.chdir(previous)
        for number, handler in handlers.items():
            signal.signal(number, handler)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(
        ["eagledata", *args], result.exit_code, result.stdout, result.stderr
    )
