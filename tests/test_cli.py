"""Issue 3, items 5-6 and the CLI's error contract: ``status``, ``verify``, and one line on stderr
with a non-zero exit code for every problem, never a traceback. The commands run in this process
(``run_cli``); the contract as a real process gives it is checked on two of them."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import orjson
import pytest

from conftest import SAMPLES, TOKENIZER, eagledata_cmd, make_config, run_cli, sim_config
from eagledata.run import pipeline
from eagledata.rundir.records import failure_line
from eagledata.simserver import SimServerThread

SHAREGPT = str(SAMPLES / "sharegpt.jsonl")


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args)


def cli_process(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        eagledata_cmd(*args), capture_output=True, text=True, timeout=120, check=False
    )


def config_file(tmp_path: Path, url: str, extra: str = "") -> Path:
    path = tmp_path / "eagledata.toml"
    path.write_text(
        f'[tokenizer]\nname = "{TOKENIZER}"\n[server]\nurls = ["{url}"]\n'
        "guard_interval_s = 0.2\nguard_max_held = 8\n"
        "[generation]\nmax_new_tokens = 64\nmax_prompt_tokens = 4000\n"
        "[canary]\nenabled = false\n" + extra
    )
    return path


def one_error_line(result: subprocess.CompletedProcess[str], code: int) -> str:
    assert result.returncode == code, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("eagledata: error: ")
    return lines[0].removeprefix("eagledata: error: ")


@pytest.fixture(scope="module")
def finished(tokenizer_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run with records and failures (bad_rows.jsonl)."""
    with SimServerThread(sim_config(tokenizer_dir)) as server:
        out = tmp_path_factory.mktemp("cli") / "run"
        config = make_config([server.url], out, generation={"max_prompt_tokens": 4000})
        pipeline.generate(config, str(SAMPLES / "bad_rows.jsonl"), None, progress=False)
    return out


def copy_run(source: Path, target: Path) -> Path:
    import shutil

    shutil.copytree(source, target)
    return target


# --- status --------------------------------------------------------------------------------------


def test_status_of_a_finished_run(finished: Path) -> None:
    result = cli("status", str(finished))
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(":", 1) for line in result.stdout.splitlines())
    assert lines["planned"].strip() == "15"
    assert lines["written"].strip() == "3"
    assert lines["failed"].strip() == (
        "12 (bad_content 3, bad_row 3, empty_conversation 1, empty_prompt 1, missing_field 1, "
        "no_user_turn 1, prompt_too_long 1, unknown_role 1)"
    )
    assert lines["skipped"].strip() == "0"
    assert lines["left"].strip() == "0"
    assert lines["run"].strip() == str(finished)


def test_status_of_an_unfinished_run_says_what_is_left(
    sim: SimServerThread, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    pipeline.generate(make_config([sim.url], out), SHAREGPT, None, progress=False)
    (out / "plan.json").unlink()  # as if the plan had not been read to its end yet
    first = sorted((out / "shards").glob("*.jsonl"))[0]
    first.unlink()  # 7 records not written yet
    result = cli("status", str(out))
    assert result.returncode == 0, result.stderr
    assert "planned:  40 (estimate)" in result.stdout
    assert "written:  33" in result.stdout
    assert "left:     7" in result.stdout


def test_status_json_holds_the_documented_keys(finished: Path) -> None:
    import orjson

    result = cli("status", str(finished), "--json")
    assert result.returncode == 0, result.stderr
    status = orjson.loads(result.stdout)
    for key in ("run_dir", "planned", "plan_complete", "written", "failed", "skipped", "left"):
        assert key in status
    assert (status["planned"], status["written"], status["failed"], status["left"]) == (
        15,
        3,
        12,
        0,
    )
    assert status["output_tokens"] > 0
    # a run of a second is too short to rate (rundir/rates.py): no figure, its active time
    assert status["tok_s"]["overall"] is None and isinstance(status["tok_s"]["active_s"], float)
    assert set(status["quality"]) == {"flags", "canary"}
    assert sum(status["finish_reasons"].values()) == 3
    assert sum(status["failure_reasons"].values()) == 12
    human = cli("status", str(finished)).stdout
    assert "flags: " in human and "canary: " in human


def test_status_of_a_directory_that_is_no_run(tmp_path: Path) -> None:
    message = one_error_line(cli_process("status", str(tmp_path)), 5)
    assert message == (
        f"{tmp_path} is not an eagledata run directory (no run.json); start one with "
        "'eagledata generate --out DIR'"
    )


# --- verify ------------------------------------------------------------------------------------


def test_verify_a_sound_run(finished: Path) -> None:
    result = cli("verify", str(finished))
    assert result.returncode == 0, result.stdout
    assert result.stdout.splitlines()[-1] == "3 records, 12 failures: ok"


def shard_lines(run: Path) -> tuple[Path, list[bytes]]:
    shard = sorted((run / "shards").glob("*.jsonl"))[0]
    return shard, shard.read_bytes().splitlines(keepends=True)


def test_verify_fails_on_a_corrupted_shard(finished: Path, tmp_path: Path) -> None:
    run = copy_run(finished, tmp_path / "run")
    shard, lines = shard_lines(run)
    lines[1] = lines[1][: len(lines[1]) // 2] + b"\n"  # a line cut in half
    shard.write_bytes(b"".join(lines))
    result = cli("verify", str(run))
    assert result.returncode == 1
    assert "problem: shards/shard-000000.jsonl:2: invalid JSON" in result.stdout
    assert result.stdout.splitlines()[-1].endswith("2 problem(s)")  # and the plan is short


def test_verify_fails_on_a_wrong_token_count(finished: Path, tmp_path: Path) -> None:
    run = copy_run(finished, tmp_path / "run")
    shard, lines = shard_lines(run)
    record = orjson.loads(lines[0])
    record["output_ids"] = record["output_ids"][:-1]
    lines[0] = orjson.dumps(record) + b"\n"
    shard.write_bytes(b"".join(lines))
    result = cli("verify", str(run))
    assert result.returncode == 1
    count = record["completion_tokens"]
    assert (
        f"problem: shards/shard-000000.jsonl:1: completion_tokens {count} != {count - 1} ids"
        in result.stdout
    )


def test_verify_fails_on_duplicate_ids(finished: Path, tmp_path: Path) -> None:
    run = copy_run(finished, tmp_path / "run")
    _, lines = shard_lines(run)
    (run / "shards" / "shard-000007.jsonl").write_bytes(lines[0])  # one record twice
    result = cli("verify", str(run))
    assert result.returncode == 1
    item_id = orjson.loads(lines[0])["id"]
    assert (
        f"problem: shards/shard-000007.jsonl:1: id '{item_id}' already at "
        "shards/shard-000000.jsonl:1" in result.stdout
    )
    assert "problem: plan has 15 items but 16 are accounted for" in result.stdout


def test_verify_fails_on_a_record_that_also_failed(finished: Path, tmp_path: Path) -> None:
    run = copy_run(finished, tmp_path / "run")
    _, lines = shard_lines(run)
    item_id = orjson.loads(lines[0])["id"]
    with (run / "failures.jsonl").open("ab") as handle:
        entry = failure_line(
            item_id=item_id,
            dataset="bad_rows",
            row_id="good-001",
            sample=0,
            reason="timeout",
            message="timed out",
            attempts=5,
        )
        handle.write(entry.dump() + b"\n")
    result = cli("verify", str(run))
    assert result.returncode == 1
    assert f"id '{item_id}' already at shards/shard-000000.jsonl:1" in result.stdout


def test_verify_fails_on_a_lost_shard(finished: Path, tmp_path: Path) -> None:
    run = copy_run(finished, tmp_path / "run")
    sorted((run / "shards").glob("*.jsonl"))[0].unlink()
    result = cli("verify", str(run))
    assert result.returncode == 1
    assert (
        "problem: plan has 15 items but 12 are accounted for (0 records + 12 failed/skipped)"
        in result.stdout
    )


# --- one line on stderr, a non-zero exit, no traceback --------------------------------------------


def test_unknown_dataset(sim: SimServerThread, tmp_path: Path) -> None:
    config = config_file(tmp_path, sim.url, f'[datasets.mine]\nsource = "{SHAREGPT}"\n')
    message = one_error_line(cli("generate", "--config", str(config), "--dataset", "nosuch"), 2)
    assert message == (
        "unknown dataset 'nosuch'; use a name from the config (mine), a .jsonl/.json/.parquet "
        "path, or a hub id like org/name"
    )


def test_missing_dataset_file(sim: SimServerThread, tmp_path: Path) -> None:
    config = config_file(tmp_path, sim.url)
    missing = tmp_path / "nope.jsonl"
    message = one_error_line(cli("generate", "--config", str(config), "--dataset", str(missing)), 2)
    assert message == f"dataset file {missing} not found; check the path or the name"


def test_missing_config_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    message = one_error_line(
        cli_process("generate", "--config", str(missing), "--dataset", SHAREGPT), 2
    )
    assert message == f"config file {missing} not found; pass --config FILE"


@pytest.mark.slow
def test_bad_config_value(sim: SimServerThread, tmp_path: Path) -> None:
    config = config_file(tmp_path, sim.url, "[run]\nconcurrency = 0\n")
    message = one_error_line(cli("generate", "--config", str(config), "--dataset", SHAREGPT), 2)
    assert message == f"{config}: run.concurrency: must be 'auto' or an integer from 1 to 65536"


@pytest.mark.slow
def test_unreachable_server(tmp_path: Path) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    config = config_file(tmp_path, url)
    message = one_error_line(
        cli(
            "generate",
            "--config",
            str(config),
            "--dataset",
            SHAREGPT,
            "--out",
            str(tmp_path / "run"),
        ),
        3,
    )
    assert message == (
        f"cannot reach an SGLang server at {url}; start one (eagledata launch-server) or fix "
        "--server"
    )


def test_resume_of_a_directory_that_is_no_run(tmp_path: Path) -> None:
    message = one_error_line(cli("resume", str(tmp_path / "nothing")), 5)
    assert message.endswith(
        "is not an eagledata run directory (no run.json); start one with "
        "'eagledata generate --out DIR'"
    )


# --- several servers ---------------------------------------------------------------------------


@pytest.mark.slow
def test_server_may_repeat(tokenizer_dir: str, tmp_path: Path) -> None:
    with (
        SimServerThread(sim_config(tokenizer_dir, latency_s=0.02)) as first,
        SimServerThread(sim_config(tokenizer_dir, latency_s=0.02)) as second,
    ):
        config = config_file(tmp_path, "http://127.0.0.1:9")  # replaced by --server
        out = tmp_path / "run"
        result = cli(
            "generate",
            "--config",
            str(config),
            "--dataset",
            SHAREGPT,
            "--out",
            str(out),
            "--server",
            first.url,
            "--server",
            second.url,
            "--no-progress",
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("planned 40 = written 40 + failed 0 + skipped 0 + left 0")
        # Both take work: how much each gets depends on timing (the one with more room gets the
        # next request), so only "both" is a promise; tests/test_loadcontrol.py covers the split.
        assert first.stats()["requests"] > 0 and second.stats()["requests"] > 0
    assert cli("verify", str(out)).returncode == 0
