"""Invariant 2 on the data path: no record from a server without a bf16 KV cache ever lands.

The server's facts are checked before the first request, every ``guard_interval_s`` (sooner when
``guard_max_held`` results wait) and after every reconnect. A result that completed at time *t* on
server *S* is held until a check of *S* that *started* after *t* has passed: a server swapped for
an fp8 one between two checks cannot slip a record in. A failing check drops every held result
(they are generated again on resume, against a good server) and stops the run.

A server that goes down takes its held results with it: no later check can vouch for the process
that produced them (the one answering after a restart may be another). They are handed back
through ``requeue`` and generated again, on whichever server is up.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import orjson

from eagledata.errors import ServerRefusedError, ServerUnavailableError
from eagledata.server.client import SGLangClient
from eagledata.server.serverfacts import GuardVerdict, ServerFacts, evaluate_kv_guard

T = TypeVar("T")


class CheckLog(Protocol):
    """Where check entries go: one whole JSON line each (the run's ``checks.jsonl`` journal)."""

    def append(self, line: bytes) -> None: ...


@dataclass(frozen=True, slots=True)
class Held(Generic[T]):
    payload: T
    server: str
    completed_at: float


class KVGuard(Generic[T]):
    """Checks servers, holds results until a later check passes, then hands them to ``release``."""

    def __init__(
        self,
        client: SGLangClient,
        *,
        expected_model: str | None,
        bf16_bytes_per_token: int | None,
        interval_s: float,
        max_held: int,
        release: Callable[[T], None],
        requeue: Callable[[T], None] | None = None,
        check_log: CheckLog | None = None,
    ) -> None:
        self.client = client
        self.expected_model = expected_model
        self.bf16_bytes_per_token = bf16_bytes_per_token
        self.interval_s = interval_s
        self.max_held = max_held
        self.release = release
        self.requeue = requeue
        self.check_log = check_log
        self.facts: dict[str, ServerFacts] = {}
        self._held: list[Held[T]] = []
        self._wake = asyncio.Event()

    @property
    def held(self) -> int:
        return len(self._held)

    async def check(self, url: str) -> ServerFacts:
        """Read and judge one server's facts. Raises ``ServerRefusedError`` on a failing verdict.

        Behind an sglang-router, ``/get_server_info`` describes the router, not a worker (0.3.x),
        or one worker picked by the router (older): either way not every KV cache that may serve
        a request. So a router is checked through its workers, each read directly, and passes
        only if every worker it routes to passes; a worker that cannot be read makes the router
        unavailable (no traffic, results held) until it can, never unchecked.
        """
        workers = await self.client.router_workers(url)
        if workers is None:
            return await self._check_one(url)
        if not workers:
            raise ServerUnavailableError(f"{url}: the router lists no healthy worker")
        checked = []
        for worker in workers:
            try:
                checked.append(await self._check_one(worker, via=url))
            except ServerUnavailableError as exc:
                raise ServerUnavailableError(
                    f"{url}: cannot check worker {worker} behind the router ({exc}); the bf16 "
                    "guard reads every worker's /server_info, so they must be reachable from here"
                ) from None
        # The prompt length limit must suit whichever worker the router picks.
        facts = min(checked, key=lambda f: f.max_req_input_len or f.context_length or 1 << 62)
        self.facts[url] = facts
        return facts

    async def _check_one(self, url: str, via: str | None = None) -> ServerFacts:
        info = await self.client.server_info(url)
        facts = ServerFacts.from_server_info(info)
        verdict = evaluate_kv_guard(
            facts,
            expected_model=self.expected_model,
            bf16_bytes_per_token=self.bf16_bytes_per_token,
        )
        self._log(url, facts, verdict, via)
        if not verdict.ok:
            where = url if via is None else f"{url} (behind the router {via})"
            raise ServerRefusedError(f"{where} refused: {'; '.join(verdict.problems)}")
        if self.expected_model is None:
            # Pin the model seen first: a later swap to another model is refused like fp8 is.
            self.expected_model = facts.model_path
        self.facts[url] = facts
        return facts

    def _log(
        self, url: str, facts: ServerFacts, verdict: GuardVerdict, via: str | None = None
    ) -> None:
        if self.check_log is None:
            return
        entry = {
            "time": time.time(),
            "server": url,
            "via": via,
            "ok": verdict.ok,
            "problems": verdict.problems,
            "model_path": facts.model_path,
            "kv_cache_dtype": facts.kv_cache_dtype,
            "internal_kv_dtypes": verdict.kv_dtypes,
            "bytes_per_token": verdict.bytes_per_token,
            "max_total_num_tokens": facts.max_total_num_tokens,
        }
        self.check_log.append(orjson.dumps(entry))

    def hold(self, payload: T, server: str, completed_at: float) -> None:
        self._held.append(Held(payload, server, completed_at))
        if len(self._held) >= self.max_held:
            self._wake.set()

    async def check_and_release(self) -> None:
        """One round: check every healthy server, release what completed before its check.

        A server that cannot be read now is marked down, not fatal: its results stay held, the
        scheduler's work goes to the others (or waits for it), and it is checked again when it
        answers ``/health`` (``SGLangClient.revive``).
        """
        for endpoint in self.client.endpoints:
            if not endpoint.healthy:
                self._give_back(endpoint.url)
                continue
            started = time.monotonic()
            try:
                await self.check(endpoint.url)
            except ServerUnavailableError:
                endpoint.healthy = False
                self._give_back(endpoint.url)
                continue
            except ServerRefusedError:
                self._held.clear()
                raise
            keep: list[Held[T]] = []
            for held in self._held:
                if held.server == endpoint.url and held.completed_at <= started:
                    self.release(held.payload)
                else:
                    keep.append(held)
            self._held = keep

    async def run(self) -> None:
        """The periodic check loop; runs until cancelled by its owner's task group."""
        while True:
            # asyncio.timeout, not wait_for: 3.11's wait_for can swallow the owner's cancel
            # when the wake-up and the cancel race, and the run would then never end.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval_s):
                    await self._wake.wait()
            self._wake.clear()
            await self.client.revive(self.check_reconnected)
            await self.check_and_release()

    def _give_back(self, server: str | None = None) -> None:
        """Hand the results held from ``server`` (from every server if None) to ``requeue``."""
        keep: list[Held[T]] = []
        for held in self._held:
            if server is None or held.server == server:
                if self.requeue is not None:  # without one, dropped: resume generates it again
                    self.requeue(held.payload)
            else:
                keep.append(held)
        self._held = keep

    async def check_reconnected(self, url: str) -> None:
        """Check a server that was down; what it produced before going down is given back."""
        self._give_back(url)
        await self.check(url)

    async def flush(self) -> None:
        """Final rounds at the end of a run: everything still held is checked and released.

        Results of a server that is down by now cannot be vouched for: they are given back
        (``requeue``), or without one dropped, not failed, and ``resume`` generates them again.
        """
        for _ in range(3):
            if not self._held:
                return
            await asyncio.sleep(0.001)  # let the monotonic clock pass the last completion
            await self.check_and_release()
        self._give_back()
