"""The canary on the simulated server: its cost per check and its detection margin.

    python benchmarks/bench_canary.py [--prompt-tokens 2000] [--checks 5]
    python benchmarks/bench_canary.py --dp 4 --degrade-rank 3   # one DP rank of four degraded

Records a baseline with the default settings (24 references of 512 tokens, 8 greedy probes of
256 tokens, 3 idle + 3 loaded scorings), then runs healthy checks and degraded checks
(``SimConfig.degraded``: still bf16 everywhere) and prints, per check, the requests, prompt
tokens and seconds, and for each statistic its noise threshold and the degraded value over it.
Prompts are cut from the simulator's own text (real canary prompts come from the run's dataset).
The simulated server runs in a separate process, as a real one would. With ``--dp N`` it has N
DP attention ranks, each with a prefix cache of its own; the canary pins each reference to one
(``CanaryScorer``), and ``--degrade-rank R`` degrades rank R alone (``degraded_dp_ranks``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import httpx
import numpy as np

from eagledata.config import CanarySettings, resolve_bundled
from eagledata.quality.canary import build_baseline
from eagledata.quality.canary_ranks import rank_shares, rank_verdicts
from eagledata.quality.canary_scorer import CanaryScorer
from eagledata.quality.canary_stats import compare, fired
from eagledata.server.client import SGLangClient
from eagledata.simserver.config import SimConfig
from eagledata.simserver.model import resolve_model


def start_server(options: dict[str, object]) -> tuple[subprocess.Popen[str], str]:
    code = (
        "from eagledata.simserver import SimConfig, run_sim_server;"
        f"run_sim_server(SimConfig(**{options!r}), '127.0.0.1', 0)"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=os.environ.copy()
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    return process, line.rsplit(" ", 1)[-1].strip()


async def main(args: argparse.Namespace) -> None:
    tokenizer = resolve_bundled("bundled:tokenizer/tiny-chatml")
    options = {
        "tokenizer_path": tokenizer,
        "context_length": 32768,
        "logprob_noise": args.noise,
        "routing_flip_rate": args.flips,
    }
    if args.dp > 1:
        options.update(tp_size=args.dp, dp_size=args.dp, enable_dp_attention=True)
    table = resolve_model(SimConfig(**options)).table  # type: ignore[arg-type]
    settings = CanarySettings()
    prompts = [table[i * 997 : i * 997 + args.prompt_tokens] for i in range(settings.prompts)]
    process, url = start_server(options)
    try:
        async with SGLangClient([url], in_flight=64) as client:
            scorer = CanaryScorer(client, dp_ranks=lambda _: args.dp)
            started = time.monotonic()
            baseline = await build_baseline(
                scorer, url, prompts, settings, model_path=None, ledger=None
            )
            baseline_s = time.monotonic() - started
            limits = baseline.thresholds
            healthy = [await scorer.score(url, baseline.canary_set) for _ in range(args.checks)]
            fault = (
                {"degraded": True}
                if args.degrade_rank is None
                else {"degraded_dp_ranks": [args.degrade_rank]}
            )
            async with httpx.AsyncClient() as http:  # the silent degradation, switched on
                await http.post(url + "/_sim/control", json=fault)
            degraded = [await scorer.score(url, baseline.canary_set) for _ in range(args.checks)]
    finally:
        process.terminate()
        process.wait()
    reference = baseline.reference
    print(
        f"baseline: {len(baseline.runs)} scorings in {baseline_s:.1f}s; "
        f"{baseline.canary_set.scored_tokens:,} scored tokens per check"
    )
    one = healthy[0]
    print(
        f"per check: {one.requests} requests, {one.prompt_tokens:,} prompt tokens, "
        f"{statistics.median(m.seconds for m in healthy):.2f}s median (simulator, 2 shared cores)"
    )
    print(
        "| statistic | noise threshold | healthy (worst of checks) | degraded (median) | margin |"
    )
    print("|---|---|---|---|---|")
    for name in ("mean_shift", "trimmed_abs", "topk_kl", "top1_flip", "greedy_divergence"):
        good = [compare(m.scoring, reference)[name] for m in healthy]
        bad = [compare(m.scoring, reference)[name] for m in degraded]
        limit = limits[name]
        if name in ("mean_shift", "greedy_divergence"):
            worst = min(good)
            margin = (
                (limit / float(np.median(bad)))
                if name == "greedy_divergence"
                else (float(np.median(bad)) / limit)
            )
        else:
            worst = max(good)
            margin = float(np.median(bad)) / limit
        print(
            f"| `{name}` | {limit:.4g} | {worst:.4g} | {float(np.median(bad)):.4g} | "
            f"{margin:.1f}x |"
        )
    fires_good = sum(bool(fired(compare(m.scoring, reference), limits)) for m in healthy)
    fires_bad = sum(bool(fired(compare(m.scoring, reference), limits)) for m in degraded)
    print(
        f"fired (pooled): {fires_good}/{len(healthy)} healthy checks, "
        f"{fires_bad}/{len(degraded)} degraded"
    )
    shares = rank_shares(baseline, args.dp)
    if shares:  # the per-rank verdicts (quality/canary_ranks.py) as a check applies them

        def rank_fires(measured: list[Any]) -> int:
            verdicts = (rank_verdicts(m.scoring, shares, baseline) for m in measured)
            return sum(any(v.fires or v.hard for v in checks) for checks in verdicts)

        bad_rank = args.degrade_rank if args.degrade_rank is not None else 0
        share = next(share for share in shares if share.rank == bad_rank)
        ranked = [rank_verdicts(m.scoring, [share], baseline)[0].stats for m in degraded]
        shift = float(np.median([stats["mean_shift"] for stats in ranked]))
        print(
            f"rank {bad_rank} on its own: mean_shift {shift:.4g} against "
            f"{share.limits['mean_shift']:.4g} ({shift / share.limits['mean_shift']:.1f}x); "
            f"per-rank verdicts fired in {rank_fires(healthy)}/{len(healthy)} healthy checks, "
            f"{rank_fires(degraded)}/{len(degraded)} degraded"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-tokens", type=int, default=2000)
    parser.add_argument("--checks", type=int, default=5)
    parser.add_argument("--noise", type=float, default=0.01)
    parser.add_argument("--flips", type=float, default=0.01)
    parser.add_argument("--dp", type=int, default=1, help="DP attention ranks of the server")
    parser.add_argument(
        "--degrade-rank", type=int, default=None, help="degrade this DP rank only (default: all)"
    )
    asyncio.run(main(parser.parse_args()))
