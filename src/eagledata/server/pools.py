"""The client's connection pools: opened, sized and closed here; only the client sends on them
(``client``, and ``control`` on the control pool).

Connections are sharded over many small ``httpx.AsyncClient`` pools: a pool's per-request cost
grows with its size (``benchmarks/README.md``, ``bench_client.py``), so each server gets
``ceil(in_flight / connections_per_pool)`` pools of its own, and a request goes to the least
loaded. Per server, so that a pool never closes one server's idle connection to open another's.
Beside them, one small control pool and the canary's own pool.
"""

from __future__ import annotations

import asyncio
import math
import ssl
from collections.abc import Iterable

import httpx


class Shard:
    """One server's generation pools and the requests each holds (the load)."""

    def __init__(self, pools: list[httpx.AsyncClient]) -> None:
        self.pools = pools
        self.load = [0] * len(pools)

    def pick(self) -> int:
        return self.load.index(min(self.load))


class Pools:
    """Every pool of one client, per server and per purpose; use between ``open`` and ``close``."""

    def __init__(
        self,
        *,
        in_flight: int,
        connections_per_pool: int,
        connect_timeout_s: float,
        request_timeout_s: float,
        headers: dict[str, str],
    ) -> None:
        self._headers = headers
        self._timeout = httpx.Timeout(connect_timeout_s, read=request_timeout_s, pool=None)
        self._pool_size = max(1, min(connections_per_pool, in_flight))
        self._pool_count = max(1, math.ceil(in_flight / self._pool_size))
        self._shards: dict[str, Shard] = {}
        self._control_pool: httpx.AsyncClient | None = None
        self._canary_pool: httpx.AsyncClient | None = None
        self._tls: ssl.SSLContext | None = None

    def open(self, urls: Iterable[str]) -> None:
        # One TLS context for all pools: each AsyncClient would otherwise load the CA bundle anew
        # (~16 ms each, and there may be hundreds of pools).
        self._tls = httpx.create_ssl_context()
        # One small extra pool for control calls so they never queue behind generations.
        self._control_pool = httpx.AsyncClient(
            timeout=httpx.Timeout(30.0), headers=self._headers, verify=self._tls
        )
        for url in urls:
            self.shard(url)

    async def close(self) -> None:
        pools = [pool for shard in self._shards.values() for pool in shard.pools]
        pools.extend(pool for pool in (self._control_pool, self._canary_pool) if pool is not None)
        self._shards, self._control_pool, self._canary_pool = {}, None, None
        await asyncio.gather(*(pool.aclose() for pool in pools), return_exceptions=True)

    @property
    def control(self) -> httpx.AsyncClient:
        if self._control_pool is None:
            raise RuntimeError("SGLangClient used outside 'async with'")
        return self._control_pool

    def shard(self, url: str) -> Shard:
        """The generation pools of one server, opened on first use."""
        shard = self._shards.get(url)
        if shard is None:
            if self._control_pool is None or self._tls is None:
                raise RuntimeError("SGLangClient used outside 'async with'")
            limits = httpx.Limits(
                max_connections=self._pool_size, max_keepalive_connections=self._pool_size
            )
            headers = {**self._headers, "Content-Type": "application/json"}
            shard = self._shards[url] = Shard(
                [
                    httpx.AsyncClient(
                        limits=limits, timeout=self._timeout, headers=headers, verify=self._tls
                    )
                    for _ in range(self._pool_count)
                ]
            )
        return shard

    @property
    def canary(self) -> httpx.AsyncClient:
        """The canary's own small pool: its requests never queue behind production's (nor
        production's behind them), and never count in its load."""
        if self._canary_pool is None:
            if self._tls is None:
                raise RuntimeError("SGLangClient used outside 'async with'")
            limits = httpx.Limits(max_connections=32, max_keepalive_connections=32)
            headers = {**self._headers, "Content-Type": "application/json"}
            self._canary_pool = httpx.AsyncClient(
                limits=limits, timeout=self._timeout, headers=headers, verify=self._tls
            )
        return self._canary_pool
