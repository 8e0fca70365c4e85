"""The logprob canary (issue 7): no false alarm under realistic noise, a silent degradation stops
the run with nothing degraded landing, a stored baseline refuses a server degraded from its
first request, a cold canary is blind, and bad input gets one line naming the fix."""

from __future__ import annotations

import asyncio
import math
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest

from conftest import SAMPLES, eagledata_cmd, make_config, read_failures, read_records, sim_config
from eagledata.config import AppConfig, CanarySettings
from eagledata.errors import CanaryDriftError, ConfigError, ServerError
from eagledata.quality.canary import CanaryMonitor, build_baseline
from eagledata.quality.canary_baseline import Baseline
from eagledata.quality.canary_cli import record_baseline, score_against
from eagledata.quality.canary_scorer import CanaryScorer
from eagledata.quality.canary_stats import (
    Rules,
    Scoring,
    compare,
    fired,
    median_reference,
    null_statistics,
    thresholds,
    trimmed_signed_mean,
)
from eagledata.run import pipeline
from eagledata.rundir.lines import QualityLine
from eagledata.rundir.status import run_status
from eagledata.server.client import SGLangClient
from eagledata.simserver import SimServerThread

DATASET = str(SAMPLES / "sharegpt.jsonl")
SMALL = {
    "enabled": True,
    "prompts": 6,
    "reference_tokens": 48,
    "probes": 3,
    "probe_tokens": 24,
    "top_logprobs": 5,
    "baseline_idle_runs": 3,
    "baseline_load_runs": 2,
    "load_requests": 4,
    "period_s": 0.3,
}
NOISY = {"logprob_noise": 0.01, "routing_flip_rate": 0.01}


def canary_config(url: str, out: Path, **sections: dict[str, Any]) -> AppConfig:
    sections.setdefault("canary", {})
    sections["canary"] = {**SMALL, **sections["canary"]}
    return make_config([url], out, **sections)


def ledger(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "quality.jsonl"
    return [orjson.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []


def prompts(n: int = 6, length: int = 40) -> list[list[int]]:
    return [[100 + 7 * i + j for j in range(length)] for i in range(n)]


async def _baseline(url: str, settings: CanarySettings) -> tuple[SGLangClient, Baseline]:
    client = SGLangClient([url], in_flight=16)
    await client.__aenter__()
    baseline = await build_baseline(
        CanaryScorer(client), url, prompts(), settings, model_path=None, ledger=None
    )
    return client, baseline


# --- no false alarm ----------------------------------------------------------------------------


@pytest.mark.slow
def test_many_checks_against_a_noisy_healthy_server_never_fire(tokenizer_dir: str) -> None:
    """bf16 batch noise on every logit and MoE routing flips on 1% of positions: 25 checks over
    HTTP, each compared with thresholds derived from the baseline's own noise, none fires."""
    with SimServerThread(sim_config(tokenizer_dir, **NOISY)) as sim:

        async def main() -> tuple[Baseline, list[list[str]]]:
            client, baseline = await _baseline(sim.url, CanarySettings(**SMALL))
            scorer = CanaryScorer(client)
            fires = []
            try:
                for _ in range(25):
                    measured = await scorer.score(sim.url, baseline.canary_set)
                    assert measured.cold == 0 and measured.mismatch is None
                    stats = compare(measured.scoring, baseline.reference)
                    fires.append(fired(stats, baseline.thresholds))
            finally:
                await client.__aexit__(None, None, None)
            return baseline, fires

        baseline, fires = asyncio.run(main())
    assert [f for f in fires if f] == []
    # And 1,000 more scorings of the same references straight from the simulator's model (no
    # HTTP): the thresholds the baseline derived still hold.
    offline_fires = 0
    rng = np.random.default_rng(7)
    for _ in range(1000):
        scoring = _simulated_scoring(baseline, rng, degraded=False)
        offline_fires += bool(fired(compare(scoring, baseline.reference), baseline.thresholds))
    assert offline_fires == 0


def test_a_baseline_whose_pairs_agree_by_chance_keeps_a_threshold_beyond_the_noise() -> None:
    """Five scorings whose pairs happen to agree in their mean (each one's chance offset taken
    out) while each token still moves by batch noise: the worst pair's ``mean_shift`` alone would
    put the threshold at the 1e-3 floor, inside the range healthy checks reach (the CI failure:
    4 of 1,000 healthy checks fired against such a baseline). The per-token noise keeps the
    threshold beyond it: 2,000 healthy checks, none fires."""
    rng = np.random.default_rng(11)
    tokens, sigma = 288, 0.006  # the tests' canary: 6 references of 48 tokens
    truth = -rng.exponential(1.0, tokens)
    runs = [truth + rng.normal(0.0, sigma, tokens) for _ in range(5)]
    centre = median_reference([Scoring(lps, *empty_top()) for lps in runs])
    runs = [lps - trimmed_signed_mean(lps - centre.lps) for lps in runs]
    baseline = [Scoring(lps, *empty_top()) for lps in runs]
    null = null_statistics(baseline)
    assert max(abs(pair["mean_shift"]) for pair in null) < 2.5e-4  # 4x of it: under the floor
    limits = thresholds(null, Rules())
    reference = median_reference(baseline)
    healthy = [Scoring(truth + rng.normal(0.0, sigma, tokens), *empty_top()) for _ in range(2000)]
    fires = [fired(compare(check, reference), limits) for check in healthy]
    assert [f for f in fires if f] == []
    # ...while a shift of every token by 0.005 nats (a quarter of what the simulator's
    # degraded server moves, -0.0185) still fires.
    shifted = Scoring(truth + rng.normal(0.0, sigma, tokens) - 0.005, *empty_top())
    assert any(f.startswith("mean_shift") for f in fired(compare(shifted, reference), limits))


def test_a_small_canary_does_not_fire_on_three_routing_flips() -> None:
    """On the tests' canary (288 positions) the 0.01 floor of ``top1_flip`` is 2.9 positions: a
    baseline whose pairs flipped nothing fired on a healthy check with three routing flips (11 of
    300,000 checks in ``benchmarks/canary_null.py``, one CI run in ~27). The floor is a count of
    positions too: three or four flips pass, five still fire, and a large canary keeps the 0.01
    floor."""

    def unflipped(positions: int) -> list[Scoring]:
        ids = np.tile(np.arange(4), (positions, 1))
        top_lps = np.tile(np.log(np.array([0.7, 0.2, 0.06, 0.04])), (positions, 1))
        lps = np.full(positions, np.log(0.7))
        return [Scoring(lps.copy(), ids.copy(), top_lps.copy(), []) for _ in range(4)]

    baseline = unflipped(288)
    ids, lps, top_lps = baseline[0].top_ids, baseline[0].lps, baseline[0].top_lps
    null = null_statistics(baseline)
    assert max(pair["top1_flip"] for pair in null) == 0.0
    limits = thresholds(null, Rules())

    def flipped(count: int) -> Scoring:
        swapped = ids.copy()
        swapped[:count, [0, 1]] = swapped[:count, [1, 0]]
        return Scoring(lps.copy(), swapped, top_lps.copy(), [])

    def fires_on_flips(count: int) -> bool:
        return any(
            f.startswith("top1_flip") for f in fired(compare(flipped(count), baseline[0]), limits)
        )

    assert [fires_on_flips(count) for count in (3, 4, 5)] == [False, False, True]
    large_null = null_statistics(unflipped(12_288))
    assert thresholds(large_null, Rules())["top1_flip"] == Rules().top1_flip_floor


def empty_top() -> tuple[np.ndarray, np.ndarray]:
    return np.zeros((0, 0)), np.zeros((0, 0))


def _simulated_scoring(baseline: Baseline, rng: Any, *, degraded: bool) -> Scoring:
    """A warm scoring of the baseline's references by the simulator's logprob model itself."""
    from eagledata.simserver.logprobs import Noise, score

    noise = Noise(NOISY["logprob_noise"], NOISY["routing_flip_rate"], 0.05, 0.05, rng)
    lps, ids, top = [], [], []
    k = baseline.canary_set.top_k
    for prompt, reference in baseline.canary_set.references:
        ids_in = [*prompt, *reference]
        lp, cand_ids, cand_lps = score(
            ids_in[len(prompt) - 1 : -1], reference, 3000, noise, degraded
        )
        lps.append(lp)
        ids.append(cand_ids[:, :k])
        top.append(cand_lps[:, :k])
    reference_greedy = baseline.reference.greedy
    return Scoring(np.concatenate(lps), np.concatenate(ids), np.concatenate(top), reference_greedy)


@pytest.mark.slow
def test_a_long_run_checks_often_and_every_check_passes(tokenizer_dir: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    with SimServerThread(sim_config(tokenizer_dir, latency_s=0.1, **NOISY)) as sim:
        config = canary_config(
            sim.url,
            out,
            generation={"samples_per_prompt": 4},
            server={"guard_interval_s": 0.1, "guard_max_held": 16},
            run={"concurrency": 4},
        )
        changed = threading.Event()

        def change_version_mid_run() -> None:
            # 120 answers of 0.1 s, four at a time, are left after the first 40: seconds
            deadline = time.monotonic() + 120  # generous: the baseline comes first
            while len(read_records(out)) < 40 and time.monotonic() < deadline:
                time.sleep(0.01)
            sim.control(version="0.5.9.post1")  # /server_info changes: a canary is due
            changed.set()

        threading.Thread(target=change_version_mid_run, daemon=True).start()
        summary = pipeline.generate(config, DATASET, None, progress=False)
    assert changed.is_set()
    assert summary.written == 160 and summary.left == 0
    checks = [entry for entry in ledger(out) if entry["kind"] == "check"]
    assert len(checks) >= 10
    assert {entry["verdict"] for entry in checks} == {"pass"}
    triggers = {entry["trigger"] for entry in checks}
    assert {"start", "server_info", "end"} <= triggers and triggers & {"held", "period"}
    baseline = [entry for entry in ledger(out) if entry["kind"] == "baseline"]
    assert [entry["trigger"] for entry in baseline] == ["idle"] * 3 + ["load"] * 2
    canary = run_status(out).to_json()["quality"]["canary"]
    assert canary["enabled"] and canary["checks"] == len(checks) == canary["passed"]
    # Canary traffic is not data: every record is a production answer, exactly once.
    records = read_records(out)
    assert len({r["id"] for r in records}) == len(records) == 160


@pytest.mark.slow
def test_a_run_on_a_dp_server_scores_every_check_warm(tokenizer_dir: str, tmp_path: Path) -> None:
    """A whole run against a DP server: the canary takes the ranks from the server's facts and
    its pinned requests are accepted beside the run's own traffic (a rank out of range would be
    a 400 and fail the check); every check is warm and passes, and every record lands."""
    out = tmp_path / "run"
    dp = {"tp_size": 2, "dp_size": 2, "enable_dp_attention": True}
    with SimServerThread(sim_config(tokenizer_dir, latency_s=0.05, **NOISY, **dp)) as sim:
        config = canary_config(
            sim.url,
            out,
            generation={"samples_per_prompt": 2},
            server={"guard_interval_s": 0.1, "guard_max_held": 8},
            run={"concurrency": 8},
        )
        summary = pipeline.generate(config, DATASET, None, progress=False)
    assert summary.written == 80
    checks = [entry for entry in ledger(out) if entry["kind"] == "check"]
    assert len(checks) >= 3
    assert [entry["cold"] for entry in checks] == [0] * len(checks)
    assert {entry["verdict"] for entry in checks} == {"pass"}
    # 6 references of 48 tokens over two ranks: a share too small for verdicts of its own.
    assert all(entry["ranks"] == [] for entry in checks)


# --- silent degradation ------------------------------------------------------------------------


@pytest.mark.slow
def test_silent_degradation_mid_run_stops_with_nothing_degraded_landing(
    tokenizer_dir: str, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    # 0.1 s answers, four at a time: seconds of work are left when the first 10 have landed,
    # so the degradation comes mid-run however busy the machine
    with SimServerThread(sim_config(tokenizer_dir, latency_s=0.1, **NOISY)) as sim:
        config = canary_config(
            sim.url,
            out,
            generation={"samples_per_prompt": 4},
            server={"guard_interval_s": 0.1, "guard_max_held": 1000},
            run={"concurrency": 4},
        )
        switched = threading.Event()

        def degrade_after_some_work() -> None:
            deadline = time.monotonic() + 120  # generous: the baseline comes first
            while len(read_records(out)) < 10 and time.monotonic() < deadline:
                time.sleep(0.005)
            sim.control(degraded=True)  # still reports bf16 everywhere
            switched.set()

        threading.Thread(target=degrade_after_some_work, daemon=True).start()
        with pytest.raises(CanaryDriftError) as caught:
            pipeline.generate(config, DATASET, None, progress=False)
        degraded_rids = set(sim.stats()["answers"]["degraded"])
    assert switched.is_set() and degraded_rids
    message = str(caught.value)
    assert message.startswith(f"{sim.url} drifted from the canary baseline: ")
    assert any(name in message for name in ("mean_shift", "trimmed_abs", "topk_kl", "greedy"))
    assert f"eagledata resume {out}" in message
    records = read_records(out)
    assert 0 < len(records) < 160
    assert not degraded_rids & {r["rid"] for r in records}
    assert ledger(out)[-1]["verdict"] == "drift"
    # Against a healthy server, resume completes the plan exactly once.
    with SimServerThread(sim_config(tokenizer_dir, **NOISY)) as good:
        summary = pipeline.resume(out, server_urls=[good.url], progress=False)
    records = read_records(out)
    assert summary.written == 160 and summary.left == 0 and read_failures(out) == []
    assert len({r["id"] for r in records}) == len(records) == 160


@pytest.mark.slow
def test_a_server_degraded_from_its_first_request_is_refused_on_resume(
    tokenizer_dir: str, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    with SimServerThread(sim_config(tokenizer_dir, **NOISY)) as sim:
        pipeline.generate(canary_config(sim.url, out), DATASET, None, progress=False)
    shards = sorted((out / "shards").glob("*.jsonl"))
    shards[-1].unlink()  # some work left for a resume
    before = read_records(out)
    with SimServerThread(sim_config(tokenizer_dir, degraded=True, **NOISY)) as bad:
        result = subprocess.run(
            eagledata_cmd("resume", str(out), "--server", bad.url, "--no-progress"),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        produced = bad.stats()["answers"]["degraded"]
    # exit 4, as for a refused server, and one line naming the server and the statistic
    assert result.returncode == 4, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert lines[0].startswith(f"eagledata: error: {bad.url} drifted from the canary baseline: ")
    assert read_records(out) == before  # zero new records
    assert produced  # it answered the canary, degraded
    # The start check fired and its immediate rerun too (or it was past a hard limit): drift.
    last = ledger(out)[-1]
    assert (last["server"], last["verdict"]) == (bad.url, "drift")
    assert last["trigger"] in ("start", "rerun")


# --- why the warm-up ---------------------------------------------------------------------------


def test_a_canary_without_warm_up_is_blind_to_a_degraded_cache(tokenizer_dir: str) -> None:
    """On SGLang's MLA path a cold prefill scores the new tokens from in-flight values and never
    reads the pooled KV, which is where an fp8 or corrupted cache lives: the simulator models
    that, and a cold canary sees nothing while the warmed one fires."""
    with SimServerThread(sim_config(tokenizer_dir, **NOISY)) as sim:

        async def main() -> tuple[Any, Any, list[str], list[str]]:
            client, baseline = await _baseline(sim.url, CanarySettings(**{**SMALL, "probes": 0}))
            scorer = CanaryScorer(client)
            try:
                sim.control(degraded=True)
                async with httpx.AsyncClient() as http:  # the warm-ups of the baseline gone
                    await http.post(sim.url + "/flush_cache")
                cold = await scorer.score(sim.url, baseline.canary_set, warm=False)
                warm = await scorer.score(sim.url, baseline.canary_set, warm=True)
            finally:
                await client.__aexit__(None, None, None)
            limits = baseline.thresholds
            cold_fires = fired(compare(cold.scoring, baseline.reference), limits)
            warm_fires = fired(compare(warm.scoring, baseline.reference), limits)
            return cold, warm, cold_fires, warm_fires

        cold, warm, cold_fires, warm_fires = asyncio.run(main())
    assert cold.cold == 6 and warm.cold == 0
    assert cold_fires == []  # blind
    assert warm_fires  # sees it


@pytest.mark.slow
def test_on_a_dp_server_each_warm_up_and_its_scoring_share_a_rank(tokenizer_dir: str) -> None:
    """Each DP rank has a radix cache of its own, and SGLang sends unpinned requests round robin:
    beside other traffic a reference's warm-up and its scoring land on different ranks and the
    scoring is cold, blind to the pooled KV. Pinned to one rank, every reference is warm (and
    they go round the ranks), and the degraded cache is seen."""
    dp = {"tp_size": 2, "dp_size": 2, "enable_dp_attention": True}
    with SimServerThread(sim_config(tokenizer_dir, **NOISY, **dp)) as sim:

        async def main() -> tuple[Any, list[str]]:
            client, baseline = await _baseline(sim.url, CanarySettings(**{**SMALL, "probes": 0}))
            scorer = CanaryScorer(client, dp_ranks=lambda _: 2)
            try:
                sim.control(degraded=True)
                async with httpx.AsyncClient() as http:
                    await http.post(sim.url + "/flush_cache")
                measured = await scorer.score_under_load(sim.url, baseline.canary_set, 4)
            finally:
                await client.__aexit__(None, None, None)
            return measured, fired(
                compare(measured.scoring, baseline.reference), baseline.thresholds
            )

        measured, fires = asyncio.run(main())
    assert measured.cold == 0
    assert fires


@pytest.mark.slow
def test_a_fault_on_one_dp_rank_is_caught(tokenizer_dir: str) -> None:
    """The references go round the ranks, so a rank that degrades alone moves its share of them
    (here half), and the check fires on it."""
    dp = {"tp_size": 2, "dp_size": 2, "enable_dp_attention": True}
    # Twice the usual fault: at the usual one, half the tests' small canary moved mean_shift
    # only 1.2-7x past a threshold that six baseline runs set, and 3 of ~60 runs missed it.
    with SimServerThread(sim_config(tokenizer_dir, **NOISY, **dp, degrade_shift=0.1)) as sim:

        async def main() -> list[str]:
            client, baseline = await _baseline(sim.url, CanarySettings(**SMALL))
            scorer = CanaryScorer(client, dp_ranks=lambda _: 2)
            try:
                healthy = await scorer.score(sim.url, baseline.canary_set)
                sim.control(degraded_dp_ranks=[1])
                degraded = await scorer.score(sim.url, baseline.canary_set)
            finally:
                await client.__aexit__(None, None, None)
            assert healthy.cold == degraded.cold == 0
            assert fired(compare(healthy.scoring, baseline.reference), baseline.thresholds) == []
            return fired(compare(degraded.scoring, baseline.reference), baseline.thresholds)

        assert asyncio.run(main())


@pytest.mark.slow
def test_one_dp_rank_of_four_degraded_fails_its_own_verdict(tokenizer_dir: str) -> None:
    """Pooled over four ranks, one degraded rank moves a quarter of the references and stays
    under the pooled thresholds; compared on its own share of the baseline it fires, the
    rerun fires again, and the check stops the run naming the rank."""
    dp = {"tp_size": 4, "dp_size": 4, "enable_dp_attention": True}
    lines: list[bytes] = []

    class Ledger:
        def append(self, line: QualityLine) -> None:
            lines.append(line.dump())

    # A mild fault (a tenth of the usual shift): a quarter of it is under the pooled floor.
    with SimServerThread(sim_config(tokenizer_dir, **NOISY, **dp, degrade_shift=0.006)) as sim:

        async def main() -> str:
            settings = CanarySettings(
                **{**SMALL, "prompts": 8, "probes": 4, "reference_tokens": 256}
            )
            client = SGLangClient([sim.url], in_flight=16)
            async with client:
                scorer = CanaryScorer(client, dp_ranks=lambda _: 4)
                baseline = await build_baseline(
                    scorer, sim.url, prompts(8), settings, model_path=None, ledger=None
                )
                monitor = CanaryMonitor(
                    scorer, baseline, period_s=60, max_held=100, ledger=Ledger()
                )
                await monitor.check(sim.url, "start")  # healthy: every rank passes
                sim.control(degraded_dp_ranks=[3])
                with pytest.raises(CanaryDriftError) as caught:
                    await monitor.check(sim.url, "period")
            return str(caught.value)

        message = asyncio.run(main())
    assert "rank 3: " in message
    checks = [orjson.loads(line) for line in lines]
    assert [c["verdict"] for c in checks] == ["pass", "fired", "drift"]
    assert all(len(c["ranks"]) == 4 and c["cold"] == 0 for c in checks)
    for check in checks[1:]:
        assert fired(check["stats"], check["thresholds"]) == []  # the pooled verdict is blind
        assert [r["rank"] for r in check["ranks"] if r["fired"]] == [3]


@pytest.mark.slow
def test_calibration_against_a_dp_server_reports_each_rank(
    tokenizer_dir: str, tmp_path: Path
) -> None:
    """``eagledata canary --against`` on a DP server: every check carries each rank's own
    statistics, and a fault on one rank is named."""
    dp = {"tp_size": 4, "dp_size": 4, "enable_dp_attention": True}
    canary = {"prompts": 8, "probes": 4, "reference_tokens": 256}
    shared, scored = tmp_path / "baseline.json", tmp_path / "scored.json"
    with SimServerThread(sim_config(tokenizer_dir, **NOISY, **dp, degrade_shift=0.006)) as sim:
        config = canary_config(sim.url, tmp_path / "unused", canary=canary)
        record_baseline(config, DATASET, shared)
        sim.control(degraded_dp_ranks=[3])
        line = score_against(config, shared, 2, scored)
    assert line.startswith("2 of 2 checks")
    checks = orjson.loads(scored.read_bytes())["checks"]
    assert all([r["rank"] for r in check["ranks"]] == [0, 1, 2, 3] for check in checks)
    assert all(check["fired"] and all("rank 3: " in f for f in check["fired"]) for check in checks)


# --- bad input, the command, --no-canary ----------------------------------------------------------


def test_a_corrupt_baseline_file_is_one_line_naming_the_fix(
    tokenizer_dir: str, tmp_path: Path
) -> None:
    bad = tmp_path / "baseline.json"
    bad.write_text('{"version": 1, "runs": [')
    with SimServerThread(sim_config(tokenizer_dir)) as sim:
        config = canary_config(sim.url, tmp_path / "run", canary={"baseline": str(bad)})
        with pytest.raises(ConfigError) as caught:
            pipeline.generate(config, DATASET, None, progress=False)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"canary baseline {bad} is unreadable")
    assert message.endswith(
        "record one with 'eagledata canary --server URL --out FILE', or drop --canary-baseline"
    )


def test_a_server_without_logprobs_is_one_line_naming_the_fix(
    tokenizer_dir: str, tmp_path: Path
) -> None:
    with SimServerThread(sim_config(tokenizer_dir, logprobs_supported=False)) as sim:
        out = tmp_path / "run"
        with pytest.raises(ServerError) as caught:
            pipeline.generate(canary_config(sim.url, out), DATASET, None, progress=False)
    assert str(caught.value) == (
        f"{sim.url} returned no logprobs (meta_info.input_token_logprobs); the canary needs "
        "SGLang's return_logprob: point --server at the SGLang server itself, or run with "
        "--no-canary"
    )
    assert read_records(out) == []


async def _scored_with(url: str, change: Any) -> tuple[Any, Any]:
    """A healthy scoring, and one of the same canary set whose scorings ``change`` rewrote."""
    client, baseline = await _baseline(url, CanarySettings(**{**SMALL, "probes": 0}))
    try:
        honest = await CanaryScorer(client).score(url, baseline.canary_set)
        real = client.post_generate

        async def rewritten(server: str, body: dict[str, Any]) -> dict[str, Any]:
            answer = await real(server, body)
            if body.get("top_logprobs_num"):
                change(answer["meta_info"]["input_top_logprobs"])
            return answer

        client.post_generate = rewritten  # type: ignore[method-assign]
        try:
            return honest, await CanaryScorer(client).score(url, baseline.canary_set)
        except ServerError as exc:
            return honest, exc
    finally:
        await client.__aexit__(None, None, None)


def test_a_scoring_with_a_short_top_list_reads_every_other_position_alike(
    tokenizer_dir: str,
) -> None:
    """A position with fewer top entries than asked is read entry by entry, the rest of the
    scoring as it would be whole: the two ways of reading give the same numbers."""

    def shorten(tops: list[Any]) -> None:
        tops[-1] = tops[-1][:-1]

    with SimServerThread(sim_config(tokenizer_dir, logprob_noise=0.0)) as sim:
        honest, short = asyncio.run(_scored_with(sim.url, shorten))
    length = len(honest.scoring.lps) // 6
    last = np.arange(len(honest.scoring.lps)) % length == length - 1
    for field in ("top_ids", "top_lps"):
        whole, partial = getattr(honest.scoring, field), getattr(short.scoring, field)
        assert np.array_equal(whole[~last], partial[~last])
        assert np.array_equal(whole[last][:, :-1], partial[last][:, :-1])
    assert (short.scoring.top_lps[last][:, -1] == -1e9).all()


@pytest.mark.parametrize(
    "entry",
    [{"logprob": -1.0, "id": 5}, [None, 5, None], [-1.0], ["x", 5, None], [-1.0, None, None]],
    ids=["object", "null-logprob", "no-id", "string-logprob", "null-id"],
)
def test_a_malformed_top_logprob_is_one_line_not_a_crash(tokenizer_dir: str, entry: Any) -> None:
    def corrupt(tops: list[Any]) -> None:
        tops[-1][0] = entry

    with SimServerThread(sim_config(tokenizer_dir)) as sim:
        _, refused = asyncio.run(_scored_with(sim.url, corrupt))
    assert isinstance(refused, ServerError)
    assert str(refused).startswith(f"{sim.url}: a canary scoring came back malformed (")


@pytest.mark.slow
def test_the_canary_command_records_a_baseline_that_runs_share(
    tokenizer_dir: str, tmp_path: Path
) -> None:
    shared = tmp_path / "shared.json"
    config_file = tmp_path / "eagledata.toml"
    small = "\n".join(f"{k} = {orjson.dumps(v).decode()}" for k, v in SMALL.items())
    with SimServerThread(sim_config(tokenizer_dir, **NOISY)) as sim:
        config_file.write_text(
            f'[tokenizer]\nname = "bundled:tokenizer/tiny-chatml"\n[canary]\n{small}\n'
        )
        result = subprocess.run(
            eagledata_cmd(
                "canary",
                "--config",
                str(config_file),
                "--server",
                sim.url,
                "--dataset",
                DATASET,
                "--out",
                str(shared),
            ),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert f"written to {shared}" in result.stdout
        out = tmp_path / "run"
        config = canary_config(sim.url, out, canary={"baseline": str(shared)})
        summary = pipeline.generate(config, DATASET, None, progress=False)
    assert summary.written == 40
    assert (out / "canary" / "baseline.json").read_bytes() == shared.read_bytes()
    assert not [e for e in ledger(out) if e["kind"] == "baseline"]  # none recorded: shared
    # Calibration: score a deliberately bad server (fp8 reported, degraded) against it.
    scored = tmp_path / "fp8.json"
    with SimServerThread(
        sim_config(tokenizer_dir, degraded=True, kv_cache_dtype="fp8_e4m3", **NOISY)
    ) as bad:
        result = subprocess.run(
            eagledata_cmd(
                "canary",
                "--config",
                str(config_file),
                "--server",
                bad.url,
                "--against",
                str(shared),
                "--checks",
                "2",
                "--out",
                str(scored),
            ),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"2 of 2 checks of {bad.url} fired against {shared}")
    written = orjson.loads(scored.read_bytes())
    assert written["kv_guard"]["ok"] is False and len(written["checks"]) == 2


def test_no_canary_is_frozen_in_run_json_and_shown_by_status(
    tokenizer_dir: str, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    with SimServerThread(sim_config(tokenizer_dir)) as sim:
        config = canary_config(sim.url, out, canary={"enabled": False})
        pipeline.generate(config, DATASET, None, progress=False)
        assert orjson.loads((out / "run.json").read_bytes())["canary"] == {"enabled": False}
        assert "canary:   off (--no-canary)" in run_status(out).render()
        with pytest.raises(Exception, match="started with --no-canary; that choice is frozen"):
            pipeline.generate(canary_config(sim.url, out), DATASET, None, progress=False)
    assert not (out / "quality.jsonl").exists()


@pytest.mark.slow
def test_a_server_restarted_degraded_is_caught_by_the_reconnect_check(
    tokenizer_dir: str, tmp_path: Path
) -> None:
    """The KV guard passes the restarted server (bf16 everywhere); the canary that runs after
    every reconnect refuses it before anything it produced lands."""
    # 0.2 s answers: the run is far from its end when the test restarts the server
    first = SimServerThread(sim_config(tokenizer_dir, latency_s=0.2, **NOISY)).start()
    port = first.port
    out = tmp_path / "run"
    config = canary_config(
        first.url,
        out,
        generation={"samples_per_prompt": 4},
        server={"guard_interval_s": 0.1, "guard_max_held": 1000, "down_deadline_s": 120},
        run={"concurrency": 4},
    )
    outcome: list[BaseException | None] = []

    def work() -> None:
        try:
            pipeline.generate(config, DATASET, None, progress=False)
            outcome.append(None)
        except BaseException as exc:  # handed to the test thread
            outcome.append(exc)

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    second = None
    try:
        deadline = time.monotonic() + 120  # generous: the baseline comes first
        while len(read_records(out)) < 10 and time.monotonic() < deadline:
            time.sleep(0.005)
        first.stop()
        time.sleep(0.3)  # down for a while (how long does not matter: under the deadline)
        second = SimServerThread(
            sim_config(tokenizer_dir, latency_s=0.05, degraded=True, **NOISY), port=port
        ).start()
        worker.join(timeout=120)
        produced = set(second.stats()["answers"]["degraded"])
    finally:
        first.stop()
        if second is not None:
            second.stop()
    assert outcome and isinstance(outcome[0], CanaryDriftError), outcome
    assert not produced & {r["rid"] for r in read_records(out)}
    last = ledger(out)[-1]
    assert last["verdict"] == "drift" and last["trigger"] in ("reconnect", "rerun")
    assert "reconnect" in {entry["trigger"] for entry in ledger(out)}


def test_topk_kl_is_a_divergence_when_the_server_moves_mass_into_the_top_k() -> None:
    """The reference's top-2 holds 0.7 of its mass; the current server gives those two ids 0.9.
    Summed over the top-k alone, p_ref (lp_ref - lp_now) is -0.176, a negative "KL" (what the
    report showed); with the rest as one bucket it is the KL of two whole distributions."""

    def scoring(ids: list[int], probs: list[float]) -> Scoring:
        return Scoring(
            np.log(np.array([probs[0]])),
            np.array([ids]),
            np.log(np.array([probs])),
        )

    reference = scoring([1, 2], [0.4, 0.3])
    moved = scoring([1, 2], [0.5, 0.4])
    expected = 0.4 * math.log(0.4 / 0.5) + 0.3 * math.log(0.3 / 0.4) + 0.3 * math.log(0.3 / 0.1)
    assert compare(moved, reference)["topk_kl"] == pytest.approx(expected)
    assert expected > 0.15
    assert compare(reference, reference)["topk_kl"] == 0.0
    # an id gone from the current top-k: it gets at most what the top-k leaves (0.05 here)
    swapped = scoring([1, 3], [0.55, 0.4])
    kl = compare(swapped, reference)["topk_kl"]
    assert kl == pytest.approx(
        0.4 * math.log(0.4 / 0.55) + 0.3 * math.log(0.3 / 0.05) + 0.3 * math.log(0.3 / 0.4)
    )
    assert kl > 0
