"""plan, check-server and launch-server --dry-run through the CLI, as a user runs them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import REPO, sim_config
from eagledata.cli import app
from eagledata.simserver import SimServerThread

runner = CliRunner()


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # profiles and configs resolve as in a checkout
    monkeypatch.delenv("EAGLEDATA_CONFIG", raising=False)


def test_plan_shows_bf16_profiles_beside_the_rejected_fp8_one() -> None:
    result = runner.invoke(app, ["plan"])
    assert result.exit_code == 0, result.output
    # The reference figures: ~116k slots for bf16 TP8 @0.85, ~376k for fp8 @0.90.
    assert "116.0k" in result.output and "376.0k" in result.output
    assert "fp8 REJECTED" in result.output
    assert "best bf16 profile:" in result.output


def test_plan_measures_the_dataset_with_the_run_tokenizer() -> None:
    result = runner.invoke(
        app,
        [
            "plan",
            "--config",
            "configs/demo.toml",
            "--dataset",
            "sample",
            "--profile",
            "kimi-k25-tp8",
            "--mean-output-tokens",
            "200",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "workload: 40 prompts" in result.output
    assert "mean output 200" in result.output


def test_plan_with_a_live_server_uses_its_pool(tokenizer_dir: str) -> None:
    with SimServerThread(sim_config(tokenizer_dir, max_total_num_tokens=150_000)) as sim:
        result = runner.invoke(app, ["plan", "--profile", "kimi-k25-tp8", "--server", sim.url])
    assert result.exit_code == 0, result.output
    assert "150.0k" in result.output
    assert "measured pool (from /server_info)" in result.output


@pytest.mark.parametrize(
    ("setup", "exit_code", "verdict"),
    [
        ({}, 0, "BF16 KV OK"),
        ({"kv_cache_dtype": "fp8_e4m3"}, 4, "REFUSED"),
        ({"kv_cache_dtype": "auto", "internal_kv_cache_dtype": "fp8_e4m3"}, 4, "REFUSED"),
    ],
    ids=["bf16", "fp8", "auto-fp8"],
)
def test_check_server_verdict_and_exit_code(
    tokenizer_dir: str, setup: dict[str, str], exit_code: int, verdict: str
) -> None:
    with SimServerThread(sim_config(tokenizer_dir, **setup)) as sim:
        result = runner.invoke(app, ["check-server", sim.url, "--config", "configs/eagledata.toml"])
    assert result.exit_code == exit_code, result.output
    assert verdict in result.output.upper()
    assert "moonshotai/Kimi-K2.5" in result.output


@pytest.mark.parametrize(
    ("version", "dp_attention"),
    [
        ("0.5.9", "--dp-size 4 --enable-dp-attention"),
        ("0.5.15.post1", "--dp-size 4 --enable-dp-attention"),
        ("0.5.23", "--attn-dp-size 4"),
    ],
)
def test_launch_server_dry_run_prints_the_exact_bf16_command_of_each_release(
    version: str, dp_attention: str
) -> None:
    result = runner.invoke(
        app,
        ["launch-server", "--profile", "kimi-k25-dpa4", "--sglang-version", version, "--dry-run"],
    )
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()  # the command alone; which profile it is goes to stderr
    assert len(lines) == 1
    script, rest = lines[0].split(" ", 1)
    assert script == "scripts/launch_sglang.sh" and rest.startswith("--model-path moonshotai/")
    assert "--kv-cache-dtype bf16" in rest and f" {dp_attention} " in rest
    assert f"sglang {version} form" in result.stderr


def test_launch_server_dry_run_for_a_release_the_profile_lacks_names_those_it_has() -> None:
    result = runner.invoke(
        app,
        ["launch-server", "--profile", "kimi-k25-dcp8", "--sglang-version", "0.5.9", "--dry-run"],
    )
    assert result.exit_code != 0
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(
        "eagledata: error: profile kimi-k25-dcp8 has no form for sglang 0.5.9"
    )
    assert lines[0].endswith("it runs on 0.5.15.post1, 0.5.23")


def test_plan_json_names_each_profiles_releases() -> None:
    result = runner.invoke(app, ["plan", "--json"])
    assert result.exit_code == 0, result.output
    rows = {row["profile"]: row for row in json.loads(result.stdout)["profiles"]}
    assert rows["kimi-k25-dcp8-eagle3"]["sglang_versions"] == ["0.5.23"]
    assert rows["kimi-k25-dcp8"]["sglang_versions"] == ["0.5.15.post1", "0.5.23"]
    assert rows["kimi-k25-tp8"]["sglang_versions"] == ["0.5.9", "0.5.15.post1", "0.5.23"]
    assert all(row["sglang_versions"] for row in rows.values())


def test_launch_server_refuses_an_fp8_override_in_one_line() -> None:
    result = runner.invoke(
        app, ["launch-server", "--dry-run", "--", "--kv-cache-dtype", "fp8_e4m3"]
    )
    assert result.exit_code != 0
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("eagledata: error: refused --kv-cache-dtype")


def test_environment_is_offline() -> None:
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    assert Path(REPO / "configs" / "profiles").is_dir()
