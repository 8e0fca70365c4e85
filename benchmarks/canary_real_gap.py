"""How far a real server's prefill scoring of its own samples is from their sampling.

    python benchmarks/canary_real_gap.py [--sets 40] [--prompts 4] [--reference-tokens 32]
        [--beside 0 8] [--model DIR] [--save FILE.npz]

The canary's baseline compares the logprob the server gave each reference token as it sampled
it (decode) with the logprob its scorings give the same token (prefill): the self-check's
"references as sampled" test (``quality/canary_selfcheck.py``). On a healthy server the two
differ only by how decode and prefill round. This starts SGLang 0.5.23 on this CPU with the
repo's trained model (the real-server tier's server, bf16 KV cache, 4,096-token pool), and for
each ``--beside`` count B, samples ``--sets`` canary sets (``--prompts`` references of
``--reference-tokens`` tokens, sampled together at temperature 1 while B other sampled
generations run, so the decode batches differ), scores each set once in prefill (the same B
beside: a CPU's prefill gives the same logprobs whatever the batch), and
prints, per B: the per-token difference (scored - sampled) mean and spread, each set's trimmed
mean (the test's statistic) and its standard error, and how many sets the test's floor (1e-3)
alone would refuse.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from eagledata.config import TokenizerSettings
from eagledata.quality.canary_scorer import CanaryScorer
from eagledata.quality.canary_stats import trimmed_mean_se, trimmed_signed_mean
from eagledata.server.client import SGLangClient
from eagledata.source.tokenization import PromptTokenizer
from realserver import TRAINED_MODEL, env

SAMPLES = Path(__file__).resolve().parents[1] / "src/eagledata/assets/samples/prompts.jsonl"


def templated_prompts(model_dir: Path) -> list[list[int]]:
    """The bundled sample questions, templated as ``generate`` templates them."""
    tokenizer = PromptTokenizer(TokenizerSettings(name=str(model_dir)))
    questions = [json.loads(line)["prompt"] for line in SAMPLES.read_text().splitlines()]
    return [tokenizer.encode([{"role": "user", "content": q}]) for q in questions]


async def measure(url: str, prompts: list[list[int]], args: argparse.Namespace) -> None:
    rng = np.random.default_rng(args.seed)
    saved: dict[str, Any] = {}  # each B's sets x tokens, for --save
    async with SGLangClient([url], in_flight=64) as client:
        scorer = CanaryScorer(client)
        for beside in args.beside:
            stop = asyncio.Event()

            async def load(index: int, stop: asyncio.Event = stop) -> None:
                while not stop.is_set():
                    body = {
                        "input_ids": prompts[(index * 7) % len(prompts)],
                        "sampling_params": {"max_new_tokens": 64, "temperature": 1.0},
                    }
                    await client.post_generate(url, body)

            loaders = [asyncio.create_task(load(i)) for i in range(beside)]
            deltas, shifts, errors = [], [], []
            try:
                for _ in range(args.sets):
                    chosen = rng.choice(len(prompts), size=args.prompts, replace=False)
                    canary = await scorer.sample_set(
                        url,
                        [prompts[i] for i in chosen],
                        reference_tokens=args.reference_tokens,
                        probes=0,
                        probe_tokens=0,
                        top_k=1,
                    )
                    measured = await scorer.score(url, canary)
                    assert canary.sampled_lps is not None
                    delta = measured.scoring.lps - canary.sampled_lps
                    deltas.append(delta)
                    shifts.append(trimmed_signed_mean(delta))
                    errors.append(trimmed_mean_se(delta))
            finally:
                stop.set()
                await asyncio.gather(*loaders, return_exceptions=True)
            every = np.concatenate(deltas)
            shift = np.array(shifts)
            se = np.array(errors)
            z = shift / np.maximum(se, 1e-12)  # the set's shift in its own standard errors
            summary = {
                "sets": args.sets,
                "tokens_per_set": len(deltas[0]),
                "token_delta_mean": float(every.mean()),
                "token_delta_std": float(every.std()),
                "token_delta_abs_p99": float(np.quantile(np.abs(every), 0.99)),
                "tokens_exactly_equal": float(np.mean(every == 0.0)),
                "set_shift_mean": float(shift.mean()),
                "set_shift_min": float(shift.min()),
                "set_se_median": float(np.median(se)),
                "set_se_max": float(se.max()),
                "set_z_min": float(z.min()),
                "set_z_p01_p50_p99": [float(q) for q in np.quantile(z, [0.01, 0.5, 0.99])],
                "sets_under_4se_or_floor": int((shift < -np.maximum(4 * se, 1e-3)).sum()),
                "sets_under_floor": int((shift < -1e-3).sum()),
            }
            print(json.dumps({"beside": beside, **summary}), flush=True)
            saved[f"beside_{beside}"] = np.stack(deltas).astype(np.float32)
    if args.save is not None:
        np.savez_compressed(args.save, **saved)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", type=int, default=40)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--reference-tokens", type=int, default=32)
    parser.add_argument("--beside", type=int, nargs="+", default=[0, 8])
    parser.add_argument("--model", type=Path, default=TRAINED_MODEL)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--save", type=Path, help="an .npz of each B's per-token differences (sets x tokens)"
    )
    args = parser.parse_args()
    venv = env.ensure_venv()
    prompts = templated_prompts(args.model)
    with (
        tempfile.TemporaryDirectory() as work,
        env.Server(args.model, Path(work), venv=venv) as server,
    ):
        asyncio.run(measure(server.url, prompts, args))


if __name__ == "__main__":
    main()
