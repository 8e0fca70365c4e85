"""``--concurrency auto`` against fixed settings on the **real** SGLang 0.5.23 scheduler on CPU.

The simulator's matrix (``bench_matrix.py``) judges the controller on scheduler models; this
one runs the same comparison against SGLang's own scheduler (real admission, chunked prefill,
``new_token_ratio``, retraction, ``/v1/loads``), serving the bundled trained model
(``bundled:model/tiny-llama-chatml``) on this machine's CPU, from the venv
``scripts/sglang_cpu_env.py`` builds. The KV pool is kept small (``--max-total-tokens``) so
that it binds: the model is tiny, so the pool, not the step time, decides how many requests
decode at once.

Shapes (``--shapes``), each a job of its own prompts (a sample question after 2-12 random
words: unique, so no prefix-cache hit beyond the chat template), sized so that on a quiet
machine a point lasts ~30-60 s and the pool binds (a 4,096-token pool that 17-30 running
requests fill to 0.6-0.85, measured; SGLang's ``new_token_ratio`` decays over ~600 decode steps,
which 30 prompts never reached):

* ``mixed``: 600 prompts, answers of mixed lengths that stop on their own (the trained model
  ends its answers: 3 to 256 tokens here, mean ~77, median ~40, a few cut at 256), prompts of
  20-90 tokens, ``max_new_tokens`` 256. Fixed 16, 64 and 256 around the best (at 4,096 tokens
  SGLang runs 17-30 at once; the rest waits in its queue), and ``auto``.
* ``queue-cap``: the same with ``--max-queued-requests 16``: fixed 64 holds more than the
  server runs plus 16 and gets 503s; ``auto`` reads the cap from ``/server_info``. Fixed 16
  and 64 (256 would only add 503s), and ``auto``.
* ``growing``: 500 prompts whose answers grow over the job: the first half asks the sample
  questions the model answers shortest (means of 63-72 tokens, medians 35-56, measured), the
  second half those it answers longest (means 120-141, medians 98-117, a few cut at
  ``max_new_tokens`` 320). The answers still stop
  on their own (no ``ignore_eos``: SGLang reserves the whole ``max_new_tokens`` of such a
  request, which never retracts), so the growth is real on the server: what the length model
  learned from the first half is wrong for the second.
* ``conservativeness`` (not in the default run): ``mixed`` on a server launched with
  ``--schedule-conservativeness 0.3``: SGLang's own admission reserves less of each request's
  ``max_new_tokens``, so it runs more of what it holds: the server-side lever, beside the
  client's.
* ``two``: 300 prompts, two servers on the same 2 cores, the second with
  ``--max-running-requests 8`` (its batch, not its step, is capped: at most 8 decode at once
  against the first one's 17-30, so it serves fewer tok/s at any load). Fixed 16 and 64 on
  each server alone, then on both (``--concurrency N`` bounds the requests in flight over
  both), then ``auto`` on both. "Alone" still shares the CPU with the other, idle server
  (``--sleep-on-idle``), and the two share the cores when both run: the sum of the single
  bests is an upper bound no client reaches on one CPU, so the best fixed setting on both
  servers is given beside it.

``--prompts``, ``--max-new-tokens`` and ``--pool`` resize every shape run (a quick look);
``--settings`` replaces each shape's own.

Every point is one ``eagledata generate --model DIR --server URL`` process, canary off, with
the client's default ``[load]`` settings. Settings are interleaved within a job (the machine is
shared: the server's own speed changes with the load, so only points of one job compare), the
prefix cache is flushed before each point (``/flush_cache``), and each job is its own prompts
(``--seed``). Per point: output tok/s from the first request sent to the last answer (from the
records: ``created_at`` less ``e2e_latency``; the client's start-up is left out), retractions
(the server's own log lines in the point: its ``/metrics`` counter lags), 503s (the server's
access log; the client's own count, its telemetry's ``queue_full``, beside), errors (failed
records, exit code), and the 1-minute load average at the start and the end.

    python benchmarks/bench_real.py --jobs 3     # mixed, queue-cap, growing, two: ~40 min
    python benchmarks/bench_real.py --shapes two --jobs 1 --merge
    python benchmarks/bench_real.py --shapes mixed --settings "fixed 16" auto --keep /tmp/r
    python benchmarks/bench_real.py --table        # the tables of benchmarks/results/real.json

Prints a markdown table per job, and at the end each shape against the targets; writes
``benchmarks/results/real.json`` after every point (a session cut short keeps what it
measured): the points, and per shape the targets' verdicts over its complete jobs and what a
retraction cost (``retraction_cost``). The numbers and their reading: docs/throughput.md
(Against the real scheduler).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parents[1]
MODEL = REPO / "src" / "eagledata" / "assets" / "model" / "tiny-llama-chatml"
SAMPLES = REPO / "src" / "eagledata" / "assets" / "samples" / "prompts.jsonl"
RESULTS = Path(__file__).resolve().parent / "results" / "real.json"
WORDS = ["alpha", "beta", "gamma", "delta", "model", "token", "cache", "server", "river", "cat"]


@dataclass(frozen=True)
class Shape:
    name: str
    prompts: int
    max_new_tokens: int
    pool: int
    settings: tuple[str, ...] = ("fixed 16", "fixed 64", "fixed 256", "auto")
    """What runs in each job (``--settings`` replaces it): fixed ones around the best, and
    ``auto``."""
    flags: tuple[str, ...] = ()
    second_flags: tuple[str, ...] | None = None
    """Two servers: the second one's own flags (``two``)."""
    growing: bool = False
    """The second half of the prompts asks the questions the model answers at length."""


SHAPES = {
    "mixed": Shape("mixed", 600, 256, 4096),
    "queue-cap": Shape(
        "queue-cap", 600, 256, 4096, ("fixed 16", "fixed 64", "auto"),
        ("--max-queued-requests", "16"),
    ),
    "growing": Shape("growing", 500, 320, 4096, growing=True),
    "conservativeness": Shape(
        "conservativeness", 600, 256, 4096, flags=("--schedule-conservativeness", "0.3")
    ),
    "two": Shape(
        "two", 300, 256, 4096, ("fixed 16", "fixed 64", "auto"),
        second_flags=("--max-running-requests", "8"),
    ),
}  # fmt: skip
SETTINGS = SHAPES["mixed"].settings

SHORT_ANSWERS = (
    "Write a Python function that checks whether a string is a palindrome.",
    "List five fruits that are red.",
    "Describe the water cycle for a ten-year-old.",
    "Write a limerick about a cat who learns to code.",
    "Why do cats purr?",
    "What are the main causes of inflation?",
    "What is the tallest mountain in the world?",
    "How many seconds are there in a leap year?",
)
"""The sample questions the bundled model answers shortest (median 25-44 tokens, measured over
1,200 answers of the ``mixed`` shape): the first half of ``growing``."""
LONG_ANSWERS = (
    "Write a short story that begins with: 'The lighthouse went dark at midnight.'",
    "שאלה בעברית: כמה ימים יש בשבוע?",
    "What is the derivative of x^3 + 2x?",
    "ما هو أطول نهر في العالم؟",
    "한국의 전통 음식 세 가지를 알려주세요.",
)
"""The ones it answers longest (median 88-158 tokens, a quarter of them cut at 256): the
second half of ``growing``."""


def load_env() -> Any:
    """``scripts/sglang_cpu_env.py`` (the venv and the ``Server`` class) as a module."""
    spec = importlib.util.spec_from_file_location(
        "sglang_cpu_env", REPO / "scripts" / "sglang_cpu_env.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["sglang_cpu_env"] = module
    spec.loader.exec_module(module)
    return module


def write_dataset(path: Path, rows: int, seed: int, *, growing: bool = False) -> None:
    """Unique prompts: a bundled sample question with a few random words before it (the model
    answers each one at its own length; unique, so no prefix-cache hit beyond the template).
    ``growing``: the first half asks the questions answered shortest, the second half those
    answered longest (the answers grow over the job, and stop on their own)."""
    questions = [json.loads(line)["prompt"] for line in SAMPLES.read_text().splitlines()]
    assert set(SHORT_ANSWERS + LONG_ANSWERS) <= set(questions), "the bundled samples changed"
    rng = random.Random(seed)
    with path.open("w") as out:
        for index in range(rows):
            if growing:
                questions = list(SHORT_ANSWERS if index < rows // 2 else LONG_ANSWERS)
            lead = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 12)))
            text = f"{lead} {index}. {rng.choice(questions)}"
            out.write(json.dumps({"id": f"p{index}", "prompt": text}) + "\n")


def http(url: str, data: bytes | None = None, timeout: float = 60.0) -> bytes:
    request = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        return bytes(answer.read())


COUNTERS = ("requests", "input_tokens", "output_tokens")


def retracted(url: str) -> dict[str, int]:
    """The server's retraction counters: requests, and the prompt and output tokens whose KV
    was freed (each re-prefilled when its request comes back). Absent before the first: 0."""
    text = http(f"{url}/metrics").decode()
    counts = {}
    for name in COUNTERS:
        pattern = rf"^sglang:num_retracted_{name}_total(?:\{{[^}}]*\}})? ([0-9.e+]+)$"
        match = re.search(pattern, text, re.M)
        counts[name] = int(float(match.group(1))) if match else 0
    # the scheduler's own CPU time: what the point cost the server whatever else the machine
    # ran (its wall-clock speed moves with the load; its CPU time per step does not, much)
    match = re.search(
        r"^sglang:scheduler_process_cpu_seconds_total(?:\{[^}]*\})? ([0-9.e+]+)$", text, re.M
    )
    counts["cpu_ms"] = int(1000 * float(match.group(1))) if match else 0
    return counts


def flush(url: str) -> None:
    http(f"{url}/flush_cache", data=b"")


def refused(consoles: list[Path], offsets: list[int]) -> int:
    """503s the servers answered to ``/generate`` since ``offsets`` (their access log, in the
    console): the ground truth, whatever the client counted (under a fixed ``--concurrency``
    its telemetry has no lane state to count them in)."""
    count = 0
    for console, offset in zip(consoles, offsets, strict=True):
        with console.open("rb") as log:
            log.seek(offset)
            count += log.read().count(b'/generate HTTP/1.1" 503')
    return count


RETRACTED_IN_LOG = re.compile(rb"Retract requests\. #retracted_reqs: (\d+)")


def retracted_in_log(consoles: list[Path], offsets: list[int]) -> int:
    """Retractions the servers logged since ``offsets`` (SGLang's scheduler logs each one:
    "KV cache pool is full. Retract requests. #retracted_reqs: N"). The ground truth: the
    ``/metrics`` counter lags the scheduler (read right after a point it can still miss a
    retraction of that point, which then shows up in the next one's reading) and came out
    lower after a point than before it."""
    count = 0
    for console, offset in zip(consoles, offsets, strict=True):
        with console.open("rb") as log:
            log.seek(offset)
            count += sum(int(n) for n in RETRACTED_IN_LOG.findall(log.read()))
    return count


def run_point(
    started: list[Any], setting: str, shape: Shape, dataset: Path, work: Path, label: str
) -> dict[str, Any]:
    """One ``eagledata generate`` process against the servers ``started``; its figures."""
    urls = [server.url for server in started]
    consoles = [server.console for server in started]
    run_dir = work / f"run-{label}"
    concurrency = "auto" if setting == "auto" else setting.split()[-1]
    config = work / f"{label}.toml"
    config.write_text(
        f"[generation]\nmax_new_tokens = {shape.max_new_tokens}\n\n"
        f'[run]\nout_dir = "{run_dir}"\n\n[canary]\nenabled = false\n'
    )
    for url in urls:
        flush(url)
    before = [retracted(url) for url in urls]
    offsets = [console.stat().st_size for console in consoles]
    load_start = os.getloadavg()[0]
    cmd = [
        sys.executable, "-m", "eagledata.cli", "generate", "--model", str(MODEL),
        "--config", str(config), "--dataset", str(dataset), "--concurrency", concurrency,
        "--no-progress", *[arg for url in urls for arg in ("--server", url)],
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    began = time.monotonic()
    with (work / f"{label}.log").open("wb") as log:
        code = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, check=False)
    wall = time.monotonic() - began
    after = [retracted(url) for url in urls]
    records = read_records(run_dir)
    tokens = sum(int(r["completion_tokens"]) for r in records)
    first = min((r["created_at"] - r["e2e_latency"] for r in records), default=0.0)
    last = max((r["created_at"] for r in records), default=0.0)
    span = max(last - first, 1e-9)
    return {
        "setting": setting,
        "exit": code.returncode,
        "records": len(records),
        "failed": count_lines(run_dir / "failures.jsonl"),
        "output_tokens": tokens,
        "span_s": round(span, 1),
        "tok_s": round(tokens / span, 1),
        "retractions": retracted_in_log(consoles, offsets),
        # the counters' tokens, for what a retraction costs (they lag: see retracted_in_log)
        "retractions_counted": _delta(before, after, "requests"),
        "retracted_input_tokens": _delta(before, after, "input_tokens"),
        "retracted_output_tokens": _delta(before, after, "output_tokens"),
        "scheduler_cpu_s": round(_delta(before, after, "cpu_ms") / 1000, 1),
        # the counter is recorded every few seconds: nothing over a point shorter than that,
        # and it went down over some points (a negative delta says nothing either)
        "tok_per_cpu_s": round(1000 * tokens / cpu_ms, 1)
        if (cpu_ms := _delta(before, after, "cpu_ms")) > 0
        else None,
        "queue_full": refused(consoles, offsets),
        "queue_full_seen": queue_full(run_dir),
        "stopped": sum(1 for r in records if r["finish_reason"] == "stop"),
        "wall_s": round(wall, 1),
        "load_start": round(load_start, 1),
        "load_end": round(os.getloadavg()[0], 1),
        "run_dir": str(run_dir),
    }


def _delta(before: list[dict[str, int]], after: list[dict[str, int]], name: str) -> int:
    return sum(a[name] - b[name] for a, b in zip(before, after, strict=True))


def read_records(run_dir: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for path in [*run_dir.glob("shards/*.jsonl"), *run_dir.glob("pending/*.jsonl")]:
        rows.extend(orjson.loads(line) for line in path.read_bytes().splitlines() if line)
    return rows


def count_lines(path: Path) -> int:
    return len(path.read_bytes().splitlines()) if path.exists() else 0


def queue_full(run_dir: Path) -> int:
    """503s the client's telemetry counted: the last line's ``queue_full`` of each lane."""
    last: dict[str, int] = {}
    for path in sorted(run_dir.glob("telemetry*.jsonl")):
        for line in path.read_bytes().splitlines():
            sample = orjson.loads(line)
            last[f"{sample['server']} {sample.get('rank')}"] = int(sample.get("queue_full", 0))
    return sum(last.values())


@contextlib.contextmanager
def servers(env: Any, shape: Shape, work: Path) -> Iterator[list[Any]]:
    flag_sets = [shape.flags] if shape.second_flags is None else [shape.flags, shape.second_flags]
    started = []
    try:
        for index, flags in enumerate(flag_sets):
            server = env.Server(
                MODEL, work / f"server-{shape.name}-{index}", max_total_tokens=shape.pool,
                extra_flags=("--sleep-on-idle", *flags),
            )  # fmt: skip
            started.append(server)
            server.start()
        yield started
    finally:
        for server in started:
            server.stop()


def run_job(
    started: list[Any],
    shape: Shape,
    seed: int,
    settings: tuple[str, ...] | None,
    work: Path,
    on_point: Callable[[dict[str, Any]], None],
) -> None:
    dataset = work / f"{shape.name}-seed{seed}.jsonl"
    write_dataset(dataset, shape.prompts, seed, growing=shape.growing)
    job = seed  # a job is its prompts
    print(f"\n### {shape.name}, job {job}\n\n{HEADER}", flush=True)
    settings = settings or shape.settings
    order = list(settings) if job % 2 else list(reversed(settings))  # interleaved
    targets: list[tuple[str, list[Any]]] = []
    for setting in order:
        if len(started) == 2 and setting != "auto":
            targets += [
                (f"{setting} fast alone", started[:1]),
                (f"{setting} slow alone", started[1:]),
            ]
        targets.append((setting if len(started) == 1 else f"{setting} on both", started))
    for name, target in targets:
        setting = " ".join(name.split()[:2]) if name.startswith("fixed") else "auto"
        label = f"{shape.name}-j{job}-{name}".replace(" ", "-")
        point = run_point(target, setting, shape, dataset, work, label)
        point.update(shape=shape.name, job=job, seed=seed, setting=name)
        print(row(point), flush=True)
        on_point(point)


HEADER = (
    "| setting | output tok/s | tok per scheduler CPU-s | span s | retractions | 503s (client's) "
    "| errors "
    "| stopped | load (start-end) |\n|---|---|---|---|---|---|---|---|---|"
)


def row(p: dict[str, Any]) -> str:
    errors = p["failed"] + (p["exit"] != 0)
    return (
        f"| {p['setting']} | {p['tok_s']:,.1f} | {p.get('tok_per_cpu_s') or '-'} | "
        f"{p['span_s']:.0f} | {p['retractions']} | "
        f"{p['queue_full']} ({p.get('queue_full_seen', '-')}) | {errors} | "
        f"{p['stopped']}/{p['records']} | "
        f"{p['load_start']:.0f}-{p['load_end']:.0f} |"
    )


def verdict(shape: str, points: list[dict[str, Any]]) -> dict[str, Any]:
    """The targets over a shape's jobs: ``auto`` >= 0.95x the best fixed setting on the mean
    of the jobs' ratios and >= 0.90x in each; retractions at most a quarter of the best's (one
    per 1,000 requests where it has none); no error, no 503. Two servers: against the sum of
    the single bests (and, on one CPU, the best fixed setting on both)."""
    jobs = sorted({p["job"] for p in points if p["shape"] == shape})
    most = max(
        (sum(p["shape"] == shape and p["job"] == j for p in points) for j in jobs), default=0
    )
    per_job = []
    for job in jobs:
        mine = [p for p in points if p["shape"] == shape and p["job"] == job]
        auto = next((p for p in mine if p["setting"].startswith("auto")), None)
        if auto is None or len(mine) < max(most, 2):
            continue  # a job cut short: no verdict of its own
        if shape == "two":
            candidates = {
                which: [p for p in mine if p["setting"].endswith(f"{which} alone")]
                for which in ("fast", "slow")
            }
            fixed_on_both = [p for p in mine if p["setting"].endswith("on both") and p is not auto]
            if not all(candidates.values()) or not fixed_on_both:
                continue  # the job's points so far lack a server alone or a setting on both
            alone = {which: max(found, key=_tok) for which, found in candidates.items()}
            both = max(fixed_on_both, key=_tok)
            best_tok = sum(p["tok_s"] for p in alone.values())
            best_name = " + ".join(p["setting"] for p in alone.values())
            best_retractions = sum(p["retractions"] for p in alone.values())
            extra = {
                "best_on_both": both["setting"],
                "ratio_on_both": round(auto["tok_s"] / both["tok_s"], 4),
            }
        else:
            best = max((p for p in mine if p is not auto), key=_tok)
            best_tok, best_name, best_retractions = (
                best["tok_s"],
                best["setting"],
                best["retractions"],
            )
            extra = {}
        allowed = best_retractions / 4 if best_retractions else auto["records"] / 1000
        per_job.append({
            "job": job,
            "best": best_name,
            "ratio": round(auto["tok_s"] / best_tok, 4),
            "cpu_ratio": _cpu_ratio(auto, [p for p in mine if p is not auto]),
            "retractions": auto["retractions"],
            "best_retractions": best_retractions,
            "retractions_ok": auto["retractions"] <= allowed,
            "queue_full": auto["queue_full"],
            "errors": auto["failed"] + (auto["exit"] != 0),
            **extra,
        })  # fmt: skip
    ratios = [j["ratio"] for j in per_job]
    floor = 0.9 if shape == "two" else 0.95
    mean = sum(ratios) / len(ratios) if ratios else 0.0
    return {
        "shape": shape,
        "jobs": per_job,
        "mean_ratio": round(mean, 4),
        "mean_ok": mean >= floor,
        "every_job_ok": all(r >= 0.9 for r in ratios),
        "retractions_ok": all(j["retractions_ok"] for j in per_job),
        "clean": all(j["queue_full"] == 0 and j["errors"] == 0 for j in per_job),
    }


def _cpu_ratio(auto: dict[str, Any], fixed: list[dict[str, Any]]) -> float | None:
    """``auto``'s output tokens per scheduler CPU-second over the best fixed setting's: the
    comparison the machine's load moves least (one server's shapes only)."""
    rates = [p.get("tok_per_cpu_s") for p in [auto, *fixed]]
    if any(rate is None for rate in rates) or any(p["setting"].endswith("alone") for p in fixed):
        return None
    return round(float(auto["tok_per_cpu_s"]) / max(float(p["tok_per_cpu_s"]) for p in fixed), 4)


def _tok(point: dict[str, Any]) -> float:
    return float(point["tok_s"])


def retraction_cost(
    request_log: Path, retractions: int, input_tokens: int, output_tokens: int
) -> dict[str, Any]:
    """What a retraction costs on this server, from its request log (``meta_info`` of every
    answer): the re-prefill of the request's prompt and generated tokens (SGLang frees a
    retracted request's KV without caching it) against the decode time those tokens took.

    A request's prefill time is its first token's latency less its queue time (its prefill
    batch's forward, shared with the batch); its decode time per token is the rest of its
    latency over its other tokens. The tokens a retraction throws away are the server's own
    counters (prompt and output tokens over ``retractions``)."""
    prefill: list[tuple[float, int]] = []
    per_token: list[float] = []
    for path in sorted(request_log.glob("*.log")):
        for line in path.read_text(errors="replace").splitlines():
            start = line.find("{")
            if start < 0 or '"request.finished"' not in line:
                continue
            with contextlib.suppress(ValueError):
                meta = json.loads(line[start:])["out"]["meta_info"]
                if meta.get("num_retractions") or meta["completion_tokens"] < 2:
                    continue
                ttft, queued = meta["first_token_latency"], meta["queue_time"]
                prefill.append((ttft - queued, int(meta["prompt_tokens"])))
                decode = meta["e2e_latency"] - ttft
                per_token.append(decode / (meta["completion_tokens"] - 1))
    if not prefill or not retractions:
        return {"retractions": retractions}
    prefill.sort()
    per_token.sort()
    generated = output_tokens / retractions
    prefill_s = prefill[len(prefill) // 2][0]
    token_s = per_token[len(per_token) // 2]
    return {
        "retractions": retractions,
        "reprefill_tokens_each": round((input_tokens + output_tokens) / retractions, 1),
        "generated_tokens_each": round(generated, 1),
        "median_prefill_s": round(prefill_s, 3),
        "median_prompt_tokens": sorted(p for _, p in prefill)[len(prefill) // 2],
        "median_decode_s_per_token": round(token_s, 4),
        "decode_s_of_generated_tokens": round(generated * token_s, 2),
    }


def tables(results: dict[str, Any]) -> str:
    """The docs' tables: every point by shape and job, then each shape against the targets."""
    lines = []
    head, rule = HEADER.split("\n")
    for shape in dict.fromkeys(p["shape"] for p in results["points"]):
        lines.append(f"\n{shape}\n\n| job {head}\n|---{rule}")
        for p in (p for p in results["points"] if p["shape"] == shape):
            lines.append(f"| {p['job']} {row(p)}")
    lines.append(verdict_table(results["verdicts"]))
    return "\n".join(lines)


def verdict_table(verdicts: list[dict[str, Any]]) -> str:
    """Each shape against the targets: ``auto`` >= 0.95x the best fixed setting on the mean of
    the jobs (two servers: 0.90x the sum of the single bests) and >= 0.90x in every job;
    retractions at most a quarter of the best's (one per 1,000 requests where it has none);
    no error, no 503. ``yes``/``NO`` per target."""
    lines = [
        "\n| shape | jobs | auto / best fixed, each job | mean (target) | every job >= 90% "
        "| per scheduler CPU-s, each job | auto's retractions (best's) | retractions ok "
        "| auto's 503s/errors | met |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for v in verdicts:
        jobs = v["jobs"]
        each = ", ".join(f"{100 * j['ratio']:.0f}% ({j['best']}){_on_both(j)}" for j in jobs)
        retractions = ", ".join(f"{j['retractions']} ({j['best_retractions']})" for j in jobs)
        bad = ", ".join(f"{j['queue_full']}/{j['errors']}" for j in jobs)
        cpu = ", ".join(
            "-" if j.get("cpu_ratio") is None else f"{100 * j['cpu_ratio']:.0f}%" for j in jobs
        )
        floor = 90 if v["shape"] == "two" else 95
        checks = (v["mean_ok"], v["every_job_ok"], v["retractions_ok"], v["clean"])
        met = "-" if not jobs else "yes" if all(checks) else "NO"
        lines.append(
            f"| {v['shape']} | {len(jobs)} | {each or '-'} | {100 * v['mean_ratio']:.0f}% "
            f"(>= {floor}%) | {_yes(v['every_job_ok'])} | {cpu or '-'} | {retractions or '-'} "
            f"| {_yes(v['retractions_ok'])} | {bad or '-'} | {met} |"
        )
    return "\n".join(lines)


def _on_both(job: dict[str, Any]) -> str:
    """Two servers: ``auto`` against the best fixed setting on both, beside the sum of the
    single bests (which no client reaches when the two share one CPU)."""
    if "ratio_on_both" not in job:
        return ""
    return f"; {100 * job['ratio_on_both']:.0f}% of {job['best_on_both']}"


def _yes(ok: bool) -> str:
    return "yes" if ok else "NO"


def resized(shape: Shape, args: argparse.Namespace) -> Shape:
    """``shape`` with the sizes the command line gives in place of its own (a quick look)."""
    sizes = {"prompts": args.prompts, "max_new_tokens": args.max_new_tokens, "pool": args.pool}
    return replace(shape, **{name: value for name, value in sizes.items() if value})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--shapes",
        nargs="+",
        choices=tuple(SHAPES),
        default=["mixed", "queue-cap", "growing", "two"],
    )
    parser.add_argument(
        "--settings", nargs="+", help='e.g. "fixed 64" auto (default: each shape\'s own)'
    )
    parser.add_argument("--jobs", type=int, default=3, help="independent jobs per shape")
    parser.add_argument("--prompts", type=int, help="prompts per job (default: the shape's)")
    parser.add_argument("--max-new-tokens", type=int, help="default: the shape's")
    parser.add_argument("--pool", type=int, help="--max-total-tokens (default: the shape's)")
    parser.add_argument("--seed", type=int, default=0, help="the first job's seed (then +1, ...)")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--merge", action="store_true", help="replace only the shapes run")
    parser.add_argument("--keep", type=Path, help="run in this folder and keep it")
    parser.add_argument(
        "--table", action="store_true", help="print the tables of --results; run nothing"
    )
    args = parser.parse_args()
    if args.table:
        print(tables(json.loads(args.results.read_text())))
        return
    # a plain ``kill`` ends the servers too (the ``finally`` of their context runs)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    env = load_env()
    env.ensure_venv(log=lambda line: print(line, file=sys.stderr))
    work = args.keep or Path(tempfile.mkdtemp(prefix="bench-real-"))
    work.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
    ).stdout.strip()
    started = time.monotonic()
    points: list[dict[str, Any]] = []
    old: dict[str, Any] = {"runs": [], "points": [], "verdicts": []}
    if args.merge and args.results.exists():
        old = json.loads(args.results.read_text())
    run = {
        "command": " ".join(["python", "benchmarks/bench_real.py", *sys.argv[1:]]),
        "commit": commit,
        "cpus": os.cpu_count(),
    }
    shapes = {name: resized(SHAPES[name], args) for name in args.shapes}
    with contextlib.ExitStack() as stack:  # every shape's servers up, kept for all its jobs
        fleets = {name: stack.enter_context(servers(env, shapes[name], work)) for name in shapes}

        def save(point: dict[str, Any]) -> None:
            """The results so far (a session cut short keeps its points)."""
            points.append(point)
            run["wall_s"] = round(time.monotonic() - started)
            verdicts = []
            for name in args.shapes:
                shape_points = [p for p in points if p["shape"] == name]
                if not shape_points:
                    continue
                cost = retraction_cost(
                    fleets[name][0].request_log_dir,
                    sum(p["retractions"] for p in shape_points),
                    sum(p["retracted_input_tokens"] for p in shape_points),
                    sum(p["retracted_output_tokens"] for p in shape_points),
                )
                verdicts.append({**verdict(name, points), "retraction_cost": cost})
            done = set(args.shapes)
            out = {
                "runs": [*old["runs"], run],
                "points": [p for p in old["points"] if p["shape"] not in done] + points,
                "verdicts": [v for v in old["verdicts"] if v["shape"] not in done] + verdicts,
            }
            args.results.parent.mkdir(parents=True, exist_ok=True)
            args.results.write_text(json.dumps(out, indent=2) + "\n")

        settings = tuple(args.settings) if args.settings else None
        for job in range(args.jobs):  # job by job (a job is its seed): settings in one session
            for name in args.shapes:
                run_job(fleets[name], shapes[name], args.seed + job, settings, work, save)
    print("\n### Against the targets")
    print(verdict_table([verdict(name, points) for name in args.shapes]))


if __name__ == "__main__":
    main()
