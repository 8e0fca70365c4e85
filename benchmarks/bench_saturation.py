"""Saturation: fixed ``--concurrency`` against ``auto`` on the simulated capacity engine.

The simulated server runs SGLang's scheduler step by step (``simserver/capacity.py``): the
reference bf16 pool of 116,000 tokens, the reference step-time fit, admission with the decaying
``new_token_ratio``, retraction, ``--max-queued-requests 32`` (a launch profile's queue cap).
Time runs ``--time-scale`` times modelled time (0.03: a modelled second lasts 30 ms, a minute of
wall time is half an hour of the server's), and the client's controller timings are scaled the
same way. ``eagledata generate`` runs as its own process against it (the product path: dataset,
template, scheduler, controller, KV guard, writer), with ``[canary] enabled = false``: the
canary's baseline takes ~12 s of wall time (hours of modelled time) before the first request,
and its cost is ``bench_canary.py``'s to measure, not this benchmark's. Each point checks that
the client wrote records, so the numbers come from a run that produced data.

The workload: prompts of 700-6,600 tokens (the tiny tokenizer's ChatML template around 250-2,300
random words, ~2.85 tokens a word), ``max_new_tokens`` 8,192, and answers that stop on their own
at 3,000 tokens +- 50% (uniform): long thinking answers, about 20 of them in the pool at once. The
``tail`` section draws answers from an exponential distribution around 4,000 tokens instead
(``max_new_tokens`` 16,384): the long tail of real thinking answers, where a few run 4-5x the
mean. Answer lengths are a function of the prompt, so every point sees the same workload.

Each point runs a warm-up, then measures a window, both in modelled time from the server's own
clock: output tok/s, mean KV usage and running batch (time-weighted), the share of time spent in
prefill, retractions, 503s. Sections:

* ``single``: ``fixed 16/64/256/1024`` and ``auto`` on one server (``--repeat`` runs it again);
* ``tail``: the exponential workload, ``fixed 8/16/64`` and ``auto``;
* ``two``: two servers of unequal speed (the second's step time doubled): ``auto`` on both
  against the sum of each server's best fixed setting alone;
* ``changing``: answers grow from 2,000 to 4,000 tokens halfway through the window;
* ``job``: ``fixed 64``, ``fixed 1024`` and ``auto`` each run a whole job (the first 500
  prompts) to its end. A window holds only ~150 answers, and which ones fall in it differs
  between settings and runs (under 503 churn, whichever request retries first takes a freed
  queue slot), so one setting's window can hold shorter prompts than another's; the same
  setting measured twice differs by up to 5%. A makespan has no such choice.

    python benchmarks/bench_saturation.py --repeat 2      # every section, ~65 minutes on 2 cores
    python benchmarks/bench_saturation.py --only single --repeat 2
    python benchmarks/bench_saturation.py --only job --job-prompts 1500   # ~55 minutes

Prints markdown tables and writes ``benchmarks/results/saturation.json`` (``--results`` elsewhere);
``--keep DIR`` keeps every point's run directory, telemetry and log; ``--load KEY=VALUE`` sets a
``[load]`` setting for a controller experiment. Numbers and their reading: docs/throughput.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from eagledata.config import resolve_bundled
from eagledata.simserver import SimConfig, SimServerThread

RESULTS = Path(__file__).resolve().parent / "results" / "saturation.json"
POOL = 116_000
QUEUE_CAP = 32
WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "model",
    "token",
    "cache",
    "server",
    "drafter",
    "answer",
    "think",
    "prompt",
]


@dataclass(frozen=True)
class Workload:
    max_new_tokens: int = 8192
    answers: dict[str, Any] = field(
        default_factory=lambda: {"output_len_mean": 3000.0, "output_len_spread": 0.5}
    )


UNIFORM = Workload()
TAIL = Workload(16384, {"output_len_mean": 4000.0, "output_len_shape": "exponential"})
GROWING = Workload(8192, {"output_len_mean": 2000.0, "output_len_spread": 0.5})


@dataclass
class Point:
    label: str
    servers: int
    tok_s: float
    kv_usage: float
    running: float
    prefill_share: float
    retractions: int
    queue_full: int
    modelled_s: float


@dataclass
class Bench:
    tokenizer: str
    dataset: Path
    work: Path
    time_scale: float
    warmup: float
    measure: float
    load: dict[str, float] = field(default_factory=dict)
    """Extra ``[load]`` settings (``--load KEY=VALUE``), for experiments on the controller."""

    def server(self, workload: Workload, **overrides: Any) -> SimConfig:
        fields: dict[str, Any] = {
            "engine": "sglang",
            "tokenizer_path": self.tokenizer,
            "context_length": 32768,
            "max_total_num_tokens": POOL,
            "max_queued_requests": QUEUE_CAP,
            "time_scale": self.time_scale,
            "steps_per_tick": 8,
            "length_fraction": 0.0,
            **workload.answers,
        }
        fields.update(overrides)
        return SimConfig(**fields)

    def write_config(
        self, path: Path, urls: list[str], concurrency: str, run_dir: Path, max_new: int
    ) -> None:
        scale = self.time_scale
        limit = json.dumps(concurrency if concurrency == "auto" else int(concurrency))
        path.write_text(
            f"""
[tokenizer]
name = "bundled:tokenizer/tiny-chatml"

[generation]
max_new_tokens = {max_new}
temperature = 1.0

[server]
urls = {json.dumps(urls)}
guard_interval_s = 5
request_timeout_s = 600
backoff_base_s = {scale * 10}

[run]
out_dir = "{run_dir}"
concurrency = {limit}
shard_size = 1000
fsync_interval_s = 1.0

[canary]
enabled = false

[load]
poll_interval_s = {scale}
telemetry_interval_s = {10 * scale}
creep_every_s = {30 * scale}
freeze_s = {120 * scale}
"""
            + "".join(f"{key} = {value}\n" for key, value in self.load.items())
        )

    def slug(self, label: str) -> str:
        """A name for a point's files that no earlier point used: a repeated point in the same
        folder must start a new run, not resume the last one (which would skip the prompts it
        wrote and so measure other prompts)."""
        base = label.replace(" ", "-")
        slug, count = base, 1
        while (self.work / f"run-{slug}").exists():
            count += 1
            slug = f"{base}-{count}"
        return slug

    def job(self, label: str, config: SimConfig, concurrency: str, prompts: int) -> dict[str, Any]:
        """A whole job: the first ``prompts`` prompts, run to the end. Its makespan has no
        window to choose from: every answer, long prompt or short, is in it (and so are
        auto's learning at the start and the drain at the end)."""
        dataset = self.work / f"job-{prompts}.jsonl"
        with self.dataset.open() as source, dataset.open("w") as out:
            for _, line in zip(range(prompts), source, strict=False):
                out.write(line)
        sim = SimServerThread(config).start()
        slug = self.slug(label)
        run_dir = self.work / f"run-{slug}"
        self.write_config(self.work / f"{slug}.toml", [sim.url], concurrency, run_dir, 8192)
        cmd = [
            sys.executable, "-m", "eagledata.cli", "generate", "--config",
            str(self.work / f"{slug}.toml"), "--dataset", str(dataset), "--no-progress",
        ]  # fmt: skip
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
        with (self.work / f"{slug}.log").open("wb") as log:
            try:
                code = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
                end = engine_totals(sim)
            finally:
                sim.stop()
        written = count_records(run_dir)
        if code != 0 or written != prompts:
            raise RuntimeError(f"{label}: exit {code}, {written} of {prompts} records")
        result: dict[str, Any] = {
            "label": label,
            "prompts": prompts,
            "makespan_s": end["time"],
            "tok_s": end["decoded"] / end["time"],
            "kv_usage": end["usage_area"] / end["time"],
            "retractions": int(end["retracted"]),
            "queue_full": int(end["queue_full"]),
        }
        print(
            f"| {label} | {result['makespan_s']:,.0f} | {result['tok_s']:,.1f} | "
            f"{100 * result['kv_usage']:.1f}% | {result['retractions']} | "
            f"{result['queue_full']} |",
            flush=True,
        )
        return result

    def point(
        self,
        label: str,
        configs: list[SimConfig],
        concurrency: str,
        workload: Workload,
        change: dict[str, Any] | None = None,
    ) -> Point:
        """One client process against fresh servers: warm up, then measure a window."""
        sims = [SimServerThread(config).start() for config in configs]
        slug = self.slug(label)
        config_path = self.work / f"{slug}.toml"
        urls = [sim.url for sim in sims]
        self.write_config(
            config_path, urls, concurrency, self.work / f"run-{slug}", workload.max_new_tokens
        )
        cmd = [
            sys.executable, "-m", "eagledata.cli", "generate", "--config", str(config_path),
            "--dataset", str(self.dataset), "--no-progress",
        ]  # fmt: skip
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
        log = (self.work / f"{slug}.log").open("wb")
        client = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            wait_for_traffic(sims, client)
            time.sleep(self.warmup)
            start = [engine_totals(sim) for sim in sims]
            if change is not None:
                time.sleep(self.measure / 2)
                for sim in sims:
                    sim.control(**change)
                time.sleep(self.measure / 2)
            else:
                time.sleep(self.measure)
            end = [engine_totals(sim) for sim in sims]
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
        sums = dict.fromkeys(("tok_s", "usage", "running", "prefill", "retracted", "503"), 0.0)
        span = 0.0
        for a, b in zip(start, end, strict=True):
            modelled = b["time"] - a["time"]
            span = max(span, modelled)
            sums["tok_s"] += (b["decoded"] - a["decoded"]) / modelled
            sums["usage"] += (b["usage_area"] - a["usage_area"]) / modelled / len(sims)
            sums["running"] += (b["running_area"] - a["running_area"]) / modelled
            sums["prefill"] += (b["prefill_s"] - a["prefill_s"]) / modelled / len(sims)
            sums["retracted"] += b["retracted"] - a["retracted"]
            sums["503"] += b["queue_full"] - a["queue_full"]
        result = Point(
            label=label,
            servers=len(sims),
            tok_s=sums["tok_s"],
            kv_usage=sums["usage"],
            running=sums["running"],
            prefill_share=sums["prefill"],
            retractions=int(sums["retracted"]),
            queue_full=int(sums["503"]),
            modelled_s=span,
        )
        written = count_records(self.work / f"run-{slug}")
        if written == 0:
            raise RuntimeError(f"{label}: the client wrote no records (see {slug}.log)")
        print(row(result), flush=True)
        return result


def write_dataset(path: Path, rows: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    with path.open("w") as out:
        for index in range(rows):
            words = rng.randint(250, 2300)
            text = " ".join(rng.choice(WORDS) for _ in range(words))
            out.write(json.dumps({"id": f"p{index}", "prompt": text}) + "\n")


def count_records(run_dir: Path) -> int:
    """Records committed: sealed shards and the open journal (``run/writer.py``)."""
    paths = [*run_dir.glob("shards/*.jsonl"), *run_dir.glob("pending/*.jsonl")]
    return sum(sum(1 for _ in path.open("rb")) for path in paths)


def engine_totals(sim: SimServerThread) -> dict[str, float]:
    stats = sim.stats()
    totals = {"queue_full": float(stats["outcomes"].get("queue_full", 0)), "time": 0.0}
    names = {
        "decoded": "decoded_tokens",
        "usage_area": "usage_area",
        "running_area": "running_area",
        "prefill_s": "prefill_seconds",
        "retracted": "retracted_total",
    }
    for key, name in names.items():
        totals[key] = float(sum(rank[name] for rank in stats["engine"]))
    totals["time"] = max(rank["sim_time"] for rank in stats["engine"])
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


HEADER = (
    "| setting | output tok/s | mean KV usage | mean running | prefill | retractions | 503s |\n"
    "|---|---|---|---|---|---|---|"
)


def row(p: Point) -> str:
    return (
        f"| {p.label} | {p.tok_s:,.1f} | {100 * p.kv_usage:.1f}% | {p.running:.1f} | "
        f"{100 * p.prefill_share:.1f}% | {p.retractions} | {p.queue_full} |"
    )


def table(points: list[Point]) -> str:
    return "\n".join([HEADER, *(row(p) for p in points)])


def versus_fixed(points: list[Point]) -> str:
    fixed = [p for p in points if "auto" not in p.label]
    auto = next((p for p in points if "auto" in p.label), None)
    if not fixed or auto is None:
        return "(no auto / fixed comparison: this run measured only one kind)"
    best = max(fixed, key=_tok_s)
    return (
        f"auto / best fixed ({best.label}): {100 * auto.tok_s / best.tok_s:.1f}% "
        f"(target >= 97%, zero retractions, zero 503s, mean KV >= 85%)"
    )


def _tok_s(point: Point) -> float:
    return point.tok_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--warmup", type=float, default=20.0, help="wall seconds")
    parser.add_argument("--measure", type=float, default=60.0, help="wall seconds")
    parser.add_argument(
        "--only", choices=("single", "tail", "two", "changing", "job"), action="append"
    )
    parser.add_argument("--job-prompts", type=int, default=500, help="prompts of the job section")
    parser.add_argument("--fixed", type=int, nargs="*", default=[16, 64, 256, 1024])
    parser.add_argument("--repeat", type=int, default=1, help="runs of the single section")
    parser.add_argument(
        "--time-scale",
        type=float,
        default=0.03,
        help="wall seconds per modelled second; the client's poll and reaction delays, "
        "in modelled time, grow as it shrinks (a loaded machine makes them worse)",
    )
    parser.add_argument(
        "--job-settings",
        nargs="*",
        default=["fixed 64", "fixed 1024", "auto"],
        help="the settings of the job section ('fixed N' or 'auto')",
    )
    parser.add_argument(
        "--load",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an extra [load] setting for every point (a controller experiment; not for the "
        "docs' tables)",
    )
    parser.add_argument("--results", type=Path, default=RESULTS, help="the JSON file to update")
    parser.add_argument(
        "--keep",
        type=Path,
        help="run in this folder and keep it (each point's run directory, telemetry and log)",
    )
    args = parser.parse_args()
    sections = args.only or ["single", "tail", "two", "changing", "job"]
    # Sections run on their own keep the others' results; each section says how it was run.
    results_path: Path = args.results
    results: dict[str, Any] = json.loads(results_path.read_text()) if results_path.exists() else {}
    results.update({"pool": POOL, "queue_cap": QUEUE_CAP})
    runs: dict[str, Any] = results.setdefault("runs", {})
    load_start = os.getloadavg()[0]
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
    workdir = (
        contextlib.nullcontext(str(args.keep))
        if args.keep is not None
        else tempfile.TemporaryDirectory(prefix="bench-saturation-")
    )
    with workdir as tmp:
        bench = Bench(
            tokenizer=resolve_bundled("bundled:tokenizer/tiny-chatml"),
            dataset=Path(tmp) / "prompts.jsonl",
            work=Path(tmp),
            time_scale=args.time_scale,
            warmup=args.warmup,
            measure=args.measure,
            load={k: float(v) for k, v in (item.split("=", 1) for item in args.load)},
        )
        write_dataset(bench.dataset, 3000)
        fast = bench.server(UNIFORM)
        slow = bench.server(UNIFORM, step_base_s=0.154, step_per_request_s=0.00036, seed=1)
        if "single" in sections:
            repeats = []
            for attempt in range(args.repeat):
                print(f"\n## single server, run {attempt + 1}\n\n{HEADER}", flush=True)
                points = [bench.point(f"fixed {n}", [fast], str(n), UNIFORM) for n in args.fixed]
                points.append(bench.point("auto", [fast], "auto", UNIFORM))
                print(f"\n{versus_fixed(points)}\n")
                repeats.append([asdict(p) for p in points])
            results["single"] = repeats
        if "tail" in sections:
            print(f"\n## exponential answers\n\n{HEADER}", flush=True)
            heavy = bench.server(TAIL)
            points = [bench.point(f"tail fixed {n}", [heavy], str(n), TAIL) for n in (8, 16, 64)]
            points.append(bench.point("tail auto", [heavy], "auto", TAIL))
            print(f"\n{versus_fixed(points)}\n")
            results["tail"] = [asdict(p) for p in points]
        if "two" in sections:
            print(f"\n## two servers of unequal speed\n\n{HEADER}", flush=True)
            singles: dict[str, list[Point]] = {}
            for name, config in (("fast", fast), ("slow", slow)):
                for n in (16, 64):
                    point = bench.point(f"{name} fixed {n}", [config], str(n), UNIFORM)
                    singles.setdefault(name, []).append(point)
            both = bench.point("two servers auto", [fast, slow], "auto", UNIFORM)
            best_sum = sum(max(p.tok_s for p in points) for points in singles.values())
            print(
                f"\nauto on both / sum of single-server bests: {100 * both.tok_s / best_sum:.1f}% "
                "(target >= 90%)\n"
            )
            results["two"] = {
                "singles": {k: [asdict(p) for p in v] for k, v in singles.items()},
                "auto": asdict(both),
                "best_sum": best_sum,
            }
        if "job" in sections:
            print(
                f"\n## a whole job of {args.job_prompts} prompts\n\n"
                "| setting | makespan (modelled s) | output tok/s | mean KV usage | "
                "retractions | 503s |\n|---|---|---|---|---|---|",
                flush=True,
            )
            # keyed by size, so a longer job measured on its own keeps the default one's points
            key = "job" if args.job_prompts == 500 else f"job-{args.job_prompts}"
            results[key] = [
                bench.job(f"job {limit}", fast, limit.split()[-1], args.job_prompts)
                for limit in args.job_settings
            ]
        if "changing" in sections:
            print(f"\n## answers grow from 2,000 to 4,000 tokens halfway\n\n{HEADER}", flush=True)
            grow = bench.server(GROWING)
            points = [
                bench.point(label, [grow], limit, GROWING, change={"output_len_mean": 4000.0})
                for label, limit in (("changing fixed 64", "64"), ("changing auto", "auto"))
            ]
            results["changing"] = [asdict(p) for p in points]
    for section in sections:
        if section == "job" and args.job_prompts != 500:
            section = f"job-{args.job_prompts}"
        runs[section] = {
            "command": " ".join(["python", "benchmarks/bench_saturation.py", *sys.argv[1:]]),
            "time_scale": args.time_scale,
            "warmup_wall_s": args.warmup,
            "measure_wall_s": args.measure,
            "load_average_1min": [load_start, os.getloadavg()[0]],
            "load_settings": bench.load,
            "commit": commit,
        }
    results_path.parent.mkdir(parents=True, exist_ok=True)
    results_path.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
