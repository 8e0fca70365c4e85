"""False alarms of the canary on a healthy noisy server: how many simulated checks fire.

    python benchmarks/canary_null.py [--baselines 6] [--checks 1000] [--ranks 4]
    python benchmarks/canary_null.py --self-check 200 [--offline 5000] [--degraded 20]

Either takes the canary's size: [--references 4 --reference-tokens 24] [--idle-runs 1
--load-runs 1].

For each of ``--baselines`` baselines (recorded over HTTP on a fresh simulated server with
``logprob_noise=0.01`` and ``routing_flip_rate=0.01``, the small canary of tests/test_canary.py:
6 references of 48 tokens, 3 idle + 2 loaded runs; ``--references 24``: the default canary, 24
references of ``--reference-tokens`` 512, 3 + 3 runs), ``--checks`` more scorings are drawn straight
from the simulator's logprob model and compared with the thresholds that baseline derived. Prints
the fires per baseline and which statistic fired. ``--ranks N`` adds the per-rank verdicts of a
server with N DP ranks (``quality/canary_ranks.py``: each rank's share of the references against
its own share of the baseline), which a check also fails on. A baseline its own self-check refuses
on the healthy server is counted (a false alarm of another kind) and no checks are drawn from it.

``--self-check N`` measures the baseline's self-check instead (``quality/canary_selfcheck.py``):
N baselines recorded over HTTP, each on a fresh healthy noisy server, and the refusals counted
(false refusals); ``--offline M`` adds M baselines drawn from the simulator's logprob model (no
HTTP: many more, the references' sampling included); ``--degraded R`` records R baselines per
scoring whose server degrades silently from that scoring on, and counts the ones caught.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import test_canary as canary_tests
from conftest import sim_config
from eagledata.config import CanarySettings, resolve_bundled
from eagledata.errors import BaselineChangedError
from eagledata.quality.canary import build_baseline
from eagledata.quality.canary_ranks import rank_shares, rank_verdicts
from eagledata.quality.canary_scorer import CanaryScorer
from eagledata.quality.canary_selfcheck import self_check
from eagledata.quality.canary_stats import Rules, compare, fired
from eagledata.server.client import SGLangClient
from eagledata.simserver import SimServerThread


def _settings(args: argparse.Namespace) -> CanarySettings:
    if args.references is None:
        settings = CanarySettings(**canary_tests.SMALL)
    else:
        settings = CanarySettings(
            enabled=True, prompts=args.references, reference_tokens=args.reference_tokens
        )
    runs = {"baseline_idle_runs": args.idle_runs, "baseline_load_runs": args.load_runs}
    return settings.model_copy(update={k: v for k, v in runs.items() if v is not None})


def _prompt_tokens(args: argparse.Namespace) -> int:
    """The references' prompt length: the tests' 40 for their small canary, else 200."""
    return 40 if args.references is None else 200


def _why_refused(error: BaselineChangedError) -> str:
    """What the self-check saw, from its one-line refusal."""
    return str(error).split(" measured (", 1)[1]


def _record(
    tokenizer: str, settings: CanarySettings, prompt_tokens: int, degrade_at: int | None
) -> tuple[str | None, float]:
    """One baseline on a fresh noisy server: the refusal (or None) and the seconds it took."""
    from test_canary_baseline import DegradesAtScoring

    started = time.monotonic()
    with SimServerThread(sim_config(tokenizer, **canary_tests.NOISY)) as sim:

        async def record() -> str | None:
            async with SGLangClient([sim.url], in_flight=settings.load_requests + 16) as client:
                never = settings.baseline_idle_runs + settings.baseline_load_runs + 1
                scorer = DegradesAtScoring(client, sim, never if degrade_at is None else degrade_at)
                try:
                    await build_baseline(
                        scorer,
                        sim.url,
                        canary_tests.prompts(settings.prompts, prompt_tokens),
                        settings,
                        model_path=None,
                        ledger=None,
                    )
                except BaselineChangedError as error:
                    return _why_refused(error)
                return None

        refused = asyncio.run(record())
    return refused, time.monotonic() - started


def self_check_main(args: argparse.Namespace) -> None:
    tokenizer = resolve_bundled("bundled:tokenizer/tiny-chatml")
    settings = _settings(args)
    prompt_tokens = _prompt_tokens(args)
    size = f"{settings.prompts} x {settings.reference_tokens}"
    runs = settings.baseline_idle_runs + settings.baseline_load_runs
    why: Counter[str] = Counter()
    seconds = []
    for _ in range(args.self_check):
        refused, took = _record(tokenizer, settings, prompt_tokens, None)
        seconds.append(took)
        if refused is not None:
            why[refused.split(",")[0].split(":")[0]] += 1
    print(
        f"healthy, over HTTP ({size}, {runs} scorings): {sum(why.values())} of "
        f"{args.self_check} baselines refused {dict(why)}; "
        f"median {np.median(seconds) if seconds else 0:.1f} s a baseline"
    )
    if args.offline:
        from test_canary_baseline import _offline_scoring

        rng = np.random.default_rng(2022)
        kinds = ["idle"] * settings.baseline_idle_runs + ["load"] * settings.baseline_load_runs
        offline: Counter[str] = Counter()
        for _ in range(args.offline):
            references = [
                (prompt, [int(t) for t in rng.integers(10, 3000, settings.reference_tokens)])
                for prompt in canary_tests.prompts(settings.prompts)
            ]
            sampled = _offline_scoring(references, rng).lps
            found = self_check(
                [_offline_scoring(references, rng) for _ in kinds], kinds, Rules(), sampled
            )
            if found is not None:
                offline[found.what.split(",")[0]] += 1
        print(
            f"healthy, the simulator's model ({size}, {runs} scorings): "
            f"{sum(offline.values())} of {args.offline} baselines refused {dict(offline)}"
        )
    for at in range(runs if args.degraded else 0):
        caught = sum(
            _record(tokenizer, settings, prompt_tokens, at)[0] is not None
            for _ in range(args.degraded)
        )
        print(f"degraded from scoring {at + 1} of {runs}: {caught} of {args.degraded} caught")


def main(args: argparse.Namespace) -> None:
    tokenizer = resolve_bundled("bundled:tokenizer/tiny-chatml")
    settings = _settings(args)
    prompt_tokens = _prompt_tokens(args)
    which: Counter[str] = Counter()
    total = checked = refused = 0
    for trial in range(args.baselines):
        with SimServerThread(sim_config(tokenizer, **canary_tests.NOISY)) as sim:

            async def record(url: str) -> canary_tests.Baseline:
                async with SGLangClient([url], in_flight=32) as client:
                    return await build_baseline(
                        CanaryScorer(client),
                        url,
                        canary_tests.prompts(settings.prompts, prompt_tokens),
                        settings,
                        model_path=None,
                        ledger=None,
                    )

            try:
                baseline = asyncio.run(record(sim.url))
            except BaselineChangedError as error:  # a healthy server refused: a false alarm too
                refused += 1
                print(f"baseline {trial}: refused ({_why_refused(error)}")
                continue
        rng = np.random.default_rng(trial)
        limits = baseline.thresholds
        shares = rank_shares(baseline, args.ranks)
        fires = 0
        for _ in range(args.checks):
            scoring = canary_tests._simulated_scoring(baseline, rng, degraded=False)
            found = fired(compare(scoring, baseline.reference), limits)
            for verdict in rank_verdicts(scoring, shares, baseline):
                found += [fire.split(": ", 1)[1] for fire in verdict.hard or verdict.fires]
            which.update(item.split()[0] for item in found)
            fires += bool(found)
        total += fires
        checked += args.checks
        print(f"baseline {trial}: {fires} of {args.checks} checks fired; thresholds {limits}")
    print(
        f"total: {total} of {checked} checks fired; by statistic: {dict(which)}; "
        f"{refused} of {args.baselines} baselines refused by their self-check"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--self-check", type=int, default=0, help="healthy baselines over HTTP")
    parser.add_argument("--offline", type=int, default=0, help="and from the simulator's model")
    parser.add_argument("--degraded", type=int, default=0, help="degraded baselines per scoring")
    parser.add_argument("--baselines", type=int, default=6)
    parser.add_argument("--checks", type=int, default=1000)
    parser.add_argument("--ranks", type=int, default=1, help="DP ranks: per-rank verdicts too")
    parser.add_argument(
        "--references", type=int, default=None, help="a canary of this many (default: 6 x 48)"
    )
    parser.add_argument("--reference-tokens", type=int, default=512)
    parser.add_argument("--idle-runs", type=int, default=None, help="the baseline's idle scorings")
    parser.add_argument("--load-runs", type=int, default=None, help="and its loaded ones")
    parsed = parser.parse_args()
    if parsed.self_check or parsed.offline or parsed.degraded:
        self_check_main(parsed)
    else:
        main(parsed)
