"""Speculative decoding in the simulated server: what SGLang reports, at a configured acceptance.

The simulation reports; it does not speed anything up (the capacity engine owns time). What it
reproduces, from SGLang 0.5.9 / 0.5.15.post1:

* ``/server_info``: the ``speculative_*`` ServerArgs at the top level and in every internal state,
  plus ``internal_states[i].avg_spec_accept_length`` once a verify step ran
  (``scheduler.get_internal_state``);
* the final ``meta_info`` of an answer: ``spec_verify_ct``, ``spec_accept_length``
  (= completion_tokens / spec_verify_ct), ``spec_accept_rate``, ``spec_accept_token_num`` and
  ``spec_draft_token_num``, only when ``spec_verify_ct > 0``
  (``tokenizer_manager._calculate_spec_decoding_metrics``). The first token comes from prefill,
  so a one-token answer ran no verify step and carries no ``spec_*`` key;
* ``/metrics``: the scheduler gauges ``sglang:spec_accept_length`` and ``sglang:spec_accept_rate``;
* the draft's KV dtype: SGLang's draft runner resolves ``--kv-cache-dtype auto`` from its own
  checkpoint and writes an fp8 resolution into the scheduler's shared args, so with
  ``draft_kv_cache_dtype`` set and ``auto`` requested, internal states report the draft's dtype.

Acceptance per answer varies deterministically around ``accept_length`` (seeded by the rid), as
real acceptance varies with the text, and is clamped to what a step can accept.
"""

from __future__ import annotations

import math
import zlib
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


class SimSpeculative(BaseModel):
    """``SimConfig.speculative``: the reported settings and the acceptance to simulate."""

    model_config = ConfigDict(extra="forbid")

    algorithm: str = "EAGLE3"
    draft_model_path: str = "AQ-MedAI/Kimi-K25-eagle3"
    num_steps: Annotated[int, Field(ge=1)] = 3
    eagle_topk: Annotated[int, Field(ge=1)] = 1
    num_draft_tokens: Annotated[int, Field(ge=2)] = 4
    accept_length: Annotated[float, Field(ge=1.0)] = 2.8
    """Mean tokens per verify step (the accepted drafts plus the target's own token)."""
    spread: Annotated[float, Field(ge=0.0, le=1.0)] = 0.2
    """Per-answer acceptance varies by up to this fraction either way."""
    accept_threshold_single: float = 1.0
    accept_threshold_acc: float = 1.0
    draft_kv_cache_dtype: str | None = None
    """What the draft resolved ``auto`` to (None: as the target)."""
    draft_kv_cache_dtype_arg: str | None = None
    """``--speculative-draft-kv-cache-dtype`` (0.5.23; None: follows ``--kv-cache-dtype``)."""

    @model_validator(mode="after")
    def _check(self) -> SimSpeculative:
        if self.accept_length > self.num_draft_tokens:
            raise ValueError("accept_length cannot exceed num_draft_tokens")
        return self


def server_args(spec: SimSpeculative | None, *, with_draft_kv: bool = False) -> dict[str, Any]:
    """The ``speculative_*`` ServerArgs keys (SGLang reports them, as None, when off);
    ``with_draft_kv``: the release has ``speculative_draft_kv_cache_dtype`` (0.5.23)."""
    draft_kv: dict[str, Any] = {"speculative_draft_kv_cache_dtype": None} if with_draft_kv else {}
    if spec is None:
        return draft_kv | {
            "speculative_algorithm": None,
            "speculative_draft_model_path": None,
            "speculative_num_steps": None,
            "speculative_eagle_topk": None,
            "speculative_num_draft_tokens": None,
            "speculative_accept_threshold_single": 1.0,
            "speculative_accept_threshold_acc": 1.0,
        }
    if with_draft_kv:
        draft_kv["speculative_draft_kv_cache_dtype"] = spec.draft_kv_cache_dtype_arg
    return draft_kv | {
        "speculative_algorithm": spec.algorithm,
        "speculative_draft_model_path": spec.draft_model_path,
        "speculative_num_steps": spec.num_steps,
        "speculative_eagle_topk": spec.eagle_topk,
        "speculative_num_draft_tokens": spec.num_draft_tokens,
        "speculative_accept_threshold_single": spec.accept_threshold_single,
        "speculative_accept_threshold_acc": spec.accept_threshold_acc,
    }


def internal_state(
    spec: SimSpeculative | None, *, requested_kv_dtype: str, tokens: int, verify_ct: int
) -> dict[str, Any]:
    """Keys an internal state adds or overrides: the draft's ``auto`` resolution and the measured
    acceptance of the answers served so far."""
    extra: dict[str, Any] = {}
    if spec is None:
        return extra
    if requested_kv_dtype == "auto" and spec.draft_kv_cache_dtype is not None:
        extra["kv_cache_dtype"] = spec.draft_kv_cache_dtype
    if verify_ct > 0:
        extra["avg_spec_accept_length"] = tokens / verify_ct
    return extra


def verify_count(spec: SimSpeculative, rid: str, completion_tokens: int) -> int:
    """Verify steps for an answer: the tokens after the prefill's one, at this answer's rate."""
    after_prefill = completion_tokens - 1
    if after_prefill <= 0:
        return 0
    jitter = (zlib.crc32(rid.encode()) % 2001) / 1000.0 - 1.0  # in [-1, 1]
    rate = spec.accept_length * (1.0 + spec.spread * jitter)
    rate = min(float(spec.num_draft_tokens), max(1.0, rate))
    return max(1, math.ceil(after_prefill / rate))


def meta_info(spec: SimSpeculative | None, rid: str, completion_tokens: int) -> dict[str, Any]:
    """The ``spec_*`` keys of a finished answer's ``meta_info`` (none when no verify ran)."""
    if spec is None:
        return {}
    verify_ct = verify_count(spec, rid, completion_tokens)
    if verify_ct == 0:
        return {}
    drafts = verify_ct * (spec.num_draft_tokens - 1)
    accepted = max(0, completion_tokens - 1 - verify_ct)
    return {
        "spec_accept_rate": accepted / drafts,
        "spec_accept_length": completion_tokens / verify_ct,
        "spec_accept_token_num": accepted,
        "spec_draft_token_num": drafts,
        "spec_verify_ct": verify_ct,
    }


def metrics_lines(spec: SimSpeculative | None, labels: list[str], accept: float) -> list[str]:
    """``sglang:spec_accept_length`` / ``spec_accept_rate`` gauges, one sample per rank label."""
    if spec is None:
        return []
    rate = (accept - 1.0) / (spec.num_draft_tokens - 1) if accept > 0 else 0.0
    lines: list[str] = []
    for metric, value, help_text in (
        ("spec_accept_length", accept, "The average acceptance length of speculative decoding."),
        ("spec_accept_rate", rate, "The average acceptance rate of speculative decoding."),
    ):
        lines += [f"# HELP sglang:{metric} {help_text}", f"# TYPE sglang:{metric} gauge"]
        lines += [f"sglang:{metric}{{{label}}} {float(value)}" for label in labels]
    return lines


class SpecTally:
    """What the server has verified so far: ``avg_spec_accept_length`` and the gauge read it."""

    def __init__(self) -> None:
        self.tokens = 0
        self.verify_ct = 0

    def finish(
        self, spec: SimSpeculative | None, rid: str, completion_tokens: int
    ) -> dict[str, Any]:
        """The answer's ``spec_*`` meta_info keys, counted into the tally."""
        keys = meta_info(spec, rid, completion_tokens)
        if keys:
            self.tokens += completion_tokens
            self.verify_ct += int(keys["spec_verify_ct"])
        return keys

    @property
    def accept_length(self) -> float:
        return self.tokens / self.verify_ct if self.verify_ct else 0.0


def loads_section(spec: SimSpeculative | None, accept: float) -> dict[str, Any]:
    """``/v1/loads`` ``speculative`` (S9 ``SpeculativeMetrics``), once a verify step ran."""
    if spec is None or accept <= 0:
        return {}
    rate = (accept - 1.0) / (spec.num_draft_tokens - 1)
    return {"speculative": {"accept_length": accept, "accept_rate": rate}}
