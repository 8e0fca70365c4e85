"""Issue 21: ``--concurrency`` is a bound on everything eagledata has in flight, the canary
included; ``auto`` admits at the pace answers end whatever its poll, and never fills a queue cap
the server reports."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from conftest import SAMPLES, make_config, sim_config
from eagledata.capacity.controller import Lane, LaneSample, Ticket
from eagledata.capacity.controller_settings import ControllerSettings
from eagledata.capacity.lengths import kaplan_meier
from eagledata.config import LoadSettings
from eagledata.run import pipeline
from eagledata.run.load_lanes import ServerPlan
from eagledata.run.loadcontrol import LoadController
from eagledata.rundir.telemetry import read_telemetry
from eagledata.server.client import SGLangClient
from eagledata.server.loads import RankLoad
from eagledata.simserver import SimConfig, SimServerThread

DATASET = str(SAMPLES / "sharegpt.jsonl")  # 40 rows
SMALL_CANARY = {
    "enabled": True,
    "prompts": 6,
    "reference_tokens": 48,
    "probes": 3,
    "probe_tokens": 24,
    "top_logprobs": 5,
    "baseline_idle_runs": 2,
    "baseline_load_runs": 1,
    "load_requests": 4,
}


def loop_engine(tokenizer_dir: str, **overrides: Any) -> Any:
    """The second SGLang scheduler model, small and fast: a 2,500-token pool, 100x time."""
    fields: dict[str, Any] = {
        "engine": "sglang-loop",
        "max_total_num_tokens": 2500,
        "time_scale": 0.01,
        "length_fraction": 0.0,
        "output_len_mean": 100.0,
        "output_len_spread": 0.3,
    }
    fields.update(overrides)
    return sim_config(tokenizer_dir, **fields)


def ledger(run_dir: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in (run_dir / "quality.jsonl").read_bytes().splitlines()]


# --- the arithmetic -----------------------------------------------------------------------------


def test_every_answer_that_ends_admits_one_however_slow_the_poll() -> None:
    """Between two samples (however far apart) the gate counts the server's queue from what it
    knows: the sample's, plus what it sent since, less what ended since. So each answer that
    ends admits one request, and a slow poll is not a slow admission."""
    settings = ControllerSettings(freeze_s=10, creep_every_s=1, backoff_gap_s=0.5)
    gate = Lane(server="http://s", rank=None, settings=settings, pool_tokens=100_000)
    gate.queue_target = 4
    lengths = kaplan_meier([50] * 20, [], cap=4096)
    for sent in range(8):
        gate.tickets[Ticket(gate, 100, 150, 0.01 * sent, lengths)] = None
    # The server is full by its own rule: six of ours run, two wait in its queue.
    gate.observe(LaneSample(time=0.1, load=RankLoad(0, waiting=2, running=6), ours_at_ask=8), 0.1)

    def admit(now: float) -> int:
        count = 0
        while gate.room(ticket := Ticket(gate, 100, 150, now, lengths), now) is not None:
            gate.tickets[ticket] = None
            count += 1
        return count

    assert admit(0.1) == 2  # no answer has ended: the queue may reach q* (4), no more
    for step in range(1, 41):  # forty answers end before the next sample
        now = 0.2 + step * 0.01
        oldest = min(gate.tickets, key=lambda t: t.sent_at)
        gate.tickets.pop(oldest)
        gate.ended(oldest, now, 150, data=True)
        assert admit(now) == 1
    assert gate.held_by.get("queue", 0) == 41  # the queue rule, and nothing else, held them


# --- the budget ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_fixed_concurrency_bounds_the_canary_and_the_run_together(
    tokenizer_dir: str, tmp_path: Path
) -> None:
    """``--concurrency 4``: the canary's references, scorings, probes and baseline load, and
    the run's own requests, never more than four at once on the server (it counts them)."""
    with SimServerThread(sim_config(tokenizer_dir, latency_s=0.05)) as sim:
        config = make_config(
            [sim.url],
            tmp_path / "run",
            run={"concurrency": 4},
            canary=SMALL_CANARY,
            generation={"max_new_tokens": 32, "temperature": 1.0},
        )
        summary = pipeline.generate(config, DATASET, tmp_path / "run", progress=False)
        stats = sim.stats()
    assert summary.written == 40
    kinds = [(entry["kind"], entry["verdict"]) for entry in ledger(tmp_path / "run")]
    assert ("baseline", "pass") in kinds and ("check", "pass") in kinds  # the canary ran...
    assert stats["max_in_flight"] == 4  # ...inside the four, which it filled (6 references)


def test_auto_gates_the_canary_on_its_lane_and_learns_nothing_from_it() -> None:
    """Under auto a canary request takes a ticket on the lane it is pinned to, ahead of the
    run's waiting requests, counted in flight and in the forecast at its exact length; its
    answer teaches the answer-length model nothing."""

    async def run() -> None:
        async with SGLangClient(["http://127.0.0.1:9"], in_flight=4) as client:
            control = LoadController(
                client, LoadSettings(), fixed=None, max_new_tokens=512, telemetry=None,
                note=lambda _: None,
            )  # fmt: skip
            control.add_server(ServerPlan("http://127.0.0.1:9", None, None))
            lane = control.lanes["http://127.0.0.1:9"][0]
            lane.pool_tokens = 3000
            # 1,500 + 512 in the forecast: neither 200 + 512 nor the canary's 1,000 + 48 fit
            # beside it within 0.85 of 3,000 (each would run beside it to its end)
            first = await control.acquire(1500)
            waiting = asyncio.create_task(control.acquire(200))
            canary = asyncio.create_task(control.enter("http://127.0.0.1:9", None, 1000, 48))
            await asyncio.sleep(0)
            assert not waiting.done() and not canary.done()  # no room for either yet
            control.release(first, completion_tokens=300)
            entry = await canary  # the canary first, though the run's request waited longer
            assert isinstance(entry, Ticket) and entry.projected == 1048 and entry.lengths is None
            assert entry in lane.tickets and lane.peak(0.0) >= 1048
            control.leave(entry)
            assert control.lengths.samples == 1  # the run's answer, not the canary's
            (await waiting).lane.tickets.clear()

    asyncio.run(run())


# --- whole runs ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_auto_gets_no_503_from_a_server_that_reports_its_queue_cap(
    tokenizer_dir: str, tmp_path: Path
) -> None:
    """A server that runs at most three requests and queues at most two, with the canary's
    start-up burst: under auto neither the canary nor the run gets a 503 (the gate reads
    ``max_queued_requests`` from /server_info and never fills it). A fixed concurrency that
    knows no cap does get them."""
    server = loop_engine(tokenizer_dir, max_running_requests=3, max_queued_requests=2)
    load = {"poll_interval_s": 0.05, "telemetry_interval_s": 0.05}
    runs = {}
    for setting in ("auto", 16):
        with SimServerThread(server) as sim:
            out = tmp_path / f"run-{setting}"
            config = make_config(
                [sim.url],
                out,
                run={"concurrency": setting},
                # the fixed run is the control: its own requests are enough to fill the queue
                canary=SMALL_CANARY if setting == "auto" else {"enabled": False},
                load=load,
                generation={"max_new_tokens": 200, "temperature": 1.0},
            )
            runs[setting] = (pipeline.generate(config, DATASET, out, progress=False), sim.stats())
    summary, stats = runs["auto"]
    assert summary.written == 40
    assert stats["outcomes"].get("queue_full", 0) == 0
    assert stats["outcomes"].get("queue_full_retracted", 0) == 0
    assert {entry.queue_cap for entry in read_telemetry(tmp_path / "run-auto")} == {2}
    fixed_summary, fixed_stats = runs[16]
    assert fixed_summary.written == 40 and fixed_stats["outcomes"]["queue_full"] > 0


@contextlib.contextmanager
def server_process(config: SimConfig) -> Iterator[str]:
    """The simulated server in a process of its own (as a real one is): the client's event loop
    is not slowed by the server's, nor the server's by the client's."""
    code = (
        "import sys; from eagledata.simserver import SimConfig, run_sim_server; "
        "run_sim_server(SimConfig.model_validate_json(sys.argv[1]), '127.0.0.1', 0)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, config.model_dump_json()], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        yield proc.stdout.readline().split()[-1]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.slow
def test_auto_keeps_up_with_a_fast_server_at_a_slow_poll(
    tokenizer_dir: str, tmp_path: Path
) -> None:
    """Answers of ~60 tokens that end 30-40 times a second (each lasts ~1 s of wall time, ~45
    run at once): auto with a poll of 8 s (it samples every 2 s while requests wait) makes the
    same makespan, in the server's own modelled time, as with a poll of 0.25 s. A gate that
    counted a sample's KV until the next one, and every request sent since as queued, took
    1.4 times as long at the slow poll (measured: 44.6 modelled s against 32.1)."""
    server = loop_engine(
        tokenizer_dir, max_total_num_tokens=8000, output_len_mean=60.0, time_scale=0.25
    )
    makespans: dict[float, float] = {}
    for poll in (0.25, 8.0):
        with server_process(server) as url:
            out = tmp_path / f"run-{poll}"
            config = make_config(
                [url],
                out,
                run={"concurrency": "auto"},
                load={"poll_interval_s": poll, "telemetry_interval_s": 2.0},
                generation={"max_new_tokens": 96, "temperature": 1.0, "samples_per_prompt": 8},
            )
            summary = pipeline.generate(config, DATASET, out, progress=False)
            engine = httpx.get(url + "/_sim/stats").json()["engine"][0]
        assert summary.written == 320
        makespans[poll] = engine["sim_time"]
    assert makespans[8.0] < 1.2 * makespans[0.25]
