"""Real SGLang releases for the tests: each supported release's own code, importable on a CPU box.

Built once per machine under ``~/.cache/eagledata-tests/sglang`` (``EAGLEDATA_TEST_CACHE`` moves
it), on top of the trainers' venv (``tests/trainerkit.py``: Python, torch 2.13.0's CPU build,
numpy, pydantic, aiohttp, ... already there):

* ``common/``: the light packages the releases' imports need beyond that venv
  (``tests/sglang-requirements.txt``), installed ``--no-deps --target``;
* ``<version>/``: one folder per release of ``configs/sglang-releases/``: ``sglang==<version>``
  and the packages it pins at versions of its own (the release file's ``[check] pins``: its
  transformers, huggingface_hub, tokenizers, openai), ``--no-deps --target``.

A process gets one release with the venv's python and ``PYTHONPATH=<version>:common`` (the
release's own transformers shadow the venv's). Nothing asks pip for torch: the release wheels
go in ``--no-deps``, so a CUDA build is never pulled. Each folder is built under a temporary name
and renamed when whole, under a file lock, and rebuilt when its pins (or Python) change. A test
skips, saying so, only when the package registry cannot be reached.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

import trainerkit
from eagledata.profiles.releases import Release, releases

ROOT = trainerkit.CACHE / "sglang"
COMMON_PINS = Path(__file__).with_name("sglang-requirements.txt")
PROBE = Path(__file__).with_name("sglang_probe.py")
PROBE_TIMEOUT_S = 1800


def _pins(lines: str) -> list[str]:
    return [line.split("#")[0].strip() for line in lines.splitlines() if line.split("#")[0].strip()]


def _stamp(requirements: list[str]) -> str:
    digest = hashlib.sha256("\n".join(requirements).encode()).hexdigest()[:16]
    return f"{digest} {sys.version.split()[0]}"


def _install(venv: Path, target: Path, requirements: list[str]) -> None:
    result = trainerkit._pip(venv, "--target", str(target), *requirements)
    if result.returncode != 0:
        output = result.stdout + result.stderr
        if any(marker in output for marker in trainerkit.UNREACHABLE):
            pytest.skip(f"cannot reach the package registry to install {' '.join(requirements)}")
        pytest.fail(f"pip install --no-deps --target {target} {requirements} failed:\n{output}")


def _folder(name: str, requirements: list[str]) -> Path:
    """``ROOT/name`` holding ``requirements``, built the first time (under a lock)."""
    folder = ROOT / name
    stamp = _stamp(requirements)
    done = folder / ".complete"
    if done.is_file() and done.read_text() == stamp:
        return folder
    venv = trainerkit.trainers_venv()
    ROOT.mkdir(parents=True, exist_ok=True)
    with (ROOT / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test run may be building it: wait for it
        if done.is_file() and done.read_text() == stamp:
            return folder
        building = ROOT / f"{name}.tmp"
        shutil.rmtree(building, ignore_errors=True)
        started = time.monotonic()
        try:
            _install(venv, building, requirements)
        except BaseException:
            shutil.rmtree(building, ignore_errors=True)
            raise
        (building / ".build-seconds").write_text(f"{time.monotonic() - started:.0f}\n")
        (building / ".complete").write_text(stamp)
        shutil.rmtree(folder, ignore_errors=True)
        building.rename(folder)
    return folder


def common() -> Path:
    return _folder("common", _pins(COMMON_PINS.read_text()))


def release_folder(release: Release) -> Path:
    return _folder(release.version, [f"sglang=={release.version}", *release.check.pins])


def probe(release: Release, job: Mapping[str, Any]) -> dict[str, Any]:
    """Run ``tests/sglang_probe.py`` on ``release``'s own code; its JSON report."""
    folder, shared = release_folder(release), common()
    venv = trainerkit.trainers_venv()
    out = ROOT / f"report-{release.version}-{os.getpid()}-{time.monotonic_ns()}.json"
    env = {**os.environ, **trainerkit.OFFLINE, "PYTHONPATH": f"{folder}{os.pathsep}{shared}"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # the release's bytecode, written once, kept
    try:
        done = subprocess.run(
            [str(venv / "bin" / "python"), str(PROBE), "--release-dir", str(folder),
             "--out", str(out)],
            input=json.dumps(job), capture_output=True, text=True, timeout=PROBE_TIMEOUT_S,
            env=env, check=False,
        )  # fmt: skip
        if not out.is_file():
            pytest.fail(
                f"the probe of sglang {release.version} wrote no report (exit "
                f"{done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            )
        report: dict[str, Any] = json.loads(out.read_text())
    finally:
        out.unlink(missing_ok=True)
    if not report["import"]["ok"]:
        pytest.fail(
            f"sglang {release.version} does not import: {report['import']['error']}\n"
            f"{report['import'].get('traceback', '')}"
        )
    return report


def supported() -> tuple[Release, ...]:
    return releases()
