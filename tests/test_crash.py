"""Issue 3, item 4: crash safety of the real CLI process (invariant 3).

``eagledata generate`` runs as a subprocess against a simulated server in this process; it is
SIGKILLed at seeded random moments, resumed each time, and at the end the run must hold exactly
the ids of an uninterrupted run, each once, every record token-faithful. Ctrl-C (SIGINT) drains
and exits 130; a run directory from another schema, with other settings, or already locked is
refused with one line.
"""

from __future__ import annotations

import random
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from conftest import (
    SAMPLES,
    TOKENIZER,
    eagledata_cmd,
    make_config,
    read_failures,
    read_records,
    run_cli,
    sim_config,
)
from eagledata.run import pipeline
from eagledata.rundir.manifest import RunDir
from eagledata.rundir.shardindex import build_index, load_index
from eagledata.rundir.totals import sealed_shards
from eagledata.rundir.verify import verify_run
from eagledata.simserver import SimServerThread, expected_output

DATASET = str(SAMPLES / "sharegpt.jsonl")  # 40 rows
SAMPLES_PER_PROMPT = 4
GENERATION = {"max_new_tokens": 64, "temperature": 0.7, "samples_per_prompt": SAMPLES_PER_PROMPT}
# Some 503s to retry and some broken token counts that end in the failure file, so the kills
# also land while failure entries are being written.
FAULTS = {"fail_503_rate": 0.05, "bad_count_rate": 0.03}


def write_config(path: Path, url: str, **run: Any) -> Path:
    settings = {"shard_size": 7, "concurrency": 6, "fsync_interval_s": 0.05, **run}
    lines = [
        "[tokenizer]",
        f'name = "{TOKENIZER}"',
        "[generation]",
        *(f"{key} = {value}" for key, value in GENERATION.items()),
        "[server]",
        f'urls = ["{url}"]',
        "guard_interval_s = 0.2",
        "guard_max_held = 8",
        "backoff_base_s = 0.01",
        "backoff_max_s = 0.05",
        "down_deadline_s = 10",
        "request_timeout_s = 10",
        "[run]",
        *(f"{key} = {value}" for key, value in settings.items()),
        "[canary]",  # test_canary.py covers it; these tests are about kills and Ctrl-C
        "enabled = false",
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def busy_sim(tokenizer_dir: str) -> Iterator[SimServerThread]:
    """Slow enough that a kill always finds requests in flight and results held."""
    with SimServerThread(sim_config(tokenizer_dir, latency_s=0.04, **FAULTS)) as server:
        yield server


def generate_cmd(config: Path, out: Path) -> list[str]:
    return eagledata_cmd(
        "generate",
        "--config",
        str(config),
        "--dataset",
        DATASET,
        "--out",
        str(out),
        "--no-progress",
    )


def resume_cmd(out: Path) -> list[str]:
    return eagledata_cmd("resume", str(out), "--no-progress")


def spawn(cmd: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(cmd: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def finish_here(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    """``cmd`` run in this process: for a refusal, which needs no process of its own."""
    assert cmd[:3] == eagledata_cmd()
    return run_cli(*cmd[3:])


def committed_ids(out: Path) -> list[str]:
    if not (out / "shards").is_dir():
        return []
    return [r["id"] for r in read_records(out)] + [f["id"] for f in read_failures(out)]


def wait_for_committed(out: Path, count: int, process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60  # generous: a few seconds on a busy machine
    while len(committed_ids(out)) < count:
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "no progress"
        time.sleep(0.005)


def reference_ids(tmp_path: Path, url: str) -> set[str]:
    """The ids an uninterrupted run plans (records + failures)."""
    out = tmp_path / "reference"
    config = make_config([url], out, generation=GENERATION)
    summary = pipeline.generate(config, DATASET, None, progress=False)
    assert summary.left == 0
    return set(committed_ids(out))


def assert_faithful(out: Path, server: SimServerThread, prompt_tokenizer: Any) -> None:
    params = make_config([server.url], out, generation=GENERATION).generation.sampling_params()
    for record in read_records(out):
        assert record["input_ids"] == prompt_tokenizer.encode(record["messages"])
        output, finish_reason = expected_output(
            record["input_ids"], {**params, "sampling_seed": record["sample"]}, server.config
        )
        assert record["output_ids"] == output, record["id"]
        assert record["finish_reason"] == finish_reason["type"]


@pytest.mark.slow
def test_kill_9_at_random_moments_then_resume_is_exactly_once(
    busy_sim: SimServerThread, prompt_tokenizer: Any, tmp_path: Path
) -> None:
    rng = random.Random(20240531)
    out = tmp_path / "run"
    config = write_config(tmp_path / "eagledata.toml", busy_sim.url)
    expected = reference_ids(tmp_path, busy_sim.url)
    assert len(expected) == 40 * SAMPLES_PER_PROMPT

    kills = torn = 0
    progress_seen: list[int] = []
    for round_no in range(8):
        cmd = resume_cmd(out) if RunDir(out).exists() else generate_cmd(config, out)
        process = spawn(cmd)
        if round_no % 2:
            # wait for some new work to land, then kill a little after it: mid-stream
            wait_for_committed(out, len(committed_ids(out)) + rng.randint(1, 12), process)
            time.sleep(rng.uniform(0.0, 0.05))
        else:
            time.sleep(rng.uniform(0.05, 0.6))  # anywhere, start-up included
        if process.poll() is not None:
            break  # it finished before the kill: nothing left to interrupt
        process.send_signal(signal.SIGKILL)
        process.communicate()
        kills += 1
        # What a kill leaves behind is consistent right away: no id twice, sealed shards whole.
        ids = committed_ids(out)
        assert len(ids) == len(set(ids))
        assert set(ids) <= expected
        progress_seen.append(len(ids))
        torn += (
            sum(
                1
                for p in (out / "pending").glob("*.jsonl")
                if p.stat().st_size and not p.read_bytes().endswith(b"\n")
            )
            if (out / "pending").is_dir()
            else 0
        )
        if RunDir(out).exists():
            report = verify_run(out)
            assert report.ok, report.problems

    assert kills >= 6, kills
    assert progress_seen[-1] > 0
    # A power cut can tear the last line of the journal (a kill -9 cannot: one write(2) a line).
    pending = sorted((out / "pending").glob("*.jsonl"))
    if pending:
        with pending[-1].open("ab") as handle:
            handle.write(b'{"id": "sharegpt/torn", "input_ids": [1, 2')
        torn += 1

    done = finish(resume_cmd(out))
    assert done.returncode == 0, done.stderr
    assert "left 0" in done.stdout and "stopped early" not in done.stdout

    ids = committed_ids(out)
    assert len(ids) == len(set(ids)), "an item landed twice"
    assert set(ids) == expected, "an item was lost"
    assert_faithful(out, busy_sim, prompt_tokenizer)
    assert all(f["reason"] for f in read_failures(out))
    assert not list((out / "pending").glob("*.jsonl")), "every journal sealed at the end"
    verified = finish(eagledata_cmd("verify", str(out)))
    assert verified.returncode == 0, verified.stdout
    assert verified.stdout.strip().endswith(": ok")
    # Shard indexes: a kill between a shard's seal and its index leaves none; none is wrong.
    for shard in sealed_shards(out):
        assert load_index(shard) == build_index(shard), shard
    assert verify_run(out, full=True).ok
    print(f"kills survived: {kills}, torn tails repaired: {torn}, items: {len(ids)}")


@pytest.mark.slow
def test_ctrl_c_drains_in_flight_work_and_exits_130(
    tokenizer_dir: str, prompt_tokenizer: Any, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    # 0.25 s answers, six at a time: seconds of work are left after the first 20, so the
    # Ctrl-C finds the run going however slowly a busy machine delivers it
    with SimServerThread(sim_config(tokenizer_dir, latency_s=0.25, **FAULTS)) as slow:
        config = write_config(tmp_path / "eagledata.toml", slow.url)
        process = spawn(generate_cmd(config, out))
        wait_for_committed(out, 20, process)
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=60)
        aborted = slow.stats()["abort_calls"]

    assert process.returncode == 130, stderr
    assert f"stopped early: interrupted; continue with 'eagledata resume {out}'" in stdout
    assert "stopping: finishing" in stderr and "Traceback" not in stderr
    assert aborted == []  # drained: nothing in flight was abandoned
    assert not list((out / "pending").glob("*.jsonl"))  # the journal was sealed on the way out
    assert verify_run(out).ok

    with SimServerThread(sim_config(tokenizer_dir, **FAULTS)) as fast:  # the same model
        done = finish([*resume_cmd(out), "--server", fast.url])
        assert done.returncode == 0, done.stderr
        ids = committed_ids(out)
        assert len(ids) == len(set(ids)) == 40 * SAMPLES_PER_PROMPT
        assert_faithful(out, fast, prompt_tokenizer)


@pytest.mark.slow
def test_a_second_ctrl_c_abandons_in_flight_work_and_aborts_it(
    tokenizer_dir: str, prompt_tokenizer: Any, tmp_path: Path
) -> None:
    # 2 s answers: the drain the first Ctrl-C starts lasts long enough for the second to find
    # requests in flight, however slowly a busy machine delivers it
    with SimServerThread(sim_config(tokenizer_dir, latency_s=2.0)) as slow:
        out = tmp_path / "run"
        config = write_config(tmp_path / "eagledata.toml", slow.url, concurrency=4, limit=5)
        process = spawn(generate_cmd(config, out))
        wait_for_committed(out, 4, process)
        err_lines: list[str] = []
        draining = threading.Event()

        def read_stderr() -> None:
            assert process.stderr is not None
            for line in process.stderr:
                err_lines.append(line)
                if line.startswith("stopping: finishing"):
                    draining.set()

        reader = threading.Thread(target=read_stderr, daemon=True)
        reader.start()
        process.send_signal(signal.SIGINT)
        # the second Ctrl-C once the first has been handled (two signals sent at once may
        # arrive as one): the process says it is draining
        assert draining.wait(timeout=60), "".join(err_lines)
        process.send_signal(signal.SIGINT)
        assert process.stdout is not None
        stdout = process.stdout.read()
        process.wait(timeout=60)
        reader.join(timeout=60)
        stderr = "".join(err_lines)
        assert process.returncode == 130, stderr
        assert "stopped early: interrupted twice: in-flight requests abandoned" in stdout
        assert "Traceback" not in stderr
        aborted = slow.stats()["abort_calls"]
        assert 1 <= len(aborted) <= 4  # what was in flight, each by its own rid
        assert all(rid.startswith("eagledata-") for rid in aborted)
        assert verify_run(out).ok

    with SimServerThread(sim_config(tokenizer_dir)) as fast:  # the same model, no waiting
        done = finish([*resume_cmd(out), "--server", fast.url])
        assert done.returncode == 0, done.stderr
        ids = committed_ids(out)
        assert len(ids) == len(set(ids)) == 5 * SAMPLES_PER_PROMPT
        assert_faithful(out, fast, prompt_tokenizer)


# --- refusals -----------------------------------------------------------------------------------


@pytest.fixture
def finished_run(sim: SimServerThread, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    config = make_config([sim.url], out, generation=GENERATION, run={"limit": 3})
    pipeline.generate(config, DATASET, None, progress=False)
    return out


def test_a_run_dir_from_another_schema_version_is_refused(finished_run: Path) -> None:
    manifest = orjson.loads((finished_run / "run.json").read_bytes())
    manifest["schema_version"] = 2
    (finished_run / "run.json").write_bytes(orjson.dumps(manifest))
    result = finish_here(resume_cmd(finished_run))
    assert result.returncode == 5
    assert result.stderr == (
        f"eagledata: error: {finished_run} was written with run schema 2, this eagledata reads "
        "1; use the eagledata version that made it, or a new --out\n"
    )


def test_changed_settings_are_refused_naming_the_keys(
    sim: SimServerThread, finished_run: Path, tmp_path: Path
) -> None:
    config = write_config(tmp_path / "eagledata.toml", sim.url, limit=3)
    result = finish_here(
        [*generate_cmd(config, finished_run), "--max-new-tokens", "32", "--samples", "2"]
    )
    assert result.returncode == 5
    assert result.stderr == (
        f"eagledata: error: {finished_run} was started with other settings "
        "(generation.max_new_tokens, generation.samples_per_prompt); resume it with "
        f"'eagledata resume {finished_run}' or pass a new --out\n"
    )


@pytest.mark.slow
def test_a_second_process_on_the_same_run_dir_is_refused(
    tokenizer_dir: str, tmp_path: Path
) -> None:
    # 3 s answers: the first run outlasts the second's start-up on a loaded machine
    with SimServerThread(sim_config(tokenizer_dir, latency_s=3.0)) as slow:
        out = tmp_path / "run"
        config = write_config(tmp_path / "eagledata.toml", slow.url, concurrency=2)
        first = spawn(generate_cmd(config, out))
        try:
            wait_for_committed(out, 1, first)
            second = finish(resume_cmd(out))
            assert second.returncode == 5
            assert second.stderr == (
                f"eagledata: error: eagledata (PID {first.pid}) is working on {out}; wait for it "
                f"or stop it (kill {first.pid})\n"
            )
            assert first.poll() is None  # the first one is untouched
            assert (out / ".lock").read_text().strip() == str(first.pid)
        finally:
            first.kill()
            first.communicate()
    ids = committed_ids(out)
    assert len(ids) == len(set(ids))
