"""Is ``--concurrency auto``'s forecast calibrated? A replay of a finished run.

The gate admits work while the ``load.overflow_quantile`` (0.9) of the forecast KV peak of what
is in flight stays within ``u* x pool`` (``capacity/forecast.py``); every ``telemetry.jsonl``
line holds that forecast (``forecast_usage``). Once the run has ended, its records say what
really happened to each request that was in flight at a sample: when it started
(``created_at - e2e_latency``), when it ended and how long its answer was. From them this script
computes the **true** peak each sample's requests reached (with nothing admitted after it; a
request's tokens are taken to grow linearly over its life) and counts how often the forecast
held it. A calibrated 90th percentile holds it in about 90% of the samples: more means the
forecast is loose (room the gate refused for nothing), fewer that it is optimistic.

    python benchmarks/bench_saturation.py --only job --job-prompts 1500 --keep /tmp/sat
    python benchmarks/forecast_calibration.py /tmp/sat/run-job-auto

The pool size and the time scale default to the saturation benchmark's. Samples of the first
``--skip`` and the last ``--drain`` modelled seconds are left out (learning and drain).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import orjson


def replay(
    run_dir: Path, *, pool: int, time_scale: float, skip: float, drain: float
) -> dict[str, float]:
    starts, ends, prompts, answers = [], [], [], []
    for shard in sorted((run_dir / "shards").glob("*.jsonl")):
        for line in shard.read_bytes().splitlines():
            record = orjson.loads(line)
            ends.append(record["created_at"])
            starts.append(record["created_at"] - record["e2e_latency"])
            prompts.append(record["prompt_tokens"])
            answers.append(record["completion_tokens"])
    start, end = np.asarray(starts), np.asarray(ends)
    prompt, answer = np.asarray(prompts, float), np.asarray(answers, float)
    samples = [orjson.loads(line) for line in (run_dir / "telemetry.jsonl").read_bytes().split()]
    first, last = samples[0]["time"], samples[-1]["time"]
    rows = []
    for sample in samples:
        now, forecast = sample["time"], sample.get("forecast_usage")
        if (
            forecast is None
            or not skip <= (now - first) / time_scale <= (last - first) / time_scale - drain
        ):
            continue
        live = (start <= now) & (end > now)
        if live.sum() < 2:
            continue
        generated = answer[live] * (now - start[live]) / (end[live] - start[live])
        left = answer[live] - generated
        held = prompt[live] + generated
        order = np.argsort(left)
        # The same path peak as the forecast's: at each end, what is still running holds its
        # tokens now plus that end's remaining length.
        after = np.cumsum(held[order][::-1])[::-1]
        peak = (after + np.arange(len(order), 0, -1) * left[order]).max() / pool
        rows.append((sample["token_usage"], peak, forecast))
    usage, peak, forecast = (np.asarray(column) for column in zip(*rows, strict=True))
    return {
        "samples": len(rows),
        "usage_mean": float(usage.mean()),
        "true_peak_mean": float(peak.mean()),
        "true_peak_max": float(peak.max()),
        "forecast_mean": float(forecast.mean()),
        "held": float((peak <= forecast).mean()),
        "margin_mean": float((forecast - peak).mean()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path, help="a kept run directory of an auto point")
    parser.add_argument("--pool", type=int, default=116_000, help="the server's KV pool, tokens")
    parser.add_argument("--time-scale", type=float, default=0.03)
    parser.add_argument("--skip", type=float, default=1000.0, help="modelled s left out first")
    parser.add_argument("--drain", type=float, default=1500.0, help="modelled s left out last")
    args = parser.parse_args()
    result = replay(
        args.run_dir, pool=args.pool, time_scale=args.time_scale, skip=args.skip, drain=args.drain
    )
    pct = {key: 100 * value for key, value in result.items()}
    print(
        f"{result['samples']:,} samples: the forecast 90th percentile held the true peak in "
        f"{pct['held']:.1f}% of them\n"
        f"mean KV usage {pct['usage_mean']:.1f}%, true peak {pct['true_peak_mean']:.1f}% "
        f"(max {pct['true_peak_max']:.1f}%), forecast {pct['forecast_mean']:.1f}% "
        f"(above the true peak by {pct['margin_mean']:.1f} points on average)"
    )


if __name__ == "__main__":
    main()
