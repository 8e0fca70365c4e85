"""``--concurrency auto`` against fixed 32, 128 and 1024 over a matrix of workloads, whole jobs,
each at two time scales, on the second SGLang scheduler model (``engine="sglang-loop"``).

The first model (``simserver/capacity.py``) is the one the controller was tuned on; this one
(``simserver/sglang_loop.py``) was written again from SGLang's source, with a step-time fit of
its own. Every point is one ``eagledata generate`` process with the client's **default**
``[load]`` settings (a 1 s poll), as a new user would run it, against simulated servers in this
process. The time scale (wall seconds per modelled second) changes only the server: at the
faster scale the same poll sees twice as much happen between two samples. A controller whose
result depends on it is bound to its poll.

Shapes (``--shapes``):

* ``fast``: short answers on a fast server: prompts of 100-500 tokens, answers of 250 tokens
  +-30% (``max_new_tokens`` 330), a 36,000-token pool; 30-80 answers end per wall second.
* ``queue-cap``: the same with ``--max-queued-requests 64`` and the canary on (its start-up
  burst: 24 references, their scorings and probes, before and beside the first requests).
* ``reference``: the reference job's shape: prompts of 700-6,600 tokens, answers of 3,000
  tokens +-50% (``max_new_tokens`` 8,192), the 116,000-token pool; ~20 requests fill it.
* ``two``: two servers of the ``fast`` shape, the second at half speed: each fixed setting on
  each server alone, then ``auto`` on both, against the sum of the single-server bests.
* ``growing``: answers of 400 tokens +-30% for the first half of the dataset and of 800 for
  the second half (``max_new_tokens`` 1,024, a 36,000-token pool). The growth belongs to the
  work item (the second half's prompts end in a marker word the simulated server knows,
  ``output_len_long_token``), not to when its request arrives: every setting faces the same
  job, however early it sends the second half.
* ``restart``: the ``growing`` shape's first half; then the server restarts (its process goes,
  connections are cut, it comes back on the same port a modelled 20 s later) with a pool of
  24,000 tokens instead of 36,000.

Per point, in modelled time from the servers' own clocks: output tok/s of the run's records
over the makespan, mean KV usage while work remains (from the first request to the last
first admission: the drain, which no setting can fill, is left out), retractions, 503s (a
refused arrival, or a retracted request refused by a full queue), and the most requests the
server held at once (``max in flight``: what the client had there, canary included).

    python benchmarks/bench_matrix.py           # every shape at both scales (~47 min, 2 cores)
    python benchmarks/bench_matrix.py --quick         # fast, queue-cap, two at one scale
    python benchmarks/bench_matrix.py --shapes fast --scales 0.1 --merge
    python benchmarks/bench_matrix.py --shapes fast --client-src ../main/src --results before.json

Prints a markdown table per shape and writes ``benchmarks/results/matrix.json``; ``--merge``
replaces only the shapes and scales it ran there, each point stamped with the commit of its
client. ``--client-src`` runs the client (``eagledata generate``) from another source tree
against the same simulated servers: an A/B of two commits' clients on one simulator. The
numbers and their reading: docs/throughput.md (A second scheduler model, and a matrix of
workloads).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from eagledata.config import resolve_bundled
from eagledata.simserver import SimConfig, SimServerThread

RESULTS = Path(__file__).resolve().parent / "results" / "matrix.json"
WORDS = ["alpha", "beta", "gamma", "delta", "model", "token", "cache", "server", "think"]
SETTINGS = ("fixed 32", "fixed 128", "fixed 1024", "auto")


@dataclass(frozen=True)
class Shape:
    name: str
    prompts: int
    words: tuple[int, int]
    """Prompt length in words (~2.9 tokens each with the bundled tokenizer's template)."""
    max_new_tokens: int
    server: dict[str, Any]
    scales: tuple[float, float]
    canary: bool = False
    grow_to: float | None = None
    """Answers' mean for the second half of the dataset (``growing``)."""
    restart_pool: int | None = None
    """The pool the server restarts with halfway through the job (``restart``)."""
    slow_second: bool = False
    """Two servers, the second at half speed (``two``)."""


SHORT = {"output_len_mean": 250.0, "output_len_spread": 0.3, "max_total_num_tokens": 36_000}
MEDIUM = {"output_len_mean": 400.0, "output_len_spread": 0.3, "max_total_num_tokens": 36_000}
SHAPES = {
    "fast": Shape("fast", 1200, (35, 170), 330, SHORT, (0.1, 0.05)),
    "queue-cap": Shape(
        "queue-cap", 1200, (35, 170), 330, {**SHORT, "max_queued_requests": 64}, (0.1, 0.05),
        canary=True,
    ),
    "reference": Shape(
        "reference", 600, (250, 2300), 8192,
        {"output_len_mean": 3000.0, "output_len_spread": 0.5, "max_total_num_tokens": 116_000},
        (0.01, 0.005),
    ),
    "two": Shape("two", 800, (35, 170), 330, SHORT, (0.1, 0.05), slow_second=True),
    "growing": Shape("growing", 600, (35, 170), 1024, MEDIUM, (0.1, 0.05), grow_to=800.0),
    "restart": Shape("restart", 600, (35, 170), 1024, MEDIUM, (0.1, 0.05), restart_pool=24_000),
}  # fmt: skip
QUICK = ("fast", "queue-cap", "two")


@dataclass
class Job:
    """One ``eagledata generate`` process and the servers it ran against."""

    shape: Shape
    scale: float
    setting: str
    work: Path
    tokenizer: str
    label: str = ""
    long_token: int | None = None
    """The token id that marks the prompts of the grown answers (``growing``)."""
    client_src: Path | None = None
    """Run the client from this source tree (``--client-src``), not this one."""
    load: dict[str, str] = field(default_factory=dict)
    """Extra ``[load]`` settings (``--load``): an experiment, not the matrix's numbers."""
    seed: int = 0
    """Added to the servers' seeds (``--seed``): other answer lengths and tokens for the same
    shape. Without it every run of a shape answers each prompt alike."""
    engines: list[dict[str, float]] = field(default_factory=list)
    outcomes: dict[str, int] = field(default_factory=dict)
    max_in_flight: list[int] = field(default_factory=list)

    def server_config(self, *, slow: bool = False, seed: int = 0, **extra: Any) -> SimConfig:
        fields: dict[str, Any] = {
            "engine": "sglang-loop",
            "tokenizer_path": self.tokenizer,
            "context_length": 32768,
            "time_scale": self.scale,
            "length_fraction": 0.0,
            "seed": seed + self.seed,
            **self.shape.server,
            **extra,
        }
        if self.shape.grow_to is not None:
            fields["output_len_long_token"] = self.long_token
            fields["output_len_long_mean"] = self.shape.grow_to
        if slow:
            fields["sglang_loop"] = {"slowdown": 2.0}
        return SimConfig(**fields)

    def write_config(self, path: Path, urls: list[str], run_dir: Path) -> None:
        concurrency = "auto" if self.setting == "auto" else int(self.setting.split()[-1])
        path.write_text(
            f"""
[tokenizer]
name = "bundled:tokenizer/tiny-chatml"

[generation]
max_new_tokens = {self.shape.max_new_tokens}
temperature = 1.0

[server]
urls = {json.dumps(urls)}

[run]
out_dir = "{run_dir}"
concurrency = {json.dumps(concurrency)}
shard_size = 1000

[canary]
enabled = {"true" if self.shape.canary else "false"}

[load]
"""
            + "".join(f"{key} = {value}\n" for key, value in self.load.items())
        )

    def run(self, dataset: Path, configs: list[SimConfig]) -> dict[str, Any]:
        slug = f"{self.shape.name}-{self.scale}-{self.label or self.setting}".replace(" ", "-")
        while (self.work / f"run-{slug}").exists():  # a point again: a new run, not a resume
            slug += "+"
        run_dir = self.work / f"run-{slug}"
        config_path = self.work / f"{slug}.toml"
        sims = [SimServerThread(config).start() for config in configs]
        self.write_config(config_path, [sim.url for sim in sims], run_dir)
        cmd = [
            sys.executable, "-m", "eagledata.cli", "generate", "--config", str(config_path),
            "--dataset", str(dataset), "--no-progress",
        ]  # fmt: skip
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
        if self.client_src is not None:
            env["PYTHONPATH"] = str(self.client_src)
        started = time.monotonic()
        with (self.work / f"{slug}.log").open("wb") as log:
            client = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
            try:
                sims = self._watch(client, sims)
                code = client.wait()
                for sim in sims:
                    self._collect(sim)
            finally:
                if client.poll() is None:
                    client.kill()
                for sim in sims:
                    sim.stop()
        tokens, written = output_tokens(run_dir)
        if code != 0 or written != self.shape.prompts:
            raise RuntimeError(f"{slug}: exit {code}, {written} of {self.shape.prompts} records")
        return self._result(tokens, time.monotonic() - started)

    def _watch(self, client: subprocess.Popen[bytes], sims: list[SimServerThread]) -> list[Any]:
        """Halfway through the job (by answers), restart the server (``restart``)."""
        shape = self.shape
        if shape.restart_pool is None:
            return sims
        half = shape.prompts // 2
        while client.poll() is None:
            if sum(sim.stats()["outcomes"].get("ok", 0) for sim in sims) >= half:
                break
            time.sleep(0.1)
        else:
            return sims
        old = sims[0]
        self._collect(old)
        port = old.port
        old.stop()
        time.sleep(20 * self.scale)  # down a modelled 20 s (it reloads its weights)
        config = self.server_config(max_total_num_tokens=shape.restart_pool)
        return [SimServerThread(config, port=port).start()]

    def _collect(self, sim: SimServerThread) -> None:
        stats = sim.stats()
        for name, count in stats["outcomes"].items():
            self.outcomes[name] = self.outcomes.get(name, 0) + int(count)
        self.engines.extend(stats["engine"])
        self.max_in_flight.append(int(stats["max_in_flight"]))

    def _result(self, tokens: int, wall_s: float) -> dict[str, Any]:
        engines = self.engines
        if self.shape.slow_second and len(engines) == 2:
            makespan = max(e["sim_time"] for e in engines)  # two servers side by side
            fill = [e["fill_usage_area"] / max(e["fill_time"], 1e-9) for e in engines]
            usage = sum(fill) / len(fill)
        else:  # one server (one after the other, on a restart)
            makespan = sum(e["sim_time"] for e in engines)
            usage = sum(e["fill_usage_area"] for e in engines) / max(
                1e-9, sum(e["fill_time"] for e in engines)
            )
        return {
            "shape": self.shape.name,
            "scale": self.scale,
            "setting": self.label or self.setting,
            "makespan_s": round(makespan, 1),
            "tok_s": round(tokens / makespan, 1),
            "kv_usage": round(usage, 4),
            "retractions": int(sum(e["retracted_total"] for e in engines)),
            "queue_full": self.outcomes.get("queue_full", 0)
            + self.outcomes.get("queue_full_retracted", 0),
            "max_in_flight": max(self.max_in_flight, default=0),
            "wall_s": round(wall_s, 1),
        }


def write_dataset(
    path: Path, rows: int, words: tuple[int, int], seed: int = 0, *, marked_from: int | None = None
) -> list[str]:
    """The job's prompts; those from row ``marked_from`` on end in ``MARKER``. Returns them."""
    rng = random.Random(seed)
    texts = []
    with path.open("w") as out:
        for index in range(rows):
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(*words)))
            if marked_from is not None and index >= marked_from:
                text += f" {MARKER}"
            texts.append(text)
            out.write(json.dumps({"id": f"p{index}", "prompt": text}) + "\n")
    return texts


MARKER = "grow"
"""The word that ends the prompts of ``growing``'s second half."""


def marker_token(tokenizer_dir: str, texts: list[str], marked_from: int) -> int:
    """A token id that every marked prompt holds and no unmarked one (nor the chat template's
    own text) does: what the simulated server keys the grown answers on."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json"))
    template = ["<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n"]
    unmarked: set[int] = set()
    for text in [*texts[:marked_from], *template]:
        unmarked.update(tokenizer.encode(text).ids)
    common: set[int] | None = None
    for text in texts[marked_from:]:
        ids = set(tokenizer.encode(text).ids)
        common = ids if common is None else common & ids
    candidates = sorted((common or set()) - unmarked)
    if not candidates:
        raise RuntimeError(f"no token of {MARKER!r} marks the second half only: pick another")
    return candidates[0]


def output_tokens(run_dir: Path) -> tuple[int, int]:
    """(output tokens, records) of a finished run: its sealed shards and open journal."""
    tokens = records = 0
    for path in [*run_dir.glob("shards/*.jsonl"), *run_dir.glob("pending/*.jsonl")]:
        for line in path.read_bytes().splitlines():
            tokens += int(orjson.loads(line)["completion_tokens"])
            records += 1
    return tokens, records


def run_shape(
    shape: Shape,
    scale: float,
    work: Path,
    tokenizer: str,
    settings: tuple[str, ...] = SETTINGS,
    load: dict[str, str] | None = None,
    client_src: Path | None = None,
    seed: int = 0,
) -> list[dict[str, Any]]:
    dataset = work / f"{shape.name}.jsonl"
    half = shape.prompts // 2 if shape.grow_to is not None else None
    texts = write_dataset(dataset, shape.prompts, shape.words, seed, marked_from=half)
    long_token = None if half is None else marker_token(tokenizer, texts, half)
    results = []
    print(f"\n### {shape.name}, time scale {scale}\n", flush=True)
    print(HEADER, flush=True)

    def job(setting: str, label: str = "") -> Job:
        return Job(
            shape, scale, setting, work, tokenizer, label=label, long_token=long_token,
            client_src=client_src, load=load or {}, seed=seed,
        )  # fmt: skip

    if shape.slow_second:
        for which, slow in (("fast", False), ("slow", True)):
            for setting in [s for s in settings if s != "auto"]:
                one = job(setting, f"{which} alone {setting}")
                results.append(one.run(dataset, [one.server_config(slow=slow, seed=int(slow))]))
                print(row(results[-1]), flush=True)
        both = job("auto", "auto on both")
        configs = [both.server_config(), both.server_config(slow=True, seed=1)]
        results.append(both.run(dataset, configs))
        print(row(results[-1]), flush=True)
        return results
    for setting in settings:
        one = job(setting)
        results.append(one.run(dataset, [one.server_config()]))
        print(row(results[-1]), flush=True)
    return results


HEADER = (
    "| setting | makespan (modelled s) | output tok/s | mean KV usage while work remains | "
    "retractions | 503s | max in flight | wall s |\n|---|---|---|---|---|---|---|---|"
)


def row(r: dict[str, Any]) -> str:
    return (
        f"| {r['setting']} | {r['makespan_s']:,.0f} | {r['tok_s']:,.1f} | "
        f"{100 * r['kv_usage']:.1f}% | {r['retractions']:,} | {r['queue_full']:,} | "
        f"{r['max_in_flight']:,} | {r['wall_s']:.0f} |"
    )


def verdict(shape: str, scale: float, results: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's targets for one shape at one scale."""
    points = [r for r in results if r["shape"] == shape and r["scale"] == scale]
    if shape == "two":
        best = {
            which: max((r for r in points if r["setting"].startswith(which)), key=_tok_s)
            for which in ("fast", "slow")
        }
        auto = next(r for r in points if r["setting"] == "auto on both")
        total = sum(r["tok_s"] for r in best.values())
        retractions = sum(r["retractions"] for r in best.values())
        return {
            "shape": shape,
            "scale": scale,
            "best": " + ".join(r["setting"] for r in best.values()),
            "ratio": round(auto["tok_s"] / total, 4),
            "target_ratio": 0.9,
            "retractions": auto["retractions"],
            "best_retractions": retractions,
            "queue_full": auto["queue_full"],
            "kv_usage": auto["kv_usage"],
            "kv_1024": None,
        }
    fixed = [r for r in points if r["setting"] != "auto"]
    auto = next(r for r in points if r["setting"] == "auto")
    best = max(fixed, key=_tok_s)
    widest = next(r for r in fixed if r["setting"] == "fixed 1024")
    return {
        "shape": shape,
        "scale": scale,
        "best": best["setting"],
        "ratio": round(auto["tok_s"] / best["tok_s"], 4),
        "target_ratio": 0.95,
        "retractions": auto["retractions"],
        "best_retractions": best["retractions"],
        "queue_full": auto["queue_full"],
        "kv_usage": auto["kv_usage"],
        "kv_1024": widest["kv_usage"],
    }


def _tok_s(point: dict[str, Any]) -> float:
    return float(point["tok_s"])


def summary_row(v: dict[str, Any]) -> str:
    retraction_ok = v["retractions"] <= v["best_retractions"] / 10
    kv = f"{100 * v['kv_usage']:.1f}%"
    if v["kv_1024"] is not None:
        kv += f" ({100 * v['kv_usage'] / max(v['kv_1024'], 1e-9):.0f}% of 1024's)"
    return (
        f"| {v['shape']} | {v['scale']} | {v['best']} | **{100 * v['ratio']:.1f}%** "
        f"(>= {100 * v['target_ratio']:.0f}%) | {v['retractions']} vs {v['best_retractions']} "
        f"({'ok' if retraction_ok else 'over'}) | {v['queue_full']} | {kv} |"
    )


SUMMARY_HEADER = (
    "| shape | time scale | best fixed | auto / best | auto's retractions vs best's | "
    "auto's 503s | auto's mean KV usage |\n|---|---|---|---|---|---|---|"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", nargs="+", choices=tuple(SHAPES), default=None)
    parser.add_argument("--scales", nargs="+", type=float, help="instead of each shape's two")
    parser.add_argument("--quick", action="store_true", help="fast, queue-cap, two; one scale")
    parser.add_argument(
        "--settings", nargs="+", choices=SETTINGS, help="only these (no verdict: an experiment)"
    )
    parser.add_argument(
        "--load", action="append", default=[], metavar="KEY=VALUE", help="a [load] setting"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="other prompts and answer lengths (independent jobs)"
    )
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--keep", type=Path, help="run in this folder and keep it")
    parser.add_argument(
        "--merge", action="store_true", help="replace only the shapes and scales run in --results"
    )
    parser.add_argument(
        "--client-src", type=Path, help="run the client from this source tree (an A/B)"
    )
    args = parser.parse_args()
    names = args.shapes or (list(QUICK) if args.quick else list(SHAPES))
    tokenizer = resolve_bundled("bundled:tokenizer/tiny-chatml")
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    load_average = [os.getloadavg()[0]]
    results: list[dict[str, Any]] = []
    verdicts: list[dict[str, Any]] = []
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
    work_dir = args.keep or Path(tempfile.mkdtemp(prefix="bench-matrix-"))
    stop_sampling = threading.Event()

    def sample_load() -> None:
        while not stop_sampling.wait(30):
            load_average.append(os.getloadavg()[0])

    threading.Thread(target=sample_load, daemon=True).start()
    started = time.monotonic()
    for name in names:
        shape = SHAPES[name]
        scales = args.scales or (shape.scales[:1] if args.quick else shape.scales)
        for scale in scales:
            chosen = tuple(args.settings or SETTINGS)
            load = dict(item.split("=", 1) for item in args.load)
            shape_results = run_shape(
                shape, scale, work_dir, tokenizer, chosen, load, args.client_src, args.seed
            )
            results.extend(shape_results)
            if args.settings is None:
                verdicts.append(verdict(name, scale, shape_results))
    stop_sampling.set()
    print(f"\n### Against the targets\n\n{SUMMARY_HEADER}")
    for v in verdicts:
        print(summary_row(v))
    client = str(args.client_src) if args.client_src is not None else commit
    run = {
        "command": " ".join(["python", "benchmarks/bench_matrix.py", *sys.argv[1:]]),
        "commit": commit,
        "client": client,
        "wall_s": round(time.monotonic() - started),
        "load_average_1min": [round(x, 2) for x in load_average],
    }
    for point in [*results, *verdicts]:
        point["client"] = client
    out = {"runs": [run], "points": results, "verdicts": verdicts}
    if args.merge and args.results.exists():
        out = merged(json.loads(args.results.read_text()), out)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(out, indent=2) + "\n")


def merged(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """``old`` with the shapes and scales of ``new`` replaced by its points (``--merge``)."""
    runs = old.get("runs")
    if runs is None:  # a file from one run: its fields were at the top
        top = {key: old[key] for key in ("command", "commit", "wall_s", "load_average_1min")}
        runs = [{**top, "client": old["commit"]}]
        for point in [*old["points"], *old["verdicts"]]:
            point.setdefault("client", old["commit"])
    done = {(p["shape"], p["scale"]) for p in new["points"]}
    return {
        "runs": [*runs, *new["runs"]],
        **{
            key: [p for p in old[key] if (p["shape"], p["scale"]) not in done] + new[key]
            for key in ("points", "verdicts")
        },
    }


if __name__ == "__main__":
    main()
