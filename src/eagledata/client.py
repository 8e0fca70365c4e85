"""Step 5: the only module that speaks HTTP to SGLang.

* Connections are sharded over several ``httpx.AsyncClient`` pools: one pool's cost grows with the
  square of its size (DESIGN.md, HTTP), so ``ceil(in_flight / connections_per_pool)`` small pools
  keep the client far from being the bottleneck.
* Work goes to the healthy server with the fewest requests in flight from us.
* Every response is checked against the token contract before it becomes a ``GenerateResult``.
* httpx exceptions are translated here, by type and status code, never by message text, into the
  error tree: ``RetryableItemError`` (try again), ``RejectedRequestError`` (the request itself is
  bad), ``ServerError`` (the run cannot go on).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from eagledata.errors import (
    ContractViolationError,
    RejectedRequestError,
    RetryableItemError,
    ServerError,
    ServerUnavailableError,
)

RID_PREFIX = "eagledata-"


def new_rid() -> str:
    """A request id that is never a prefix of another: SGLang aborts every rid starting with one.

    All rids have the same length (a fixed prefix and 32 hex digits), and two distinct strings of
    equal length cannot be prefixes of each other.
    """
    return RID_PREFIX + uuid.uuid4().hex


class ServerDownError(RetryableItemError):
    """The server did not accept a connection. Not the item's fault: it does not use an attempt."""

    reason = "server_down"


@dataclass(frozen=True, slots=True)
class GenerateResult:
    rid: str
    server: str
    output_ids: list[int]
    text: str
    finish_reason: str
    matched: int | str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None
    e2e_latency: float | None
    weight_version: str | None
    completed_at: float = field(default_factory=time.monotonic)


@dataclass(slots=True)
class Endpoint:
    url: str
    healthy: bool = True
    in_flight: int = 0
    requests: int = 0
    failures: int = 0


def _error_message(content: bytes) -> str:
    """SGLang's error bodies come in three shapes (sglang-api.md §3.5); find the message."""
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
    if kind not in ("stop", "length"):
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
        finish_reason=kind,
        matched=finish.get("matched") if kind == "stop" and isinstance(finish, dict) else None,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        cached_tokens=cached if isinstance(cached, int) else None,
        e2e_latency=float(latency) if isinstance(latency, (int, float)) else None,
        weight_version=meta.get("weight_version"),
    )


ReconnectCheck = Callable[[str], Awaitable[None]]


class SGLangClient:
    """Async client for one or more SGLang servers. Use as ``async with SGLangClient(...)``."""

    def __init__(
        self,
        urls: list[str],
        *,
        in_flight: int,
        connections_per_pool: int = 32,
        connect_timeout_s: float = 10.0,
        request_timeout_s: float = 3600.0,
        api_key: str | None = None,
        health_poll_s: float = 2.0,
    ) -> None:
        if not urls:
            raise ServerError("no server URL given; pass --server URL")
        self.endpoints = [Endpoint(url.rstrip("/")) for url in urls]
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = httpx.Timeout(connect_timeout_s, read=request_timeout_s, pool=None)
        self._pool_size = max(1, min(connections_per_pool, in_flight))
        self._pool_count = max(1, math.ceil(in_flight / self._pool_size))
        self._pools: list[httpx.AsyncClient] = []
        self._pool_load: list[int] = []
        self._health_poll_s = health_poll_s
        self._recovering = asyncio.Lock()

    @classmethod
    def api_key_from_env(cls, variable: str) -> str | None:
        return os.environ.get(variable) or None

    async def __aenter__(self) -> SGLangClient:
        limits = httpx.Limits(
            max_connections=self._pool_size, max_keepalive_connections=self._pool_size
        )
        self._pools = [
            httpx.AsyncClient(limits=limits, timeout=self._timeout, headers=self._headers)
            for _ in range(self._pool_count)
        ]
        # One small extra pool for control calls so they never queue behind generations.
        self._pools.append(httpx.AsyncClient(timeout=httpx.Timeout(30.0), headers=self._headers))
        self._pool_load = [0] * len(self._pools)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        pools, self._pools = self._pools, []
        await asyncio.gather(*(pool.aclose() for pool in pools), return_exceptions=True)

    @property
    def _control(self) -> httpx.AsyncClient:
        if not self._pools:
            raise RuntimeError("SGLangClient used outside 'async with'")
        return self._pools[-1]

    def _pick_pool(self) -> int:
        loads = self._pool_load[:-1]
        return loads.index(min(loads))

    def pick_endpoint(self) -> Endpoint:
        healthy = [endpoint for endpoint in self.endpoints if endpoint.healthy]
        if not healthy:
            raise ServerDownError("no server is reachable", reason="server_down")
        return min(healthy, key=lambda endpoint: endpoint.in_flight)

    # --- the data path ---------------------------------------------------------------------

    async def generate(
        self, input_ids: list[int], sampling_params: dict[str, Any], rid: str
    ) -> GenerateResult:
        """One attempt at one generation. Raises an ``ItemError`` or a ``ServerError``."""
        endpoint = self.pick_endpoint()
        pool_index = self._pick_pool()
        body = orjson.dumps(
            {"input_ids": input_ids, "sampling_params": sampling_params, "rid": rid}
        )
        endpoint.in_flight += 1
        endpoint.requests += 1
        self._pool_load[pool_index] += 1
        try:
            response = await self._pools[pool_index].post(
                endpoint.url + "/generate",
                content=body,
                headers={"Content-Type": "application/json"},
            )
        except httpx.ConnectError as exc:
            endpoint.healthy = False
            raise ServerDownError(f"{endpoint.url}: cannot connect ({exc})") from None
        except httpx.TimeoutException:
            await self.abort(endpoint.url, rid)
            raise RetryableItemError(
                f"{endpoint.url}: request timed out", reason="timeout"
            ) from None
        except asyncio.CancelledError:
            await self.abort(endpoint.url, rid)
            raise
        except httpx.TransportError as exc:  # reset, remote protocol error, read error
            endpoint.failures += 1
            raise RetryableItemError(
                f"{endpoint.url}: connection lost ({type(exc).__name__})", reason="connection_lost"
            ) from None
        finally:
            endpoint.in_flight -= 1
            self._pool_load[pool_index] -= 1
        return self._parse_response(response, input_ids, rid, endpoint)

    def _parse_response(
        self, response: httpx.Response, input_ids: list[int], rid: str, endpoint: Endpoint
    ) -> GenerateResult:
        status = response.status_code
        if status == 200:
            try:
                item = orjson.loads(response.content)
            except orjson.JSONDecodeError:
                raise ContractViolationError("response body is not JSON") from None
            return parse_generate_item(item, input_ids, rid, endpoint.url)
        endpoint.failures += 1
        message = _error_message(response.content)
        if status in (401, 403):
            raise ServerError(
                f"{endpoint.url} refused the API key (HTTP {status}); set the right key in the "
                "environment variable named by server.api_key_env"
            )
        if status == 404:
            raise ServerError(f"{endpoint.url} has no /generate route; is it an SGLang server?")
        if status >= 500 or status == 429:
            raise RetryableItemError(f"HTTP {status}: {message}", reason=f"http_{status}")
        raise RejectedRequestError(f"HTTP {status}: {message}", reason=f"http_{status}")

    # --- control calls ---------------------------------------------------------------------

    async def abort(self, url: str, rid: str) -> None:
        """Ask the server to stop a generation we gave up on, so it stops holding KV cache."""
        # Best effort: the server also aborts a request whose client disconnected.
        with contextlib.suppress(httpx.HTTPError, asyncio.CancelledError, RuntimeError):
            await asyncio.shield(
                self._control.post(url + "/abort_request", json={"rid": rid}, timeout=5.0)
            )

    async def health(self, url: str) -> bool:
        try:
            response = await self._control.get(url + "/health", timeout=30.0)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def server_info(self, url: str) -> dict[str, Any]:
        """The server's ``/server_info`` (``/get_server_info`` on older builds)."""
        last_error = ""
        for route in ("/server_info", "/get_server_info"):
            try:
                response = await self._control.get(url + route)
            except httpx.HTTPError as exc:
                raise ServerUnavailableError(f"{url}: cannot read {route}: {exc!r}") from None
            if response.status_code == 200:
                body = orjson.loads(response.content)
                if isinstance(body, dict):
                    return body
                last_error = f"{route} returned {type(body).__name__}"
            else:
                last_error = f"{route} answered HTTP {response.status_code}"
        raise ServerError(f"{url}: no server facts ({last_error}); is it an SGLang server?")

    async def revive(self, on_reconnect: ReconnectCheck) -> list[str]:
        """Probe servers marked down; bring back those that answer and pass ``on_reconnect``."""
        revived = []
        for endpoint in self.endpoints:
            if not endpoint.healthy and await self.health(endpoint.url):
                await on_reconnect(endpoint.url)
                endpoint.healthy = True
                revived.append(endpoint.url)
        return revived

    async def wait_until_healthy(
        self, deadline_s: float, on_reconnect: ReconnectCheck, on_wait: Callable[[str], None]
    ) -> None:
        """Block until some server is healthy again, or raise ``ServerUnavailableError``.

        Single-flight: concurrent callers share one poll. A server only counts as back once
        ``on_reconnect`` (the KV guard) has passed for it.
        """
        async with self._recovering:
            if any(endpoint.healthy for endpoint in self.endpoints):
                return
            urls = ", ".join(endpoint.url for endpoint in self.endpoints)
            on_wait(f"no server reachable ({urls}); waiting up to {deadline_s:.0f}s")
            give_up = time.monotonic() + deadline_s
            while True:
                if await self.revive(on_reconnect):
                    on_wait("server back; resuming")
                    return
                if time.monotonic() >= give_up:
                    raise ServerUnavailableError(
                        f"no server answered /health for {deadline_s:.0f}s ({urls}); the run is "
                        "saved: start the server and run 'eagledata resume RUN_DIR'"
                    )
                await asyncio.sleep(self._health_poll_s)
