"""An answer's ids read back the way a chat client reads them: thinking and content.

A client of SGLang's chat API gets the answer text with the stop token removed and, for a
thinking model, the thinking split off into ``reasoning_content``. SGLang's reasoning parser
(``BaseReasoningFormatDetector.detect_and_parse``): an answer with no think block is returned as
it is; otherwise the think-start tag is removed and the text stripped, everything before the
think-end tag is the reasoning and everything after it, stripped, the content (an answer cut
inside its thinking is all reasoning). ``turns = "all"`` sends an earlier answer back that way,
as the next turn's assistant message; the chat template then decides what it renders of it
(Kimi-K2.5 drops earlier thinking). ``export --format conversations`` writes the same message,
with both fields stripped (``strip=True``: a trainer's role validators refuse whitespace-only
turns).

Everything is read from ``output_ids`` (never from the server's ``text``, which a server decoding
with ``skip_special_tokens`` has stripped of special think tags), split on ids, and each side
decoded with the model's own tokenizer, special tokens kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from eagledata.source.prompts import Message

THINK_PAIRS = (("<think>", "</think>"), ("<|thinking|>", "<|/thinking|>"), ("◁think▷", "◁/think▷"))
"""Think tags as models spell them (Qwen3, DeepSeek-R1 and Kimi-K2.5; others; Kimi-VL)."""


def single_token_id(tokenizer: Any, token: str) -> int | None:
    """The id of ``token`` if the tokenizer has it as one token, else None."""
    ids = tokenizer.encode(token, add_special_tokens=False)
    return int(ids[0]) if len(ids) == 1 else None


@dataclass(frozen=True, slots=True)
class AnswerParts:
    reasoning: str
    content: str
    reasoning_tokens: int
    """Ids of the thinking, tags excluded."""
    thought: bool
    """A think block was open in the answer (opened by the model, or by the prompt)."""

    def message(self, *, reasoning_field: bool = False) -> Message:
        """The assistant message a chat client sends back with the next user message; with
        ``reasoning_field`` it carries ``reasoning_content`` even when it did not think
        (``source/conversations.py``: one key set for every message of a run)."""
        answer: Message = {"role": "assistant", "content": self.content}
        if self.thought or reasoning_field:
            answer["reasoning_content"] = self.reasoning
        return answer


class AnswerReader:
    """Splits an answer's ids into thinking and content at the model's think-end token."""

    def __init__(self, tokenizer: Any, *, strip: bool = False) -> None:
        self.tokenizer = tokenizer
        self.strip = strip
        """Strip both fields of surrounding whitespace (else: as SGLang's parser leaves them)."""
        self.think_start: int | None = None
        self.think_end: int | None = None
        for start, end in THINK_PAIRS:
            opened, closed = single_token_id(tokenizer, start), single_token_id(tokenizer, end)
            if opened is not None and closed is not None:
                self.think_start, self.think_end = opened, closed
                break
        self.special_ids = frozenset(int(i) for i in getattr(tokenizer, "all_special_ids", []))

    @property
    def has_thinking(self) -> bool:
        return self.think_end is not None

    def without_stop(
        self, output_ids: Sequence[int], finish_reason: str, matched: int | str | None
    ) -> list[int]:
        """The answer without the stop token that ended it (kept in the record, dropped here)."""
        output = list(output_ids)
        if output and finish_reason == "stop":
            last = output[-1]
            if last == matched or last in self.special_ids:
                output.pop()
        return output

    def prompt_opens_think(self, prompt: Sequence[int]) -> bool:
        """True when the generation prompt ends inside a think block (K2.5 prefills ``<think>``)."""
        if self.think_start is None:
            return False
        for token in reversed(prompt):
            if token == self.think_end:
                return False
            if token == self.think_start:
                return True
        return False

    def split_ids(
        self, prompt: Sequence[int], content: list[int]
    ) -> tuple[list[int], list[int], bool]:
        """(thinking ids, answer ids, whether a think block was open) of a stop-less answer."""
        if not self.has_thinking:
            return [], content, False
        in_think = self.prompt_opens_think(prompt)
        if content and content[0] == self.think_start:  # the model opened the block itself
            content = content[1:]
            in_think = True
        if self.think_end in content:
            end = content.index(self.think_end)
            return content[:end], content[end + 1 :], True
        if in_think:  # cut inside its thinking: no answer yet
            return content, [], True
        return [], content, False

    def split(
        self,
        prompt: Sequence[int],
        output_ids: Sequence[int],
        finish_reason: str,
        matched: int | str | None,
    ) -> AnswerParts:
        content = self.without_stop(output_ids, finish_reason, matched)
        thinking, answer, thought = self.split_ids(prompt, content)
        reasoning, text = self._decode(thinking), self._decode(answer)
        if self.strip:
            reasoning, text = reasoning.strip(), text.strip()
        elif thought:  # SGLang: the whole text stripped, then the content after the tag
            reasoning, text = reasoning.lstrip(), text.strip()
            if self.think_end not in content:
                reasoning = reasoning.rstrip()
        return AnswerParts(reasoning, text, len(thinking), thought)

    def reasoning_tokens(
        self,
        prompt: Sequence[int],
        output_ids: Sequence[int],
        finish_reason: str,
        matched: int | str | None,
    ) -> int | None:
        """Output ids spent thinking (tags excluded); None for a tokenizer without think tags.
        Ids only, nothing decoded: it runs for every record."""
        if not self.has_thinking:
            return None
        content = self.without_stop(output_ids, finish_reason, matched)
        return len(self.split_ids(prompt, content)[0])

    def _decode(self, ids: Sequence[int]) -> str:
        if not ids:
            return ""
        text = self.tokenizer.decode(
            list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        return str(text)
