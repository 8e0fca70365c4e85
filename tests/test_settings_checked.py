"""Issue 23, item 2: a setting is checked once, before anything is frozen, and a setting frozen
by an earlier release that this one refuses never makes a run unresumable (real subprocesses:
one line on stderr, never a traceback)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import orjson
import pytest

from conftest import SAMPLES, TOKENIZER, eagledata_cmd, make_config, sim_config
from eagledata.run import pipeline
from eagledata.simserver import SimServerThread
from test_cli import one_error_line

DATASET = str(SAMPLES / "sharegpt.jsonl")


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        eagledata_cmd(*args), capture_output=True, text=True, timeout=120, check=False
    )


def config_file(tmp_path: Path, url: str, run: str = "") -> Path:
    path = tmp_path / "eagledata.toml"
    path.write_text(
        f'[tokenizer]\nname = "{TOKENIZER}"\n[server]\nurls = ["{url}"]\n'
        "guard_interval_s = 0.2\n[generation]\nmax_new_tokens = 32\n"
        f"[run]\nlimit = 3\n{run}\n[canary]\nenabled = false\n"
    )
    return path


@pytest.mark.parametrize(
    ("flag", "toml"),
    [
        ("-5", ""),
        ("0", ""),
        ("100000", ""),
        ("eight", ""),
        (None, 'concurrency = "-5"'),
        (None, "concurrency = -5"),
    ],
)
@pytest.mark.slow
def test_a_bad_concurrency_is_one_line_before_the_run_starts(
    tmp_path: Path, flag: str | None, toml: str
) -> None:
    """Today '-5' (flag or TOML string) was accepted, the run wrote nothing, exited 0 and could
    never be resumed. No server is needed to refuse it: nothing is created."""
    config = config_file(tmp_path, "http://127.0.0.1:9", toml)
    out = tmp_path / "run"
    args = ["generate", "--config", str(config), "--dataset", DATASET, "--out", str(out)]
    result = cli(*args, *(["--concurrency", flag] if flag is not None else []))
    line = one_error_line(result, 2)
    where = f"--concurrency {flag!r}" if flag is not None else f"{config}: run.concurrency"
    assert line == f"{where}: must be 'auto' or an integer from 1 to 65536"
    assert not out.exists()


@pytest.mark.slow
def test_max_new_tokens_past_the_servers_context_is_one_line_before_anything_is_frozen(
    tokenizer_dir: str, tmp_path: Path
) -> None:
    """Today 100000000 failed every item 'over the limit of 0', exited 0, and was frozen."""
    with SimServerThread(sim_config(tokenizer_dir, context_length=4096)) as sim:
        config = config_file(tmp_path, sim.url)
        out = tmp_path / "run"
        result = cli(
            "generate",
            "--config",
            str(config),
            "--dataset",
            DATASET,
            "--out",
            str(out),
            "--max-new-tokens",
            "100000000",
        )
        line = one_error_line(result, 2)
        assert line == (
            "generation.max_new_tokens is 100,000,000, but the server's context_length is "
            "4,096: no prompt would fit; pass --max-new-tokens of at most 4,094 (less the "
            "longest prompt)"
        )
        assert not (out / "run.json").exists()
        assert sim.stats()["requests"] == 0
        # the same run directory then starts with a value that fits
        result = cli(
            "generate",
            "--config",
            str(config),
            "--dataset",
            DATASET,
            "--out",
            str(out),
            "--max-new-tokens",
            "64",
            "--no-progress",
        )
        assert result.returncode == 0, result.stderr
        assert "written 3" in result.stdout


@pytest.fixture
def finished_run(tokenizer_dir: str, tmp_path: Path) -> tuple[Path, SimServerThread]:
    sim = SimServerThread(sim_config(tokenizer_dir)).start()
    out = tmp_path / "run"
    config = make_config([sim.url], out, run={"limit": 3})
    pipeline.generate(config, DATASET, None, progress=False)
    return out, sim


def edit_run_json(out: Path, section: str, key: str, value: object, where: str = "config") -> None:
    manifest = orjson.loads((out / "run.json").read_bytes())
    manifest[where][section][key] = value
    (out / "run.json").write_bytes(orjson.dumps(manifest))


@pytest.mark.slow
def test_a_frozen_concurrency_this_release_refuses_never_blocks_resume(
    finished_run: tuple[Path, SimServerThread],
) -> None:
    """A run started with concurrency -5 (an earlier release let it through): resume names the
    key, and resume --concurrency 8 continues it (today: a pydantic traceback, every time)."""
    out, sim = finished_run
    try:
        edit_run_json(out, "run", "concurrency", -5)
        (out / "plan.json").unlink()  # make it do something again
        line = one_error_line(cli("resume", str(out), "--no-progress"), 2)
        assert line == (
            f"{out}/run.json: run.concurrency: must be 'auto' or an integer from 1 to 65536; "
            "pass --concurrency auto or N to resume"
        )
        result = cli("resume", str(out), "--concurrency", "8", "--no-progress")
        assert result.returncode == 0, result.stderr
        assert "planned 3 = written 3" in result.stdout
        # a bad --concurrency at resume is the flag's problem, said as such
        line = one_error_line(cli("resume", str(out), "--concurrency", "-5"), 2)
        assert line == "--concurrency '-5': must be 'auto' or an integer from 1 to 65536"
    finally:
        sim.stop()


@pytest.mark.slow
@pytest.mark.parametrize("where", ["config", "frozen"])
def test_a_frozen_data_setting_this_release_refuses_is_named(
    finished_run: tuple[Path, SimServerThread], where: str
) -> None:
    out, sim = finished_run
    sim.stop()
    edit_run_json(out, "generation", "max_new_tokens", 0, where)
    code = 2 if where == "config" else 5
    line = one_error_line(cli("resume", str(out), "--concurrency", "8"), code)
    key = "generation.max_new_tokens" if where == "config" else "frozen.generation.max_new_tokens"
    assert line.startswith(f"{out}/run.json: {key}: Input should be greater than or equal to 1; ")
    assert line.endswith(
        "the run was started with a setting this eagledata refuses: continue it with the "
        "eagledata version that started it, or start a new run with --out"
    )
