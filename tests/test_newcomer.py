"""Issue 20 (a newcomer's first hour): errors that name the cause first, a run that wrote
nothing exits non-zero, a flag's bad value blames the flag, a typo gets its near key, a Ctrl-C
while starting says what it stopped, and the small messages a first hour runs into."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from conftest import SAMPLES, TOKENIZER, eagledata_cmd, run_cli, sim_config
from eagledata.cli import app
from eagledata.config import resolve_bundled
from eagledata.simserver import SimServerThread

runner = CliRunner()


def write_config(path: Path, url: str, extra: str = "") -> Path:
    path.write_text(
        f'[tokenizer]\nname = "{TOKENIZER}"\n[server]\nurls = ["{url}"]\n'
        "down_deadline_s = 5\nrequest_timeout_s = 10\n[run]\nconcurrency = 4\n"
        "[canary]\nenabled = false\n" + extra
    )
    return path


def test_a_file_of_unknown_columns_stops_before_anything_with_its_cause(
    tmp_path: Path,
) -> None:
    rows = tmp_path / "questions.jsonl"
    rows.write_text('{"question": "what is 2+2?"}\n{"question": "and 3+3?"}\n')
    # no server at all: the cause is named before any server, tokenizer or canary is touched
    config = write_config(tmp_path / "c.toml", "http://127.0.0.1:9")
    result = runner.invoke(
        app, ["generate", "-c", str(config), "-d", str(rows), "--out", str(tmp_path / "run")]
    )
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert (
        "its first 2 rows all fail the same way: no conversations, messages or 'prompt' "
        in (lines[0])
    )
    assert "(fields: question)" in lines[0] and 'prompt_field = "question"' in lines[0]
    assert lines[0].endswith(f"(in {rows}, row 1; the setting goes in {config})")
    assert not (tmp_path / "run").exists()


def test_a_message_without_a_role_names_the_file_and_the_row_not_the_config(
    tmp_path: Path,
) -> None:
    rows = tmp_path / "chats.jsonl"
    rows.write_text('{"messages": [{"content": "hi"}]}\n')
    config = write_config(tmp_path / "c.toml", "http://127.0.0.1:9")
    result = runner.invoke(
        app, ["generate", "-c", str(config), "-d", str(rows), "--out", str(tmp_path / "run")]
    )
    assert result.exit_code == 2
    assert result.output == (
        "eagledata: error: dataset chats: its first row fails: messages[0] has no 'role' "
        "(one of assistant, system, user); give every message a role: user, assistant or "
        f"system (or human, gpt) (in {rows}, row 1)\n"
    )


def test_a_run_in_which_every_item_failed_exits_non_zero(
    tokenizer_dir: str, tmp_path: Path
) -> None:
    with SimServerThread(sim_config(tokenizer_dir)) as sim:
        config = write_config(tmp_path / "c.toml", sim.url, "[generation]\nmax_prompt_tokens = 3\n")
        out = tmp_path / "run"
        result = runner.invoke(
            app,
            ["generate", "-c", str(config), "-d", str(SAMPLES / "sharegpt.jsonl"), "--out",
             str(out), "--no-progress"],
        )  # fmt: skip
    assert result.exit_code == 7, result.output
    assert "planned 40 = written 0 + failed 40" in result.output
    assert "eagledata: error: every item failed, no record was written (prompt_too_long 40)" in (
        result.output
    )


def test_a_bad_flag_value_blames_the_flag_and_a_typo_gets_its_near_key(tmp_path: Path) -> None:
    demo = Path(__file__).resolve().parents[1] / "configs" / "demo.toml"
    result = runner.invoke(
        app, ["generate", "-c", str(demo), "-d", "sample", "--concurrency", "abc"]
    )
    assert result.exit_code == 2
    assert result.output.startswith("eagledata: error: --concurrency 'abc': ")
    assert "demo.toml" not in result.output and len(result.output.splitlines()) == 1
    typo = tmp_path / "typo.toml"
    typo.write_text(f'[tokenizer]\nname = "{TOKENIZER}"\n[generation]\nmax_new_token = 5\n')
    result = runner.invoke(app, ["generate", "-c", str(typo), "-d", "sample"])
    assert result.exit_code == 2
    assert result.output == (
        f"eagledata: error: {typo}: generation.max_new_token: unknown key; "
        "did you mean 'max_new_tokens'?\n"
    )


def test_check_server_on_a_url_that_is_down_names_the_fix() -> None:
    result = runner.invoke(app, ["check-server", "http://127.0.0.1:9"])
    assert result.exit_code == 3
    assert "is an SGLang server running there? start one (eagledata launch-server)" in (
        result.output
    )


def test_plan_of_a_small_job_reads_in_minutes_not_zero_days() -> None:
    demo = Path(__file__).resolve().parents[1] / "configs" / "demo.toml"
    result = runner.invoke(app, ["plan", "-c", str(demo), "--dataset", "sample"])
    assert result.exit_code == 0, result.output
    assert "0.0M" not in result.output and "0.0 days" not in result.output
    assert ": 10,240 output tokens" in result.output
    assert "wall clock, minutes" in result.output


def test_launch_server_dry_run_names_the_profile_it_picked() -> None:
    result = run_cli("launch-server", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 1  # the command alone on stdout
    assert "profile kimi-k25-tp8 (the default" in result.stderr


def test_a_dry_run_leaves_sigterm_alone() -> None:
    """A dry run starts nothing for SIGTERM to stop: a caller's own handler stays."""

    def callers(signum: int, frame: object) -> None:
        raise AssertionError("never sent")

    previous = signal.signal(signal.SIGTERM, callers)
    try:
        result = runner.invoke(app, ["launch-server", "--dry-run"])
        assert result.exit_code == 0, result.output
        assert signal.getsignal(signal.SIGTERM) is callers
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_one_ctrl_c_while_starting_says_it_stopped_the_start_not_twice(
    tokenizer_dir: str, tmp_path: Path
) -> None:
    # A slow server: the canary's baseline takes seconds, and the Ctrl-C falls inside it.
    with SimServerThread(sim_config(tokenizer_dir, latency_s=0.5)) as sim:
        config = write_config(tmp_path / "c.toml", sim.url)
        config.write_text(config.read_text().replace("enabled = false", "enabled = true"))
        out = tmp_path / "run"
        process = subprocess.Popen(
            eagledata_cmd("generate", "-c", str(config), "-d", str(SAMPLES / "sharegpt.jsonl"),
                          "--out", str(out), "--no-progress"),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while not (out / "run.json").exists():  # created once the servers passed their check
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.01)
        manifest = orjson.loads((out / "run.json").read_bytes())
        assert manifest["canary"]["enabled"]
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert "stopped early: interrupted while starting" in stdout
    assert "twice" not in stdout and "Traceback" not in stderr


def test_a_server_address_without_a_scheme_is_told_to_add_it() -> None:
    result = runner.invoke(app, ["check-server", "localhost:30000"])
    assert result.exit_code == 2
    assert result.output == (
        "eagledata: error: localhost:30000 has no http:// or https://; add it: "
        "http://localhost:30000\n"
    )


def _hub_down_env(tmp_path: Path) -> dict[str, str]:
    """No hub (a closed port answers at once) and an empty cache of our own; offline unset."""
    env = {k: v for k, v in os.environ.items() if not k.endswith("_OFFLINE")}
    env |= {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "hf")}
    return env


def test_offline_a_hub_dataset_not_in_the_cache_fails_in_one_line_without_retries(
    tokenizer_dir: str, tmp_path: Path
) -> None:
    """The hub client's five backoffs per file took 28-48 s before the same answer."""
    with SimServerThread(sim_config(tokenizer_dir)) as sim:
        config = write_config(tmp_path / "c.toml", sim.url)
        started = time.monotonic()
        done = subprocess.run(
            eagledata_cmd("generate", "-c", str(config), "-d", "org/some-dataset", "--out",
                          str(tmp_path / "run"), "--no-progress"),
            env=_hub_down_env(tmp_path), capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        elapsed = time.monotonic() - started
    assert done.returncode == 2
    assert done.stderr == (
        "eagledata: error: cannot read dataset org/some-dataset: http://127.0.0.1:9 cannot be "
        "reached (no answer within 3 s) and the local cache has no datasets--org--some-dataset; "
        "connect to the network, copy a cache that holds it (HF_HOME), or pass a local file or "
        "directory\n"
    )
    assert elapsed < 25  # the retries alone took 28 s; a busy machine's start-up is a few


def test_offline_a_hub_tokenizer_the_cache_holds_is_read_from_it(tmp_path: Path) -> None:
    env = _hub_down_env(tmp_path)
    snapshot = tmp_path / "hf" / "hub" / "models--org--tiny" / "snapshots" / ("0" * 40)
    shutil.copytree(resolve_bundled(TOKENIZER), snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0" * 40)
    # what a download records when the repo has no config.json (the tokenizer asks for one)
    missing = snapshot.parents[1] / ".no_exist" / ("0" * 40)
    missing.mkdir(parents=True)
    (missing / "config.json").touch()
    script = (
        "from eagledata.config import TokenizerSettings\n"
        "from eagledata.source.tokenization import PromptTokenizer\n"
        "tokenizer = PromptTokenizer(TokenizerSettings(name='org/tiny'))\n"
        "print(tokenizer.vocab_size)\n"
        "try:\n"
        "    PromptTokenizer(TokenizerSettings(name='org/absent'))\n"
        "except Exception as error:\n"
        "    print(error)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    size, absent = done.stdout.splitlines()
    assert int(size) > 0
    assert absent == (
        "cannot load tokenizer 'org/absent': http://127.0.0.1:9 cannot be reached (no answer "
        "within 3 s) and the local cache has no models--org--absent; connect to the network, "
        "copy a cache that holds it (HF_HOME), or pass a local file or directory"
    )
    assert "Retrying" not in done.stderr


def test_the_draft_vocab_mapping_without_torch_names_the_extra(tmp_path: Path) -> None:
    """The install does not bring torch; the mapping's one line says how to get it, before the
    export reads anything."""
    import importlib.util

    if importlib.util.find_spec("torch") is not None:
        pytest.skip("torch is installed here: the mapping is written, not refused")
    result = runner.invoke(
        app, ["export", str(tmp_path / "run"), "--out", str(tmp_path / "x.jsonl"),
              "--draft-vocab-size", "32000"],
    )  # fmt: skip
    assert result.exit_code == 2
    assert result.output == (
        "eagledata: error: --draft-vocab-size writes a torch file and needs torch: pip install "
        "'eagledata[draft]' (or pip install torch); or pass --token-counts and build the "
        "mapping where torch is installed\n"
    )
