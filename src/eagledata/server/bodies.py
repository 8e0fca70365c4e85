"""Every body a server sends, read under a cap as it is decompressed, and parsed in one checked
place: what the client holds of an answer is never more than a few MB past its cap, and a
server that answers something else than JSON is said in one line, never a traceback.

SGLang never compresses its answers, and every request says ``Accept-Encoding: identity``
(``IDENTITY``). A proxy between may still encode one (``gzip``, ``deflate``, nested as in
``gzip, gzip``): the raw bytes are read as they come (``aiter_raw``) and inflated here in pieces
of at most ``STEP_BYTES``, the cap checked after each piece. httpx's own decoding would inflate a
whole network chunk at once, without a bound (a 3.6 kB answer can hold 2 GiB), and hold the
event loop while it does, so that no deadline fires. Any other encoding (``br``, ``zstd``) is
refused unread.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from eagledata.errors import ServerError

IDENTITY = {"Accept-Encoding": "identity"}
"""Sent with every request: SGLang does not compress, and nothing between should either."""

STEP_BYTES = 64 * 1024
"""The most one decompression step produces before the cap is looked at again."""

CONTROL_BODY_BOUND = 8 << 20
"""The most a control answer (``/health``, ``/server_info``, ``/metrics``, ``/v1/loads``,
``/get_load``, a router's workers, an abort) may hold: a real ``/server_info`` is ~20 kB and
``/metrics`` of a DP-16 server a few hundred kB."""


class BodyTooLarge(Exception):
    """A body past its cap: refused before it is read (or inflated) whole."""


class BodyUnreadable(Exception):
    """A body in an encoding eagledata does not decode, or a corrupt compressed stream."""


class _Deflate:
    """``Content-Encoding: deflate``: zlib-wrapped as the standard says, or raw deflate as some
    servers send it (httpx reads both; so does this)."""

    def __init__(self) -> None:
        self._inner = zlib.decompressobj()
        self._started = False

    def decompress(self, data: bytes, max_length: int) -> bytes:
        if not self._started:
            self._started = True
            try:
                return self._inner.decompress(data, max_length)
            except zlib.error:
                self._inner = zlib.decompressobj(-zlib.MAX_WBITS)
        return self._inner.decompress(data, max_length)

    @property
    def unconsumed_tail(self) -> bytes:
        return self._inner.unconsumed_tail


def _stage(encoding: str) -> Any:
    if encoding in ("gzip", "x-gzip"):
        return zlib.decompressobj(zlib.MAX_WBITS | 16)
    if encoding == "deflate":
        return _Deflate()
    raise BodyUnreadable(f"it is sent with Content-Encoding {encoding!r}, which is not decoded")


class BoundedBody:
    """The body of one answer, fed its raw bytes as they arrive and decoded in bounded steps:
    ``BodyTooLarge`` as soon as more than ``bound`` bytes (raw or decoded) have come."""

    def __init__(self, content_encoding: str, bound: int) -> None:
        encodings = [part.strip().lower() for part in content_encoding.split(",")]
        encodings = [part for part in encodings if part and part != "identity"]
        # listed in the order they were applied: undone last to first
        self._stages = [_stage(encoding) for encoding in reversed(encodings)]
        self.encoded = bool(self._stages)
        self.bound = bound
        self.raw_bytes = 0
        self._body = bytearray()

    def feed(self, raw: bytes) -> None:
        self.raw_bytes += len(raw)
        if self.raw_bytes > self.bound:
            raise BodyTooLarge(f"it passed {self.bound:,} bytes")
        try:
            for piece in self._inflate(0, raw):
                self._body += piece
                if len(self._body) > self.bound:
                    raise BodyTooLarge(f"it passed {self.bound:,} bytes once decompressed")
        except zlib.error as exc:
            raise BodyUnreadable(f"its compressed body is corrupt ({exc})") from None

    def _inflate(self, index: int, data: bytes) -> Iterator[bytes]:
        """``data`` through the stages from ``index`` on, in pieces of at most ``STEP_BYTES``;
        a stage is asked again with nothing new until it has nothing left to give."""
        if index == len(self._stages):
            if data:
                yield data
            return
        stage = self._stages[index]
        pending = data
        while True:
            piece = stage.decompress(pending, STEP_BYTES)
            pending = stage.unconsumed_tail
            if piece:
                yield from self._inflate(index + 1, piece)
            elif not pending:
                return

    def content(self) -> bytes:
        return bytes(self._body)


def check_declared(response: httpx.Response, bound: int) -> None:
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > bound:
        raise BodyTooLarge(f"it declares {int(declared):,} bytes")


def _already_read(response: httpx.Response, bound: int) -> bytes | None:
    """The body of a response built whole in memory (a test's mock transport), else None."""
    if not response.is_stream_consumed:
        return None
    if len(response.content) > bound:
        raise BodyTooLarge(f"it passed {bound:,} bytes")
    return response.content


async def read_bounded(response: httpx.Response, bound: int) -> bytes:
    """The body of a streamed ``response``, at most ``bound`` bytes decoded (``BodyTooLarge``
    past that, the rest never read)."""
    check_declared(response, bound)
    whole = _already_read(response, bound)
    if whole is not None:
        return whole
    body = BoundedBody(response.headers.get("content-encoding", ""), bound)
    async for chunk in response.aiter_raw():
        body.feed(chunk)
    return body.content()


@dataclass(frozen=True, slots=True)
class Reply:
    """One answer read whole under its cap: what the checked parse needs."""

    method: str
    route: str
    status: int
    content_type: str
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self, url: str) -> Any:
        """The body as JSON; one line naming the route and what came back otherwise."""
        try:
            return orjson.loads(self.body)
        except orjson.JSONDecodeError:
            raise ServerError(self.not_json(url)) from None

    def what_came(self) -> str:
        kind = self.content_type.split(";")[0].strip() or "no Content-Type"
        shown = " ".join(self.text[:60].split())
        return f"{self.status} with {kind} ({'`' + shown + '...`' if shown else 'empty'})"

    def not_json(self, url: str) -> str:
        return (
            f"{url}: {self.method} {self.route} answered {self.what_came()}, not JSON: is "
            f"{url} an SGLang server?"
        )

    def wrong_shape(self, url: str, expected: str, got: object) -> str:
        return (
            f"{url}: {self.method} {self.route} answered {type(got).__name__}, not {expected}: "
            f"is {url} an SGLang server?"
        )


async def get_bounded(
    client: httpx.AsyncClient, url: str, route: str, *, bound: int = CONTROL_BODY_BOUND
) -> Reply:
    """``GET url+route``, its body read under ``bound``. The caller bounds the whole call."""
    async with client.stream("GET", url + route, headers=IDENTITY) as response:
        body = await read_bounded(response, bound)
        return Reply(
            "GET", route, response.status_code, response.headers.get("content-type", ""), body
        )


def get_bounded_sync(
    client: httpx.Client,
    url: str,
    route: str,
    *,
    deadline_s: float,
    bound: int = CONTROL_BODY_BOUND,
) -> Reply:
    """``GET url+route`` on a blocking client, its body under ``bound`` and the whole call
    within ``deadline_s``: no read waits past what is left of it, and the time is looked at
    after each, so a server dripping a byte at a time is cut off (``httpx.ReadTimeout``)."""
    give_up = time.monotonic() + deadline_s

    def left() -> float:
        remaining = give_up - time.monotonic()
        if remaining <= 0:
            raise httpx.ReadTimeout(f"no whole answer within {deadline_s:g}s")
        return remaining

    timeout = httpx.Timeout(min(left(), 5.0), read=left(), write=left(), pool=left())
    with client.stream("GET", url + route, headers=IDENTITY, timeout=timeout) as response:
        check_declared(response, bound)
        content = _already_read(response, bound)
        if content is None:
            body = BoundedBody(response.headers.get("content-encoding", ""), bound)
            for chunk in response.iter_raw():
                body.feed(chunk)
                left()
            content = body.content()
        return Reply(
            "GET", route, response.status_code, response.headers.get("content-type", ""), content
        )
