"""The simulated model as far as token ids go: its vocabulary, its EOS, the table generated ids
come from, and text for them (decoded with the real tokenizer when the server has one)."""

from __future__ import annotations

import bisect
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eagledata.errors import ConfigError
from eagledata.simserver.config import DEFAULT_EOS_TOKEN_ID, DEFAULT_VOCAB_SIZE, SimConfig

TABLE_SIZE = 1 << 16
"""Generated ids are slices of a fixed pseudo-random table of valid ids: no per-token work."""
LOWEST_GENERATED_ID = 10
_EOS_NAMES = ("<|im_end|>", "<|endoftext|>", "[EOS]", "</s>", "<|eot_id|>", "<eos>")


@dataclass(frozen=True, eq=False)
class ModelSpec:
    """Vocabulary facts the generator needs, resolved once per (tokenizer, vocab, eos)."""

    vocab_size: int
    eos_token_id: int
    excluded: frozenset[int]
    """Never generated: ids below LOWEST_GENERATED_ID, added/special tokens and the EOS."""
    table: list[int]
    tokenizer: Any | None = field(default=None, repr=False)
    word_starts: list[int] | None = field(default=None, repr=False)
    """Table positions where a word begins (text tables only), sorted: an answer starts at
    one, so it does not begin with half a word no tokenizer would produce alone."""
    think: tuple[int, int] | None = None
    """The ids of ``<think>`` and ``</think>`` when the tokenizer has them (``think_share``)."""

    def think_state(self, ids: list[int]) -> str:
        """How a prompt leaves thinking: ``open`` (it ends inside a think block: the template
        opened it), ``off`` (it ends with a closed one: the template turned thinking off, like
        ``enable_thinking=False``), or ``none``."""
        if self.think is None or not ids:
            return "none"
        opened, closed = self.think
        if ids[-1] == closed:
            return "off"
        for token in reversed(ids[-64:]):
            if token == closed:
                return "none"
            if token == opened:
                return "open"
        return "none"

    def snap(self, offset: int) -> int:
        """The first word start at or after ``offset`` (wrapping), or ``offset`` itself."""
        starts = self.word_starts
        if not starts:
            return offset
        index = bisect.bisect_left(starts, offset)
        return starts[index] if index < len(starts) else starts[0]

    def snap_back(self, end: int) -> int:
        """The last word start at or before ``end``, or ``end`` itself."""
        starts = self.word_starts
        if not starts:
            return end
        index = bisect.bisect_right(starts, end)
        return starts[index - 1] if index else end

    def encode(self, text: str) -> list[int]:
        if self.tokenizer is not None:
            return list(self.tokenizer.encode(text).ids)
        span = self.vocab_size - LOWEST_GENERATED_ID
        return [LOWEST_GENERATED_ID + byte % span for byte in text.encode()]

    def decode(self, ids: list[int]) -> str:
        if self.tokenizer is not None:
            return str(self.tokenizer.decode(ids, skip_special_tokens=True))
        return " ".join(map(str, ids))


_MODELS: dict[tuple[str | None, int | None, int | None], ModelSpec] = {}


def resolve_model(config: SimConfig) -> ModelSpec:
    key = (config.tokenizer_path, config.vocab_size, config.eos_token_id)
    spec = _MODELS.get(key)
    if spec is None:
        spec = _MODELS[key] = _build_model(*key)
    return spec


def _build_model(path: str | None, vocab: int | None, eos: int | None) -> ModelSpec:
    tokenizer: Any | None = None
    specials: set[int] = set()
    if path is not None:
        from tokenizers import Tokenizer

        try:
            tokenizer = Tokenizer.from_file(str(Path(path) / "tokenizer.json"))
        except Exception as exc:
            raise ConfigError(f"sim-server: cannot load {path}/tokenizer.json: {exc}") from exc
        specials = set(tokenizer.get_added_tokens_decoder())
        if vocab is None:
            vocab = int(tokenizer.get_vocab_size(with_added_tokens=True))
        if eos is None:
            eos = _find_eos(Path(path), tokenizer)
    vocab = DEFAULT_VOCAB_SIZE if vocab is None else vocab
    eos = (
        (DEFAULT_EOS_TOKEN_ID if vocab > DEFAULT_EOS_TOKEN_ID else vocab - 1)
        if eos is None
        else eos
    )
    excluded = frozenset(specials | {eos} | set(range(LOWEST_GENERATED_ID)))
    allowed = [i for i in range(vocab) if i not in excluded]
    if not allowed:
        raise ConfigError("sim-server: the vocabulary has no ordinary token to generate")
    table = random.Random(0x5EED).choices(allowed, k=TABLE_SIZE)
    starts: list[int] | None = None
    if tokenizer is not None:
        text_table = _text_table(tokenizer, excluded)
        if text_table:
            table = text_table
            pieces = tokenizer.decode_batch([[t] for t in sorted(set(table))])
            opens = {
                t for t, text in zip(sorted(set(table)), pieces, strict=True) if text[:1].isspace()
            }
            starts = [i for i, t in enumerate(table) if t in opens]
    think = None
    if tokenizer is not None:
        opened, closed = tokenizer.token_to_id("<think>"), tokenizer.token_to_id("</think>")
        think = (opened, closed) if opened is not None and closed is not None else None
    return ModelSpec(vocab, eos, excluded, table, tokenizer, starts, think)


def _text_table(tokenizer: Any, excluded: frozenset[int]) -> list[int]:
    """With a real tokenizer, the table is the canonical encoding of prose (the bundled sample
    conversations, shuffled and repeated): answers then decode to text and mostly survive a
    decode/encode round trip, as a real model's do; a table of random ids never would."""
    from importlib import resources

    texts: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, str) and len(value) > 20:
            texts.append(value)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    samples = resources.files("eagledata").joinpath("assets", "samples")
    for name in ("sharegpt.jsonl", "ultrachat.jsonl", "prompts.jsonl"):
        source = samples.joinpath(name)
        if source.is_file():
            for line in source.read_text(encoding="utf-8").splitlines():
                walk(json.loads(line))
    if not texts:
        return []
    shuffler = random.Random(0x7E47)
    table: list[int] = []
    while len(table) < TABLE_SIZE:
        shuffler.shuffle(texts)
        ids = tokenizer.encode("\n\n".join(texts), add_special_tokens=False).ids
        table.extend(t for t in ids if t not in excluded)
        table.append(tokenizer.encode("\n\n", add_special_tokens=False).ids[0])
    return table[:TABLE_SIZE]


def _find_eos(path: Path, tokenizer: Any) -> int:
    for name, key in (
        ("tokenizer_config.json", "eos_token"),
        ("generation_config.json", "eos_token_id"),
        ("config.json", "eos_token_id"),
    ):
        try:
            value = json.loads((path / name).read_text()).get(key)
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, list) and value:
            value = value[0]
        if isinstance(value, str):
            value = tokenizer.token_to_id(value)
        if isinstance(value, int):
            return value
    for name in _EOS_NAMES:
        found = tokenizer.token_to_id(name)
        if found is not None:
            return int(found)
    raise ConfigError(f"sim-server: no EOS token found in {path}; set eos_token_id")
