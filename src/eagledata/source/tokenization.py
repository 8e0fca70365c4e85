"""Step 3: messages become the exact ids sent, with the model's own tokenizer and chat template.

The template is applied once per prompt, client-side; nothing downstream ever re-tokenizes. The
length limit comes from the server (``max_req_input_len``, and prompt + max_new_tokens must stay
below ``context_length``) and from an optional configured cap: an over-long prompt is never sent.
A prompt far past it is refused by its characters before it is tokenized (``check_size``):
tokenizing a 20 MB prompt whole peaked at 3.1 GB, only to learn it was too long.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagledata.config import TokenizerSettings, resolve_bundled
from eagledata.errors import BadRowError, PromptTooLongError, TokenizerError
from eagledata.source.hub import unreachable_and_uncached
from eagledata.source.prompts import Message


@dataclass(frozen=True, slots=True)
class LengthLimit:
    """The longest prompt that may be sent, and what sets that bound (for the failure reason)."""

    max_prompt_tokens: int | None
    source: str
    bounds: tuple[int | None, int | None, int | None] = (None, None, None)
    """What it was combined from (configured cap, max_req_input_len, context_length), so a
    dataset with its own ``max_new_tokens`` gets its own limit (``for_max_new_tokens``)."""

    @classmethod
    def combine(
        cls,
        *,
        configured_cap: int | None,
        max_req_input_len: int | None,
        context_length: int | None,
        max_new_tokens: int,
    ) -> LengthLimit:
        given = (configured_cap, max_req_input_len, context_length)
        bounds: list[tuple[int, str]] = []
        if configured_cap is not None:
            bounds.append((configured_cap, "generation.max_prompt_tokens"))
        if max_req_input_len is not None:
            bounds.append((max_req_input_len, "server max_req_input_len"))
        if context_length is not None:
            # SGLang answers 400 when prompt + max_new_tokens >= context_length.
            bounds.append((context_length - max_new_tokens - 1, "server context_length"))
        if not bounds:
            return cls(None, "none", given)
        limit, source = min(bounds)
        return cls(max(limit, 0), source, given)

    def for_max_new_tokens(self, max_new_tokens: int) -> LengthLimit:
        """The limit for answers of ``max_new_tokens`` (a dataset's own setting)."""
        cap, input_len, context = self.bounds
        if context is None:  # nothing in it depends on the answer's length
            return self
        return LengthLimit.combine(
            configured_cap=cap,
            max_req_input_len=input_len,
            context_length=context,
            max_new_tokens=max_new_tokens,
        )


class PromptTokenizer:
    """Applies the chat template of a ``transformers.AutoTokenizer`` to messages."""

    def __init__(self, settings: TokenizerSettings) -> None:
        from transformers import AutoTokenizer  # deferred: the import costs seconds

        self.settings = settings
        source = resolve_bundled(settings.name)
        if not Path(source).exists():  # a hub id
            unreachable = unreachable_and_uncached(source, "model")
            if unreachable is not None:
                raise TokenizerError(f"cannot load tokenizer {settings.name!r}: {unreachable}")
        try:
            self._tokenizer = AutoTokenizer.from_pretrained(
                source, revision=settings.revision, trust_remote_code=settings.trust_remote_code
            )
        except Exception as exc:  # transformers raises OSError, ValueError, HF hub errors, ...
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise TokenizerError(
                f"cannot load tokenizer {settings.name!r}: {first}; pass --tokenizer with a local "
                "directory or a reachable hub id"
            ) from None
        if settings.chat_template is not None:
            self._tokenizer.chat_template = settings.chat_template
        if not getattr(self._tokenizer, "chat_template", None):
            raise TokenizerError(
                f"tokenizer {settings.name!r} has no chat template (neither chat_template.jinja "
                "nor one in tokenizer_config.json); pass --chat-template FILE with the Jinja "
                "template the model was trained with, or set [tokenizer] chat_template"
            )

    @property
    def hf(self) -> Any:
        """The ``transformers`` tokenizer itself, for readers of a run (export decodes with it)."""
        return self._tokenizer

    @property
    def eos_ids(self) -> frozenset[int]:
        """The model's end-of-sequence ids: the tokenizer's EOS, and those of a
        ``generation_config.json`` beside it (SGLang stops on every one of them)."""
        ids = {self._tokenizer.eos_token_id}
        config = Path(resolve_bundled(self.settings.name)) / "generation_config.json"
        with contextlib.suppress(OSError, ValueError, AttributeError):
            declared = json.loads(config.read_text()).get("eos_token_id")
            ids.update(declared if isinstance(declared, list) else [declared])
        return frozenset(token for token in ids if type(token) is int)

    @property
    def vocab_size(self) -> int:
        """Ids a model with this tokenizer can produce: ``[0, vocab_size)``, added tokens
        included. An answer holding any other id breaks the token contract."""
        return len(self._tokenizer)

    @property
    def embedding_rows(self) -> int | None:
        """Rows of the model's embedding, when the tokenizer's folder is the model's (its
        ``config.json``'s ``vocab_size``, a multimodal wrapper's ``text_config``): real models
        pad it past ``vocab_size``. None when unknown."""
        folder = Path(resolve_bundled(self.settings.name))
        try:
            config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(config, dict):
            return None
        text = config.get("text_config")
        rows = (text if isinstance(text, dict) else config).get("vocab_size")
        if type(rows) is not int or rows <= self.vocab_size:
            return None
        return rows

    @property
    def model_vocab_rows(self) -> int:
        """The model's vocabulary as its own config states it (its embedding rows, often
        padded past the tokenizer: ``embedding_rows``), else the tokenizer's size. SGLang
        reports the last of these ids as 0 where it scores input tokens
        (``quality/canary_scorer.py``)."""
        return self.embedding_rows or self.vocab_size

    def encode(
        self, messages: list[Message], template_kwargs: dict[str, Any] | None = None
    ) -> list[int]:
        """The ids of ``messages`` with the generation prompt; ``template_kwargs`` (a dataset's
        own ``chat_template_kwargs``, merged) replace the tokenizer's."""
        kwargs: dict[str, Any] = dict(
            self.settings.chat_template_kwargs if template_kwargs is None else template_kwargs
        )
        try:
            ids = self._tokenizer.apply_chat_template(
                messages, tokenize=True, add_generation_prompt=True, return_dict=False, **kwargs
            )
        except Exception as exc:  # the template's raise_exception() and jinja errors
            raise BadRowError(f"chat template refused the row: {exc}", reason="template") from None
        if ids and isinstance(ids[0], list):  # some versions wrap a single conversation
            ids = ids[0]
        return [int(token) for token in ids]  # type: ignore[arg-type]

    # --- for the record flags (quality/flags.py); never on the ids sent ---------------------

    def token_id(self, token: str) -> int | None:
        """The id of a vocabulary token (e.g. ``<think>``), None if the vocabulary lacks it."""
        found = self._tokenizer.convert_tokens_to_ids(token)
        unknown = self._tokenizer.unk_token_id
        return found if isinstance(found, int) and found != unknown else None

    def roundtrip(self, ids: list[int]) -> list[int]:
        """Decode ``ids`` to text (special tokens kept) and encode that text again."""
        backend = getattr(self._tokenizer, "backend_tokenizer", None)
        if backend is not None:  # the Rust tokenizer itself: no Python-side post-processing
            text = backend.decode(ids, skip_special_tokens=False)
            return list(backend.encode(text, add_special_tokens=False).ids)
        text = self._tokenizer.decode(
            ids, skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        return list(self._tokenizer.encode(text, add_special_tokens=False))


MAX_CHARS_PER_TOKEN = 32
"""More characters than any prompt's tokens hold on average: English runs ~4 a token, code
and whitespace a few more, CJK fewer than 2. A prompt past ``max_prompt_tokens`` times this
cannot fit whatever its tokens turn out to be."""


def check_size(messages: list[Message], limit: LengthLimit) -> None:
    """Refuse, before it is tokenized, a prompt whose characters could not fit in the limit's
    tokens (``MAX_CHARS_PER_TOKEN`` each): ``PromptTooLongError``, an item failure."""
    if limit.max_prompt_tokens is None:
        return
    most = limit.max_prompt_tokens * MAX_CHARS_PER_TOKEN
    chars = sum(len(value) for message in messages for value in message.values())
    if chars > most:
        raise PromptTooLongError(
            f"prompt has {chars:,} characters, more than {limit.max_prompt_tokens} tokens can "
            f"hold at {MAX_CHARS_PER_TOKEN} a token ({limit.source}); not tokenized"
        )


def check_length(input_ids: list[int], limit: LengthLimit) -> None:
    if not input_ids:
        raise BadRowError("the templated prompt is empty", reason="empty_prompt")
    if limit.max_prompt_tokens is not None and len(input_ids) > limit.max_prompt_tokens:
        raise PromptTooLongError(
            f"prompt has {len(input_ids)} tokens, over the limit of {limit.max_prompt_tokens} "
            f"({limit.source})"
        )
