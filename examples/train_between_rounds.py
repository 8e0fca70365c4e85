"""Train a toy head on round k's ids while round k+1 regenerates in the background.

The loop a drafter trainer runs when it wants fresh on-policy samples every epoch: round 0 is
generated first; then, for each round k, a thread regenerates round k+1 of the same prompts
(``eagledata.regenerate(..., round=k + 1)``) while the main thread trains on round k's rows
(``eagledata.dataset(out, round=k)``: the ``ids`` rows ``eagledata export`` writes, their loss
mask exact). A round that was stopped (the process killed) is resumed by the same call.

The head is a toy (a bigram model over hashed token ids: each supervised token predicted from the
token before it), CPU only, a few seconds a round; a real trainer puts its drafter here. torch is
the trainer's dependency, not eagledata's.

    # against eagledata's simulated server (no GPU), in one terminal:
    eagledata sim-server --port 30000 --tokenizer bundled:tokenizer/tiny-chatml
    # in another:
    python examples/train_between_rounds.py --server http://127.0.0.1:30000 \\
        --tokenizer bundled:tokenizer/tiny-chatml --out runs/rounds --rounds 3

    # against a real SGLang server of the model (bf16 KV cache), its folder as --model:
    python examples/train_between_rounds.py --server http://127.0.0.1:30000 --model DIR ...

The last line printed is one JSON object: each round's rows, each epoch's mean loss, and whether
the next round was still generating when training on the round before it started.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from typing import Any

import torch
from torch import nn

import eagledata
from eagledata.errors import EagledataError

BUCKETS = 4096
"""Token ids are hashed into this many classes: the toy head's vocabulary."""


def prompts(count: int) -> list[str]:
    topics = ["the sea", "volcanoes", "prime numbers", "bread", "the moon", "bees", "rivers"]
    return [
        f"Explain one thing about {topics[i % len(topics)]} (question {i})." for i in range(count)
    ]


class BigramHead(nn.Module):
    """Predicts a token from the token before it: the smallest model that learns from ids."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(BUCKETS, width)
        self.out = nn.Linear(width, BUCKETS)

    def forward(self, previous: torch.Tensor) -> torch.Tensor:
        return self.out(self.embed(previous))


def supervised_pairs(rows: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(previous token, supervised token) for every position the loss mask marks."""
    previous: list[int] = []
    target: list[int] = []
    for row in rows:
        ids, mask = row["input_ids"], row["loss_mask"]
        for i in range(1, len(ids)):
            if mask[i]:
                previous.append(ids[i - 1] % BUCKETS)
                target.append(ids[i] % BUCKETS)
    return torch.tensor(previous), torch.tensor(target)


def train_round(head: BigramHead, optimizer: torch.optim.Optimizer, rows: Any) -> float:
    """One epoch over a round's supervised tokens; the mean loss."""
    previous, target = supervised_pairs(rows)
    if len(target) == 0:
        return float("nan")
    losses = []
    for start in range(0, len(target), 256):
        batch = slice(start, start + 256)
        loss = nn.functional.cross_entropy(head(previous[batch]), target[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return sum(losses) / len(losses)


def in_background(
    questions: list[str], round_index: int, settings: dict[str, Any]
) -> tuple[threading.Thread, dict[str, Any]]:
    """Regenerate a round in a thread (no signal handler is installed there, nothing printed);
    its summary, or its error, lands in the dict once the thread ends."""
    outcome: dict[str, Any] = {}

    def regenerate() -> None:
        try:
            outcome["summary"] = eagledata.regenerate(questions, round=round_index, **settings)
        except EagledataError as error:  # typed: one line naming the fix
            outcome["error"] = error

    worker = threading.Thread(target=regenerate, name=f"round-{round_index}")
    worker.start()
    return worker, outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", required=True, action="append", help="SGLang server URL")
    parser.add_argument("--out", required=True, help="Folder of the rounds (OUT/round-NNNN)")
    parser.add_argument("--model", help="The target model's folder (as eagledata --model)")
    parser.add_argument("--tokenizer", help="Tokenizer dir or bundled:..., without --model")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--no-canary", action="store_true", help="Run without the canary")
    parser.add_argument(
        "--small-canary", action="store_true", help="A canary sized for a toy run (4 prompts)"
    )
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    questions = prompts(args.prompts)
    settings: dict[str, Any] = {
        "server": args.server,
        "out": args.out,
        "model": args.model,
        "tokenizer": args.tokenizer,
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
    }
    if args.no_canary:
        settings["canary"] = False
    elif args.small_canary:  # the defaults suit a real run: 24 prompts x 512 scored tokens
        settings.update(
            {
                "canary.prompts": 4,
                "canary.reference_tokens": 32,
                "canary.probes": 2,
                "canary.probe_tokens": 16,
                "canary.load_requests": 2,
            }
        )

    first = eagledata.regenerate(questions, round=0, **settings)
    head = BigramHead()
    optimizer = torch.optim.Adam(head.parameters(), lr=0.01)
    report: dict[str, Any] = {"rounds": [], "first": first.written}

    for k in range(args.rounds):
        # round k+1 regenerates in a thread while round k trains (the last round trains alone)
        worker: threading.Thread | None = None
        outcome: dict[str, Any] = {}
        if k + 1 < args.rounds:
            worker, outcome = in_background(questions, k + 1, settings)
        started = time.monotonic()
        overlapped = worker is not None and worker.is_alive()
        rows = eagledata.dataset(args.out, round=k)
        loss = train_round(head, optimizer, rows)
        report["rounds"].append(
            {
                "round": k,
                "rows": len(rows),
                "loss": round(loss, 4),
                "train_s": round(time.monotonic() - started, 2),
                "next_round_generating": overlapped,
            }
        )
        print(f"round {k}: {len(rows)} rows, loss {loss:.4f}", flush=True)
        if worker is not None:
            worker.join()
            if "error" in outcome:
                raise SystemExit(f"round {k + 1}: {outcome['error']}")
            summary = outcome["summary"]
            print(
                f"round {k + 1}: {summary.written} records at {summary.tokens_per_s:,.0f} tok/s; "
                f"quality: {summary.quality}; canary: {summary.canary}",
                flush=True,
            )
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
