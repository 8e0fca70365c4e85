"""Step 5: the async client that speaks HTTP to SGLang during a run (its control calls in
``control``).

* Connections are sharded over many small ``httpx.AsyncClient`` pools, per server (``pools``:
  why, and how many), and a request goes to the least loaded.
* Work goes to the healthy server with the fewest requests in flight from us.
* A request is a ``GenerateRequest`` and its answer is parsed once, from the bytes, into a
  ``GenerateAnswer`` (``generate_types``), checked against the token contract (``responses``)
  before it becomes a ``GenerateResult``; its body is read with a size cap derived from the
  request (``responses.response_bound``: a larger one is refused unread, and a compressed one is
  inflated in bounded steps, the cap looked at after each: ``bodies``), and the whole request,
  not only the gap between two reads, has a deadline (``request_timeout_s``) that no
  decompression can outlast.
* httpx exceptions are translated here, by type, never by message text, into the error tree;
  status codes and bodies are read by ``answers``: ``RetryableItemError`` (try again),
  ``RejectedRequestError`` (the request itself is bad), ``ServerError`` (the run cannot go on).
* The control calls (health, server facts, loads, router workers, abort) are a ``ControlCalls``
  it holds (``control``) and offers; reviving servers marked down is here.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from eagledata.errors import (
    ContractViolationError,
    ItemError,
    RetryableItemError,
    ServerError,
    ServerUnavailableError,
)
from eagledata.server.answers import ServerDownError, canary_answer, generate_answer
from eagledata.server.bodies import IDENTITY, BodyTooLarge, BodyUnreadable, Reply, read_bounded
from eagledata.server.budget import SlotGate, TrafficGate
from eagledata.server.control import ControlCalls
from eagledata.server.generate_types import GenerateRequest, SamplingParams
from eagledata.server.loads import ServerLoad
from eagledata.server.pools import Pools

# Re-exported: callers that hold a client also name its results and request ids from here.
from eagledata.server.responses import GenerateResult as GenerateResult
from eagledata.server.responses import new_rid as new_rid
from eagledata.server.responses import response_bound
from eagledata.server.serverfacts import BOTH_PIN_FIELDS


async def read_capped(pool: httpx.AsyncClient, url: str, body: bytes, bound: int) -> Reply:
    """POST ``body`` to ``url`` (a ``/generate`` route) and read the answer: its status, type
    and at most ``bound`` bytes of its body, decoded in bounded steps (``bodies.read_bounded``);
    ``BodyTooLarge`` (the connection closed, the rest never read or inflated) past that,
    ``BodyUnreadable`` for an encoding that is not decoded."""
    async with pool.stream("POST", url, content=body, headers=IDENTITY) as response:
        content = await read_bounded(response, bound)
        kind = response.headers.get("content-type", "")
        return Reply("POST", "/generate", response.status_code, kind, content)


def _too_large(url: str, why: BodyTooLarge | BodyUnreadable, bound: int) -> str:
    if isinstance(why, BodyUnreadable):
        return f"{url}: POST /generate answer refused unread: {why}"
    return (
        f"{url}: answer refused unread: {why}, more than an answer to this request can hold "
        f"({bound:,} bytes)"
    )


@dataclass(slots=True)
class Endpoint:
    url: str
    healthy: bool = True
    in_flight: int = 0
    last_ok: float = field(default_factory=time.monotonic)
    """When a generation last succeeded here (or the client started): a server that has failed
    every request since an item's first failure is down, whatever its ``/health`` says."""


ReconnectCheck = Callable[[str], Awaitable[None]]


class SGLangClient:
    """Async client for one or more SGLang servers. Use as ``async with SGLangClient(...)``."""

    def __init__(
        self,
        urls: list[str],
        *,
        in_flight: int,
        connections_per_pool: int = 8,
        connect_timeout_s: float = 10.0,
        request_timeout_s: float = 3600.0,
        api_key: str | None = None,
        api_key_env: str = "SGLANG_API_KEY",
        health_poll_s: float = 2.0,
        vocab_size: int | None = None,
        embedding_rows: int | None = None,
        eos_ids: frozenset[int] = frozenset(),
    ) -> None:
        """``vocab_size`` is the tokenizer's: an answer holding an id outside it is a contract
        violation (None: ids are only checked to be non-negative integers); ``embedding_rows``
        the model's embedding, when known: an id between the two is named a padding row.
        ``eos_ids``: the model's end-of-sequence ids, which stop every request not sent with
        ``ignore_eos``."""
        if not urls:
            raise ServerError("no server URL given; pass --server URL")
        self.endpoints = [Endpoint(url.rstrip("/")) for url in urls]
        pools = Pools(
            in_flight=in_flight,
            connections_per_pool=connections_per_pool,
            connect_timeout_s=connect_timeout_s,
            request_timeout_s=request_timeout_s,
            headers={"Authorization": f"Bearer {api_key}"} if api_key else {},
        )
        self._pools = pools
        self._api_key_env = api_key_env
        self.control = ControlCalls(pools, api_key_env)
        """The calls beside the data path, over the same pools (``server/control.py``)."""
        self._health_poll_s = health_poll_s
        self.request_timeout_s = request_timeout_s
        self.vocab_size = vocab_size
        self.embedding_rows = embedding_rows
        self.eos_ids = eos_ids
        self._recovering = asyncio.Lock()
        self.rank_pins: dict[str, tuple[str, ...]] = {}
        """Per server, the ``/generate`` field(s) that pin a DP rank
        (``ServerFacts.rank_pin_fields``, set by the KV guard from the server's release)."""
        self.gate: TrafficGate | None = None
        """Every generation passes it before it is sent (``server/budget.py``): the slots of a
        fixed ``--concurrency``, or the load controller under auto. None: nothing gated."""

    @classmethod
    def api_key_from_env(cls, variable: str) -> str | None:
        return os.environ.get(variable) or None

    async def __aenter__(self) -> SGLangClient:
        self._pools.open(endpoint.url for endpoint in self.endpoints)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._pools.close()

    def pick_endpoint(self) -> Endpoint:
        """The healthy server with the fewest of our requests in flight (one with a free slot
        first, under a fixed ``--concurrency``: the canary may hold another's)."""
        healthy = [endpoint for endpoint in self.endpoints if endpoint.healthy]
        if not healthy:
            raise ServerDownError("no server is reachable", reason="server_down")
        gate = self.gate
        if isinstance(gate, SlotGate):
            return min(healthy, key=lambda e: (not gate.has_room(e.url), e.in_flight))
        return min(healthy, key=lambda endpoint: endpoint.in_flight)

    async def _through_gate(
        self,
        url: str,
        rank: int | None,
        prompt_tokens: int,
        max_new_tokens: int,
        *,
        background: bool = False,
    ) -> object | None:
        """Wait for the gate's leave to send one request to ``url``; None: no gate."""
        if self.gate is None:
            return None
        return await self.gate.enter(
            url, rank, prompt_tokens, max_new_tokens, background=background
        )

    def _charged_rank(self, entry: object | None) -> int | None:
        """The DP rank the gate counted a request that named none on (``TrafficGate.rank_of``):
        it is sent pinned there, so that the rank that runs it is the one charged."""
        if entry is None or self.gate is None:
            return None
        return self.gate.rank_of(entry)

    def _leave_gate(self, entry: object | None) -> None:
        if entry is not None and self.gate is not None:
            self.gate.leave(entry)

    def endpoint(self, url: str) -> Endpoint | None:
        return next((endpoint for endpoint in self.endpoints if endpoint.url == url), None)

    # --- the data path ---------------------------------------------------------------------

    async def generate(
        self,
        input_ids: list[int],
        sampling_params: dict[str, Any],
        rid: str,
        *,
        url: str | None = None,
        dp_rank: int | None = None,
        admitted: bool = False,
    ) -> GenerateResult:
        """One attempt at one generation. Raises an ``ItemError`` or a ``ServerError``.

        ``url`` sends it to that server (the load controller's choice) while it is healthy;
        ``dp_rank`` pins its DP rank (``pinned``); ``admitted``: the load controller already
        counted it (a ticket), so it does not pass the gate again."""
        chosen = self.endpoint(url) if url is not None else None
        endpoint = chosen if chosen is not None and chosen.healthy else self.pick_endpoint()
        entry = None
        if not admitted:
            max_new = int(sampling_params.get("max_new_tokens") or 0)
            entry = await self._through_gate(endpoint.url, dp_rank, len(input_ids), max_new)
            if dp_rank is None:
                dp_rank = self._charged_rank(entry)
        try:
            result = await self._generate(
                endpoint, input_ids, sampling_params, rid, dp_rank=dp_rank
            )
        except RetryableItemError as exc:
            exc.server = endpoint.url
            raise
        finally:
            self._leave_gate(entry)
        endpoint.last_ok = time.monotonic()
        return result

    async def probe(self, endpoint: Endpoint, input_ids: list[int]) -> bool:
        """Does ``endpoint`` generate at all? One greedy token for ``input_ids``, nothing kept."""
        entry = await self._through_gate(endpoint.url, None, len(input_ids), 1)
        try:
            await self._generate(
                endpoint,
                input_ids,
                {"max_new_tokens": 1, "temperature": 0.0},
                new_rid(),
                dp_rank=self._charged_rank(entry),
            )
        except (ItemError, ServerError):
            return False
        finally:
            self._leave_gate(entry)
        endpoint.last_ok = time.monotonic()
        return True

    async def _generate(
        self,
        endpoint: Endpoint,
        input_ids: list[int],
        sampling_params: dict[str, Any],
        rid: str,
        dp_rank: int | None = None,
    ) -> GenerateResult:
        shard = self._pools.shard(endpoint.url)
        pool_index = shard.pick()
        request = GenerateRequest(
            input_ids=input_ids,
            sampling_params=SamplingParams.model_validate(sampling_params),
            rid=rid,
        )
        if dp_rank is not None:
            request = request.pinned(self.pin_fields(endpoint.url), dp_rank)
        body = request.body()
        bound = response_bound(request)
        deadline = self.request_timeout_s
        endpoint.in_flight += 1
        shard.load[pool_index] += 1
        try:
            # the whole request, not only each read: a server trickling a byte at a time
            # would otherwise hold it for ever
            async with asyncio.timeout(deadline):
                reply = await read_capped(
                    shard.pools[pool_index], endpoint.url + "/generate", body, bound
                )
        except (BodyTooLarge, BodyUnreadable) as exc:
            raise ContractViolationError(_too_large(endpoint.url, exc, bound)) from None
        except httpx.ConnectError as exc:
            endpoint.healthy = False
            raise ServerDownError(f"{endpoint.url}: cannot connect ({exc})") from None
        except (httpx.TimeoutException, TimeoutError):
            await self.abort(endpoint.url, rid)
            raise RetryableItemError(
                f"{endpoint.url}: request timed out (no whole answer within {deadline:g}s)",
                reason="timeout",
            ) from None
        except asyncio.CancelledError:
            await self.abort(endpoint.url, rid)
            raise
        except httpx.TransportError as exc:  # reset, remote protocol error, read error
            raise RetryableItemError(
                f"{endpoint.url}: connection lost ({type(exc).__name__})", reason="connection_lost"
            ) from None
        finally:
            endpoint.in_flight -= 1
            shard.load[pool_index] -= 1
        return generate_answer(
            reply,
            request,
            endpoint.url,
            self._api_key_env,
            vocab_size=self.vocab_size,
            embedding_rows=self.embedding_rows,
            stop_ids=self.stop_ids(request.sampling_params),
        )

    def stop_ids(self, sampling_params: SamplingParams) -> frozenset[int]:
        """The ids that stop a request of ``sampling_params``: its ``stop_token_ids``, and the
        model's EOS unless it is sent with ``ignore_eos``."""
        stops = frozenset(sampling_params.stop_token_ids or ())
        return stops if sampling_params.ignore_eos else stops | self.eos_ids

    def pin_fields(self, url: str) -> tuple[str, ...]:
        """The ``/generate`` field(s) that pin a DP rank on the server at ``url``, as its
        release knows them: ``data_parallel_rank`` (0.5.9), ``routed_dp_rank`` (0.5.15.post1
        drops ``data_parallel_rank`` silently; 0.5.23 takes it only as a deprecated alias).
        Both before the server's release is known."""
        return self.rank_pins.get(url, BOTH_PIN_FIELDS)

    def pinned(self, url: str, body: dict[str, Any], rank: int) -> dict[str, Any]:
        """``body`` (a canary request as a dict) pinned to DP rank ``rank`` of the server at
        ``url`` (``pin_fields``)."""
        return {**body, **dict.fromkeys(self.pin_fields(url), rank)}

    # --- the canary (quality/canary_scorer.py): raw answers from one named server ----------

    async def post_generate(
        self, url: str, body: dict[str, Any], *, background: bool = False
    ) -> dict[str, Any]:
        """One ``/generate`` call to the server at ``url``, answered as parsed JSON (logprob
        fields and all; no token contract: the caller checks what it asked for).

        Raises ``ServerUnavailableError`` when the server cannot be reached or answers 5xx,
        ``ServerError`` when it refuses the request (4xx). It passes the gate like any other
        generation: the canary's traffic is inside ``--concurrency``; ``background`` (the
        canary baseline's load) waits there behind every other request.
        """
        request = GenerateRequest.model_validate(body)
        bound = response_bound(request)
        rank = request.rank
        entry = await self._through_gate(
            url,
            rank,
            len(request.input_ids),
            request.max_new_tokens or 0,
            background=background,
        )
        charged = self._charged_rank(entry) if rank is None else None
        if charged is not None:
            request = request.pinned(self.pin_fields(url), charged)  # where the gate counted it
        try:
            async with asyncio.timeout(self.request_timeout_s):
                reply = await read_capped(
                    self._pools.canary, url + "/generate", request.body(), bound
                )
        except (BodyTooLarge, BodyUnreadable) as exc:
            raise ServerError(_too_large(url, exc, bound)) from None
        except TimeoutError:
            raise ServerUnavailableError(
                f"{url}: /generate gave no whole answer within {self.request_timeout_s:g}s"
            ) from None
        except httpx.HTTPError as exc:
            raise ServerUnavailableError(f"{url}: /generate failed ({exc!r})") from None
        finally:
            self._leave_gate(entry)
        canary_vocab = max(self.vocab_size or 0, self.embedding_rows or 0) or None
        return canary_answer(url, reply, self._api_key_env, canary_vocab)

    # --- recovery: servers marked down, probed until one answers -----------------------------

    async def revive(self, on_reconnect: ReconnectCheck) -> list[str]:
        """Probe servers marked down; bring back those that answer and pass ``on_reconnect``.

        A server that answers ``/health`` but not the check (still starting, gone again) stays
        down until a later probe; a check that *refuses* the server (``ServerRefusedError``)
        propagates: that is fatal.
        """
        revived = []
        for endpoint in self.endpoints:
            if not endpoint.healthy and await self.health(endpoint.url):
                try:
                    await on_reconnect(endpoint.url)
                except ServerUnavailableError:
                    continue
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
            await self.revive(on_reconnect)
            if any(endpoint.healthy for endpoint in self.endpoints):
                return  # back at once: say nothing
            urls = ", ".join(endpoint.url for endpoint in self.endpoints)
            on_wait(f"no server reachable ({urls}); waiting up to {deadline_s:.0f}s")
            give_up = time.monotonic() + deadline_s
            while True:
                await self.revive(on_reconnect)
                # Another task (the guard's loop) may have revived it: healthy is what counts.
                if any(endpoint.healthy for endpoint in self.endpoints):
                    on_wait("server back; resuming")
                    return
                if time.monotonic() >= give_up:
                    raise ServerUnavailableError(
                        f"no server answered /health for {deadline_s:.0f}s ({urls}); the run is "
                        "saved: start the server and run 'eagledata resume RUN_DIR'"
                    )
                await asyncio.sleep(self._health_poll_s)

    # --- the control calls (``server/control.py``), over the same pools ------------------------

    async def abort(self, url: str, rid: str) -> None:
        await self.control.abort(url, rid)

    async def health(self, url: str) -> bool:
        return await self.control.health(url)

    async def server_info(self, url: str) -> dict[str, Any]:
        return await self.control.server_info(url)

    async def read_load(self, url: str) -> ServerLoad | None:
        return await self.control.read_load(url)

    async def router_workers(self, url: str) -> list[str] | None:
        return await self.control.router_workers(url)
