"""The control calls to an SGLang server, beside the data path: ``/health``, its facts
(``/server_info``), its live load (the signals of ``server/load_signals.py``), the workers of an
sglang-router, and aborting a generation given up on.

``SGLangClient`` (``server/client.py``) holds one ``ControlCalls`` over its own pools and offers
its calls: the control pool's own deadline (``CONTROL_DEADLINE_S``, on the whole call), every
body read under ``CONTROL_BODY_BOUND`` as it is decompressed and parsed by ``bodies.Reply``
(``server/bodies.py``), and a refused key said as such.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import httpx

from eagledata.errors import ServerError, ServerUnavailableError
from eagledata.server.answers import auth_error, router_worker_urls
from eagledata.server.bodies import (
    IDENTITY,
    BodyTooLarge,
    BodyUnreadable,
    Reply,
    get_bounded,
    read_bounded,
)
from eagledata.server.load_signals import LOAD_SIGNALS
from eagledata.server.loads import ServerLoad
from eagledata.server.pools import Pools

LOADS_ROUTE = LOAD_SIGNALS["loads"].route
"""The sections eagledata reads; every release from 0.5.8 knows these four names (an unknown
one is a 400 in 0.5.23, ``managers/load_snapshot.py``)."""

CONTROL_DEADLINE_S = 30.0
"""A control call's whole life (health, server facts, loads, an abort): connect to last byte."""


class ControlCalls:
    """The control calls of a client over ``pools`` (its control pool)."""

    def __init__(self, pools: Pools, api_key_env: str) -> None:
        self._pools = pools
        self._api_key_env = api_key_env
        self._missing_load_routes: dict[str, set[str]] = {}

    async def abort(self, url: str, rid: str) -> None:
        """Ask the server to stop a generation we gave up on, so it stops holding KV cache.

        Best effort: the server also aborts a request whose client disconnected. The request is
        its own task, shielded, so that a cancelled caller still sends it; that task's end is
        always retrieved (``_send_abort`` keeps every failure to itself, and a done callback
        reads whatever is left), never printed by the loop as "Task exception was never
        retrieved" (a dripping server once gave ~60 such tracebacks)."""
        sending = asyncio.get_running_loop().create_task(
            self._send_abort(url, rid), name=f"abort {rid}"
        )
        sending.add_done_callback(_retrieve)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(sending)

    async def _send_abort(self, url: str, rid: str) -> None:
        with contextlib.suppress(Exception):
            async with (
                asyncio.timeout(5.0),
                self._pools.control.stream(
                    "POST", url + "/abort_request", json={"rid": rid}, headers=IDENTITY
                ) as response,
            ):
                await read_bounded(response, 1 << 16)

    async def _control_get(self, url: str, route: str) -> Reply:
        """GET on the control pool (``CONTROL_DEADLINE_S`` for the whole call, decompression
        and all), tried once more if a pooled keep-alive connection was closed under us: that
        is not a dead server, and must not mark one down. A body past its cap, or in an
        encoding not decoded, is ``ServerError`` naming the route."""
        try:
            async with asyncio.timeout(CONTROL_DEADLINE_S):
                try:
                    return await get_bounded(self._pools.control, url, route)
                except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError):
                    return await get_bounded(self._pools.control, url, route)
        except TimeoutError:
            raise httpx.ReadTimeout(f"no whole answer within {CONTROL_DEADLINE_S:g}s") from None
        except (BodyTooLarge, BodyUnreadable) as exc:
            raise ServerError(
                f"{url}: GET {route} answer refused unread: {exc}; is {url} an SGLang server?"
            ) from None

    async def health(self, url: str) -> bool:
        try:
            reply = await self._control_get(url, "/health")
        except (httpx.HTTPError, ServerError):
            return False
        return reply.status == 200

    async def _read_control_route(self, url: str, route: str) -> Reply:
        """GET a control route; an unreachable server and a refused key become our errors."""
        try:
            reply = await self._control_get(url, route)
        except httpx.HTTPError as exc:
            raise ServerUnavailableError(f"{url}: cannot read {route}: {exc!r}") from None
        if reply.status in (401, 403):
            raise auth_error(url, reply.status, self._api_key_env)
        return reply

    async def server_info(self, url: str) -> dict[str, Any]:
        """The server's ``/server_info`` (``/get_server_info`` on older builds)."""
        last_error = ""
        for route in ("/server_info", "/get_server_info"):
            reply = await self._read_control_route(url, route)
            if reply.status == 200:
                body = reply.json(url)
                if isinstance(body, dict):
                    return body
                raise ServerError(reply.wrong_shape(url, "an object", body))
            last_error = f"{route} answered HTTP {reply.status}"
        raise ServerError(f"{url}: no server facts ({last_error}); is it an SGLang server?")

    async def read_load(self, url: str) -> ServerLoad | None:
        """The server's live load from the best signal it offers (``server/load_signals.py``,
        best first), with what a supplementing one adds to it. None when it offers none or
        cannot be reached; a route that answers 404 once is not asked again."""
        missing = self._missing_load_routes.setdefault(url, set())
        found: ServerLoad | None = None
        for signal in LOAD_SIGNALS.values():
            if signal.path in missing or (found is not None and signal.supplements is None):
                continue
            answer = await self._load_route(url, signal.route, missing, text=signal.text)
            load = signal.parse(answer) if answer is not None else None
            if load is None:
                continue
            if found is None:
                found = load
            elif signal.supplements is not None:
                found = signal.supplements(found, load)
        return found

    async def _load_route(
        self, url: str, route: str, missing: set[str], *, text: bool = False
    ) -> Any:
        try:
            reply = await self._control_get(url, route)
        except httpx.HTTPError:
            return None
        if reply.status in (404, 405):
            missing.add(route.split("?")[0])
            return None
        if reply.status != 200:
            return None
        if text:
            return reply.text
        return reply.json(url)

    async def router_workers(self, url: str) -> list[str] | None:
        """The workers behind an sglang-router at ``url``; None when ``url`` is no router.

        sglang-router 0.3 answers ``GET /workers`` with ``{"workers": [{"url", "is_healthy",
        ...}]}``, older ones ``GET /list_workers`` with ``{"urls": [...]}``; an SGLang server has
        neither route (404). Workers the router itself marks unhealthy get no traffic from it and
        are left out.
        """
        for route, key in (("/workers", "workers"), ("/list_workers", "urls")):
            reply = await self._read_control_route(url, route)
            if reply.status != 200:
                continue
            urls = router_worker_urls(reply.body, key)
            if urls is not None:
                return urls
        return None


def _retrieve(task: asyncio.Task[None]) -> None:
    """Read a finished task's outcome, so that the loop never reports it as unretrieved."""
    if not task.cancelled():
        task.exception()
