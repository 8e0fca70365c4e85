"""``--concurrency auto`` on a small KV pool, where one request is a tenth of it (retractions).

The saturation benchmark's pool holds ~20 requests; this one holds ~9. It is the capacity engine
of the tests (``tests/test_loadcontrol.py``: a 2,500-token pool, answers of 300 tokens +-30%,
``max_new_tokens`` 512, 100x time), run for longer than a test can: the 40 bundled ShareGPT
prompts, five samples each (200 answers a run). Each run is one ``generate`` in this process
against its own simulated server. Every setting reports retractions per run, mean KV usage and
the wall time of the run (modelled time is that over ``--time-scale``, 100x at the default).

    python benchmarks/bench_small_pool.py --runs 8 --settings auto 6 8 12
    python benchmarks/bench_small_pool.py --runs 8 --settings auto --load max_usage=0.90
    python benchmarks/bench_small_pool.py --runs 1 --settings auto --keep /tmp/small
    python benchmarks/forecast_calibration.py /tmp/small/run-auto-0 --pool 2500 \
        --time-scale 0.01 --skip 60 --drain 60

Measured numbers are in ``docs/throughput.md`` (A small pool).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

import orjson

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from eagledata.config import AppConfig, resolve_bundled
from eagledata.run import pipeline
from eagledata.simserver import SimConfig, SimServerThread

TOKENIZER = "bundled:tokenizer/tiny-chatml"
DATASET = Path(resolve_bundled("bundled:samples")) / "sharegpt.jsonl"


def server_config(time_scale: float) -> SimConfig:
    return SimConfig(
        tokenizer_path=resolve_bundled(TOKENIZER),
        context_length=32768,
        engine="sglang",
        max_total_num_tokens=2500,
        time_scale=time_scale,
        steps_per_tick=4,
        length_fraction=0.0,
        output_len_mean=300.0,
        output_len_spread=0.3,
    )


def app_config(
    url: str, out: Path, concurrency: str, time_scale: float, load: dict[str, float]
) -> AppConfig:
    # The tests' poll and reaction periods at 0.01; scaled with the time, so that a modelled
    # second holds the same number of polls at any --time-scale.
    scale = time_scale / 0.01
    return AppConfig.model_validate(
        {
            "tokenizer": {"name": TOKENIZER},
            "generation": {"max_new_tokens": 512, "temperature": 1.0, "samples_per_prompt": 5},
            "server": {
                "urls": [url],
                "backoff_base_s": 0.01,
                "backoff_max_s": 0.05,
                "request_timeout_s": 60,
            },
            "run": {
                "out_dir": str(out),
                "concurrency": concurrency if concurrency == "auto" else int(concurrency),
            },
            "canary": {"enabled": False},
            "load": {
                "poll_interval_s": 0.02 * scale,
                "telemetry_interval_s": 0.05 * scale,
                "creep_every_s": 0.1 * scale,
                "freeze_s": 0.3 * scale,
                **load,
            },
        }
    )


def one_run(
    concurrency: str, time_scale: float, work: Path, load: dict[str, float] | None = None
) -> dict[str, Any]:
    out = work / f"run-{concurrency}-{len(list(work.iterdir()))}"
    with SimServerThread(server_config(time_scale)) as sim:
        summary = pipeline.generate(
            app_config(sim.url, out, concurrency, time_scale, load or {}),
            str(DATASET),
            out,
            progress=False,
        )
        engine = sim.stats()["engine"][0]
    rows = [orjson.loads(line) for line in (out / "telemetry.jsonl").read_bytes().splitlines()]
    usage = [row["token_usage"] for row in rows if row["token_usage"] is not None]
    return {
        "written": summary.written,
        "retractions": engine["retracted_total"],
        "kv_usage": statistics.fmean(usage) if usage else 0.0,
        "wall_s": rows[-1]["time"] - rows[0]["time"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=8, help="runs of every setting")
    parser.add_argument("--settings", nargs="+", default=["auto", "6", "8", "12"])
    parser.add_argument("--time-scale", type=float, default=0.01)
    parser.add_argument("--keep", type=Path, help="run in this folder and keep the run dirs")
    parser.add_argument(
        "--load", action="append", default=[], metavar="KEY=VALUE", help="a [load] setting"
    )
    args = parser.parse_args()
    load = {key: float(value) for key, value in (item.split("=", 1) for item in args.load)}
    print("| setting | runs | retractions per run | mean KV usage | wall s per run |")
    print("|---|---|---|---|---|")
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
    workdir = (
        contextlib.nullcontext(str(args.keep))
        if args.keep is not None
        else tempfile.TemporaryDirectory(prefix="bench-small-pool-")
    )
    with workdir as tmp:
        for setting in args.settings:
            runs = [one_run(setting, args.time_scale, Path(tmp), load) for _ in range(args.runs)]
            assert all(run["written"] == 200 for run in runs), runs
            retractions = [run["retractions"] for run in runs]
            print(
                f"| {setting} | {len(runs)} | {statistics.fmean(retractions):.2f} "
                f"({min(retractions)}-{max(retractions)}) "
                f"| {100 * statistics.fmean(run['kv_usage'] for run in runs):.1f}% "
                f"| {statistics.fmean(run['wall_s'] for run in runs):.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
