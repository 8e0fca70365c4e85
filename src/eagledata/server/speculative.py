"""Speculative decoding as a running SGLang server reports it, and what the guard asks of it.

What SGLang says (read in the 0.5.9 and 0.5.15.post1 wheels):

* ``/server_info`` carries every ServerArgs field, so ``speculative_algorithm`` (``EAGLE3``...),
  ``speculative_draft_model_path``, ``speculative_num_steps``, ``speculative_eagle_topk``,
  ``speculative_num_draft_tokens`` and the two acceptance thresholds are at the top level and in
  every ``internal_states[i]`` (the scheduler's own copy, updatable at run time:
  ``/set_internal_state`` may change exactly the thresholds).
  ``internal_states[i].avg_spec_accept_length`` is the rank's mean accepted tokens per verify
  step since start, once a verify step ran (``scheduler.get_internal_state``).
* There is no separate draft KV dtype. The draft ``ModelRunner`` reads the same
  ``--kv-cache-dtype`` (``model_runner.configure_kv_cache_dtype``); when that is ``auto`` it
  resolves it from *its own* checkpoint and writes an fp8 resolution into the scheduler's shared
  args, so ``internal_states[i].kv_cache_dtype`` is the draft's dtype as much as the target's.
  ``memory_usage`` is the target pool only: bytes per token cannot check the draft.
* The final ``meta_info`` of an answer has ``spec_verify_ct`` (verify steps) and
  ``spec_accept_length`` (= completion_tokens / spec_verify_ct), when at least one verify ran.

Losslessness: EAGLE verification with both thresholds at 1.0 is speculative sampling, whose
output distribution is the target's own. ``--speculative-accept-threshold-single`` below 1 accepts
a draft token whenever its target probability passes it, and ``--speculative-accept-threshold-acc``
below 1 raises an acceptance probability p to min(1, p / threshold) (the flags' own help text):
both trade the target distribution for speed, so the guard refuses them like an fp8 KV cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

LOSSLESS_THRESHOLD = 1.0
"""SGLang's default for both acceptance thresholds: exact speculative sampling."""


class SpeculativeSettings(BaseModel):
    """A server's speculative decoding settings, and its measured acceptance when known."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    algorithm: str
    draft_model_path: str | None = None
    num_steps: int | None = None
    eagle_topk: int | None = None
    num_draft_tokens: int | None = None
    accept_threshold_single: float | None = None
    accept_threshold_acc: float | None = None
    accept_length: float | None = None
    """Mean tokens per verify step, as the server measured it (mean over the ranks reporting
    ``avg_spec_accept_length``); None before the first verify step."""

    def describe(self) -> str:
        """``EAGLE3, draft X, 3 steps x top-k 1, 4 draft tokens``."""
        parts = [self.algorithm]
        if self.draft_model_path:
            parts.append(f"draft {self.draft_model_path}")
        if self.num_steps is not None:
            parts.append(f"{self.num_steps} steps x top-k {_unknown(self.eagle_topk)}")
        if self.num_draft_tokens is not None:
            parts.append(f"{self.num_draft_tokens} draft tokens")
        return ", ".join(parts)


def _unknown(value: object) -> str:
    return "?" if value is None else str(value)


def settings_from_facts(
    *,
    algorithm: str | None,
    draft_model_path: str | None,
    num_steps: int | None,
    eagle_topk: int | None,
    num_draft_tokens: int | None,
    accept_threshold_single: float | None,
    accept_threshold_acc: float | None,
    rank_accept_lengths: Sequence[float | None],
) -> SpeculativeSettings | None:
    """The settings, or None when the server runs no speculative algorithm."""
    if not algorithm or algorithm.lower() in ("none", "null"):
        return None
    measured = [value for value in rank_accept_lengths if value is not None and value > 0]
    return SpeculativeSettings(
        algorithm=algorithm,
        draft_model_path=draft_model_path,
        num_steps=num_steps,
        eagle_topk=eagle_topk,
        num_draft_tokens=num_draft_tokens,
        accept_threshold_single=accept_threshold_single,
        accept_threshold_acc=accept_threshold_acc,
        accept_length=sum(measured) / len(measured) if measured else None,
    )


def threshold_problems(where: str, single: float | None, acc: float | None) -> list[str]:
    """Refusals for relaxed acceptance (lossy), one per threshold below 1."""
    problems = []
    for name, value in (("single", single), ("acc", acc)):
        if value is not None and value < LOSSLESS_THRESHOLD:
            problems.append(
                f"{where}speculative_accept_threshold_{name} is {value:g}: relaxed acceptance "
                "is lossy (keep it at 1.0)"
            )
    return problems


def speculative_guard(
    settings: SpeculativeSettings,
    *,
    requested_kv_dtype: str | None,
    rank_thresholds: Sequence[tuple[float | None, float | None]],
) -> tuple[list[str], list[str]]:
    """The guard's problems and notes for a speculative server (beyond the KV checks all get)."""
    problems = threshold_problems(
        "", settings.accept_threshold_single, settings.accept_threshold_acc
    )
    for index, (rank_single, rank_acc) in enumerate(rank_thresholds):
        for problem in threshold_problems(f"internal_states[{index}].", rank_single, rank_acc):
            if problem not in problems:
                problems.append(problem)
    if requested_kv_dtype == "auto":
        problems.append(
            "kv_cache_dtype is 'auto' with speculative decoding: the draft model resolves it from "
            "its own checkpoint and server_info shows one resolution for both"
        )
    notes = [
        "speculative: draft KV follows kv_cache_dtype (checked above); bytes per token cover the "
        "target pool only"
    ]
    return problems, notes


def format_speculative(settings: SpeculativeSettings | None) -> str:
    """The ``check-server`` line."""
    if settings is None:
        return "off"
    text = settings.describe()
    if settings.accept_length is not None:
        text += f"; measured acceptance {settings.accept_length:.2f} tokens/step"
    else:
        text += "; acceptance not measured yet"
    return text


def speculative_json(settings: SpeculativeSettings | None) -> dict[str, Any] | None:
    return None if settings is None else settings.model_dump()
