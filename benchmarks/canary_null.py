"""False alarms of the canary on a healthy noisy server: how many simulated checks fire.

    python benchmarks/canary_null.py [--baselines 6] [--checks 1000] [--ranks 4]

For each of ``--baselines`` baselines (recorded over HTTP on a fresh simulated server with
``logprob_noise=0.01`` and ``routing_flip_rate=0.01``, the small canary of tests/test_canary.py:
6 references of 48 tokens, 3 idle + 2 loaded runs; ``--references 24``: the default canary, 24
references of ``--reference-tokens`` 512, 3 + 3 runs), ``--checks`` more scorings are drawn straight
from the simulator's logprob model and compared with the thresholds that baseline derived. Prints
the fires per baseline and which statistic fired. ``--ranks N`` adds the per-rank verdicts of a
server with N DP ranks (``quality/canary_ranks.py``: each rank's share of the references against
its own share of the baseline), which a check also fails on.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import test_canary as canary_tests
from conftest import sim_config
from eagledata.config import CanarySettings, resolve_bundled
from eagledata.quality.canary import build_baseline
from eagledata.quality.canary_ranks import rank_shares, rank_verdicts
from eagledata.quality.canary_scorer import CanaryScorer
from eagledata.quality.canary_stats import compare, fired
from eagledata.server.client import SGLangClient
from eagledata.simserver import SimServerThread


def main(args: argparse.Namespace) -> None:
    tokenizer = resolve_bundled("bundled:tokenizer/tiny-chatml")
    which: Counter[str] = Counter()
    total = 0
    for trial in range(args.baselines):
        with SimServerThread(sim_config(tokenizer, **canary_tests.NOISY)) as sim:

            async def record(url: str) -> canary_tests.Baseline:
                if args.references is None:
                    settings = CanarySettings(**canary_tests.SMALL)
                    client, baseline = await canary_tests._baseline(url, settings)
                    await client.__aexit__(None, None, None)
                    return baseline
                settings = CanarySettings(
                    enabled=True, prompts=args.references, reference_tokens=args.reference_tokens
                )
                async with SGLangClient([url], in_flight=32) as client:
                    return await build_baseline(
                        CanaryScorer(client),
                        url,
                        canary_tests.prompts(settings.prompts, 200),
                        settings,
                        model_path=None,
                        ledger=None,
                    )

            baseline = asyncio.run(record(sim.url))
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
        print(f"baseline {trial}: {fires} of {args.checks} checks fired; thresholds {limits}")
    print(f"total: {total} of {args.baselines * args.checks} fired; by statistic: {dict(which)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baselines", type=int, default=6)
    parser.add_argument("--checks", type=int, default=1000)
    parser.add_argument("--ranks", type=int, default=1, help="DP ranks: per-rank verdicts too")
    parser.add_argument(
        "--references", type=int, default=None, help="a canary of this many (default: 6 x 48)"
    )
    parser.add_argument("--reference-tokens", type=int, default=512)
    main(parser.parse_args())
