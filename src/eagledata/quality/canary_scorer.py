"""The canary's requests: warm, score and probe one named server, and parse what comes back.

The protocol (warm-up, scoring from ``logprob_start_len``, greedy probes, why a cold prefill is
blind to the pooled KV) is described in ``canary``; this module speaks it through the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from eagledata.errors import ServerError, ServerUnavailableError
from eagledata.quality.canary_baseline import CanarySet
from eagledata.quality.canary_stats import Scoring
from eagledata.server.client import SGLangClient, new_rid

PAGE_SLACK = 16
"""A cache hit may stop short of the prompt's end by up to a page (SGLang's ``page_size``)."""
RETRIES = 6


@dataclass
class Measured:
    """One scoring and what it cost."""

    scoring: Scoring
    requests: int = 0
    prompt_tokens: int = 0
    seconds: float = 0.0
    cold: int = 0
    """References scored without their prompt in the cache (blind to the pooled KV)."""
    mismatch: str | None = None


class CanaryScorer:
    """Sends the canary's requests to one named server and parses what comes back.

    ``dp_ranks`` says how many DP ranks a server has (``ServerFacts.dp_ranks``). Each rank has a
    radix cache of its own and SGLang spreads requests over them round robin, so a reference's
    warm-up and its scoring would land on different ranks and the scoring would be cold (blind
    to the pooled KV). Both are pinned to one rank (``SGLangClient.pinned``: the field the
    server's release knows), and the references go round the ranks, so that every check reads
    every rank's KV."""

    def __init__(
        self,
        client: SGLangClient,
        dp_ranks: Callable[[str], int] | None = None,
        *,
        vocab_rows: int | None = None,
    ) -> None:
        """``vocab_rows``: the model's vocabulary as its config states it (its embedding rows),
        whose last id the server reports as 0 in a scoring (``token_mismatch``); None: the
        client's (its ``embedding_rows``, else its tokenizer's ``vocab_size``)."""
        self.client = client
        self.dp_ranks = dp_ranks
        self.vocab_rows = vocab_rows

    @property
    def last_id(self) -> int | None:
        """The model's last token id, which the server's scorings report as 0 (None: unknown,
        every id must come back as sent)."""
        rows = self.vocab_rows
        if rows is None:
            rows = self.client.embedding_rows or self.client.vocab_size
        return None if rows is None else rows - 1

    def ranks(self, url: str) -> int:
        """The DP ranks the references go round on this server (1: none pinned)."""
        return max(1, self.dp_ranks(url)) if self.dp_ranks is not None else 1

    async def _post(self, url: str, body: dict[str, Any], counter: Measured) -> dict[str, Any]:
        """One request, tried again on a transient failure (503, 5xx, a reset): a busy server
        is not a drifted one. Past ``RETRIES`` the server is unavailable for this check."""
        for attempt in range(RETRIES):
            counter.requests += 1
            counter.prompt_tokens += len(body["input_ids"])
            try:
                return await self.client.post_generate(url, {**body, "rid": new_rid()})
            except ServerUnavailableError:
                if attempt == RETRIES - 1:
                    raise
                await asyncio.sleep(min(2.0, 0.05 * 2**attempt))
        raise AssertionError("unreachable")

    async def sample_set(
        self,
        url: str,
        prompts: list[list[int]],
        *,
        reference_tokens: int,
        probes: int,
        probe_tokens: int,
        top_k: int,
    ) -> CanarySet:
        """Reference continuations sampled at temperature 1 (the model's own distribution),
        with the logprob the server gave each token as it sampled it (at temperature 1 and
        top_p 1 the raw ``log_softmax``: what a teacher-forced scoring of the same token
        reads), kept only when every reference came back with them."""
        counter = Measured(Scoring(np.zeros(0), np.zeros((0, 0)), np.zeros((0, 0))))
        params = {
            "max_new_tokens": reference_tokens,
            "temperature": 1.0,
            "top_p": 1.0,
            "ignore_eos": True,
        }

        async def one(prompt: list[int]) -> tuple[list[int], list[int], np.ndarray | None]:
            body = {"input_ids": prompt, "sampling_params": params, "return_logprob": True}
            answer = await self._post(url, body, counter)
            ids = answer.get("output_ids")
            if not isinstance(ids, list) or len(ids) < 2:
                raise ServerError(f"{url}: a canary reference came back without output ids")
            reference = [int(t) for t in ids]
            return prompt, reference, _sampled_lps(answer, reference)

        sampled = list(await asyncio.gather(*(one(p) for p in prompts)))
        lps = [lp for _, _, lp in sampled if lp is not None]
        return CanarySet(
            [(prompt, reference) for prompt, reference, _ in sampled],
            [p for p in prompts[:probes]],
            top_k,
            probe_tokens,
            np.concatenate(lps) if len(lps) == len(sampled) else None,
        )

    async def score(self, url: str, canary: CanarySet, *, warm: bool = True) -> Measured:
        """One canary run: every reference warmed then scored, and the greedy probes. The
        references go concurrently (each one's warm-up before its own scoring): a few seconds of
        prefill on a real server, whatever its latency per request."""
        started = time.monotonic()
        measured = Measured(Scoring(np.zeros(0), np.zeros((0, 0)), np.zeros((0, 0))))
        ranks = self.ranks(url)

        def on_rank(body: dict[str, Any], index: int) -> dict[str, Any]:
            return body if ranks < 2 else self.client.pinned(url, body, index % ranks)

        async def one(
            index: int, prompt: list[int], reference: list[int]
        ) -> tuple[np.ndarray, list[int], np.ndarray, np.ndarray, int]:
            if warm:
                warm_up = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 0}}
                await self._post(url, on_rank(warm_up, index), measured)
            scoring = {
                "input_ids": prompt + reference,
                "return_logprob": True,
                "logprob_start_len": len(prompt) - 1,
                "top_logprobs_num": canary.top_k,
                "sampling_params": {"max_new_tokens": 0},
            }
            answer = await self._post(url, on_rank(scoring, index), measured)
            try:
                return _parse_scored(url, answer, prompt, reference, canary)
            except (TypeError, ValueError, IndexError, KeyError, OverflowError) as exc:
                raise ServerError(
                    f"{url}: a canary scoring came back malformed ({type(exc).__name__}: {exc})"
                ) from None

        async def probe(index: int, prompt: list[int]) -> list[int]:
            params = {"max_new_tokens": canary.probe_tokens, "temperature": 0.0, "ignore_eos": True}
            body = {"input_ids": prompt, "sampling_params": params}
            answer = await self._post(url, on_rank(body, index), measured)
            return [int(t) for t in answer.get("output_ids") or []]

        scored = await asyncio.gather(*(one(i, p, r) for i, (p, r) in enumerate(canary.references)))
        greedy = list(await asyncio.gather(*(probe(i, p) for i, p in enumerate(canary.probes))))
        last_id = self.last_id
        for (prompt, reference), (_, ids, _, _, cached) in zip(
            canary.references, scored, strict=True
        ):
            if measured.mismatch is None:
                measured.mismatch = token_mismatch(ids, reference, last_id)
            if cached < len(prompt) - 1 - PAGE_SLACK:
                measured.cold += 1
        measured.scoring = Scoring(
            np.concatenate([s[0] for s in scored]),
            np.concatenate([s[2] for s in scored]),
            np.concatenate([s[3] for s in scored]),
            greedy,
        )
        measured.seconds = time.monotonic() - started
        return measured

    async def score_under_load(self, url: str, canary: CanarySet, requests: int) -> Measured:
        """A scoring while ``requests`` sampled generations run beside it: batch noise as
        production sees it, without production's results (canary traffic is never data)."""
        stop = asyncio.Event()
        params = {"max_new_tokens": len(canary.references[0][1]), "temperature": 1.0}
        prompts = [p for p, _ in canary.references]

        async def load(index: int) -> None:
            while not stop.is_set():
                prompt = prompts[index % len(prompts)]
                body = {"input_ids": prompt, "sampling_params": params, "rid": new_rid()}
                with contextlib.suppress(ServerError):
                    # behind the check's own requests at the gate: it loads them, and
                    # rejoining after every answer it would otherwise go ahead of them
                    await self.client.post_generate(url, body, background=True)
                index += requests

        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(load(i)) for i in range(requests)]
            await asyncio.sleep(0)
            try:
                measured = await self.score(url, canary)
            finally:
                stop.set()
                for task in tasks:
                    task.cancel()
        return measured


def token_mismatch(ids: list[int], reference: list[int], last_id: int | None) -> str | None:
    """The first id a scoring reports that is not the reference's, or None.

    SGLang reports the model's last id (``vocab_size - 1`` of its config: embedding rows) as 0 in
    ``input_token_logprobs`` (``x if x < vocab_size - 1 else 0``, in every supported release),
    while it scores the id itself: that one substitution is accepted, where the reference holds
    exactly ``last_id``. Any other id that differs is a token-fidelity failure."""
    if len(ids) != len(reference):
        return f"token mismatch: {len(ids)} ids scored for {len(reference)} reference tokens"
    for at, (got, sent) in enumerate(zip(ids, reference, strict=True)):
        if got != sent and not (got == 0 and sent == last_id):
            return f"token mismatch: scored id {got} where the reference has {sent} (position {at})"
    return None


def _sampled_lps(answer: dict[str, Any], reference: list[int]) -> np.ndarray | None:
    """``output_token_logprobs`` of a sampled reference, one per token, or None."""
    meta = answer.get("meta_info")
    triples = meta.get("output_token_logprobs") if isinstance(meta, dict) else None
    if not isinstance(triples, list) or len(triples) != len(reference):
        return None
    try:
        if [int(t[1]) for t in triples] != reference:
            return None
        return np.asarray([float(t[0]) for t in triples], dtype=np.float64)
    except (TypeError, ValueError, IndexError):
        return None


def _parse_scored(
    url: str, answer: dict[str, Any], prompt: list[int], reference: list[int], canary: CanarySet
) -> tuple[np.ndarray, list[int], np.ndarray, np.ndarray, int]:
    meta = answer.get("meta_info")
    triples = meta.get("input_token_logprobs") if isinstance(meta, dict) else None
    if not isinstance(meta, dict) or not isinstance(triples, list) or not triples:
        raise ServerError(
            f"{url} returned no logprobs (meta_info.input_token_logprobs); the canary needs "
            "SGLang's return_logprob: point --server at the SGLang server itself, or run with "
            "--no-canary"
        )
    if len(triples) != len(reference) + 1 or triples[0][0] is not None:
        raise ServerError(
            f"{url}: the canary asked for {len(reference) + 1} input logprobs from "
            f"logprob_start_len {len(prompt) - 1} and got {len(triples)}; this SGLang version "
            "scores prompts differently: run with --no-canary and report it"
        )
    lp = np.asarray([t[0] for t in triples[1:]], dtype=np.float64)
    ids = [int(t[1]) for t in triples[1:]]
    top_ids, top_lps = _parse_tops(meta.get("input_top_logprobs"), len(triples), canary.top_k)
    cached = meta.get("cached_tokens")
    return lp, ids, top_ids, top_lps, int(cached) if isinstance(cached, int) else 0


def _parse_tops(tops: object, rows: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The top-``k`` ids and logprobs of each scored position (past the first, which has none),
    a missing entry as id 0 at -1e9. A whole scoring is 24 references of 512 positions of 20
    entries: read as two flat lists when every row is whole, not entry by entry, because this
    runs on the event loop beside a fast server (a quarter of the time)."""
    top_ids = np.zeros((rows - 1, k), dtype=np.int64)
    top_lps = np.full((rows - 1, k), -1e9)
    if not k or not isinstance(tops, list) or len(tops) != rows:
        return top_ids, top_lps
    scored = tops[1:]
    if all(isinstance(entries, list) and len(entries) == k for entries in scored):
        top_lps[:] = np.asarray(
            [entry[0] for entries in scored for entry in entries], dtype=np.float64
        ).reshape(rows - 1, k)
        top_ids[:] = np.asarray(
            [entry[1] for entries in scored for entry in entries], dtype=np.int64
        ).reshape(rows - 1, k)
    else:
        for row, entries in enumerate(scored):
            for col, entry in enumerate((entries or [])[:k]):
                top_lps[row, col], top_ids[row, col] = float(entry[0]), int(entry[1])
    if np.isnan(top_lps).any():
        raise ValueError("a top logprob is NaN")
    return top_ids, top_lps
