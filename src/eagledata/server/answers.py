"""What the server's answers mean, without HTTP: a status code and a body become a result or an
error of the tree.

``client`` and ``control`` (the modules that speak HTTP during a run) send the requests and
translate httpx's own exceptions; what comes back is read here, by status code, never by message
text: ``RetryableItemError`` (try again), ``RejectedRequestError`` (the request itself is bad),
``ServerError`` (the run cannot go on). ``responses`` holds the token contract of a ``/generate``
item that answered 200.
"""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import ValidationError

from eagledata.errors import (
    ContractViolationError,
    RejectedRequestError,
    RetryableItemError,
    ServerError,
    ServerUnavailableError,
)
from eagledata.server.bodies import Reply
from eagledata.server.generate_types import GenerateAnswer, GenerateRequest
from eagledata.server.responses import (
    GenerateResult,
    answer_error,
    check_answer,
    check_token_ids,
    error_message,
)


class ServerDownError(RetryableItemError):
    """The server did not accept a connection. Not the item's fault: it does not use an attempt."""

    reason = "server_down"


class QueueFullError(RetryableItemError):
    """HTTP 503: the server's waiting queue is full (``--max-queued-requests``). The server's
    backpressure, not the item's fault: it does not use an attempt (``run/attempts.py``)."""

    reason = "http_503"


def auth_error(url: str, status: int, api_key_env: str) -> ServerError:
    """SGLang's ``--api-key`` answers 401 on every route but /health and /metrics."""
    return ServerError(
        f"{url} refused the API key (HTTP {status}); set the right key in the environment "
        f"variable named by server.api_key_env ({api_key_env})"
    )


def generate_answer(
    reply: Reply,
    request: GenerateRequest,
    url: str,
    api_key_env: str,
    *,
    vocab_size: int | None = None,
    embedding_rows: int | None = None,
    stop_ids: frozenset[int] = frozenset(),
) -> GenerateResult:
    """A production ``/generate`` answer: a result that keeps the token contract, or an error
    (``stop_ids``: what stops this request, ``responses.check_answer``).

    A 200's body is parsed once, straight from its bytes into a ``GenerateAnswer``; only a
    body that fails that parse is read again, as plain JSON, to say what is wrong with it."""
    status, content = reply.status, reply.body
    if status == 200:
        try:
            answer = GenerateAnswer.model_validate_json(content)
        except ValidationError as invalid:
            try:
                item = orjson.loads(content)
            except orjson.JSONDecodeError:
                raise ContractViolationError(
                    f"{url}: POST /generate answered {reply.what_came()}, not JSON"
                ) from None
            raise answer_error(item, invalid) from None
        return check_answer(
            answer,
            request.input_ids,
            request.rid or "",
            url,
            max_new_tokens=request.max_new_tokens,
            vocab_size=vocab_size,
            embedding_rows=embedding_rows,
            stop_ids=stop_ids,
        )
    message = error_message(content)
    if status in (401, 403):
        raise auth_error(url, status, api_key_env)
    if status == 404:
        raise ServerError(f"{url} has no /generate route; is it an SGLang server?")
    if status == 503:
        raise QueueFullError(f"HTTP 503: {message}")
    if status >= 500 or status == 429:
        raise RetryableItemError(f"HTTP {status}: {message}", reason=f"http_{status}")
    raise RejectedRequestError(f"HTTP {status}: {message}", reason=f"http_{status}")


def canary_answer(
    url: str, reply: Reply, api_key_env: str, vocab_size: int | None = None
) -> dict[str, Any]:
    """A canary's ``/generate`` answer as parsed JSON (no token contract: the canary checks
    what it asked for), its ``output_ids`` inside the vocabulary (the model's embedding, when
    known: the canary compares ids, never decodes them, so a padding row is an id like any).
    ``ServerUnavailableError`` on 5xx, ``ServerError`` on a refusal (4xx) or an answer that
    cannot be one."""
    status, content = reply.status, reply.body
    if status in (401, 403):
        raise auth_error(url, status, api_key_env)
    if status >= 500:
        message = error_message(content)
        raise ServerUnavailableError(f"{url}: HTTP {status}: {message}")
    if status != 200:
        message = error_message(content)
        raise ServerError(f"{url} refused a canary request (HTTP {status}: {message})")
    answer = reply.json(url)
    if not isinstance(answer, dict):
        raise ServerError(reply.wrong_shape(url, "an object", answer))
    ids = answer.get("output_ids")
    if ids is not None:
        try:
            if not isinstance(ids, list):
                raise ContractViolationError("output_ids is not a list")
            check_token_ids(ids, vocab_size)
        except ContractViolationError as exc:
            raise ServerError(f"{url}: a canary answer broke the token contract: {exc}") from None
    return answer


def router_worker_urls(content: bytes, key: str) -> list[str] | None:
    """The worker URLs of a router's ``/workers`` (``key`` ``"workers"``) or ``/list_workers``
    (``"urls"``) answer, those the router marks unhealthy left out; None if it lists none."""
    try:
        body = orjson.loads(content)
    except orjson.JSONDecodeError:
        return None
    entries = body.get(key) if isinstance(body, dict) else None
    if not isinstance(entries, list):
        return None
    urls = []
    for entry in entries:
        if isinstance(entry, str):
            urls.append(entry.rstrip("/"))
        elif (
            isinstance(entry, dict)
            and isinstance(entry.get("url"), str)
            and entry.get("is_healthy") is not False
        ):
            urls.append(entry["url"].rstrip("/"))
    return urls
