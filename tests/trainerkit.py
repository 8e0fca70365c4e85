"""The drafter trainers' own tools for the export tests, in a venv of their own built once.

speculators 0.9.0's ``prepare-data`` CLI and SpecForge 0.2.0's data code need torch, datasets and
transformers at versions of their own, so they run in a venv of their own, by subprocess, pinned
by ``tests/trainers-requirements.txt`` (every package of the venv, installed ``--no-deps``). torch
is the CPU wheel on this machine's disk (pip's find-links), installed ``--no-index`` first: a
machine without it fails at once, never downloads PyPI's multi-GB CUDA build.

The venv lives in ``~/.cache/eagledata-tests/trainers-venv`` (``EAGLEDATA_TEST_CACHE`` moves it),
is built under a file lock (concurrent test runs wait for one build), and is rebuilt when the
pins, or the Python building it, change. A test skips, saying so, only when the package registry
cannot be reached.

What the tools write is read back here with pyarrow alone (the project's venv has it).
"""

from __future__ import annotations

import collections
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

CACHE = Path(os.environ.get("EAGLEDATA_TEST_CACHE", Path.home() / ".cache" / "eagledata-tests"))
PINS = Path(__file__).with_name("trainers-requirements.txt")
VENV = CACHE / "trainers-venv"
OVERLAY = "torch-overlay"
UNREACHABLE = (
    "NewConnectionError",
    "Max retries exceeded",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Network is unreachable",
    "ConnectTimeout",
    "ReadTimeout",
    "ProxyError",
    "Connection refused",
)
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
BUILD_TIMEOUT_S = 1800


def _stamp() -> str:
    digest = hashlib.sha256(PINS.read_bytes()).hexdigest()[:16]
    return f"{digest} {sys.version.split()[0]} {sys.base_prefix}"


def _pip(venv: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "install",
         "--quiet", "--no-deps", "--no-compile", *args],
        capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False,
    )  # fmt: skip


def _torch_pin() -> str:
    for line in PINS.read_text().splitlines():
        if line.strip().startswith("torch=="):
            return line.split("#")[0].strip()
    raise AssertionError(f"{PINS} pins no torch==")


def _site_packages(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def _make_torch_overlay(venv: Path) -> None:
    """Links to torch's top-level packages alone: on PYTHONPATH, they give the project's own
    interpreter torch (``export --draft-vocab-size``) without the trainers' other packages."""
    site = _site_packages(venv)
    overlay = venv / OVERLAY
    overlay.mkdir()
    record = next(site.glob("torch-*.dist-info")) / "RECORD"
    tops = {line.split("/", 1)[0] for line in record.read_text().splitlines() if "/" in line}
    for name in sorted(tops - {".."}):
        (overlay / name).symlink_to(site / name)


def _build(venv: Path) -> None:
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    torch = _torch_pin()
    result = _pip(venv, "--no-index", torch)
    if result.returncode != 0:
        pytest.fail(
            f"{torch} (its CPU build) is not among pip's local wheels (find-links); the trainer "
            "tests install it from this machine's disk and never download torch from an index. "
            f"pip said:\n{result.stdout}{result.stderr}"
        )
    result = _pip(venv, "-r", str(PINS))
    if result.returncode != 0:
        output = result.stdout + result.stderr
        if any(marker in output for marker in UNREACHABLE):
            pytest.skip(f"cannot reach the package registry to install {PINS.name}")
        pytest.fail(f"pip install --no-deps -r {PINS} failed:\n{output}")
    _make_torch_overlay(venv)
    # Smoke, and the bytecode of what the tools import written once (pip compiled none of it:
    # compiling all of torch takes longer than this).
    for argv in (
        [venv / "bin" / "speculators", "--version"],
        [venv / "bin" / "python", "-c", "import specforge.data.preprocessing"],
    ):
        result = run(argv, timeout=BUILD_TIMEOUT_S)
        if result.returncode != 0:
            pytest.fail(f"the trainers' venv does not work: {argv}:\n{result.stderr}")


def trainers_venv() -> Path:
    """The trainers' venv, built the first time (minutes: see the README's test section)."""
    stamp = _stamp()
    done = VENV / ".complete"
    if done.is_file() and done.read_text() == stamp:
        return VENV
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / "trainers-venv.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test run may be building it: wait for it
        if done.is_file() and done.read_text() == stamp:
            return VENV
        shutil.rmtree(VENV, ignore_errors=True)
        started = time.monotonic()
        try:
            _build(VENV)
        except BaseException:
            shutil.rmtree(VENV, ignore_errors=True)
            raise
        (VENV / ".build-seconds").write_text(f"{time.monotonic() - started:.0f}\n")
        done.write_text(stamp)
    return VENV


def torch_overlay(venv: Path) -> Path:
    return venv / OVERLAY


def run(
    argv: Sequence[str | Path], *, env: Mapping[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """A command, offline (the tests' HF_HOME is a temporary folder: conftest.py). The trainers'
    tools may cache their bytecode in their venv: their first import compiles it."""
    environ = {**os.environ, **OFFLINE, **(env or {})}
    if Path(argv[0]).is_relative_to(VENV):
        environ.pop("PYTHONDONTWRITEBYTECODE", None)
    return subprocess.run(
        [str(arg) for arg in argv], capture_output=True, text=True, timeout=timeout, check=False,
        env=environ,
    )  # fmt: skip


def python_json(venv: Path, script: str, *args: str | Path) -> Any:
    """Run ``script`` with the venv's python; it prints one JSON value as its last line."""
    result = run([venv / "bin" / "python", "-c", script, *args])
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def read_prepared(folder: Path) -> Any:
    """A ``save_to_disk`` folder (what ``prepare-data`` writes) as one pyarrow Table."""
    import pyarrow as pa
    import pyarrow.ipc

    state = json.loads((folder / "state.json").read_text())
    tables = []
    for entry in state["_data_files"]:
        with pa.memory_map(str(folder / entry["filename"])) as source:
            tables.append(pa.ipc.open_stream(source).read_all())
    return pa.concat_tables(tables)


Row = tuple[tuple[int, ...], tuple[int, ...]]


def expected_rows(
    records: Iterable[Mapping[str, Any]], seq_length: int
) -> tuple[collections.Counter[Row], int, int]:
    """What ``prepare-data --seq-length N`` must hold for these run records, as a multiset of
    (input_ids, loss_mask): P + O and [0]*|P| + [1]*|O|, both cut at N; a row left with no
    supervised token is dropped. Also: how many rows it cuts and keeps, and how many it drops."""
    rows: collections.Counter[Row] = collections.Counter()
    cut = dropped = 0
    for item in records:
        prompt, output = item["input_ids"], item["output_ids"]
        ids = (prompt + output)[:seq_length]
        mask = ([0] * len(prompt) + [1] * len(output))[:seq_length]
        if not any(mask):
            dropped += 1
            continue
        cut += len(prompt) + len(output) > seq_length
        rows[(tuple(ids), tuple(mask))] += 1
    return rows, cut, dropped


def prepared_rows(folder: Path) -> tuple[collections.Counter[Row], list[Row]]:
    """The prepared rows as a multiset and in their stored order, after checking their shape:
    integer columns, ``seq_len`` the row's length, a mask of 0 and 1 as long as its ids."""
    import pyarrow as pa

    table = read_prepared(folder)
    assert sorted(table.column_names) == ["input_ids", "loss_mask", "seq_len"]
    for column in ("input_ids", "loss_mask"):
        assert pa.types.is_integer(table.schema.field(column).type.value_type), table.schema
    ordered: list[Row] = []
    for item in table.to_pylist():
        ids, mask = tuple(item["input_ids"]), tuple(item["loss_mask"])
        assert item["seq_len"] == len(ids) == len(mask)
        assert set(mask) <= {0, 1}
        ordered.append((ids, mask))
    return collections.Counter(ordered), ordered
