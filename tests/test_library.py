"""The library a trainer calls (docs/library.md): rounds of fresh samples of the same prompts,
exactly once per (row, round), resumable, from an event loop or a thread, with typed errors."""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

import eagledata
from conftest import TOKENIZER, read_records, sim_config, until
from eagledata.errors import DatasetError, ServerRefusedError, UsageError
from eagledata.export.selection import Selection
from eagledata.simserver import SimServerThread
from trainerkit import VENV, torch_overlay

PROMPTS = [f"Tell me fact number {i} about the sea." for i in range(12)]
FAST = {
    "guard_interval_s": 0.2,
    "guard_max_held": 8,
    "backoff_base_s": 0.01,
    "backoff_max_s": 0.05,
    "down_deadline_s": 5,
    "request_timeout_s": 10,
    "connect_timeout_s": 2,
    "shard_size": 5,
    "concurrency": 4,
    "canary": False,
}


def call_args(url: str, out: Path, **extra: Any) -> dict[str, Any]:
    return {
        "server": url,
        "out": out,
        "tokenizer": TOKENIZER,
        "max_new_tokens": 24,
        "temperature": 0.8,
        **FAST,
        **extra,
    }


def outputs(out: Path, round_index: int) -> dict[str, list[int]]:
    return {r.id: r.output_ids for r in eagledata.records(out, round=round_index)}


def test_two_rounds_are_fresh_samples_of_the_same_prompts(
    sim: SimServerThread, tmp_path: Path
) -> None:
    out = tmp_path / "rounds"
    first = eagledata.regenerate(PROMPTS, **call_args(sim.url, out, round=0))
    second = eagledata.regenerate(PROMPTS, **call_args(sim.url, out, round=1))

    assert (first.planned, first.written, first.left) == (12, 12, 0)
    assert (second.planned, second.written, second.left) == (12, 12, 0)
    assert first.run_dir == out / "round-0000" and second.run_dir == out / "round-0001"
    assert first.complete and first.tokens_per_s > 0 and "stop" in first.quality
    assert eagledata.rounds(out) == [0, 1]
    zero, one = outputs(out, 0), outputs(out, 1)
    assert zero.keys() == one.keys() == {f"prompts/{i}/0" for i in range(12)}
    prompts_of = {r.id: r.input_ids for r in eagledata.records(out, round=1)}
    assert all(prompts_of[r.id] == r.input_ids for r in eagledata.records(out, round=0))
    differ = sum(zero[key] != one[key] for key in zero)
    assert differ >= 10, f"only {differ} of 12 answers changed between rounds"
    # every round, oldest first, when no round is named
    assert [r.id for r in eagledata.records(out)] == [*zero, *one]

    again = eagledata.regenerate(PROMPTS, **call_args(sim.url, out, round=1))
    assert again.session_records == 0 and again.written == 12  # exactly once per round
    assert outputs(out, 1) == one


def test_a_round_is_seeded_by_the_round_frozen_and_the_same_on_a_second_server(
    sim: SimServerThread, tmp_path: Path, tokenizer_dir: str
) -> None:
    """The seed is a function of (round, sample): the same round regenerated elsewhere gives the
    same samples (a server that takes sampling_seed); resume keeps the round's seed."""
    eagledata.regenerate(PROMPTS[:4], **call_args(sim.url, tmp_path / "a", round=3))
    with SimServerThread(sim_config(tokenizer_dir)) as other:
        eagledata.regenerate(PROMPTS[:4], **call_args(other.url, tmp_path / "b", round=3))
    assert outputs(tmp_path / "a", 3) == outputs(tmp_path / "b", 3)
    stored = orjson.loads((tmp_path / "a" / "round-0003" / "run.json").read_bytes())
    assert stored["config"]["generation"]["round"] == 3


def test_other_prompts_for_the_same_out_are_refused_in_one_line(
    sim: SimServerThread, tmp_path: Path
) -> None:
    out = tmp_path / "rounds"
    eagledata.regenerate(PROMPTS[:3], **call_args(sim.url, out))
    with pytest.raises(DatasetError, match="holds other prompts") as caught:
        eagledata.regenerate(PROMPTS[:4], **call_args(sim.url, out, round=1))
    assert "\n" not in str(caught.value)
    assert eagledata.rounds(out) == [0]


def test_a_cancelled_round_resumes_exactly_once(tokenizer_dir: str, tmp_path: Path) -> None:
    """Cancel the coroutine once some records are committed: the cancellation reaches the
    caller, nothing committed is lost, and the next call completes the round with one record
    per (row, sample)."""
    out = tmp_path / "rounds"
    prompts = [f"Question {i}: what is {i} plus {i}?" for i in range(40)]
    slow = sim_config(tokenizer_dir, latency_s=0.05)

    async def cancel_midway(url: str) -> None:
        task = asyncio.create_task(eagledata.aregenerate(prompts, **call_args(url, out)))
        await until(lambda: len(read_records(out / "round-0000")) >= 8 or task.done())
        assert not task.done(), "the round ended before it could be cancelled"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with SimServerThread(slow) as server:
        asyncio.run(cancel_midway(server.url))
        kept = len(read_records(out / "round-0000"))
        assert 8 <= kept < 40
        every: dict[str, Any] = {"keep": ("empty", "degenerate"), "cache_dir": tmp_path / "cache"}
        assert len(eagledata.dataset(out, round=0, **every)) == kept
        summary = eagledata.regenerate(prompts, **call_args(server.url, out))
    ids = [r.id for r in eagledata.records(out, round=0)]
    assert len(ids) == 40 and len(set(ids)) == 40
    assert summary.session_records == 40 - kept and summary.left == 0
    assert len(eagledata.dataset(out, round=0, **every)) == 40  # the grown round, not the cache


def test_aregenerate_runs_on_the_callers_loop_without_its_signals(
    sim: SimServerThread, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Inside a running loop (a trainer's): no signal handler of eagledata's is installed, the
    progress goes to the callback and nothing is printed."""
    events: list[eagledata.ProgressEvent] = []
    handlers: set[Any] = set()

    def on_progress(event: eagledata.ProgressEvent) -> None:
        events.append(event)
        handlers.add(signal.getsignal(signal.SIGTERM))

    async def trainer() -> eagledata.RunSummary:
        beside = asyncio.create_task(asyncio.sleep(0.01))  # the host's own work goes on
        summary = await eagledata.aregenerate(
            PROMPTS, on_progress=on_progress, **call_args(sim.url, tmp_path / "rounds")
        )
        await beside
        return summary

    summary = asyncio.run(trainer())
    assert summary.written == 12
    assert handlers == {signal.SIG_DFL}
    assert events and events[-1].kind == "end" and events[-1].done == 12
    captured = capfd.readouterr()
    assert captured.out == "" and captured.err == ""


def test_regenerate_inside_a_running_loop_names_aregenerate(tmp_path: Path) -> None:
    async def wrong() -> None:
        eagledata.regenerate(PROMPTS, server="http://127.0.0.1:9", out=tmp_path)

    with pytest.raises(UsageError, match="aregenerate"):
        asyncio.run(wrong())
    assert not (tmp_path / "prompts.jsonl").exists()


def test_regenerate_from_a_thread_while_the_main_thread_reads(
    sim: SimServerThread, tmp_path: Path
) -> None:
    out = tmp_path / "rounds"
    eagledata.regenerate(PROMPTS, **call_args(sim.url, out, round=0))
    result: dict[str, Any] = {}

    def background() -> None:
        try:
            result["summary"] = eagledata.regenerate(PROMPTS, **call_args(sim.url, out, round=1))
        except BaseException as error:  # the test's thread reports, the test raises
            result["error"] = error

    worker = threading.Thread(target=background)
    worker.start()
    data = eagledata.dataset(out, round=0, cache_dir=tmp_path / "cache")  # beside round 1
    worker.join(timeout=120)
    assert "error" not in result, result.get("error")
    assert result["summary"].written == 12
    by_id = {r.id: r for r in eagledata.records(out, round=0)}
    # the records export keeps: empty and degenerate answers are left out unless kept
    kept = {key for key, r in by_id.items() if Selection.build().skip_reason(r) is None}
    assert {row["id"] for row in data} == kept
    assert len(eagledata.dataset(out, round=0, keep=("empty", "degenerate"))) == 12
    again = eagledata.dataset(out, round=0, cache_dir=tmp_path / "cache")
    assert again.cache_files == data.cache_files  # an unchanged round: read from the cache
    for row in data:
        record = by_id[row["id"]]
        assert row["input_ids"] == record.input_ids + record.output_ids
        assert row["loss_mask"] == [0] * len(record.input_ids) + [1] * len(record.output_ids)
    both = eagledata.dataset(out, keep=("empty", "degenerate"))
    assert collections.Counter(row["id"].split("/")[0] for row in both) == {
        "round-0000": 12,
        "round-0001": 12,
    }


def test_an_fp8_server_is_refused_with_the_guards_error(tokenizer_dir: str, tmp_path: Path) -> None:
    with (
        SimServerThread(sim_config(tokenizer_dir, kv_cache_dtype="fp8_e4m3")) as fp8,
        pytest.raises(ServerRefusedError, match="fp8"),
    ):
        eagledata.regenerate(PROMPTS, **call_args(fp8.url, tmp_path / "rounds"))
    assert eagledata.rounds(tmp_path / "rounds") == []


def test_a_bad_dataset_is_a_dataset_error(sim: SimServerThread, tmp_path: Path) -> None:
    with pytest.raises(DatasetError):
        eagledata.regenerate(tmp_path / "missing.jsonl", **call_args(sim.url, tmp_path / "o"))
    with pytest.raises(DatasetError, match=r"source\[1\]"):
        eagledata.regenerate(["fine", ""], **call_args(sim.url, tmp_path / "o"))
    with pytest.raises(eagledata.errors.ConfigError, match="no such setting"):
        eagledata.regenerate(PROMPTS, **call_args(sim.url, tmp_path / "o", samples=2))


KILLED_ROUND = """
import sys
import eagledata
prompts = [f"Question {i}: what is {i} plus {i}?" for i in range(40)]
eagledata.regenerate(prompts, server=sys.argv[1], out=sys.argv[2], tokenizer=sys.argv[3],
    max_new_tokens=24, temperature=0.8, concurrency=4, shard_size=5, canary=False,
    guard_interval_s=0.2)
"""


@pytest.mark.slow
def test_a_round_killed_midway_resumes_exactly_once(tokenizer_dir: str, tmp_path: Path) -> None:
    """SIGKILL (no handler runs, a journal line may be torn): the next call on the same round
    resumes it; one record per (row, sample)."""
    out = tmp_path / "rounds"
    prompts = [f"Question {i}: what is {i} plus {i}?" for i in range(40)]
    with SimServerThread(sim_config(tokenizer_dir, latency_s=0.05)) as server:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        child = subprocess.Popen(
            [sys.executable, "-c", KILLED_ROUND, server.url, str(out), TOKENIZER], env=env
        )
        deadline = time.monotonic() + 120
        while len(read_records(out / "round-0000")) < 8 and child.poll() is None:
            assert time.monotonic() < deadline, "the child never committed 8 records"
            time.sleep(0.02)
        child.kill()
        child.wait(timeout=30)
        assert child.returncode == -signal.SIGKILL, "the round ended before it was killed"
        kept = len(read_records(out / "round-0000"))
        summary = eagledata.regenerate(prompts, **call_args(server.url, out))
    ids = [r.id for r in eagledata.records(out, round=0)]
    assert len(ids) == 40 and len(set(ids)) == 40
    assert summary.left == 0 and summary.session_records <= 40 - kept


SMALL_CANARY = {
    "canary": True,
    "canary.prompts": 4,
    "canary.reference_tokens": 32,
    "canary.probes": 2,
    "canary.probe_tokens": 16,
    "canary.load_requests": 2,
}


def test_the_canary_runs_as_in_the_cli_and_later_rounds_keep_the_first_baseline(
    sim: SimServerThread, tmp_path: Path
) -> None:
    """Round 1 is checked against round 0's baseline: one reference for every round (a server
    changed between rounds is refused), no baseline recorded again."""
    out = tmp_path / "rounds"
    notes: list[str] = []

    def on_progress(event: eagledata.ProgressEvent) -> None:
        if event.kind == "note":
            notes.append(event.message)

    first = eagledata.regenerate(PROMPTS, **call_args(sim.url, out, **SMALL_CANARY))
    assert first.written == 12
    assert "0 failed" in first.canary and "passed" in first.canary
    second = eagledata.regenerate(
        PROMPTS, on_progress=on_progress, **call_args(sim.url, out, round=1, **SMALL_CANARY)
    )
    assert "0 failed" in second.canary and "passed" in second.canary
    baseline = Path("canary") / "baseline.json"
    assert (first.run_dir / baseline).read_bytes() == (second.run_dir / baseline).read_bytes()
    assert not [note for note in notes if "recording the baseline" in note], notes


EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_between_rounds.py"


def torch_pythonpath(tmp_path: Path) -> str | None:
    """Where torch comes from for the example: this interpreter, else the trainers' venv's torch
    (``trainerkit``) with the two packages its optimizers import (sympy, mpmath); None when
    neither is here (the venv is built by the export consumers' tests, minutes)."""
    import importlib.util

    if importlib.util.find_spec("torch") is not None:
        return ""
    if not (VENV / ".complete").is_file():
        return None
    site = next((VENV / "lib").glob("python*/site-packages"))
    extra = tmp_path / "torch-deps"
    extra.mkdir()
    for name in ("sympy", "mpmath"):
        (extra / name).symlink_to(site / name)
    return os.pathsep.join([str(torch_overlay(VENV)), str(extra)])


@pytest.mark.slow  # trains with torch in a process of its own: 10-15 s
def test_the_example_trains_on_a_round_while_the_next_regenerates(
    sim: SimServerThread, tmp_path: Path
) -> None:
    torch_path = torch_pythonpath(tmp_path)
    if torch_path is None:
        pytest.skip("no torch here: the trainers' venv is not built (tests/trainerkit.py)")
    out = tmp_path / "rounds"
    path = [p for p in (torch_path, *sys.path) if p]
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--server", sim.url, "--tokenizer", TOKENIZER,
         "--out", str(out), "--rounds", "2", "--prompts", "8", "--max-new-tokens", "32",
         "--no-canary"],
        capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(path)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report = orjson.loads(result.stdout.splitlines()[-1])
    assert [r["round"] for r in report["rounds"]] == [0, 1]
    assert all(r["rows"] > 0 and r["loss"] > 0 for r in report["rounds"])
    assert report["rounds"][0]["next_round_generating"]
    assert eagledata.rounds(out) == [0, 1]
    assert [r.id for r in eagledata.records(out, round=1)] != []
