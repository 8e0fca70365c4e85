"""Invariant 2 on the data path: no record from a server without a bf16 KV cache ever lands.

The server's facts are checked before the first request, every ``guard_interval_s`` (sooner when
``guard_max_held`` results wait) and after every reconnect. A result that completed at time *t* on
server *S* is held until a check of *S* that *started* after *t* has passed: a server swapped for
an fp8 one between two checks cannot slip a record in. A failing check drops every held result
(they are generated again on resume, against a good server) and stops the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import orjson

from eagledata.client import SGLangClient
from eagledata.errors import ServerRefusedError
from eagledata.serverfacts import GuardVerdict, ServerFacts, evaluate_kv_guard
from eagledata.writer import Journal

T = TypeVar("T")


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
        check_log: Journal | None = None,
    ) -> None:
        self.client = client
        self.expected_model = expected_model
        self.bf16_bytes_per_token = bf16_bytes_per_token
        self.interval_s = interval_s
        self.max_held = max_held
        self.release = release
        self.check_log = check_log
        self.facts: dict[str, ServerFacts] = {}
        self.checks = 0
        self.dropped = 0
        self._held: list[Held[T]] = []
        self._wake = asyncio.Event()

    @property
    def held(self) -> int:
        return len(self._held)

    async def check(self, url: str) -> ServerFacts:
        """Read and judge one server's facts. Raises ``ServerRefusedError`` on a failing verdict."""
        info = await self.client.server_info(url)
        facts = ServerFacts.from_server_info(info)
        verdict = evaluate_kv_guard(
            facts,
            expected_model=self.expected_model,
            bf16_bytes_per_token=self.bf16_bytes_per_token,
        )
        self._log(url, facts, verdict)
        self.checks += 1
        if not verdict.ok:
            raise ServerRefusedError(f"{url} refused: {'; '.join(verdict.problems)}")
        if self.expected_model is None:
            # Pin the model seen first: a later swap to another model is refused like fp8 is.
            self.expected_model = facts.model_path
        self.facts[url] = facts
        return facts

    def _log(self, url: str, facts: ServerFacts, verdict: GuardVerdict) -> None:
        if self.check_log is None:
            return
        entry = {
            "time": time.time(),
            "server": url,
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
        """One round: check every healthy server, release what completed before its check."""
        for endpoint in self.client.endpoints:
            if not endpoint.healthy:
                continue
            started = time.monotonic()
            try:
                await self.check(endpoint.url)
            except ServerRefusedError:
                self.dropped += len(self._held)
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

    async def check_reconnected(self, url: str) -> None:
        await self.check(url)

    async def flush(self) -> None:
        """Final rounds at the end of a run: everything still held is checked and released.

        Results of a server that is down by now cannot be vouched for: they are dropped, not
        failed, and ``resume`` generates them again.
        """
        for _ in range(3):
            if not self._held:
                return
            await asyncio.sleep(0.001)  # let the monotonic clock pass the last completion
            await self.check_and_release()
        self.dropped += len(self._held)
        self._held.clear()
