"""Installed, not only checked out (issue 11): a built wheel works from any directory.

The wheel is built once for the module from a clean copy of the checkout (``setup.py`` copies the
top-level ``configs/`` and ``scripts/launch_sglang.sh`` into ``eagledata/_shipped/``), installed
with ``pip install --target`` (not editable), and run with that directory first on
``PYTHONPATH`` from an empty temporary directory. Its dependencies come from this venv.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.slow  # builds and installs the wheel

BUILD_INPUTS = (
    "src",
    "configs",
    "scripts",
    "setup.py",
    "pyproject.toml",
    "MANIFEST.in",
    "README.md",
)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"
    for name in BUILD_INPUTS:
        path = REPO / name
        if path.is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
            shutil.copytree(path, source / name, ignore=ignore)
        else:
            shutil.copy2(path, source / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(root / "dist"), "."],
        cwd=source,
        check=True,
        capture_output=True,
    )
    (wheel,) = (root / "dist").glob("eagledata-*.whl")
    target = root / "site"
    subprocess.run(
        [*pip, "install", "--no-deps", "--no-index", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
    )
    return target


def run_installed(
    target: Path, cwd: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    environment = {key: value for key, value in os.environ.items() if key != "EAGLEDATA_CONFIG"}
    environment["PYTHONPATH"] = str(target)
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "eagledata.cli", *args],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def empty_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    return folder


def test_the_wheel_is_what_runs_and_ships_the_checkouts_files(installed: Path) -> None:
    shipped = installed / "eagledata" / "_shipped"
    for relative in ("configs/eagledata.toml", "configs/demo.toml", "scripts/launch_sglang.sh"):
        assert (shipped / relative).read_bytes() == (REPO / relative).read_bytes()
    profiles = sorted(path.name for path in (shipped / "configs" / "profiles").glob("*.toml"))
    assert profiles == sorted(path.name for path in (REPO / "configs/profiles").glob("*.toml"))
    assert os.access(shipped / "scripts" / "launch_sglang.sh", os.X_OK)
    probe = subprocess.run(
        [sys.executable, "-c", "import eagledata; print(eagledata.__file__)"],
        env={**os.environ, "PYTHONPATH": str(installed)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert probe.stdout.strip() == str(installed / "eagledata" / "__init__.py")


def test_plan_works_in_an_empty_directory(installed: Path, empty_dir: Path) -> None:
    result = run_installed(installed, empty_dir, "plan")
    assert result.returncode == 0, result.stderr
    assert "116.0k" in result.stdout and "376.0k" in result.stdout  # the reference figures
    assert "best bf16 profile:" in result.stdout
    in_checkout = run_installed(installed, REPO, "plan")
    assert result.stdout == in_checkout.stdout
    assert list(empty_dir.iterdir()) == []


def test_launch_server_dry_run_works_in_an_empty_directory(
    installed: Path, empty_dir: Path
) -> None:
    result = run_installed(
        installed, empty_dir, "launch-server", "--profile", "kimi-k25-dpa4", "--dry-run"
    )
    assert result.returncode == 0, result.stderr
    script, *argv = result.stdout.split()
    assert script == str(installed / "eagledata" / "_shipped" / "scripts" / "launch_sglang.sh")
    in_checkout = run_installed(
        installed, REPO, "launch-server", "--profile", "kimi-k25-dpa4", "--dry-run"
    )
    assert in_checkout.stdout.split() == ["scripts/launch_sglang.sh", *argv]
    assert "--kv-cache-dtype" in argv and argv[argv.index("--kv-cache-dtype") + 1] == "bf16"


def test_a_local_configs_folder_and_config_flag_still_override(
    installed: Path, empty_dir: Path
) -> None:
    profiles = empty_dir / "configs" / "profiles"
    profiles.mkdir(parents=True)
    text = (REPO / "configs/profiles/kimi-k25-tp8.toml").read_text()
    (profiles / "mine.toml").write_text(text.replace("port = 30000", "port = 31234"))
    plan = run_installed(installed, empty_dir, "plan")
    assert plan.returncode == 0, plan.stderr
    assert "mine" in plan.stdout and "dpa4" not in plan.stdout  # only the local profiles
    launch = run_installed(installed, empty_dir, "launch-server", "--profile", "mine", "--dry-run")
    assert launch.returncode == 0, launch.stderr
    assert launch.stdout.split()[-2:] == ["--port", "31234"]

    config = empty_dir / "other.toml"
    config.write_text('[tokenizer]\nname = "x"\n[datasets.b2]\nsource = "mine/b2.jsonl"\n')
    result = run_installed(installed, empty_dir, "generate", "--config", str(config), "-d", "b2")
    assert result.returncode != 0
    assert f"set datasets.b2.source in {config} to its path" in result.stderr


def test_generate_b2_without_its_file_fails_fast_naming_the_file_and_setting(
    installed: Path, empty_dir: Path
) -> None:
    # HF offline and a tokenizer id no cache holds: loading it first would fail differently
    result = run_installed(installed, empty_dir, "generate", "--dataset", "b2")
    assert result.returncode == 2
    shipped_config = installed / "eagledata" / "_shipped" / "configs" / "eagledata.toml"
    assert result.stderr.splitlines() == [
        f"eagledata: error: dataset b2: file data/b2.jsonl not found (relative to {empty_dir}); "
        f"put the file there or set datasets.b2.source in {shipped_config} to its path"
    ]
    assert list(empty_dir.iterdir()) == []  # no run directory was started
