"""Invariant 2 on the data path: no record from a server without a bf16 KV cache ever lands.

``KVGuard`` is the KV check: it reads a server's facts and judges them (refusal: exit 4). Holding
results until a check vouches for them is ``run/holding.py``'s job, for this check and the
logprob canary alike: a result that completed at time *t* on server *S* is released only once a
KV check of *S* and a canary of *S*, both *started* after *t*, have passed. Checks run before the
first request, every ``guard_interval_s`` (sooner when ``guard_max_held`` results wait) and after
every reconnect.
"""

from __future__ import annotations

import time
from typing import Protocol

from eagledata.errors import ServerRefusedError, ServerUnavailableError
from eagledata.rundir.lines import CheckLine
from eagledata.server.client import SGLangClient
from eagledata.server.serverfacts import ServerFacts
from eagledata.server.verdict import GuardVerdict, evaluate_kv_guard


class CheckLog(Protocol):
    """Where check entries go: one whole JSON line each (the run's ``checks.jsonl`` journal)."""

    def append(self, line: CheckLine) -> object: ...


class KVGuard:
    """Checks servers' facts: the bf16 verdict, every worker behind a router."""

    def __init__(
        self,
        client: SGLangClient,
        *,
        expected_model: str | None,
        bf16_bytes_per_token: int | None,
        kv_heads: int | None = None,
        check_log: CheckLog | None = None,
    ) -> None:
        self.client = client
        self.expected_model = expected_model
        self.bf16_bytes_per_token = bf16_bytes_per_token
        self.kv_heads = kv_heads
        self.check_log = check_log
        self.facts: dict[str, ServerFacts] = {}
        self.workers: dict[str, list[str]] = {}
        """The workers each router was last checked through (a plain server has none)."""

    # --- as one of the checks that release held results (run/holding.py) ------------------

    name = "kv"

    def due(self, url: str, held: int) -> str | None:
        """The KV check runs on every round of the holder."""
        return "period"

    def dp_ranks(self, url: str) -> int:
        """The DP ranks the server's last facts report (1 before any): ``dp_size``, times
        ``attn_dp_size`` in 0.5.23 (where ``dp_size`` is 1 under DP attention)."""
        facts = self.facts.get(url)
        return 1 if facts is None else facts.dp_ranks

    def targets(self, url: str) -> list[str]:
        """Where a check of ``url`` must look: every worker it routes to when ``url`` is a
        router the guard has checked, else ``url`` itself (the canary scores each one)."""
        return list(self.workers.get(url) or [url])

    def facts_key(self, url: str) -> object:
        """What of the server's facts a canary re-checks on change (version, dtypes, pool)."""
        facts = self.facts.get(url)
        if facts is None:
            return None
        return (
            facts.version,
            facts.model_path,
            facts.kv_cache_dtype,
            facts.dtype,
            facts.tp_size,
            facts.dp_size,
            facts.attn_dp_size,
            facts.dcp_size,
            facts.max_total_num_tokens,
            tuple(state.kv_cache_dtype for state in facts.internal_states or []),
        )

    async def check(self, url: str, trigger: str = "period") -> ServerFacts:
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
        self.workers[url] = list(workers)
        return facts

    async def _check_one(self, url: str, via: str | None = None) -> ServerFacts:
        info = await self.client.server_info(url)
        facts = ServerFacts.from_server_info(info)
        verdict = evaluate_kv_guard(
            facts,
            expected_model=self.expected_model,
            bf16_bytes_per_token=self.bf16_bytes_per_token,
            kv_heads=self.kv_heads,
        )
        self._log(url, facts, verdict, via)
        if not verdict.ok:
            where = url if via is None else f"{url} (behind the router {via})"
            fix = f". Fix: {verdict.fix()}" if verdict.fix() else ""
            raise ServerRefusedError(f"{where} refused: {'; '.join(verdict.problems)}{fix}")
        if self.expected_model is None:
            # Pin the model seen first: a later swap to another model is refused like fp8 is.
            self.expected_model = facts.model_path
        self.facts[url] = facts
        # requests pinned to a DP rank name it as this server's release knows it
        self.client.rank_pins[url] = facts.rank_pin_fields
        return facts

    def _log(
        self, url: str, facts: ServerFacts, verdict: GuardVerdict, via: str | None = None
    ) -> None:
        if self.check_log is None:
            return
        line = CheckLine(
            time=time.time(),
            server=url,
            via=via,
            ok=verdict.ok,
            problems=verdict.problems,
            model_path=facts.model_path,
            kv_cache_dtype=facts.kv_cache_dtype,
            internal_kv_dtypes=verdict.kv_dtypes,
            bytes_per_token=verdict.bytes_per_token,
            max_total_num_tokens=facts.max_total_num_tokens,
        )
        self.check_log.append(line)
