"""Train the tiny Llama shipped in ``assets/model/tiny-llama-chatml`` (and its padded twin).

A real SGLang server needs a model to serve, and a model with random weights answers with a
near-uniform next-token distribution: byte fragments that do not survive a decode/encode round
trip, answers that never end, and canary statistics without a signal. This script trains a
small ``LlamaForCausalLM`` on the CPU, in a few minutes, so that it behaves like a trained chat
model: peaked next-token distributions, answers in the ChatML format that end with
``<|im_end|>`` at lengths from a few tokens to about 400.

What it learns (all reachable offline, fixed by content hashes):

* the user turns of the bundled sample datasets (``assets/samples``: ``prompts.jsonl``,
  ``sharegpt.jsonl``, ``ultrachat.jsonl``), templated with the repo's ChatML tokenizer
  (``assets/tokenizer/tiny-chatml``), with their own assistant turns where the row has them;
* for every conversation that ends on a user turn, an answer cut from the text of the GNU GPL
  version 3 (``/usr/share/common-licenses/GPL-3`` on Debian and Ubuntu, the same file as
  https://www.gnu.org/licenses/gpl-3.0.txt), in whole sentences, the target lengths cycling
  through ``ANSWER_TOKENS`` (24 to 400 tokens).

The templated conversations are concatenated into one stream (like pretraining documents) and
every training window starts at a conversation's first token, as a request does; a window runs
on into the following conversations, so that a greedy continuation past ``<|im_end|>`` (what
``ignore_eos`` asks for) stays as peaked as the answer itself.

Vocabulary: the tokenizer has 3,000 ids; the model is trained with an embedding of 3,072 rows
(rounded up to a multiple of 128, as real models pad theirs). The 72 padding rows are trained
like the others: no text holds their ids, so the softmax pushes their logits down on every
step (nothing sets them by hand). Two folders are written from the same weights:

* ``tiny-llama-chatml``: ``vocab_size`` 3,000, the embedding's first 3,000 rows (the logits of
  every real id are the trained model's own);
* ``tiny-llama-chatml-padded``: ``vocab_size`` 3,072, all the rows: a model whose embedding is
  larger than its tokenizer's vocabulary, as most released models are.

Each folder holds ``config.json``, ``generation_config.json`` (eos = ``<|im_end|>``),
``model.safetensors`` (bf16, tied embeddings) and the tokenizer's files with its chat template,
so ``--model-path DIR`` (SGLang) and ``from_pretrained(DIR)`` (transformers) both load it.

Determinism: fixed seeds, ``torch.use_deterministic_algorithms(True)``, one thread. The script
prints the sha256 of each ``model.safetensors``; a rebuild with the same torch on the same CPU
family reproduces them bit for bit (``--check``). Another CPU may pick other vector kernels and
differ in the last bits: the committed weights are the reference, not a rebuild.

Needs ``torch`` (CPU build), ``transformers`` and ``safetensors``, which eagledata itself does
not depend on; a scratch venv is enough::

    python3 -m venv /tmp/tiny-venv && /tmp/tiny-venv/bin/pip install torch transformers safetensors

Usage::

    python scripts/build_tiny_model.py [OUT_ROOT] [--check]     # train, write both folders
    python scripts/build_tiny_model.py --measure DIR            # greedy answers, figures
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

ROOT = Path(__file__).resolve().parent.parent
ASSETS = ROOT / "src" / "eagledata" / "assets"
TOKENIZER_DIR = ASSETS / "tokenizer" / "tiny-chatml"
SAMPLES = ASSETS / "samples"
DEFAULT_OUT_ROOT = ASSETS / "model"
NAME = "tiny-llama-chatml"
PADDED_NAME = "tiny-llama-chatml-padded"
TOKENIZER_FILES = ("special_tokens_map.json", "tokenizer.json", "tokenizer_config.json")
MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors", *TOKENIZER_FILES)

GPL3 = Path("/usr/share/common-licenses/GPL-3")
GPL3_SHA256 = "3972dc9744f6499f0f9b2dbf76696f2ae7ad8af9b23dde66d6af86c9dfb36986"
# Target lengths of the answers cut from the GPL, cycled over the conversations that need one.
ANSWER_TOKENS = (16, 200, 40, 340, 80, 24, 120, 48, 260, 64)

PAD_MULTIPLE = 128
HIDDEN = 128
LAYERS = 4
HEADS = 4
KV_HEADS = 2
INTERMEDIATE = 384
MAX_POSITIONS = 4096
WINDOW = 256
STRIDE = 192
BATCH = 16
STEPS = 300
PEAK_LR = 3e-3
WARMUP = 60
SEED = 0


# --- the training text -------------------------------------------------------------------------


def _gpl_sentences() -> list[tuple[str, bool]]:
    """The GPL's sentences, each with whether it opens a paragraph, whitespace reflowed."""
    if not GPL3.is_file():
        sys.exit(f"{GPL3} is missing: install Debian's base-files or save gpl-3.0.txt there")
    data = GPL3.read_bytes()
    if hashlib.sha256(data).hexdigest() != GPL3_SHA256:
        sys.exit(f"{GPL3} is not the GPL-3 text this model was trained on (sha256 differs)")
    sentences: list[tuple[str, bool]] = []
    for paragraph in re.split(r"\n\s*\n", data.decode("utf-8")):
        text = " ".join(paragraph.split())
        for index, sentence in enumerate(re.split(r"(?<=[.;:])\s+", text)):
            if sentence:
                sentences.append((sentence, index == 0))
    return sentences


def _answers(tokenizer: Any, count: int) -> list[str]:
    """``count`` answers from consecutive GPL sentences, each at least its target length."""
    sentences = iter(_gpl_sentences())
    answers: list[str] = []
    for number in range(count):
        target = ANSWER_TOKENS[number % len(ANSWER_TOKENS)]
        text = ""
        while len(tokenizer.encode(text, add_special_tokens=False)) < target:
            sentence, opens_paragraph = next(sentences)
            text += sentence if not text else ("\n\n" if opens_paragraph else " ") + sentence
        answers.append(text)
    return answers


def _read_jsonl(name: str) -> list[dict[str, Any]]:
    path = SAMPLES / name
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def sample_conversations() -> list[list[dict[str, str]]]:
    """The sample datasets' conversations as chat messages, in file order."""
    roles = {"human": "user", "gpt": "assistant", "system": "system"}
    conversations = [
        [{"role": "user", "content": row["prompt"]}] for row in _read_jsonl("prompts.jsonl")
    ]
    for row in _read_jsonl("sharegpt.jsonl"):
        conversations.append(
            [
                {"role": roles[turn["from"]], "content": turn["value"]}
                for turn in row["conversations"]
            ]
        )
    for row in _read_jsonl("ultrachat.jsonl"):
        conversations.append([dict(message) for message in row["messages"]])
    return conversations


def training_conversations(tokenizer: Any) -> list[list[dict[str, str]]]:
    """Every sample conversation, answered with GPL text where it ends on a user turn."""
    conversations = sample_conversations()
    open_ended = [c for c in conversations if c[-1]["role"] == "user"]
    for conversation, answer in zip(open_ended, _answers(tokenizer, len(open_ended)), strict=True):
        conversation.append({"role": "assistant", "content": answer})
    return conversations


def token_stream(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The templated conversations, concatenated, and the offset where each one starts."""
    stream: list[int] = []
    starts: list[int] = []
    for conversation in training_conversations(tokenizer):
        ids = tokenizer.apply_chat_template(conversation, tokenize=True, return_dict=False)
        starts.append(len(stream))
        stream += [int(token) for token in ids]
    return stream, starts


# --- the model ---------------------------------------------------------------------------------


def model_config(vocab_size: int, eos_id: int, bos_id: int) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=MAX_POSITIONS,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=bos_id,
        torch_dtype="bfloat16",
    )


def train(tokenizer: Any) -> tuple[dict[str, torch.Tensor], LlamaConfig]:
    """Train with the padded vocabulary; the trained tensors (float32) and their config."""
    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    vocab = len(tokenizer)
    padded_vocab = math.ceil(vocab / PAD_MULTIPLE) * PAD_MULTIPLE
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = model_config(padded_vocab, eos_id, tokenizer.convert_tokens_to_ids("<|endoftext|>"))
    model = LlamaForCausalLM(config).float()
    model.train()

    stream, starts = token_stream(tokenizer)
    wrapped = torch.tensor(stream + stream[:WINDOW], dtype=torch.long)
    # A window at every conversation's start (a request starts there) and, inside the long ones,
    # more every STRIDE tokens: each token is in at least one window per epoch.
    offsets = [
        offset
        for start, end in zip(starts, [*starts[1:], len(stream)], strict=True)
        for offset in range(start, max(start + 1, end - (WINDOW - STRIDE)), STRIDE)
    ]
    windows = torch.stack([wrapped[offset : offset + WINDOW] for offset in offsets])
    print(
        f"{len(starts)} conversations, {len(stream)} tokens, {len(windows)} windows of {WINDOW}; "
        f"{sum(p.numel() for p in model.parameters())} parameters, vocab {padded_vocab}",
        flush=True,
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=PEAK_LR, weight_decay=0.0)
    generator = torch.Generator().manual_seed(SEED)
    began = time.monotonic()
    order = torch.randperm(len(windows), generator=generator)
    cursor = 0
    for step in range(STEPS):
        if cursor + BATCH > len(order):
            order, cursor = torch.randperm(len(windows), generator=generator), 0
        batch = windows[order[cursor : cursor + BATCH]]
        cursor += BATCH
        lr = PEAK_LR * min(1.0, (step + 1) / WARMUP)
        lr *= 0.5 * (1 + math.cos(math.pi * step / STEPS)) * 0.95 + 0.05
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 100 == 0 or step == STEPS - 1:
            elapsed = time.monotonic() - began
            print(
                f"step {step:5d}  loss {loss.item():.4f}  lr {lr:.2e}  {elapsed:6.0f}s", flush=True
            )
    state = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    state.pop("lm_head.weight", None)  # tied to model.embed_tokens.weight
    return state, config


def _write_folder(
    out: Path, state: dict[str, torch.Tensor], config: LlamaConfig, vocab_size: int
) -> str:
    """One model folder with ``vocab_size`` embedding rows; returns the weights' sha256."""
    out.mkdir(parents=True, exist_ok=True)
    tensors = {
        name: (tensor[:vocab_size] if name == "model.embed_tokens.weight" else tensor)
        .to(torch.bfloat16)
        .contiguous()
        for name, tensor in sorted(state.items())
    }
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "model.safetensors").chmod(0o644)  # save_file creates it 0600
    folder_config = config.to_dict()
    folder_config.update(vocab_size=vocab_size, architectures=["LlamaForCausalLM"])
    for key in ("transformers_version", "_name_or_path"):
        folder_config.pop(key, None)
    (out / "config.json").write_text(json.dumps(folder_config, indent=2, sort_keys=True) + "\n")
    generation = {
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_id,
        "pad_token_id": config.pad_token_id,
    }
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    for name in TOKENIZER_FILES:
        shutil.copyfile(TOKENIZER_DIR / name, out / name)
    return hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()


def write(out_root: Path) -> dict[str, str]:
    """Train once, write both folders under ``out_root``; their weights' sha256 by folder."""
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    state, config = train(tokenizer)
    digests = {
        NAME: _write_folder(out_root / NAME, state, config, len(tokenizer)),
        PADDED_NAME: _write_folder(out_root / PADDED_NAME, state, config, config.vocab_size),
    }
    for name, digest in digests.items():
        print(f"sha256 {digest}  {name}/model.safetensors")
    return digests


# --- measuring what it learned ----------------------------------------------------------------

# Prompts that are in no sample dataset, to see what an unseen request gets.
UNSEEN_PROMPTS = (
    "What is a binary search tree?",
    "Name three rivers in Africa.",
    "How do I bake sourdough bread?",
    "Wie spät ist es in Tokio?",
    "Tell me a joke about databases.",
    "Why is the sky blue?",
    "Write a SQL query that counts orders per customer.",
    "What does HTTP status 404 mean?",
    "Give me a synonym for 'happy'.",
    "Summarize the plot of Hamlet in two sentences.",
)


def _roundtrip(tokenizer: Any, ids: list[int]) -> list[int]:
    """Decode (special tokens kept) and encode again, as the record flags do."""
    backend = tokenizer.backend_tokenizer
    return list(
        backend.encode(backend.decode(ids, skip_special_tokens=False), add_special_tokens=False).ids
    )


def _greedy(
    model: Any, prompt: list[int], eos_id: int, limit: int
) -> tuple[list[int], list[float]]:
    """Greedy answer (ending with eos if the model stops) and each step's top-1 probability."""
    ids = torch.tensor([prompt])
    output: list[int] = []
    top1: list[float] = []
    past = None
    with torch.no_grad():
        for _ in range(limit):
            result = model(input_ids=ids, past_key_values=past, use_cache=True)
            past = result.past_key_values
            probs = torch.softmax(result.logits[0, -1].float(), dim=-1)
            token = int(probs.argmax())
            top1.append(float(probs[token]))
            output.append(token)
            if token == eos_id:
                break
            ids = torch.tensor([[token]])
    return output, top1


def _turn_prompts() -> list[list[dict[str, str]]]:
    """Every user turn of the multi-turn samples with what precedes it (as ``--turns all``)."""
    return [
        conversation[: index + 1]
        for conversation in sample_conversations()[30:]
        for index, message in enumerate(conversation)
        if message["role"] == "user"
    ]


def measure(model_dir: Path, limit: int = 256) -> None:
    """Greedy answers to sample prompts and unseen ones, up to ``limit`` tokens; the figures."""
    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    vocab = len(tokenizer)
    sample = [row["prompt"] for row in _read_jsonl("prompts.jsonl")[:10]]
    print(f"{model_dir.name}: vocab_size {model.config.vocab_size}, tokenizer {vocab}")
    sets = {
        "prompts.jsonl[:10]": [[{"role": "user", "content": p}] for p in sample],
        "unseen prompts": [[{"role": "user", "content": p}] for p in UNSEEN_PROMPTS],
        "user turns of sharegpt/ultrachat.jsonl": _turn_prompts(),
    }
    for label, prompts in sets.items():
        ended = same = 0
        lengths: list[int] = []
        top1: list[float] = []
        for messages in prompts:
            ids = tokenizer.apply_chat_template(
                messages, tokenize=True, add_generation_prompt=True, return_dict=False
            )
            output, probs = _greedy(model, [int(t) for t in ids], eos_id, limit)
            ended += output[-1] == eos_id
            same += _roundtrip(tokenizer, output) == output
            lengths.append(len(output))
            top1 += probs
        peaked = sum(p > 0.5 for p in top1) / len(top1)
        shown = lengths if len(lengths) <= 10 else f"{min(lengths)}..{max(lengths)}"
        print(
            f"  {label}: ended with <|im_end|> {ended}/{len(prompts)}, lengths {shown}, "
            f"mean top-1 {sum(top1) / len(top1):.3f}, top-1 > 0.5 at {peaked:.1%} of steps, "
            f"round trip exact {same}/{len(prompts)}"
        )
    if model.config.vocab_size > vocab:
        _measure_padding(model, tokenizer, sets["prompts.jsonl[:10]"], eos_id, limit)


def _measure_padding(
    model: Any, tokenizer: Any, prompts: list[list[dict[str, str]]], eos_id: int, limit: int
) -> None:
    """What the padding rows (ids past the tokenizer's) get at every position of greedy
    answers: their largest logit, and the probability mass sampling would give them."""
    vocab = len(tokenizer)
    pad_logits: list[float] = []
    real_logits: list[float] = []
    masses: list[float] = []
    for messages in prompts:
        prompt = tokenizer.apply_chat_template(
            messages, tokenize=True, add_generation_prompt=True, return_dict=False
        )
        output, _ = _greedy(model, [int(t) for t in prompt], eos_id, limit)
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([[*prompt, *output]])).logits[0].float()
        pad_logits.append(float(logits[:, vocab:].max()))
        real_logits += logits[:, :vocab].max(dim=-1).values.tolist()
        masses += torch.softmax(logits, dim=-1)[:, vocab:].sum(dim=-1).tolist()
    top_real = sum(real_logits) / len(real_logits)
    print(
        f"  padding ids {vocab}..{model.config.vocab_size - 1} over {len(masses)} positions: "
        f"max logit {max(pad_logits):.1f} (top real logit: mean {top_real:.1f}), "
        f"probability mass mean {sum(masses) / len(masses):.1e}, max {max(masses):.1e}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_root", nargs="?", type=Path, default=DEFAULT_OUT_ROOT)
    parser.add_argument("--check", action="store_true", help="rebuild in a temp dir and compare")
    parser.add_argument("--measure", type=Path, metavar="DIR", help="measure a model folder")
    args = parser.parse_args(argv)
    if args.measure:
        measure(args.measure)
        return 0
    if not args.check:
        write(args.out_root)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        write(Path(tmp))
        differ = [
            f"{name}/{file}"
            for name in (NAME, PADDED_NAME)
            for file in MODEL_FILES
            if (Path(tmp) / name / file).read_bytes() != (args.out_root / name / file).read_bytes()
        ]
    if differ:
        print(f"{args.out_root} differs from a rebuild: {differ}", file=sys.stderr)
        return 1
    print(f"{args.out_root} matches a rebuild bit for bit")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
