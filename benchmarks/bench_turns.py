"""The cost of regenerating every assistant turn (``--turns all``) against the last one only.

One synthetic multi-turn dataset (``--conversations`` ShareGPT rows of 1 to 4 user turns, a
system prompt in every third, user messages of 40-300 words and original answers of 150-400
words: the tiny tokenizer's ChatML template, ~2.85 tokens a word) is generated in each mode
against its own simulated SGLang server running the capacity engine (``engine = "sglang"``: the
reference bf16 pool of 116,000 tokens, the reference step-time fit, prefill at 8,000 tok/s of
the ids *not* found in the prefix cache). The server's prefix cache holds every prompt once its
prefill is done and every finished answer with its prompt (SGLang's ``cache_finished_req``), so
turn k+1, whose prompt is turn k's prompt, answer and the next user message, can find turn k's
ids cached. Answers stop on their own at 600 tokens +- 50%.

Modes:

* ``last``: today's behaviour, one request per conversation, its original answers as context;
* ``all``: every turn, each prompted with the regenerated answers before it;
* ``all-think``: the same with a thinking model (``tiny-chatml-think``, 40% of each answer in a
  think block): the earlier reasoning goes back as ``reasoning_content`` and the template renders
  it; the reasoning parser's stripping decides how much of the cached answer the next prompt
  still matches;
* ``all-think-dropped``: the template drops earlier thinking (``keep_thinking = false``, as
  Kimi-K2.5's does): the next prompt cannot match the cached answer past its prompt.

For each: requests, prompt tokens sent, cached (prefix-cache hits, and for turns after the first
the share of the previous turn's prompt and answer found cached), prompt tokens computed, output
tokens, and the server's modelled time (makespan and its prefill share). ``eagledata generate``
runs in this process (``--concurrency`` fixed, the canary off: its cost is
``bench_canary.py``'s).

    python benchmarks/bench_turns.py                      # every mode, ~3 minutes on 2 cores
    python benchmarks/bench_turns.py --modes last all --conversations 400

Prints a markdown table and writes ``benchmarks/results/turns.json``. Numbers: docs/turns.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from eagledata.config import AppConfig, resolve_bundled
from eagledata.run import pipeline
from eagledata.simserver import SimConfig, SimServerThread

RESULTS = Path(__file__).resolve().parent / "results" / "turns.json"
TOKENIZERS = {
    "plain": "bundled:tokenizer/tiny-chatml",
    "think": "bundled:tokenizer/tiny-chatml-think",
}
MODES: dict[str, dict[str, Any]] = {
    "last": {"turns": "last", "tokenizer": "plain", "think_share": 0.0, "kwargs": {}},
    "all": {"turns": "all", "tokenizer": "plain", "think_share": 0.0, "kwargs": {}},
    "all-think": {"turns": "all", "tokenizer": "think", "think_share": 0.4, "kwargs": {}},
    "all-think-dropped": {
        "turns": "all",
        "tokenizer": "think",
        "think_share": 0.4,
        "kwargs": {"keep_thinking": False},
    },
}
WORDS = [
    "the",
    "model",
    "token",
    "cache",
    "server",
    "drafter",
    "answer",
    "prompt",
    "reason",
    "because",
    "however",
    "example",
    "first",
    "second",
    "then",
    "finally",
    "result",
    "value",
    "function",
    "python",
    "data",
    "train",
    "speculative",
    "decode",
    "latency",
    "memory",
    "attention",
    "layer",
    "weight",
    "batch",
    "request",
    "stream",
    "shard",
    "record",
    "check",
    "canary",
]


def words(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def write_dataset(path: Path, conversations: int, seed: int) -> Path:
    rng = random.Random(seed)
    lines = []
    for index in range(conversations):
        turns = []
        if index % 3 == 0:
            turns.append(
                {"from": "system", "value": f"You are assistant {index}. " + words(rng, 5, 30)}
            )
        for _ in range(1 + index % 4):
            turns.append({"from": "human", "value": words(rng, 40, 300)})
            turns.append({"from": "gpt", "value": words(rng, 150, 400)})
        lines.append(orjson.dumps({"id": f"c{index}", "conversations": turns}))
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def server_config(tokenizer: str, think_share: float, time_scale: float) -> SimConfig:
    return SimConfig(
        tokenizer_path=resolve_bundled(tokenizer),
        context_length=32768,
        engine="sglang",
        time_scale=time_scale,
        steps_per_tick=4,
        length_fraction=0.0,
        output_len_mean=600.0,
        output_len_spread=0.5,
        think_share=think_share,
    )


def app_config(url: str, out: Path, mode: dict[str, Any], concurrency: int) -> AppConfig:
    return AppConfig.model_validate(
        {
            "tokenizer": {
                "name": TOKENIZERS[mode["tokenizer"]],
                "chat_template_kwargs": mode["kwargs"],
            },
            "generation": {"max_new_tokens": 2048, "temperature": 1.0, "turns": mode["turns"]},
            "server": {
                "urls": [url],
                "guard_interval_s": 0.05,
                "backoff_base_s": 0.01,
                "backoff_max_s": 0.05,
                "request_timeout_s": 120,
            },
            "run": {"out_dir": str(out), "concurrency": concurrency, "shard_size": 500},
            "canary": {"enabled": False},
        }
    )


def read_records(out: Path) -> list[dict[str, Any]]:
    return [
        orjson.loads(line)
        for path in sorted(out.glob("shards/*.jsonl"))
        for line in path.read_bytes().splitlines()
    ]


def one_mode(name: str, dataset: Path, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    mode = MODES[name]
    out = work / name
    sim_config = server_config(TOKENIZERS[mode["tokenizer"]], mode["think_share"], args.time_scale)
    started = time.monotonic()
    with SimServerThread(sim_config) as sim:
        summary = pipeline.generate(
            app_config(sim.url, out, mode, args.concurrency), str(dataset), out, progress=False
        )
        engine = sim.stats()["engine"][0]
    wall = time.monotonic() - started
    records = read_records(out)
    by_id = {record["id"]: record for record in records}
    prompt = sum(r["prompt_tokens"] for r in records)
    cached = sum(r["cached_tokens"] or 0 for r in records)
    later = [r for r in records if r["turn"]]
    found = before = 0
    for record in later:
        previous = by_id[f"{record['conversation_id']}/{record['turn'] - 1}"]
        context = previous["prompt_tokens"] + previous["completion_tokens"] - 1
        before += context
        found += min(record["cached_tokens"] or 0, context)
    output = sum(r["completion_tokens"] for r in records)
    makespan = engine["sim_time"]
    return {
        "mode": name,
        "conversations": args.conversations,
        "requests": len(records),
        "failed": summary.failed,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "cached_share": cached / prompt if prompt else 0.0,
        "previous_turn_cached_share": found / before if before else None,
        "computed_prompt_tokens": prompt - cached,
        "output_tokens": output,
        "makespan_s": makespan,
        "prefill_s": engine["prefill_seconds"],
        "output_tok_s": output / makespan if makespan else 0.0,
        "wall_s": wall,
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| mode | requests | prompt tokens sent | cached | previous turn found cached | "
        "prompt tokens computed | output tokens | makespan (modelled) | prefill share | "
        "output tok/s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        previous = row["previous_turn_cached_share"]
        lines.append(
            f"| {row['mode']} | {row['requests']:,} | {row['prompt_tokens']:,} | "
            f"{row['cached_tokens']:,} ({row['cached_share']:.1%}) | "
            f"{'-' if previous is None else f'{previous:.1%}'} | "
            f"{row['computed_prompt_tokens']:,} | {row['output_tokens']:,} | "
            f"{row['makespan_s']:,.0f} s | {row['prefill_s'] / row['makespan_s']:.1%} | "
            f"{row['output_tok_s']:,.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--conversations", type=int, default=200)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--time-scale", type=float, default=0.02)
    parser.add_argument("--seed", type=int, default=24)
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-turns-") as tmp:
        work = Path(tmp)
        dataset = write_dataset(work / "conversations.jsonl", args.conversations, args.seed)
        for name in args.modes:
            rows.append(one_mode(name, dataset, work, args))
            print(f"{name}: done in {rows[-1]['wall_s']:.0f} s wall", flush=True)
    print(table(rows))
    args.results.parent.mkdir(parents=True, exist_ok=True)
    settings = {key: value for key, value in vars(args).items() if key != "results"}
    args.results.write_text(json.dumps({"args": settings, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
