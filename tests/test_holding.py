"""Results reach disk within a bounded time (issue 22, item 4): a check of a server is due once
one of its results has waited ``[server] guard_max_hold_s``, whatever the period and the count
say, so a crash loses at most that window of answers."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import orjson
import pytest

from conftest import SAMPLES, TOKENIZER, eagledata_cmd, read_records, sim_config
from eagledata.run.holding import HOLD_TIME, HoldAndRelease
from eagledata.simserver import SimServerThread
from eagledata.tasks import TaskScope

DATASET = str(SAMPLES / "sharegpt.jsonl")  # 40 rows
URL = "http://server"


@dataclass
class Endpoint:
    url: str
    healthy: bool = True


@dataclass
class Client:
    endpoints: list[Endpoint] = field(default_factory=lambda: [Endpoint(URL)])

    async def revive(self, on_reconnect: Any) -> list[str]:
        return []


class NeverDueCheck:
    """A check whose own schedule never makes it due (a canary's 20-minute period not reached,
    ``guard_max_held`` not reached): only the time a result has waited can."""

    name = "canary"

    def __init__(self) -> None:
        self.triggers: list[str] = []

    def due(self, url: str, held: int) -> str | None:
        return None

    async def check(self, url: str, trigger: str) -> None:
        self.triggers.append(trigger)


def test_a_result_that_waited_max_hold_s_makes_its_check_due() -> None:
    async def main() -> tuple[list[str], list[str]]:
        check = NeverDueCheck()
        released: list[str] = []
        landed = asyncio.Event()

        def release(payload: str) -> None:
            released.append(payload)
            landed.set()

        holder: HoldAndRelease[str] = HoldAndRelease(
            cast(Any, Client()),
            [check],
            interval_s=3600.0,
            max_held=1_000_000,
            max_hold_s=0.2,
            release=release,
        )
        async with TaskScope(shutdown_s=5.0) as scope:
            scope.create_task(holder.run(), name="checks")
            await asyncio.sleep(0)  # the loop is asleep for its hour before anything is held
            holder.hold("answer", URL, time.monotonic())
            async with asyncio.timeout(60):  # generous: the bound is 0.2 s
                await landed.wait()
        return check.triggers, released

    triggers, released = asyncio.run(main())
    assert triggers == [HOLD_TIME]
    assert released == ["answer"]


def test_without_a_time_bound_nothing_is_due() -> None:
    """The same holder with the hold time unbounded: the check is not due (the count and the
    period are far away), so the time bound above is what released the result."""

    async def main() -> list[str]:
        check = NeverDueCheck()
        holder: HoldAndRelease[str] = HoldAndRelease(
            cast(Any, Client()), [check], interval_s=3600.0, max_held=1_000_000, release=print
        )
        holder.hold("answer", URL, time.monotonic() - 10_000)
        await holder.check_and_release()
        return check.triggers

    assert asyncio.run(main()) == []


class PeriodicCheck(NeverDueCheck):
    """A check on its own period: next due 40 s after its last pass."""

    name = "canary"

    def __init__(self, next_at: float) -> None:
        super().__init__()
        self.next_at = next_at

    def next_due_at(self, url: str) -> float | None:
        return self.next_at


def test_the_hold_state_names_the_check_results_wait_for_and_when_it_runs() -> None:
    """What the progress line shows during a hold: the count, the check that has not vouched
    for the oldest result, and the seconds until that check's next run (its own period, or the
    hold-time bound if sooner)."""

    async def main() -> list[str]:
        now = time.monotonic()
        check = PeriodicCheck(now + 40.0)
        holder: HoldAndRelease[str] = HoldAndRelease(
            cast(Any, Client()), [check], interval_s=5.0, max_held=100, release=print
        )
        said = [holder.state().text()]
        for n in range(12):
            holder.hold(f"answer {n}", URL, now)
        state = holder.state()
        said.append(f"{state.held} {state.waiting_for} {round(state.next_in_s or 0, -1):.0f}")
        holder.max_hold_s = 10.0  # the oldest result forces the check within 10 s
        state = holder.state()
        said.append(f"{state.waiting_for} {round(state.next_in_s or 0, -1):.0f}")
        await holder.run_check(check, URL, "period")  # vouches for all twelve
        said.append(holder.state().waiting_for)
        return said

    assert asyncio.run(main()) == ["", "12 canary check 40", "canary check 10", "releasing"]


@pytest.mark.slow
def test_a_crash_mid_run_keeps_what_waited_past_the_bound(
    tokenizer_dir: str, tmp_path: Path
) -> None:
    """The canary's period (an hour) and the held count (a million) would hold every answer of
    this run until its end; with ``guard_max_hold_s = 0.5`` they reach the shards while it
    runs, and a ``kill -9`` then keeps them."""
    out = tmp_path / "run"
    config = tmp_path / "eagledata.toml"
    config.write_text(
        "\n".join(
            [
                "[tokenizer]",
                f'name = "{TOKENIZER}"',
                "[generation]",
                "max_new_tokens = 32",
                "samples_per_prompt = 4",
                "[server]",
                "guard_interval_s = 3600",
                "guard_max_held = 1000000",
                "guard_max_hold_s = 0.5",
                "request_timeout_s = 30",
                "[run]",
                "concurrency = 2",
                "fsync_interval_s = 0.05",
                "[canary]",
                "prompts = 6",
                "reference_tokens = 48",
                "probes = 2",
                "probe_tokens = 16",
                "top_logprobs = 5",
                "baseline_idle_runs = 2",
                "baseline_load_runs = 1",
                "load_requests = 2",
                "period_s = 3600",
            ]
        )
        + "\n"
    )
    # 160 answers at 0.15 s each, two at a time: about 12 s of work
    with SimServerThread(sim_config(tokenizer_dir, latency_s=0.15)) as sim:
        process = subprocess.Popen(
            eagledata_cmd(
                "generate",
                "--config",
                str(config),
                "--server",
                sim.url,
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
            give_up = time.monotonic() + 120
            while not read_records(out):
                assert process.poll() is None, process.communicate()
                assert time.monotonic() < give_up, "no record reached the disk"
                time.sleep(0.01)
            assert process.poll() is None, "the run ended before its records landed"
        finally:
            process.send_signal(signal.SIGKILL)
            process.communicate()
    kept = read_records(out)
    assert 0 < len(kept) < 160
    checks = [orjson.loads(line) for line in (out / "quality.jsonl").read_bytes().splitlines()]
    triggers = [entry["trigger"] for entry in checks if entry["kind"] == "check"]
    assert triggers[0] == "start" and HOLD_TIME in triggers and "end" not in triggers
