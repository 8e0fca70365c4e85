"""Issue 23, item 4: every wait bounded. One stop signal ends a run within the request deadline
and starts no new attempt; ``check-server`` sends the API key like every other command; a
Ctrl-C while the CLI starts prints one line, never a traceback (real subprocesses). The whole
request's deadline against a trickling server is in ``test_hostile.py``."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import SAMPLES, TOKENIZER, eagledata_cmd, read_failures, read_records, sim_config
from eagledata.simserver import SimServerThread
from hostile import HostileServer

DATASET = str(SAMPLES / "prompts.jsonl")
REQUEST_TIMEOUT_S = 4.0


@pytest.mark.slow
def test_one_sigterm_against_a_silent_server_ends_the_run_within_the_request_deadline(
    tokenizer_dir: str, tmp_path: Path
) -> None:
    """Today one SIGTERM against a silent server kept retrying for 79 s. Now the requests in
    flight end at their deadline, no attempt starts after the signal, and the items are left
    for resume: neither records nor failures."""
    with HostileServer(tokenizer_dir, "silent", only_sample=None) as server:
        config = tmp_path / "eagledata.toml"
        config.write_text(
            f'[tokenizer]\nname = "{TOKENIZER}"\n[server]\nurls = ["{server.url}"]\n'
            f"request_timeout_s = {REQUEST_TIMEOUT_S}\nmax_attempts = 8\n"
            "backoff_base_s = 0.01\nbackoff_max_s = 0.05\n"
            "[generation]\nmax_new_tokens = 32\n"
            "[run]\nconcurrency = 2\nlimit = 6\n[canary]\nenabled = false\n"
        )
        out = tmp_path / "run"
        process = subprocess.Popen(
            eagledata_cmd(
                "generate",
                "--config",
                str(config),
                "--dataset",
                DATASET,
                "--out",
                str(out),
                "--no-progress",
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 60
            while len(server.generate_times) < 2:  # both slots hold a silent request
                assert process.poll() is None, process.communicate()
                assert time.monotonic() < deadline, "no request reached the server"
                time.sleep(0.01)
            signalled = time.monotonic()
            process.send_signal(signal.SIGTERM)
            _, err = process.communicate(timeout=60)
            took = time.monotonic() - signalled
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()
        sent = len(server.generate_times)
    assert process.returncode == 130, err
    assert "Traceback" not in err
    assert sent == 2, "an attempt started after the stop signal"
    # the two silent requests end at their deadline; the rest is the process winding down
    # (generous: a loaded 2-core machine). Retrying, it took 8 deadlines and more.
    assert took < REQUEST_TIMEOUT_S + 10, took
    assert read_records(out) == [] and read_failures(out) == []


KEY = "sk-test-check-server"


@pytest.mark.slow
@pytest.mark.parametrize("command", ["check-server", "plan"])
def test_check_server_sends_the_api_key_like_every_other_command(
    tokenizer_dir: str, tmp_path: Path, command: str
) -> None:
    """Today check-server sent no key: HTTP 401 on a keyed server."""
    config = tmp_path / "eagledata.toml"
    config.write_text(f'[tokenizer]\nname = "{TOKENIZER}"\n[server]\napi_key_env = "TEST_KEY"\n')
    with SimServerThread(sim_config(tokenizer_dir, api_key=KEY)) as sim:
        args = (
            [command, sim.url, "--config", str(config)]
            if command == "check-server"
            else [command, "--server", sim.url, "--config", str(config)]
        )

        def run(env_key: str | None) -> subprocess.CompletedProcess[str]:
            env = {k: v for k, v in __import__("os").environ.items() if k != "TEST_KEY"}
            if env_key is not None:
                env["TEST_KEY"] = env_key
            return subprocess.run(
                eagledata_cmd(*args),
                capture_output=True,
                text=True,
                timeout=120,
                env=env,
                check=False,
            )

        keyed = run(KEY)
        assert keyed.returncode == 0, keyed.stderr
        missing = run(None)
    assert missing.returncode == 3
    assert missing.stderr == (
        f"eagledata: error: {sim.url} refused the API key (HTTP 401); set the right key in the "
        "environment variable named by server.api_key_env (TEST_KEY)\n"
    )


# Fire SIGINT at this process the moment it first imports ``target``: a Ctrl-C at that point
# of the CLI's start, whatever the machine's speed.
INTERRUPT_AT_IMPORT = """
import os, signal, sys
target = sys.argv[1]

class InterruptAt:
    def find_spec(self, name, path, target_module=None):
        if name == target:
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, InterruptAt())
sys.argv = ["eagledata", *sys.argv[2:]]
from eagledata.cli import main
main()
"""


@pytest.mark.parametrize(
    "module", ["typer", "pydantic", "eagledata.config", "eagledata.run.pipeline", "httpx"]
)
def test_ctrl_c_while_the_cli_starts_is_one_line_never_a_traceback(module: str) -> None:
    """Today a Ctrl-C in the first 0.3 s (the imports) printed a traceback."""
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            INTERRUPT_AT_IMPORT,
            module,
            "generate",
            "--dataset",
            "/nonexistent/rows.jsonl",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 130, result.stderr
    assert result.stderr == "eagledata: interrupted\n"


# Send SIGUSR1 to this process the moment it first imports ``target``.
USR1_AT_IMPORT = INTERRUPT_AT_IMPORT.replace("signal.SIGINT", "signal.SIGUSR1")


@pytest.mark.parametrize("module", ["typer", "eagledata.config", "eagledata.run.pipeline"])
def test_usr1_while_the_cli_starts_prints_the_stacks_and_the_command_goes_on(module: str) -> None:
    """The README offers kill -USR1 to see where a run waits; before the run's loop installed
    its handler, USR1 killed the process (exit 138)."""
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            USR1_AT_IMPORT,
            module,
            "generate",
            "--dataset",
            "/nonexistent/rows.jsonl",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2, result.stderr  # the command's own end: no such dataset
    assert "(most recent call first)" in result.stderr, result.stderr
    assert result.stderr.rstrip().splitlines()[-1].startswith("eagledata: error:")


@pytest.mark.slow
def test_usr1_while_the_servers_are_checked_prints_every_task_and_the_run_goes_on(
    tokenizer_dir: str, tmp_path: Path
) -> None:
    """During the start's server checks (a /server_info slow to come), USR1 prints each task's
    chain of awaits as it does mid-run; the run then ends as it would have."""
    with HostileServer(tokenizer_dir, spoiled={"/server_info": "slow"}, trickle_s=2.0) as server:
        config = tmp_path / "eagledata.toml"
        config.write_text(
            f'[tokenizer]\nname = "{TOKENIZER}"\n[server]\nurls = ["{server.url}"]\n'
            "[generation]\nmax_new_tokens = 16\n"
            "[run]\nconcurrency = 2\nlimit = 1\n[canary]\nenabled = false\n"
        )
        process = subprocess.Popen(
            eagledata_cmd(
                "generate",
                "--config",
                str(config),
                "--dataset",
                DATASET,
                "--out",
                str(tmp_path / "run"),
                "--no-progress",
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 60
            while "/server_info" not in server.asked:
                assert process.poll() is None, process.communicate()
                assert time.monotonic() < deadline, "the server was never checked"
                time.sleep(0.01)
            process.send_signal(signal.SIGUSR1)
            _, err = process.communicate(timeout=120)
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()
    assert process.returncode == 0, err
    assert "--- task " in err, err
    assert "Traceback" not in err
