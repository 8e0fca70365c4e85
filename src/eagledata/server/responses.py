"""The ``/generate`` contract, without HTTP: request ids, and what a response must hold.

``client`` (with ``control``, the modules that speak HTTP during a run) sends the requests; this
module says what a request id looks like and turns one answer (a ``GenerateAnswer``, the wire
type of ``generate_types``) into a ``GenerateResult``, or into an error of the tree
(docs/sglang.md, "Finish reasons and aborts": an abort answered with HTTP 200 is a failure to
retry, not a record).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
from pydantic import ValidationError

from eagledata.errors import ContractViolationError, ItemError, RetryableItemError
from eagledata.server.generate_types import (
    FinishAbort,
    FinishStop,
    GenerateAnswer,
    GenerateRequest,
    MetaInfo,
)

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


RESPONSE_OVERHEAD_BYTES = 1 << 20
"""What a ``/generate`` answer may hold besides its tokens: ``meta_info`` and the keys around."""
RESPONSE_BYTES_PER_TOKEN = 2048
"""Per token the answer may hold: its id, and its text (a vocabulary token decodes to at most
``TEXT_CHARS_PER_TOKEN`` characters, each at most 6 bytes JSON-escaped), with room to spare."""
TEXT_CHARS_PER_TOKEN = 256
LOGPROB_BYTES = 64
"""One ``[logprob, id, text]`` entry of a logprob list (``text`` null unless asked for)."""


def response_bound(request: GenerateRequest) -> int:
    """The most bytes an honest answer to ``request`` can take: anything larger is refused
    unread (a server answering 50 MB to a request for 32 tokens is not to be believed, nor
    held in memory).

    Derived from what was asked: the tokens it may generate (``max_new_tokens``, plus the stop
    token) and, when logprobs are asked for, an entry per position and per top logprob.
    """
    asked = request.max_new_tokens
    prompt_len = len(request.input_ids)
    new_tokens = (asked if asked is not None else prompt_len) + 1
    bound = RESPONSE_OVERHEAD_BYTES + new_tokens * RESPONSE_BYTES_PER_TOKEN
    if request.return_logprob:
        start = request.logprob_start_len
        scored = prompt_len - start if start is not None and 0 <= start < prompt_len else 0
        top = request.top_logprobs_num
        width = 1 + (top if top is not None and top > 0 else 0)
        # token logprobs and top logprobs, for the input positions scored and each new token
        bound += (scored + new_tokens) * 2 * width * LOGPROB_BYTES
    return bound


def check_token_ids(
    ids: list[Any],
    vocab_size: int | None,
    what: str = "output_ids",
    *,
    embedding_rows: int | None = None,
) -> None:
    """Every id an int inside the tokenizer's vocabulary ``[0, vocab_size)``: nothing
    downstream (the quality flags decode them, the trainer embeds them) can take another.

    Real models pad their embedding past the tokenizer (``embedding_rows``, the model's
    ``vocab_size``), and a server can sample a padding row: such an id has no text, so it is
    named as what it is, apart from an id the model itself cannot hold."""
    # the common case at C speed (an answer may hold thousands of ids); the first offender
    # is looked for only when there is one
    if not ids or (
        set(map(type, ids)) == {int}
        and min(ids) >= 0
        and (vocab_size is None or max(ids) < vocab_size)
    ):
        return
    for position, token in enumerate(ids):
        if type(token) is not int:
            raise ContractViolationError(
                f"{what}[{position}] is {_shown(token)}, not an integer token id"
            )
        if token < 0 or (vocab_size is not None and token >= vocab_size):
            if vocab_size is not None and embedding_rows is not None:
                if vocab_size <= token < embedding_rows:
                    raise ContractViolationError(
                        f"{what}[{position}] is {token}: a padding row of the model's embedding "
                        f"(vocab_size {embedding_rows}) past the tokenizer's {vocab_size} "
                        "tokens; it has no text: the model is not trained or the server is "
                        "misconfigured",
                        reason="padding_id",
                    )
                if token >= embedding_rows:
                    raise ContractViolationError(
                        f"{what}[{position}] is {token}, outside the model's embedding "
                        f"(vocab_size {embedding_rows}) and the tokenizer's vocabulary "
                        f"[0, {vocab_size})"
                    )
            bound = f"[0, {vocab_size})" if vocab_size is not None else "[0, ...)"
            raise ContractViolationError(
                f"{what}[{position}] is {token}, outside the tokenizer's vocabulary {bound}"
            )


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _count(meta: dict[str, Any], key: str) -> None:
    value = meta.get(key)
    if type(value) is not int:
        raise ContractViolationError(f"meta_info.{key} is {_shown(value)}, not an integer")


def answer_error(item: Any, invalid: ValidationError) -> ItemError:
    """Why ``item`` (an answer parsed as plain JSON) is not a ``GenerateAnswer``: the error
    that breach has always read as, looked for in order (an abort wins over a malformed field:
    it is retried), else the parse's first complaint. Only a malformed answer comes here."""
    try:
        _explain(item)
    except ItemError as exc:
        return exc
    first = invalid.errors(include_url=False)[0]
    where = ".".join(str(part) for part in first["loc"]) or "response"
    return ContractViolationError(f"{where}: {first['msg']} (got {_shown(first['input'])})")


def _explain(item: Any) -> None:
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
    if kind not in ("stop", "length"):
        raise ContractViolationError(f"unknown finish_reason {finish!r}")
    _count(meta, "prompt_tokens")
    _count(meta, "completion_tokens")
    check_token_ids(output_ids, None)


def check_answer(
    answer: GenerateAnswer,
    input_ids: list[int],
    rid: str,
    server: str,
    *,
    max_new_tokens: int | None = None,
    vocab_size: int | None = None,
    embedding_rows: int | None = None,
    stop_ids: frozenset[int] = frozenset(),
) -> GenerateResult:
    """Check one ``/generate`` answer against the token contract (invariant 1) before anything
    reads it. Its types were checked by the parse (``GenerateAnswer``: every count and id a
    JSON integer); here, the counts against what was sent and returned, every id inside the
    vocabulary (``vocab_size``, the tokenizer's), no more ids than asked for
    (``max_new_tokens``, the stop token aside) and the text's length in proportion. A breach is
    ``ContractViolationError``: an item failure, never a record; an abort answered with HTTP
    200 is ``RetryableItemError``.

    An answer reported cut at its length whose last id is one of ``stop_ids`` (the ids that
    stop this request) ended on its stop token: 0.5.9 and 0.5.15.post1 check the length before
    the stop token, so they say ``length`` where 0.5.23 says ``stop`` for the same ids. It is
    read as 0.5.23 reports it (``stop``, that id matched): never flagged truncated, and its stop
    token never carried into a later turn's history as text."""
    meta = answer.meta_info
    output_ids = answer.output_ids
    finish = meta.finish_reason
    if isinstance(finish, FinishAbort):
        raise RetryableItemError(
            f"server aborted the request: {finish.message}", reason="server_abort"
        )
    prompt_tokens = meta.prompt_tokens
    completion_tokens = meta.completion_tokens
    if prompt_tokens != len(input_ids):
        raise ContractViolationError(
            f"server counted {prompt_tokens} prompt tokens, {len(input_ids)} were sent"
        )
    if completion_tokens != len(output_ids):
        raise ContractViolationError(
            f"server counted {completion_tokens} completion tokens, returned {len(output_ids)} ids"
        )
    if max_new_tokens is not None and completion_tokens > max_new_tokens + 1:
        raise ContractViolationError(
            f"server returned {completion_tokens} ids, {max_new_tokens} were asked for "
            "(max_new_tokens)"
        )
    # every id is an int already (the parse): only the range is left to look at, at C speed
    if output_ids and (min(output_ids) < 0 or (vocab_size and max(output_ids) >= vocab_size)):
        check_token_ids(output_ids, vocab_size, embedding_rows=embedding_rows)
    text = answer.text or ""
    if len(text) > TEXT_CHARS_PER_TOKEN * (len(output_ids) + 1):
        raise ContractViolationError(
            f"text holds {len(text):,} characters for {len(output_ids)} ids: more than any "
            "tokens decode to"
        )
    finish_reason: FinishReason
    matched: int | str | None
    if isinstance(finish, FinishStop):
        finish_reason, matched = "stop", finish.matched
    elif output_ids and output_ids[-1] in stop_ids:
        finish_reason, matched = "stop", output_ids[-1]  # cut at its length on its stop token
    else:
        finish_reason, matched = "length", None
    if type(matched) is int:
        check_token_ids(
            [matched], vocab_size, "finish_reason.matched", embedding_rows=embedding_rows
        )
    return GenerateResult(
        rid=rid,
        server=server,
        output_ids=output_ids,
        text=text,
        finish_reason=finish_reason,
        matched=matched,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        cached_tokens=meta.cached_tokens,
        e2e_latency=meta.e2e_latency,
        weight_version=meta.weight_version,
        spec_verify_ct=_spec_verify_ct(meta),
        retractions=_retractions(meta),
    )


def _spec_verify_ct(meta: MetaInfo) -> int | None:
    """SGLang (0.5.9 and 0.5.15 ``tokenizer_manager._calculate_spec_decoding_metrics``) puts
    ``spec_verify_ct`` in the final chunk's ``meta_info`` only with a speculative algorithm and at
    least one verify step; anything but a non-negative int reads as unknown."""
    value = meta.spec_verify_ct
    return value if value is not None and value >= 0 else None


def _retractions(meta: MetaInfo) -> int:
    """``total_retractions`` (0.5.9) or ``num_retractions`` (later); 0 when neither is a count."""
    for value in (meta.total_retractions, meta.num_retractions):
        if value is not None and value >= 0:
            return value
    return 0
