"""The canary's baseline under full load on a small pool: its load loops rejoin the gate after
every answer, and the check's own requests (references, scorings, greedy probes) still get their
turn; a canary whose requests cannot fit the pool says so in one line instead of waiting."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import SAMPLES, make_config, read_records, sim_config
from eagledata.config import CanarySettings, LoadSettings
from eagledata.errors import ConfigError
from eagledata.quality.canary import build_baseline
from eagledata.quality.canary_baseline import CanarySet
from eagledata.quality.canary_scorer import CanaryScorer, Measured
from eagledata.run import pipeline
from eagledata.run.load_lanes import ServerPlan
from eagledata.run.loadcontrol import LoadController
from eagledata.server.budget import SlotGate, TrafficGate
from eagledata.server.client import SGLangClient
from eagledata.server.guard import KVGuard
from eagledata.simserver import SimServerThread

URL = "http://127.0.0.1:9"
DATASET = str(SAMPLES / "sharegpt.jsonl")
LOAD_PROMPT, PROBE_PROMPT = 400, 2800
"""The load runs cycle over every reference's prompt, the probes take the first eight: a probe
whose prompt is long needs the lane nearly to itself (2,800 + 256 of a 4,096-token pool's 3,481
at u* 0.85), while three load requests of a short prompt (400 + 512) fit together."""


async def _admissions(gate: TrafficGate, *, load_kwargs: dict[str, Any]) -> tuple[list[str], int]:
    """16 load loops that rejoin the gate the moment their answer is in (the baseline's load
    runs do, with no pause between), then 8 greedy probes. Returns what was admitted, in order,
    and how many admissions came before the probes began to wait. Stops after 300 admissions."""
    admitted: list[str] = []
    stop, cycling = asyncio.Event(), asyncio.Event()

    async def one(kind: str, prompt: int, max_new: int, **kwargs: Any) -> None:
        entry = await gate.enter(URL, None, prompt, max_new, **kwargs)
        admitted.append(kind)
        if len(admitted) >= 40:
            cycling.set()
        await asyncio.sleep(0.001)  # in flight
        gate.leave(entry)
        if len(admitted) >= 300:
            stop.set()

    async def load() -> None:
        while not stop.is_set():
            await one("load", LOAD_PROMPT, 512, **load_kwargs)

    async def probes() -> None:
        await asyncio.gather(*(one("probe", PROBE_PROMPT, 256) for _ in range(8)))
        stop.set()

    async with asyncio.TaskGroup() as group:
        loads = [group.create_task(load()) for _ in range(16)]
        await cycling.wait()
        began = len(admitted)
        group.create_task(probes())
        await stop.wait()
        for task in loads:
            task.cancel()
    return admitted, began


def _auto_gate(client: SGLangClient) -> LoadController:
    """The gate of ``--concurrency auto`` on a 4,096-token pool."""
    control = LoadController(
        client, LoadSettings(), fixed=None, max_new_tokens=512, telemetry=None, note=lambda _: None
    )
    control.add_server(ServerPlan(URL, None, None))
    control.lanes[URL][0].pool_tokens = 4096
    return control


def test_the_probes_are_not_starved_by_load_loops_that_rejoin_the_gate() -> None:
    """Every canary request used to enter ahead of every waiting one: a load loop that rejoined
    after its answer went ahead of the probes already waiting, the next answer let it in, and
    the probes never reached the server (the real 0.5.23 with a 4,096-token pool: 1,497 load
    requests, no probe, in 11 minutes): a short load request fits where a long probe does not,
    so the lane never emptied for the probe. First come first served among them, the probes
    are in once the 16 loads that waited before them are."""

    async def run() -> tuple[list[str], int]:
        async with SGLangClient([URL], in_flight=4) as client:
            return await _admissions(_auto_gate(client), load_kwargs={})

    admitted, began = asyncio.run(run())
    assert admitted.count("probe") == 8, f"{admitted.count('probe')} of 8 probes in 300 requests"
    last_probe = len(admitted) - 1 - admitted[::-1].index("probe")
    assert last_probe - began <= 16 + 8 + 1


def test_the_checks_own_requests_go_before_the_baseline_load() -> None:
    """Marked as background, the load yields to every request of the check itself: under auto
    and under a fixed --concurrency, the probes go in one after the other, with at most the
    requests already in flight before them."""

    async def run(fixed: bool) -> tuple[list[str], int]:
        async with SGLangClient([URL], in_flight=4) as client:
            gate: TrafficGate = SlotGate(1) if fixed else _auto_gate(client)
            return await _admissions(gate, load_kwargs={"background": True})

    for fixed in (False, True):
        admitted, began = asyncio.run(run(fixed))
        probes = [i for i, kind in enumerate(admitted) if kind == "probe"]
        assert len(probes) == 8
        assert probes[-1] - probes[0] == 7, admitted[began:]  # no load between two probes
        assert probes[0] - began <= 3  # behind the loads that were in flight


# --- on the simulated server: the default canary on a 4,096-token pool -------------------------


class TimedScorer(CanaryScorer):
    """Keeps how long each scoring of the baseline took (idle first, then under load)."""

    seconds: list[float]

    async def score(self, url: str, canary: CanarySet, *, warm: bool = True) -> Measured:
        started = time.monotonic()
        measured = await super().score(url, canary, warm=warm)
        self.seconds = [*getattr(self, "seconds", []), time.monotonic() - started]
        return measured


async def _record_baseline(sim: SimServerThread, fixed: int | None) -> TimedScorer:
    async with SGLangClient([sim.url], in_flight=64) as client:
        guard = KVGuard(client, expected_model=None, bf16_bytes_per_token=None)
        facts = await guard.check(sim.url)
        control = LoadController(
            client,
            LoadSettings(poll_interval_s=0.05),
            fixed=fixed,
            max_new_tokens=4096,
            telemetry=None,
            note=lambda _: None,
        )
        control.add_server(ServerPlan(sim.url, facts, None))
        client.gate = control if fixed is None else SlotGate(fixed)
        scorer = TimedScorer(client)
        # 8 long prompts (the probes' too) among short ones, as a dataset mixes them
        prompts = [[100 + 7 * i + j for j in range(2000 if i < 8 else 300)] for i in range(24)]
        async with asyncio.TaskGroup() as group:
            sampling = group.create_task(control.run())
            try:
                async with asyncio.timeout(150):
                    await build_baseline(
                        scorer, sim.url, prompts, CanarySettings(), model_path=None, ledger=None
                    )
            finally:
                sampling.cancel()
        return scorer


# The default canary end to end on the simulator is 30-50 s; the gate-level tests above keep
# the ordering it relies on in the inner loop.
@pytest.mark.slow
@pytest.mark.parametrize("fixed", [None, 16], ids=["auto", "fixed-16"])
def test_the_default_canarys_baseline_finishes_under_full_load_on_a_small_pool(
    tokenizer_dir: str, fixed: int | None
) -> None:
    """SGLang 0.5.23's scheduler on a 4,096-token pool, the default canary (24 references of
    512 tokens, 8 greedy probes of 256, 3 idle and 3 loaded scorings beside 16 load loops):
    the baseline is recorded, and a scoring under load takes at most a few times an idle one
    (before, under auto: 26 s against 4.5 s on a smaller canary, and on the real server never)."""
    config = sim_config(
        tokenizer_dir,
        version="0.5.23",
        engine="sglang-loop",
        max_total_num_tokens=4096,
        chunked_prefill_size=2048,
        time_scale=0.01,
        length_fraction=1.0,  # the load's answers run to their 512 tokens
    )
    with SimServerThread(config) as sim:
        scorer = asyncio.run(_record_baseline(sim, fixed))
    idle, loaded = scorer.seconds[:3], scorer.seconds[3:]
    assert len(loaded) == 3
    assert max(loaded) <= 4 * max(idle) + 1.0, scorer.seconds


def test_a_canary_that_cannot_fit_the_pool_says_so_instead_of_waiting(
    tokenizer_dir: str, tmp_path: Path
) -> None:
    """References of 4,000 tokens on a 4,096-token pool: SGLang would queue each for ever (its
    prompt plus 4,000 never fits), and the baseline with it. The run stops at once, in one line
    naming the setting, with nothing generated."""
    config = sim_config(
        tokenizer_dir, version="0.5.23", engine="sglang-loop", max_total_num_tokens=4096
    )
    with SimServerThread(config) as sim:
        run = make_config(
            [sim.url],
            tmp_path / "run",
            canary={"enabled": True, "reference_tokens": 4000, "prompts": 4, "probes": 2},
        )
        started = time.monotonic()
        with pytest.raises(ConfigError) as caught:
            pipeline.generate(run, DATASET, None, progress=False)
        generated = sim.stats()["by_kv_dtype"]
    message = str(caught.value)
    assert time.monotonic() - started < 30
    assert "\n" not in message
    assert message.startswith(f"{sim.url}: the canary's longest request needs ")
    assert "the server's KV pool holds 4,096" in message
    assert message.endswith(
        "lower [canary] reference_tokens or max_prompt_tokens, or run with --no-canary"
    )
    assert generated == {}  # not one request sent
    assert read_records(tmp_path / "run") == []
