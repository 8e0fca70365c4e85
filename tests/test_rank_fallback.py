"""``--concurrency auto`` on a DP-attention server whose only load signal is ``/metrics`` without
``dp_rank`` labels: one series per gauge, whichever rank's process wrote it last. No lane knows
its own rank's load, and a request not pinned to a rank (the canary's reference sampling and
baseline load, which SGLang spreads round robin) is no one lane's: every rank still gets its
share of the run."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx

from conftest import SAMPLES, make_config, read_records, sim_config
from eagledata.capacity.controller import Ticket
from eagledata.config import LoadSettings
from eagledata.run import pipeline
from eagledata.run.load_lanes import ServerPlan
from eagledata.run.loadcontrol import LoadController
from eagledata.server.client import SGLangClient
from eagledata.server.guard import KVGuard
from eagledata.server.loads import parse_metrics
from eagledata.simserver import SimServerThread

DATASET = str(SAMPLES / "sharegpt.jsonl")  # 40 rows
DPA4 = {"tp_size": 8, "dp_size": 4, "enable_dp_attention": True}
UNLABELLED = {"metrics_only": True, "metrics_dp_labels": False}
CANARY = {
    "enabled": True,
    "prompts": 8,
    "reference_tokens": 256,
    "probes": 4,
    "probe_tokens": 16,
    "top_logprobs": 5,
    "baseline_idle_runs": 2,
    "baseline_load_runs": 1,
    "load_requests": 4,
    "period_s": 0.3,
}


def test_the_simulator_serves_metrics_alone_without_rank_labels(tokenizer_dir: str) -> None:
    config = sim_config(tokenizer_dir, version="0.5.23", **DPA4, **UNLABELLED)
    with SimServerThread(config) as sim, httpx.Client(timeout=10) as http:
        assert http.get(sim.url + "/v1/loads").status_code == 404
        assert http.get(sim.url + "/get_load").status_code == 404
        text = http.get(sim.url + "/metrics").text
    assert "dp_rank" not in text
    load = parse_metrics(text)
    assert load is not None and [rank.rank for rank in load.ranks] == [0]


async def _controller(client: SGLangClient, url: str) -> LoadController:
    guard = KVGuard(client, expected_model=None, bf16_bytes_per_token=None)
    facts = await guard.check(url)
    control = LoadController(
        client, LoadSettings(), fixed=None, max_new_tokens=64, telemetry=None, note=lambda _: None
    )
    control.add_server(ServerPlan(url, facts, None))
    return control


def test_a_request_not_pinned_to_a_rank_is_not_charged_to_one_ranks_lane(
    tokenizer_dir: str,
) -> None:
    """Eight canary requests that name no rank (a reference's sampling, the baseline's load):
    SGLang would send them round robin, so none is any one lane's. The gate sends each where it
    admits it, pinned to that lane's rank: two a lane, not eight on rank 0's."""
    config = sim_config(tokenizer_dir, version="0.5.23", **DPA4, **UNLABELLED)
    with SimServerThread(config) as sim:

        async def main() -> list[int | None]:
            async with SGLangClient([sim.url], in_flight=4) as client:
                control = await _controller(client, sim.url)
                entries = [await control.enter(sim.url, None, 500, 256) for _ in range(8)]
                assert all(isinstance(entry, Ticket) for entry in entries)
                ranks = [entry.lane.rank for entry in entries]  # type: ignore[attr-defined]
                for entry in entries:
                    control.leave(entry)
                return ranks

        ranks = asyncio.run(main())
    assert sorted(ranks) == [0, 0, 1, 1, 2, 2, 3, 3]  # type: ignore[type-var]


def test_a_server_without_rank_labels_gives_every_lane_the_same_reading(
    tokenizer_dir: str,
) -> None:
    """One series per gauge is some rank's numbers, which one unknown: every lane reads it
    alike (before, rank 0's lane took it as its own and the other three had no sample at all,
    so their load was unknown while rank 0's was another rank's)."""
    config = sim_config(tokenizer_dir, version="0.5.23", **DPA4, **UNLABELLED)
    with SimServerThread(config) as sim:

        async def main() -> list[object]:
            async with SGLangClient([sim.url], in_flight=4) as client:
                control = await _controller(client, sim.url)
                await control._sample(sim.url, time.monotonic())
                return [lane.sample for lane in control.lanes[sim.url]]

        samples = asyncio.run(main())
    assert len(samples) == 4 and all(sample is not None for sample in samples)
    assert len({sample.load for sample in samples}) == 1  # type: ignore[attr-defined]


def test_every_rank_gets_its_share_without_a_per_rank_signal(
    tokenizer_dir: str, tmp_path: Path
) -> None:
    """320 requests, pinned one lane per rank, the canary on: each rank serves a quarter of the
    requests, within a third (on another scheduler model one rank served 2% of a 300-row job,
    its lane charged with the canary's unpinned requests)."""
    out = tmp_path / "run"
    fields = {
        "engine": "sglang",
        "max_total_num_tokens": 4_000,
        "time_scale": 0.01,
        "length_fraction": 0.0,
        "output_len_mean": 48.0,
        "logprob_noise": 0.01,
    }
    config = sim_config(tokenizer_dir, version="0.5.23", **DPA4, **UNLABELLED, **fields)
    with SimServerThread(config) as sim:
        run = make_config(
            [sim.url],
            out,
            generation={"max_new_tokens": 64, "samples_per_prompt": 8},
            run={"concurrency": "auto"},
            load={"poll_interval_s": 0.05, "telemetry_interval_s": 0.1},
            server={"guard_interval_s": 0.2},
            canary=CANARY,
        )
        summary = pipeline.generate(run, DATASET, None, progress=False)
        dispatched = sim.stats()["dispatched"]
    assert (summary.written, summary.failed) == (320, 0)
    assert len(read_records(out)) == 320
    # every request went pinned: the run's, the canary's checks (one reference per rank in
    # turn), and those that name no rank (pinned where the gate admitted them)
    assert dispatched["round robin"] == [0, 0, 0, 0]
    pinned = dispatched["pinned"]
    even = sum(pinned) / 4
    assert all(share >= even * 2 / 3 for share in pinned), pinned
