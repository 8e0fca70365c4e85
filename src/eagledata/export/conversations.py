"""``--format conversations``: messages for trainers that only take conversations (lossy).

For SpecForge's offline hidden states (``prepare_hidden_states.py``), ModelOpt and other trainers
that re-render messages with the chat template and re-tokenize them. Each line is
``{"id", "status": "success", "conversations": [...prompt messages as sent..., {"role":
"assistant", "content": answer, "reasoning_content": thinking}]}``.

The answer is built from ``output_ids``, never from ``text`` (a server decoding with
``skip_special_tokens`` deletes special think tags from ``text``): the stop token is dropped, the
ids are split at the first think-end token, and each side is decoded with the run's tokenizer,
surrounding whitespace stripped (as SGLang's reasoning parser does), no think markers left in
either field (``source/answers.py``: the same message ``turns = "all"`` sends back as the next
turn's context). The prompt messages are the ones sent, system message included: SpecForge
injects its template's default system prompt into a conversation without one.

Lossy by construction: the trainer's template decides what it renders. A template that drops
``reasoning_content`` when it renders history (Kimi-K2/K2.5: SpecForge's own fixture shows an empty
``<think></think>`` in every assistant turn) trains the drafter on none of the thinking tokens.
That is probed on the run's own template, warned about and counted in the report.
"""

from __future__ import annotations

from typing import Any

from eagledata.export.format import ExportFormat, RowIdentity
from eagledata.export.output import write_jsonl
from eagledata.export.report import ExportReport
from eagledata.rundir.lines import RecordLine
from eagledata.source.answers import AnswerReader

PROMPT_KEYS = ("role", "content", "reasoning_content")
"""What a prompt message keeps: an earlier answer regenerated under ``turns = "all"`` carries its
thinking as ``reasoning_content``."""

NO_ANSWER = "no_answer"
_PROBE_REASONING = "eagledata-reasoning-probe-7f3a"
_PROBE_ANSWER = "eagledata-answer-probe-7f3a"


def template_drops_reasoning(tokenizer: Any, template_kwargs: dict[str, Any]) -> bool | None:
    """Does the chat template lose ``reasoning_content`` when it renders a finished conversation?

    Renders ``[user, assistant(reasoning_content=PROBE)]`` the way a trainer does
    (``add_generation_prompt=False``) and looks for the probe. None when the template refuses.
    """
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": _PROBE_ANSWER, "reasoning_content": _PROBE_REASONING},
    ]
    try:
        rendered = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=False, **template_kwargs
        )
    except Exception:  # a template may raise_exception() on an unexpected shape
        return None
    return _PROBE_REASONING not in str(rendered)


class ConversationBuilder:
    def __init__(self, tokenizer: Any, template_kwargs: dict[str, Any] | None = None) -> None:
        self.tokenizer = tokenizer
        self.template_kwargs = dict(template_kwargs or {})
        self.splitter = AnswerReader(tokenizer, strip=True)
        self.rows_with_reasoning = 0
        self.reasoning_tokens = 0
        self.rows_without_system = 0

    def row(self, record: RecordLine, who: RowIdentity) -> dict[str, Any] | str:
        parts = self.splitter.split(
            record.input_ids, record.output_ids, record.finish_reason, record.matched
        )
        if not parts.content:
            # role validators (SpecForge's validate_row) refuse an empty assistant answer
            return NO_ANSWER
        answer: dict[str, str] = {"role": "assistant", "content": parts.content}
        if self.splitter.has_thinking:
            answer["reasoning_content"] = parts.reasoning
        if parts.reasoning:
            self.rows_with_reasoning += 1
            self.reasoning_tokens += parts.reasoning_tokens
        messages = [{key: str(m[key]) for key in PROMPT_KEYS if key in m} for m in record.messages]
        if not messages or messages[0]["role"] != "system":
            self.rows_without_system += 1
        return {"id": who.id, "status": "success", "conversations": [*messages, answer]}

    def note(self, report: ExportReport) -> None:
        drops = template_drops_reasoning(self.tokenizer, self.template_kwargs)
        report.lossy = {
            "route": "conversations",
            "why": "the trainer re-renders the messages with a chat template and re-tokenizes them",
            "template_drops_reasoning": drops,
            "rows_with_reasoning": self.rows_with_reasoning,
            "reasoning_tokens": self.reasoning_tokens,
            "rows_without_system": self.rows_without_system,
        }
        if drops and self.rows_with_reasoning:
            report.warnings.append(
                f"the chat template drops reasoning_content when it renders a conversation: a "
                f"trainer that re-renders these rows trains on none of the "
                f"{self.reasoning_tokens:,} thinking tokens of {self.rows_with_reasoning:,} "
                "rows; use --format ids (token-faithful) instead"
            )
        if self.rows_without_system:
            report.warnings.append(
                f"{self.rows_without_system:,} rows were generated without a system message; "
                "SpecForge inserts its template's default system prompt into them"
            )


FORMAT = ExportFormat(
    name="conversations",
    summary="messages for trainers that re-render (SpecForge offline, ModelOpt): lossy",
    rows=ConversationBuilder,
    write=write_jsonl,
    needs_tokenizer=True,
)
