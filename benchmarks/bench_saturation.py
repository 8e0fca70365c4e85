"""Saturation: fixed ``--concurrency`` against ``auto`` on the simulated capacity engine.

The simulated server runs SGLang's scheduler step by step (``simserver/capacity.py``): the
reference bf16 pool of 116,000 tokens, the reference step-time fit, admission with the decaying
``new_token_ratio``, retraction, ``--max-queued-requests 32``. Time runs ``TIME_SCALE`` times
faster than modelled (one modelled second lasts 10 ms), and the client's controller timings are
scaled the same way, so a modelled half hour takes about 20 s. ``eagledata generate`` runs as its
own process against it (the product path: dataset, template, scheduler, controller, writer).

The workload: prompts of 300-2,500 tokens (the tiny tokenizer's ChatML template around random
words), answers that stop on their own at 3,000 tokens +- 50% (uniform), ``max_new_tokens``
8,192: long thinking answers against a pool of ~30 of them, as on the reference job.

Each point runs a warm-up, then measures a window, both in modelled time from the server's own
clock: output tok/s, mean KV usage (time-weighted), retractions, 503s. Then:

* ``fixed 16/64/256/1024`` and ``auto`` on one server;
* two servers of unequal speed (the second's step time doubled): ``auto`` on both against the
  sum of each server's best fixed setting alone;
* a changing workload: answers grow from 2,000 to 4,000 tokens halfway through the window.

    python benchmarks/bench_saturation.py            # every section, about 10 minutes on 2 cores
    python benchmarks/bench_saturation.py --only single --measure 20

Prints markdown tables and writes ``benchmarks/results/saturation.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from eagledata.config import resolve_bundled
from eagledata.simserver import SimConfig, SimServerThread

RESULTS = Path(__file__).resolve().parent / "results" / "saturation.json"
TIME_SCALE = 0.01
POOL = 116_000
QUEUE_CAP = 32
WORKLOAD: dict[str, Any] = {"output_len_mean": 3000.0, "output_len_spread": 0.5}
MAX_NEW = 8192
WORDS = "alpha beta gamma delta model token cache server drafter answer think prompt".split()


@dataclass
class Point:
    label: str
    servers: int
    tok_s: float
    kv_usage: float
    retractions: int
    queue_full: int
    running: float
    modelled_s: float


def sim_config(tokenizer: str, **overrides: Any) -> SimConfig:
    fields: dict[str, Any] = {
        "engine": "sglang",
        "tokenizer_path": tokenizer,
        "context_length": 32768,
        "max_total_num_tokens": POOL,
        "max_queued_requests": QUEUE_CAP,
        "time_scale": TIME_SCALE,
        "steps_per_tick": 8,
        "length_fraction": 0.0,
        **WORKLOAD,
    }
    fields.update(overrides)
    return SimConfig(**fields)


def write_dataset(path: Path, rows: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    with path.open("w") as out:
        for index in range(rows):
            words = rng.randint(250, 2300)
            text = " ".join(rng.choice(WORDS) for _ in range(words))
            out.write(json.dumps({"id": f"p{index}", "prompt": text}) + "\n")


def write_config(path: Path, urls: list[str], concurrency: str, run_dir: Path) -> None:
    scale = TIME_SCALE
    path.write_text(
        f"""
[tokenizer]
name = "bundled:tokenizer/tiny-chatml"

[generation]
max_new_tokens = {MAX_NEW}
temperature = 1.0

[server]
urls = {json.dumps(urls)}
guard_interval_s = 5
request_timeout_s = 600
backoff_base_s = {scale * 10}

[run]
out_dir = "{run_dir}"
concurrency = {json.dumps(concurrency if concurrency == "auto" else int(concurrency))}
shard_size = 1000
fsync_interval_s = 1.0

[load]
poll_interval_s = {3 * scale}
telemetry_interval_s = {100 * scale}
creep_every_s = {30 * scale}
freeze_s = {120 * scale}
"""
    )


def engine_totals(sims: list[SimServerThread]) -> dict[str, float]:
    totals = {"decoded": 0.0, "area": 0.0, "time": 0.0, "retracted": 0.0, "queue_full": 0.0}
    totals["running_area"] = 0.0
    for sim in sims:
        stats = sim.stats()
        totals["queue_full"] += stats["outcomes"].get("queue_full", 0)
        for rank in stats["engine"]:
            totals["decoded"] += rank["decoded_tokens"]
            totals["area"] += rank["usage_area"]
            totals["time"] = max(totals["time"], rank["sim_time"])
            totals["retracted"] += rank["retracted_total"]
    return totals


def wait_for_traffic(sims: list[SimServerThread], client: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if client.poll() is not None:
            raise RuntimeError(f"eagledata generate exited early ({client.returncode})")
        if all(sim.stats()["engine"] for sim in sims):
            return
        time.sleep(0.2)
    raise RuntimeError("no request reached the simulated servers")


def run_point(
    label: str,
    configs: list[SimConfig],
    concurrency: str,
    dataset: Path,
    work: Path,
    *,
    warmup: float,
    measure: float,
    change: dict[str, Any] | None = None,
) -> Point:
    sims = [SimServerThread(config).start() for config in configs]
    run_dir = work / f"run-{label.replace(' ', '-')}"
    config_path = work / f"{label.replace(' ', '-')}.toml"
    write_config(config_path, [sim.url for sim in sims], concurrency, run_dir)
    cmd = [
        sys.executable, "-m", "eagledata.cli", "generate", "--config", str(config_path),
        "--dataset", str(dataset), "--no-progress",
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    log = (work / f"{label.replace(' ', '-')}.log").open("wb")
    client = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        wait_for_traffic(sims, client)
        time.sleep(warmup)
        start = [engine_totals([sim]) for sim in sims]
        if change is not None:
            time.sleep(measure / 2)
            for sim in sims:
                sim.control(**change)
            time.sleep(measure / 2)
        else:
            time.sleep(measure)
        end = [engine_totals([sim]) for sim in sims]
    finally:
        client.send_signal(signal.SIGINT)
        time.sleep(0.5)
        client.send_signal(signal.SIGINT)
        try:
            client.wait(timeout=30)
        except subprocess.TimeoutExpired:
            client.kill()
        for sim in sims:
            sim.stop()
    tok_s = usage = retracted = queue_full = 0.0
    span = 0.0
    for a, b in zip(start, end, strict=True):
        modelled = b["time"] - a["time"]
        span = max(span, modelled)
        tok_s += (b["decoded"] - a["decoded"]) / modelled
        usage += (b["area"] - a["area"]) / modelled / len(sims)
        retracted += b["retracted"] - a["retracted"]
        queue_full += b["queue_full"] - a["queue_full"]
    return Point(
        label=label,
        servers=len(sims),
        tok_s=tok_s,
        kv_usage=usage,
        retractions=int(retracted),
        queue_full=int(queue_full),
        running=0.0,
        modelled_s=span,
    )


def table(points: list[Point]) -> str:
    lines = [
        "| setting | output tok/s | mean KV usage | retractions | 503s | modelled s |",
        "|---|---|---|---|---|---|",
    ]
    for p in points:
        lines.append(
            f"| {p.label} | {p.tok_s:,.0f} | {100 * p.kv_usage:.1f}% | {p.retractions} | "
            f"{p.queue_full} | {p.modelled_s:,.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    global TIME_SCALE, MAX_NEW
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--warmup", type=float, default=20.0, help="wall seconds")
    parser.add_argument("--measure", type=float, default=20.0, help="wall seconds")
    parser.add_argument("--only", choices=("single", "two", "changing"), action="append")
    parser.add_argument("--fixed", type=int, nargs="*", default=[16, 64, 256, 1024])
    parser.add_argument(
        "--time-scale",
        type=float,
        default=TIME_SCALE,
        help="wall seconds per modelled second; the client's poll and reaction delays, "
        "in modelled time, grow as it shrinks (a loaded machine makes them worse)",
    )
    parser.add_argument("--answers", choices=("uniform", "exponential"), default="uniform")
    parser.add_argument("--labels", nargs="*", help="single section: only these points")
    args = parser.parse_args()
    TIME_SCALE = args.time_scale
    if args.answers == "exponential":
        WORKLOAD.clear()
        WORKLOAD.update({"output_len_mean": 4000.0, "output_len_shape": "exponential"})
        MAX_NEW = 16384
    sections = args.only or ["single", "two", "changing"]
    tokenizer = resolve_bundled("bundled:tokenizer/tiny-chatml")
    # Sections run on their own keep the others' results; each section says how it was run.
    results: dict[str, Any] = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    results.update({"pool": POOL, "queue_cap": QUEUE_CAP})
    results.pop("time_scale", None)
    runs: dict[str, Any] = results.setdefault("runs", {})
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-saturation-") as tmp:
        work = Path(tmp)
        dataset = work / "prompts.jsonl"
        write_dataset(dataset, 3000)
        timing = {"warmup": args.warmup, "measure": args.measure}
        fast = sim_config(tokenizer)
        slow = sim_config(tokenizer, step_base_s=0.154, step_per_request_s=0.00036, seed=1)
        if "single" in sections:
            points = [
                run_point(f"fixed {n}", [fast], str(n), dataset, work, **timing)
                for n in args.fixed
            ]
            points.append(run_point("auto", [fast], "auto", dataset, work, **timing))
            best = max(p.tok_s for p in points[:-1])
            auto = points[-1]
            print(table(points))
            print(
                f"\nauto / best fixed: {100 * auto.tok_s / best:.1f}% "
                "(target >= 97%, zero retractions, zero 503s, mean KV >= 85%)\n"
            )
            results["single"] = [asdict(p) for p in points]
        if "two" in sections:
            singles = {}
            for name, config in (("fast", fast), ("slow", slow)):
                for n in (16, 64):
                    point = run_point(f"{name} fixed {n}", [config], str(n), dataset, work, **timing)
                    singles.setdefault(name, []).append(point)
            both = run_point("two servers auto", [fast, slow], "auto", dataset, work, **timing)
            best_sum = sum(max(p.tok_s for p in points) for points in singles.values())
            print(table([*singles["fast"], *singles["slow"], both]))
            print(
                f"\nauto on both / sum of single-server bests: {100 * both.tok_s / best_sum:.1f}% "
                "(target >= 90%)\n"
            )
            results["two"] = {
                "singles": {k: [asdict(p) for p in v] for k, v in singles.items()},
                "auto": asdict(both),
                "best_sum": best_sum,
            }
        if "changing" in sections:
            grow = sim_config(tokenizer, output_len_mean=2000.0)
            points = [
                run_point(
                    label, [grow], concurrency, dataset, work,
                    change={"output_len_mean": 4000.0}, **timing,
                )  # fmt: skip
                for label, concurrency in (("changing fixed 64", "64"), ("changing auto", "auto"))
            ]
            print(table(points))
            results["changing"] = [asdict(p) for p in points]
    for section in sections:
        runs[section] = {
            "command": " ".join(["python", "benchmarks/bench_saturation.py", *sys.argv[1:]]),
            "time_scale": TIME_SCALE,
            "warmup_wall_s": args.warmup,
            "measure_wall_s": args.measure,
            "load_average_1min": [load_start, os.getloadavg()[0]],
        }
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
