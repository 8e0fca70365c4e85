"""False alarms of the canary on a healthy noisy server: how many simulated checks fire.

    python benchmarks/canary_null.py [--baselines 6] [--checks 1000]

For each of ``--baselines`` baselines (recorded over HTTP on a fresh simulated server with
``logprob_noise=0.01`` and ``routing_flip_rate=0.01``, the small canary of tests/test_canary.py:
6 references of 48 tokens, 3 idle + 2 loaded runs), ``--checks`` more scorings are drawn straight
from the simulator's logprob model and compared with the thresholds that baseline derived. Prints
the fires per baseline and which statistic fired.
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
from eagledata.quality.canary_stats import compare, fired
from eagledata.simserver import SimServerThread


def main(args: argparse.Namespace) -> None:
    tokenizer = resolve_bundled("bundled:tokenizer/tiny-chatml")
    which: Counter[str] = Counter()
    total = 0
    for trial in range(args.baselines):
        with SimServerThread(sim_config(tokenizer, **canary_tests.NOISY)) as sim:

            async def record(url: str) -> canary_tests.Baseline:
                settings = CanarySettings(**canary_tests.SMALL)
                client, baseline = await canary_tests._baseline(url, settings)
                await client.__aexit__(None, None, None)
                return baseline

            baseline = asyncio.run(record(sim.url))
        rng = np.random.default_rng(trial)
        limits = baseline.thresholds
        fires = 0
        for _ in range(args.checks):
            scoring = canary_tests._simulated_scoring(baseline, rng, degraded=False)
            found = fired(compare(scoring, baseline.reference), limits)
            which.update(item.split()[0] for item in found)
            fires += bool(found)
        total += fires
        print(f"baseline {trial}: {fires} of {args.checks} checks fired; thresholds {limits}")
    print(f"total: {total} of {args.baselines * args.checks} fired; by statistic: {dict(which)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baselines", type=int, default=6)
    parser.add_argument("--checks", type=int, default=1000)
    main(parser.parse_args())
