"""Each supported SGLang release as its server reports itself: DP attention, DCP and speculative
decoding in 0.5.9, 0.5.15.post1 and 0.5.23 shapes (the simulator speaks each,
``simserver/shapes.py``), read by eagledata as the release means them (``configs/sglang-releases``).

What broke on 0.5.23 before: ``dp_size: 1`` under DP attention (one lane, no pinning, a canary
that never rotates), a DCP capacity already widened by the DCP size (a healthy bf16 dcp8 server
refused, the plan counting its pool eight times), and on 0.5.15.post1 a ``data_parallel_rank``
the server drops (every pin lost)."""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from typer.testing import CliRunner

from conftest import SAMPLES, eagledata_cmd, make_config, read_records, sim_config
from eagledata.capacity import REFERENCE_WORKLOAD
from eagledata.capacity.planning import live_row
from eagledata.cli import app
from eagledata.config import LoadSettings
from eagledata.errors import ServerRefusedError
from eagledata.profiles.kv import KIMI_K25_BF16_BYTES_PER_TOKEN as BF16
from eagledata.profiles.releases import supported_versions
from eagledata.run import pipeline
from eagledata.run.load_lanes import ServerPlan
from eagledata.run.loadcontrol import LoadController
from eagledata.server.client import SGLangClient
from eagledata.server.facts_report import format_facts
from eagledata.server.guard import KVGuard
from eagledata.server.serverfacts import ServerFacts
from eagledata.server.verdict import evaluate_kv_guard
from eagledata.simserver import SimConfig, SimServerThread
from eagledata.simserver.server_info import server_info

VERSIONS = supported_versions()
DCP_VERSIONS = [v for v in VERSIONS if v != "0.5.9"]  # 0.5.9 has no --dcp-size
KIMI = "moonshotai/Kimi-K2.5"
DATASET = str(SAMPLES / "sharegpt.jsonl")  # 40 rows
DPA4 = {"tp_size": 8, "dp_size": 4, "enable_dp_attention": True}
runner = CliRunner()


def facts_of(config: SimConfig) -> ServerFacts:
    return ServerFacts.from_server_info(server_info(config, host="h", port=1, throughput=0.0))


def judge(config: SimConfig) -> Any:
    facts = facts_of(config)
    return facts, evaluate_kv_guard(facts, expected_model=KIMI, bf16_bytes_per_token=BF16)


# --- what /server_info says, release by release ----------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_dp_attention_is_four_ranks_in_every_release(version: str) -> None:
    config = SimConfig(version=version, max_total_num_tokens=73_600, **DPA4)
    body = server_info(config, host="h", port=1, throughput=0.0)
    if version == "0.5.23":  # ServerArgs.resolved_dict: the width moved to attn_dp_size
        assert (body["dp_size"], body["attn_dp_size"], body["enable_dp_attention"]) == (1, 4, True)
    else:
        assert (body["dp_size"], body["enable_dp_attention"]) == (4, True)
        assert "attn_dp_size" not in body
    facts = ServerFacts.from_server_info(body)
    assert facts.attention_dp and facts.dp_ranks == 4
    assert facts.system_kv_tokens == 4 * 73_600
    pin = {"0.5.9": "data_parallel_rank"}.get(version, "routed_dp_rank")
    assert facts.rank_pin_fields == (pin,)
    assert facts.release_known and facts.release_note is None


@pytest.mark.parametrize("version", DCP_VERSIONS)
def test_a_bf16_dcp8_server_passes_the_guard_and_an_fp8_one_is_refused(version: str) -> None:
    """0.5.15.post1 reports one DCP rank's rows, 0.5.23 the widened capacity; memory_usage.kvcache
    is one GPU's GiB in both. Read as each release means it, bf16 is 70,272 B per token and the
    server holds 8x a GPU's rows; an fp8 pool is refused by its dtype and by its bytes."""
    pool = 928_000
    dcp8 = {"tp_size": 8, "dcp_size": 8, "max_total_num_tokens": pool, "version": version}
    facts, verdict = judge(SimConfig(**dcp8))
    reported = pool // 8 if version == "0.5.15.post1" else pool
    assert facts.max_total_num_tokens == reported
    assert verdict.ok, verdict.problems
    assert verdict.bytes_per_token == pytest.approx(BF16, rel=0.001)
    assert facts.system_kv_tokens == facts.rank_kv_tokens == pool
    text = dict(line.split("  ", 1) for line in format_facts(facts, verdict).splitlines())
    assert text["KV tokens"].strip() == "928,000 per rank (DCP 8: 116,000 on each GPU)"
    row = live_row("http://s", facts, REFERENCE_WORKLOAD)
    assert (row.system_tokens, row.tokens_per_rank) == (pool, pool // 8)
    # fp8, said plainly
    _, fp8 = judge(SimConfig(**dcp8, kv_cache_dtype="fp8_e4m3"))
    assert not fp8.ok
    assert "kv_cache_dtype is 'fp8_e4m3', not bf16" in fp8.problems
    assert any("35,136 B per KV token, bf16 is 70,272" in p for p in fp8.problems)
    # an fp8 pool that reports bf16 everywhere: the bytes give it away
    _, hidden = judge(SimConfig(**dcp8, kv_bytes_per_token=BF16 // 2))
    assert hidden.problems == [
        "internal_states[0] holds 35,136 B per KV token, bf16 is 70,272 (fp8 would be 35,136)"
    ]


def test_a_release_this_eagledata_does_not_know_gets_one_warning_and_the_checks_that_hold() -> None:
    """A newer release under DCP: how it reports capacity may have changed again, so bytes per
    token are not compared (never misread), the pool is unknown, the pin uses both fields; the
    dtype checks still refuse fp8."""
    dcp8 = {"tp_size": 8, "dcp_size": 8, "max_total_num_tokens": 928_000, "version": "0.5.99"}
    facts, verdict = judge(SimConfig(**dcp8))
    assert not facts.release_known and facts.release.version == "0.5.23"
    assert verdict.ok and verdict.bytes_per_token is None
    assert verdict.notes == [
        "bytes per KV token not checked: how sglang 0.5.99 reports token capacity under DCP 8 "
        "is unknown to this eagledata",
        "sglang 0.5.99 is not a release this eagledata knows (0.5.9, 0.5.15.post1, 0.5.23): read "
        "as 0.5.23; checks that depend on what changed since are skipped",
    ]
    assert facts.system_kv_tokens is None and facts.rank_pin_fields == (
        "routed_dp_rank",
        "data_parallel_rank",
    )
    _, fp8 = judge(SimConfig(**dcp8, kv_cache_dtype="fp8_e4m3"))
    assert "kv_cache_dtype is 'fp8_e4m3', not bf16" in fp8.problems
    # without DCP the bytes still hold and are checked
    _, plain = judge(SimConfig(version="0.5.99", kv_bytes_per_token=BF16 // 2))
    assert any("35,136 B per KV token" in p for p in plain.problems)


@pytest.mark.parametrize(("version", "exit_code"), [("0.5.23", 0), ("0.5.99", 0)])
def test_check_server_names_the_release_and_whether_it_is_known(
    tokenizer_dir: str, version: str, exit_code: int
) -> None:
    with SimServerThread(sim_config(tokenizer_dir, version=version, **DPA4)) as sim:
        result = runner.invoke(app, ["check-server", sim.url, "--bf16-bytes-per-token", "70272"])
    assert result.exit_code == exit_code, result.output
    rows = [line.split("  ", 1) for line in result.stdout.splitlines()]
    lines = {label.strip(): value.strip() for label, value in rows}
    assert lines["parallelism"].startswith("TP 8, DP attention 4 ranks")
    if version == "0.5.23":
        assert lines["sglang version"] == "0.5.23 (known to this eagledata)"
        assert "note" not in lines
    else:
        assert lines["sglang version"] == "0.5.99 (NOT known to this eagledata: read as 0.5.23)"
        notes = [line for line in result.stdout.splitlines() if line.startswith("note")]
        assert len(notes) == 1 and "0.5.99 is not a release this eagledata knows" in notes[0]


def test_a_draft_kv_cache_that_is_not_bf16_is_refused() -> None:
    """0.5.23's --speculative-draft-kv-cache-dtype: the draft's pool is held to bf16 as well."""
    spec = {"accept_length": 2.5, "draft_kv_cache_dtype_arg": "fp8_e4m3"}
    _, verdict = judge(SimConfig(version="0.5.23", speculative=spec))
    assert verdict.problems == [
        "speculative_draft_kv_cache_dtype is 'fp8_e4m3' (top level, internal_states[0]): the "
        "draft model's KV cache is not bf16"
    ]
    _, unset = judge(SimConfig(version="0.5.23", speculative={"accept_length": 2.5}))
    assert unset.ok, unset.problems


# --- /generate pins and /v1/loads sections, release by release -------------------------------


@pytest.mark.parametrize(
    ("version", "honoured", "dropped"),
    [
        ("0.5.9", ["data_parallel_rank"], ["routed_dp_rank"]),
        ("0.5.15.post1", ["routed_dp_rank"], ["data_parallel_rank"]),
        ("0.5.23", ["routed_dp_rank", "data_parallel_rank"], []),
    ],
)
def test_the_simulator_pins_only_with_the_field_its_release_knows(
    tokenizer_dir: str, version: str, honoured: list[str], dropped: list[str]
) -> None:
    with SimServerThread(sim_config(tokenizer_dir, version=version, **DPA4)) as sim:
        for field in honoured + dropped:
            body = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 2}, field: 3}
            httpx.post(f"{sim.url}/generate", json=body, timeout=30).raise_for_status()
        dispatched = sim.stats()["dispatched"]
    assert dispatched["pinned"] == [0, 0, 0, len(honoured)]
    assert sum(dispatched["round robin"]) == len(dropped)


@pytest.mark.parametrize("version", VERSIONS)
def test_v1_loads_sends_the_speculative_section_only_when_asked(
    tokenizer_dir: str, version: str
) -> None:
    spec = {"accept_length": 2.5}
    with SimServerThread(sim_config(tokenizer_dir, version=version, speculative=spec)) as sim:
        body = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 40}}
        httpx.post(f"{sim.url}/generate", json=body, timeout=30).raise_for_status()

        def loads(query: str) -> Any:
            return httpx.get(f"{sim.url}/v1/loads{query}", timeout=30)

        asked = loads("?include=core,memory,spec,queues").json()["loads"][0]
        assert asked["speculative"]["accept_length"] > 1 and "queues" in asked
        assert "speculative" not in loads("?include=core,memory,queues").json()["loads"][0]
        default = loads("").json()["loads"][0]
        assert ("speculative" in default) == (version == "0.5.23")  # earlier: core alone
        assert loads("?include=core,nonsense").status_code == 400


# --- end to end: a DP-attention run and a DCP pool, in every release's shapes ----------------

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


@pytest.mark.slow
@pytest.mark.parametrize("version", VERSIONS)
def test_a_dp_attention_run_feeds_all_four_ranks_and_the_canary_scores_each(
    tokenizer_dir: str, tmp_path: Path, version: str
) -> None:
    """--concurrency auto runs one lane per rank, each request pinned with the release's field:
    every rank gets its even share of the work (within 10%), and every canary check scores all
    four ranks warm (a dropped pin would land warm-up and scoring on different ranks: cold)."""
    out = tmp_path / "run"
    fields = {"max_total_num_tokens": 6_000, "latency_s": 0.02, "logprob_noise": 0.01}
    with SimServerThread(sim_config(tokenizer_dir, version=version, **DPA4, **fields)) as sim:
        config = make_config(
            [sim.url],
            out,
            generation={"max_new_tokens": 64, "samples_per_prompt": 4},
            run={"concurrency": "auto"},
            load={"poll_interval_s": 0.05, "telemetry_interval_s": 0.1},
            server={"guard_interval_s": 0.2},
            canary=CANARY,
        )
        summary = pipeline.generate(config, DATASET, None, progress=False)
        dispatched = sim.stats()["dispatched"]
    assert (summary.written, summary.failed) == (160, 0)
    assert len(read_records(out)) == 160
    # every answer came pinned (the canary's reference sampling and load runs go unpinned)
    pinned = dispatched["pinned"]
    assert sum(pinned) >= summary.written
    even = sum(pinned) / 4
    assert all(abs(share - even) <= 0.1 * even for share in pinned), pinned
    lanes = {
        orjson.loads(line)["rank"] for line in (out / "telemetry.jsonl").read_bytes().splitlines()
    }
    assert lanes == {0, 1, 2, 3}
    checks = [
        entry
        for entry in map(orjson.loads, (out / "quality.jsonl").read_bytes().splitlines())
        if entry["kind"] == "check"
    ]
    assert checks and {entry["verdict"] for entry in checks} == {"pass"}
    for check in checks:
        assert check["cold"] == 0
        assert [rank["rank"] for rank in check["ranks"]] == [0, 1, 2, 3]


@pytest.mark.parametrize("version", DCP_VERSIONS)
def test_the_load_controller_counts_a_dcp_pool_once_in_every_release(
    tokenizer_dir: str, version: str
) -> None:
    """0.5.15.post1's /v1/loads reports one DCP rank's rows (and used tokens over every share),
    0.5.23's the widened pool: the controller's lane holds the same pool either way."""
    fields = {"engine": "sglang", "time_scale": 0.01, "dcp_size": 8, "tp_size": 8}
    config = sim_config(tokenizer_dir, version=version, max_total_num_tokens=40_000, **fields)
    with SimServerThread(config) as sim:

        async def main() -> Any:
            async with SGLangClient([sim.url], in_flight=4) as client:
                guard = KVGuard(client, expected_model=None, bf16_bytes_per_token=BF16)
                facts = await guard.check(sim.url)
                control = LoadController(
                    client,
                    LoadSettings(),
                    fixed=None,
                    max_new_tokens=64,
                    telemetry=None,
                    note=lambda _: None,
                )
                control.add_server(ServerPlan(sim.url, facts, None))
                before = control.lanes[sim.url][0].pool_tokens
                await control._sample(sim.url, time.monotonic())
                return before, control.lanes[sim.url][0].pool_tokens

        assert asyncio.run(main()) == (40_000, 40_000)


def test_a_guard_refusal_of_a_dcp8_fp8_server_stops_the_run(
    tokenizer_dir: str, tmp_path: Path
) -> None:
    dcp = {"dcp_size": 8, "tp_size": 8, "version": "0.5.23", "kv_bytes_per_token": BF16 // 2}
    with SimServerThread(sim_config(tokenizer_dir, **dcp)) as sim:
        config = make_config(
            [sim.url],
            tmp_path / "run",
            run={"concurrency": 4},
            server={"bf16_kv_bytes_per_token": BF16},
        )
        with pytest.raises(ServerRefusedError, match="35,136 B per KV token"):
            pipeline.generate(config, DATASET, None, progress=False)


def test_a_run_on_a_release_this_eagledata_does_not_know_says_so_once_and_goes_on(
    tokenizer_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Pinned with both fields (each known release drops or aliases the other): the canary's
    warm-ups and scorings still land on their rank."""
    out = tmp_path / "run"
    with SimServerThread(sim_config(tokenizer_dir, version="0.5.99", **DPA4)) as sim:
        config = make_config(
            [sim.url], out, run={"concurrency": "auto"}, load={"poll_interval_s": 0.05}
        )
        summary = pipeline.generate(config, DATASET, None, progress=False)
        pinned = sim.stats()["dispatched"]["pinned"]
    assert (summary.written, summary.failed) == (40, 0)
    assert sum(pinned) >= 40 and all(share > 0 for share in pinned)
    said = [line for line in capsys.readouterr().err.splitlines() if "is not a release" in line]
    assert said == [
        f"{sim.url}: sglang 0.5.99 is not a release this eagledata knows (0.5.9, 0.5.15.post1, "
        "0.5.23): read as 0.5.23; checks that depend on what changed since are skipped"
    ]


def test_sim_server_speaks_the_release_it_is_told() -> None:
    layout = ["--set", "tp_size=8", "--set", "dp_size=4", "--set", "enable_dp_attention=true"]
    argv = ["sim-server", "--port", "0", "--sglang-version", "0.5.23", *layout]
    process = subprocess.Popen(eagledata_cmd(*argv), stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        url = process.stdout.readline().split()[-1]
        info = httpx.get(url + "/server_info", timeout=30).json()
    finally:
        process.terminate()
        process.wait(timeout=30)
    assert info["version"] == "0.5.23"
    assert (info["dp_size"], info["attn_dp_size"], info["enable_dp_attention"]) == (1, 4, True)
