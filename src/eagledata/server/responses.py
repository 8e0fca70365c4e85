"""The ``/generate`` contract, without HTTP: request ids, and what a response must hold.

``client`` (the only module that speaks HTTP) sends the requests; this module says what a request
id looks like and turns one response item into a ``GenerateResult``, or into an error of the tree
(docs/sglang.md, "Finish reasons and aborts": an abort answered with HTTP 200 is a failure to
retry, not a record).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from eagledata.errors import ContractViolationError, RetryableItemError

RID_PREFIX = "eagledata-"


def new_rid() -> str:
    """A request id that is never a prefix of another: SGLang aborts every rid starting with one.

    All rids have the same length (a fixed prefix and 32 hex digits), and two distinct strings of
    equal length cannot be prefixes of each other.
    """
    return RID_PREFIX + uuid.uuid4().hex


FinishReason = Literal["stop", "length"]


@dataclass(frozen=True, slots=True)
class GenerateResult:
    rid: str
    server: str
    output_ids: list[int]
    text: str
    finish_reason: FinishReason
    matched: int | str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None
    e2e_latency: float | None
    weight_version: str | None
    completed_at: float = field(default_factory=time.monotonic)
    spec_verify_ct: int | None = None
    """Speculative verify steps SGLang ran for this answer (``meta_info.spec_verify_ct``); None
    without speculative decoding, and when no verify step ran (a one-token answer)."""
    retractions: int = 0
    """Times the server retracted this request (``meta_info.total_retractions``, S9, or
    ``num_retractions``, later): each one cost a re-prefill."""


def error_message(content: bytes) -> str:
    """SGLang's error bodies come in three shapes (docs/sglang.md, "HTTP status and error
    bodies"); find the message."""
    try:
        body = orjson.loads(content)
    except orjson.JSONDecodeError:
        return content.decode("utf-8", "replace").strip()[:300] or "(empty body)"
    if isinstance(body, dict):
        error = body.get("error", body.get("message"))
        if isinstance(error, dict):
            error = error.get("message")
        if error is not None:
            return str(error)[:300]
    return str(body)[:300]


def parse_generate_item(item: Any, input_ids: list[int], rid: str, server: str) -> GenerateResult:
    """Check one ``/generate`` item against the token contract (invariant 1)."""
    if not isinstance(item, dict):
        raise ContractViolationError(f"response is {type(item).__name__}, not an object")
    meta = item.get("meta_info")
    output_ids = item.get("output_ids")
    if not isinstance(meta, dict) or not isinstance(output_ids, list):
        raise ContractViolationError("response lacks meta_info or output_ids")
    finish = meta.get("finish_reason")
    kind = finish.get("type") if isinstance(finish, dict) else None
    if kind == "abort":
        message = finish.get("message") if isinstance(finish, dict) else None
        raise RetryableItemError(f"server aborted the request: {message}", reason="server_abort")
    if kind == "stop":
        finish_reason: FinishReason = "stop"
    elif kind == "length":
        finish_reason = "length"
    else:
        raise ContractViolationError(f"unknown finish_reason {finish!r}")
    prompt_tokens = meta.get("prompt_tokens")
    completion_tokens = meta.get("completion_tokens")
    if prompt_tokens != len(input_ids):
        raise ContractViolationError(
            f"server counted {prompt_tokens} prompt tokens, {len(input_ids)} were sent"
        )
    if completion_tokens != len(output_ids):
        raise ContractViolationError(
            f"server counted {completion_tokens} completion tokens, returned {len(output_ids)} ids"
        )
    if not all(type(token) is int for token in output_ids):
        raise ContractViolationError("output_ids holds a non-integer")
    text = item.get("text")
    cached = meta.get("cached_tokens")
    latency = meta.get("e2e_latency")
    return GenerateResult(
        rid=rid,
        server=server,
        output_ids=output_ids,
        text=text if isinstance(text, str) else "",
        finish_reason=finish_reason,
        matched=finish.get("matched") if kind == "stop" and isinstance(finish, dict) else None,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        cached_tokens=cached if isinstance(cached, int) else None,
        e2e_latency=float(latency) if isinstance(latency, (int, float)) else None,
        weight_version=meta.get("weight_version"),
        spec_verify_ct=_spec_verify_ct(meta),
        retractions=_retractions(meta),
    )


def _spec_verify_ct(meta: dict[str, Any]) -> int | None:
    """SGLang (0.5.9 and 0.5.15 ``tokenizer_manager._calculate_spec_decoding_metrics``) puts
    ``spec_verify_ct`` in the final chunk's ``meta_info`` only with a speculative algorithm and at
    least one verify step; anything but a non-negative int reads as unknown."""
    value = meta.get("spec_verify_ct")
    return value if type(value) is int and value >= 0 else None


def _retractions(meta: dict[str, Any]) -> int:
    for key in ("total_retractions", "num_retractions"):
        value = meta.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return 0
