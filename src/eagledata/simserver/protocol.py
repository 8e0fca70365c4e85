"""SGLang's answer shapes that the simulated server reproduces: JSON answers, refusals and abort
reasons."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from eagledata.errors import EagledataError

FinishReason = dict[str, Any]

JSON = "application/json"


def json_response(body: Any, status: int = 200) -> web.Response:
    """A JSON answer, as SGLang's routes give it."""
    return web.Response(body=orjson.dumps(body), status=status, content_type=JSON)


class SimRequestError(EagledataError):
    """A request the simulated server refuses; ``status`` and ``body`` are the HTTP answer."""

    def __init__(self, status: int, body: Any, *, plain_http: bool = False) -> None:
        super().__init__(orjson.dumps(body).decode())
        self.status = status
        self.body = body
        self.plain_http = plain_http
        """True when even a streaming request gets this as an HTTP error (schema checks)."""


def error_response(message: str, err_type: str, code: int) -> dict[str, Any]:
    """FastAPI's ErrorResponse body."""
    return {"object": "error", "message": message, "type": err_type, "param": None, "code": code}


def bad_value(message: str) -> SimRequestError:
    """The tokenizer manager's ValueError: 400 ``{"error":{"message":...}}``."""
    return SimRequestError(400, {"error": {"message": message}})


def bad_body(message: str) -> SimRequestError:
    """FastAPI's body type mismatch: 400 ErrorResponse."""
    return SimRequestError(400, error_response(message, "Bad Request", 400), plain_http=True)


def queue_full_body(message: str = "The request queue is full.") -> dict[str, Any]:
    return error_response(message, "503", 503)


def abort_reason(message: str, status: int | None, err_type: str | None) -> FinishReason:
    return {"type": "abort", "message": message, "status_code": status, "err_type": err_type}
