"""A canary baseline that checks itself (issue 22, item 3): a server that changes while the
baseline is being measured is refused (exit 4, one line), whichever scoring the change starts
at; a healthy server with batch noise is not."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from conftest import eagledata_cmd, read_records, sim_config
from eagledata.config import CanarySettings
from eagledata.errors import BaselineChangedError
from eagledata.quality.canary import build_baseline
from eagledata.quality.canary_baseline import Baseline, CanarySet
from eagledata.quality.canary_scorer import CanaryScorer, Measured
from eagledata.quality.canary_selfcheck import self_check
from eagledata.quality.canary_stats import Rules, Scoring
from eagledata.run import pipeline
from eagledata.rundir.lines import QualityLine
from eagledata.server.client import SGLangClient
from eagledata.simserver import SimServerThread
from eagledata.simserver.logprobs import Noise, score
from test_canary import DATASET, NOISY, SMALL, ledger, prompts

SCORINGS = SMALL["baseline_idle_runs"] + SMALL["baseline_load_runs"]  # 3 idle, then 2 loaded


class DegradesAtScoring(CanaryScorer):
    """Switches the simulated server to its silent degradation (bf16 still reported
    everywhere) just before the baseline's scoring number ``at`` (0: the first) begins."""

    def __init__(self, client: SGLangClient, sim: SimServerThread, at: int) -> None:
        super().__init__(client)
        self.sim = sim
        self.at = at
        self.scorings = 0

    async def score(self, url: str, canary: CanarySet, *, warm: bool = True) -> Measured:
        if self.scorings == self.at:
            self.sim.control(degraded=True)
        self.scorings += 1
        return await super().score(url, canary, warm=warm)


@pytest.mark.parametrize("at", range(SCORINGS), ids=[f"scoring-{n + 1}" for n in range(SCORINGS)])
def test_a_degradation_that_starts_at_any_scoring_refuses_the_baseline(
    tokenizer_dir: str, at: int
) -> None:
    """From the first scoring (every scoring degraded alike: only the references' own sampling
    shows it) to the last (one scoring alone moved: the issue's case, where the thresholds
    absorbed it), the baseline is refused and nothing of it is kept."""
    lines: list[bytes] = []

    class Ledger:
        def append(self, line: QualityLine) -> None:
            lines.append(line.dump())

    with SimServerThread(sim_config(tokenizer_dir, **NOISY)) as sim:

        async def main() -> tuple[int, str]:
            async with SGLangClient([sim.url], in_flight=16) as client:
                scorer = DegradesAtScoring(client, sim, at)
                with pytest.raises(BaselineChangedError) as caught:
                    await build_baseline(
                        scorer,
                        sim.url,
                        prompts(),
                        CanarySettings(**SMALL),
                        model_path=None,
                        ledger=Ledger(),
                    )
            return scorer.scorings, str(caught.value)

        scorings, message = asyncio.run(main())
    assert scorings == SCORINGS  # every scoring was taken: the refusal is the baseline's verdict
    assert "\n" not in message
    assert message.startswith(f"{sim.url} changed while the canary's baseline was being measured (")
    assert message.endswith("); the baseline was not kept")
    logged = [orjson.loads(line) for line in lines]
    assert [entry["verdict"] for entry in logged] == ["refused"] * SCORINGS
    assert all(entry["reason"] and entry["kind"] == "baseline" for entry in logged)


@pytest.mark.slow
def test_a_healthy_noisy_server_records_a_baseline_whose_self_check_passes(
    tokenizer_dir: str,
) -> None:
    """The same recording with no degradation: kept, and the sampling's logprobs are in it."""
    with SimServerThread(sim_config(tokenizer_dir, **NOISY)) as sim:

        async def main() -> Baseline:
            async with SGLangClient([sim.url], in_flight=16) as client:
                scorer = DegradesAtScoring(client, sim, at=SCORINGS)  # never
                settings = CanarySettings(**SMALL)
                return await build_baseline(
                    scorer, sim.url, prompts(), settings, model_path=None, ledger=None
                )

        baseline = asyncio.run(main())
    sampled = baseline.canary_set.sampled_lps
    assert sampled is not None and sampled.shape == (baseline.canary_set.scored_tokens,)
    # what the server gave each token as it sampled it is what a scoring reads, up to the noise
    assert abs(float(np.mean(baseline.reference.lps - sampled))) < 0.01


@pytest.mark.slow
def test_a_server_that_degrades_mid_baseline_stops_the_run_before_any_record(
    tokenizer_dir: str, tmp_path: Path
) -> None:
    """The issue's case through the command: a server that silently degrades after a number of
    generations, here during the second idle scoring's greedy probes (6 references sampled,
    then 3 probes per scoring). ``generate`` exits 4 with one line and no record; ``resume``
    against a healthy server records a new baseline and completes."""
    out = tmp_path / "run"
    config = tmp_path / "eagledata.toml"
    small = "\n".join(f"{key} = {orjson.dumps(value).decode()}" for key, value in SMALL.items())
    config.write_text(f'[tokenizer]\nname = "bundled:tokenizer/tiny-chatml"\n[canary]\n{small}\n')
    with SimServerThread(sim_config(tokenizer_dir, degrade_after_generations=10, **NOISY)) as bad:
        result = subprocess.run(
            eagledata_cmd(
                "generate",
                "--config",
                str(config),
                "--server",
                bad.url,
                "--dataset",
                DATASET,
                "--out",
                str(out),
                "--no-progress",
            ),
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        degraded = bad.stats()["answers"]["degraded"]
    assert result.returncode == 4, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert lines[0].startswith(
        f"eagledata: error: {bad.url} changed while the canary's baseline was being measured ("
    )
    assert lines[0].endswith(
        f"); the baseline was not kept and nothing was generated: check the server, then "
        f"'eagledata resume {out}' records a new baseline"
    )
    assert degraded  # it did degrade, silently
    assert read_records(out) == []
    assert not (out / "canary" / "baseline.json").exists()
    assert {entry["verdict"] for entry in ledger(out)} == {"refused"}
    with SimServerThread(sim_config(tokenizer_dir, **NOISY)) as good:
        summary = pipeline.resume(out, server_urls=[good.url], progress=False)
    assert summary.written == 40 and summary.left == 0
    assert (out / "canary" / "baseline.json").exists()


# --- no false refusal -----------------------------------------------------------------------------


def _offline_scoring(references: list[tuple[list[int], list[int]]], rng: Any) -> Scoring:
    """A warm scoring by the simulator's own logprob model (the noise of ``NOISY``), no HTTP."""
    noise = Noise(NOISY["logprob_noise"], NOISY["routing_flip_rate"], 0.05, 0.05, rng)
    lps, ids, tops = [], [], []
    k = SMALL["top_logprobs"]
    for prompt, reference in references:
        context = [*prompt, *reference][len(prompt) - 1 : -1]
        lp, candidate_ids, candidate_lps = score(context, reference, 3000, noise, False)
        lps.append(lp)
        ids.append(candidate_ids[:, :k])
        tops.append(candidate_lps[:, :k])
    greedy = [[7, 8, 9]] * SMALL["probes"]  # the simulator's greedy decode is deterministic
    return Scoring(np.concatenate(lps), np.concatenate(ids), np.concatenate(tops), greedy)


@pytest.mark.slow
def test_healthy_baselines_with_batch_noise_are_never_refused() -> None:
    """200 baselines of the tests' small canary (6 x 48 tokens, 3 idle and 2 loaded scorings,
    and the references' sampling) drawn from the simulator's model with its batch noise and
    routing flips: none refused. (``benchmarks/canary_null.py --self-check`` measures more.)"""
    rng = np.random.default_rng(22)
    rules = Rules()
    kinds = ["idle"] * SMALL["baseline_idle_runs"] + ["load"] * SMALL["baseline_load_runs"]
    refused = []
    for trial in range(200):
        references = [
            (prompt, [int(t) for t in rng.integers(10, 3000, SMALL["reference_tokens"])])
            for prompt in prompts()
        ]
        sampled = _offline_scoring(references, rng).lps
        runs = [_offline_scoring(references, rng) for _ in kinds]
        finding = self_check(runs, kinds, rules, sampled)
        if finding is not None:
            refused.append(f"{trial}: {finding}")
    assert refused == []


@pytest.mark.slow
def test_a_two_scoring_baseline_of_a_healthy_server_is_never_refused() -> None:
    """The fewest scorings a baseline takes (one idle, one loaded) leave one pair of scorings:
    too thin a noise estimate to judge the references as sampled against (a healthy 4 x 24
    baseline was refused about once in 24). Every test is skipped, so none refuses it."""
    rng = np.random.default_rng(15)
    kinds = ["idle", "load"]
    refused = []
    for trial in range(500):
        references = [
            (prompt, [int(t) for t in rng.integers(10, 3000, 24)]) for prompt in prompts(4)
        ]
        sampled = _offline_scoring(references, rng).lps
        runs = [_offline_scoring(references, rng) for _ in kinds]
        finding = self_check(runs, kinds, Rules(), sampled)
        if finding is not None:
            refused.append(f"{trial}: {finding}")
    assert refused == []


# --- the real server's own rounding --------------------------------------------------------------

REAL_DELTAS = Path(__file__).parent / "fixtures" / "sglang-0.5.23-cpu" / "decode_prefill_deltas.npz"
"""What SGLang 0.5.23 on this CPU did to 400 sets of the library example's small canary (4
references of 32 tokens, the repo's trained model): each token's prefill scoring minus the
logprob it had as the server sampled it, per set (``benchmarks/canary_real_gap.py --sets 200
--beside 0 16 --seed 1 --save``: sampled alone, and beside 16 other sampled generations)."""


def _cpu_baseline(
    delta: np.ndarray, change: float = 0.0
) -> tuple[list[Scoring], list[str], np.ndarray]:
    """A baseline as the real CPU server records it: six scorings equal to 1e-9 (its prefill is
    deterministic), and the references as sampled, ``delta`` away token by token; ``change``:
    the server scored every token that much lower from the first scoring on."""
    rng = np.random.default_rng(len(delta))
    lps = -rng.exponential(0.5, len(delta))
    kinds = ["idle"] * 3 + ["load"] * 3
    runs = [
        Scoring(
            lps + change + rng.normal(0.0, 1e-9, len(lps)),
            np.zeros((len(lps), 1), dtype=np.int64),
            np.zeros((len(lps), 1)),
            [[7, 8, 9]],
        )
        for _ in kinds
    ]
    return runs, kinds, lps - delta


@pytest.mark.slow
def test_the_real_servers_decode_and_prefill_rounding_is_not_a_change() -> None:
    """On the real CPU server the scorings agree to 1e-9, so their pairs carry none of the
    noise between decode and prefill, while each token's sampled logprob differs from its
    scoring by ~0.009: the mean over a 128-token canary moves by chance as far as the 1e-3
    floor (5 of these 400 healthy sets, and a stress run of the library example refused at
    -0.0021). None is refused; the same sets scored 0.01 lower from the first scoring on (a
    change after the sampling) all are, by this test. (0.005 lower: 398 of 400, 0.002: 321;
    docs/quality.md, "The references as sampled on the real server".)"""
    with np.load(REAL_DELTAS) as saved:
        sets = np.concatenate([saved[name] for name in saved.files]).astype(np.float64)
    assert sets.shape == (400, 128)
    refused = []
    for index, delta in enumerate(sets):
        runs, kinds, sampled = _cpu_baseline(delta)
        finding = self_check(runs, kinds, Rules(), sampled)
        if finding is not None:
            refused.append(f"{index}: {finding}")
    assert refused == []
    for delta in sets:
        runs, kinds, sampled = _cpu_baseline(delta, change=-0.01)
        finding = self_check(runs, kinds, Rules(), sampled)
        assert finding is not None
        assert finding.what == "the scorings against the references as the server sampled them"
