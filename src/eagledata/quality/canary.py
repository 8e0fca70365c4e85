"""The logprob canary: does the server still compute what it computed when the run began?

A dtype flag is what the server says; this is what it does (docs/quality.md). Per check,
for each reference (a prompt of the run's own dataset, chat-templated as production, and a
continuation the server sampled from it once it had passed the KV guard):

1. **warm**: ``{"input_ids": prompt, "sampling_params": {"max_new_tokens": 0}}`` puts the prompt in
   the radix cache;
2. **score**: ``input_ids = prompt + reference``, ``return_logprob``, ``logprob_start_len = P - 1``,
   ``top_logprobs_num``, ``max_new_tokens: 0``: the logprob of every reference token, and the
   top-k at each position. ``cached_tokens`` must show the prompt came from the cache: on SGLang's
   MLA backends a cold prefill scores the new tokens from in-flight bf16 values and never reads
   the pooled KV, so a cold canary is blind to an fp8 or corrupted cache (``tests/test_canary.py``
   shows it). A returned token id that is not the reference's is a token-fidelity failure: a hard
   stop, not drift.

Plus greedy decode probes (the data is produced in decode). The statistics and thresholds are in
``canary_stats``; the baseline (several scorings at the start, idle and under load) is in
``canary_baseline``, stored in the run directory (``canary/baseline.json``) so that ``resume``
compares with the original; the requests and their parsing are in ``canary_scorer``. On a server
with several DP ranks both requests of a reference go to one rank, and each rank's share is also
judged on its own (``canary_ranks``). This module records the baseline and runs the checks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Literal, Protocol

from eagledata.config import CanarySettings
from eagledata.errors import (
    BaselineChangedError,
    CanaryDriftError,
    ConfigError,
    ServerError,
    ServerUnavailableError,
)
from eagledata.quality.canary_baseline import Baseline, rules_of
from eagledata.quality.canary_ranks import RankShare, RankVerdict, rank_shares, rank_verdicts
from eagledata.quality.canary_scorer import CanaryScorer, Measured
from eagledata.quality.canary_selfcheck import self_check
from eagledata.quality.canary_stats import compare, fired, hard_stop
from eagledata.rundir.lines import QualityLine, RankLine


class LineLog(Protocol):
    def append(self, line: QualityLine) -> object: ...


async def build_baseline(
    scorer: CanaryScorer,
    url: str,
    prompts: list[list[int]],
    settings: CanarySettings,
    *,
    model_path: str | None,
    ledger: LineLog | None,
    pool_tokens: int | None = None,
) -> Baseline:
    """Sample the references on a trusted server, then score them idle and under load; refuse
    the baseline (``BaselineChangedError``) if its scorings show the server changed meanwhile.
    ``pool_tokens``: the KV one DP rank holds (``ServerFacts.rank_kv_tokens``), which every
    request of the canary must fit (``check_fits_pool``)."""
    check_fits_pool(url, prompts, settings, pool_tokens)
    canary = await scorer.sample_set(
        url,
        prompts,
        reference_tokens=settings.reference_tokens,
        probes=settings.probes,
        probe_tokens=settings.probe_tokens,
        top_k=settings.top_logprobs,
    )
    runs: list[Measured] = []
    kinds: list[str] = []
    for _ in range(settings.baseline_idle_runs):
        runs.append(await scorer.score(url, canary))
        kinds.append("idle")
    for _ in range(settings.baseline_load_runs):
        runs.append(await scorer.score_under_load(url, canary, settings.load_requests))
        kinds.append("load")
    if len(runs) < 2:  # one run has no noise to measure: score it once more
        runs.append(await scorer.score(url, canary))
        kinds.append("idle")
    for measured in runs:
        if measured.mismatch:
            raise ServerError(
                f"{url}: the canary's baseline does not reproduce its own references "
                f"({measured.mismatch}); the server is not token-faithful"
            )
    baseline = Baseline(
        canary, [m.scoring for m in runs], kinds, rules_of(settings), model_path, url
    )
    # Did the server change while it was measured? Then the null holds the change (canary_selfcheck)
    finding = self_check(baseline.runs, kinds, baseline.rules, canary.sampled_lps)
    if ledger is not None:
        limits = baseline.thresholds
        reference = baseline.reference
        for measured, kind in zip(runs, kinds, strict=True):
            _log(
                ledger,
                url,
                "baseline",
                kind,
                "pass" if finding is None else "refused",
                compare(measured.scoring, reference),
                limits,
                "" if finding is None else str(finding),
                measured,
            )
    if finding is not None:
        raise BaselineChangedError(
            f"{url} changed while the canary's baseline was being measured ({finding}); "
            "the baseline was not kept"
        )
    return baseline


def check_fits_pool(
    url: str, prompts: list[list[int]], settings: CanarySettings, pool_tokens: int | None
) -> None:
    """Every request of the canary fits the pool alone, or a ``ConfigError`` naming the fix.

    SGLang admits a request only while its prompt plus ``min(max_new_tokens, 4096)`` is below
    the free pool; one that can never be, waits in its queue for ever, and so would the
    baseline (a reference is sampled with ``reference_tokens`` new tokens, a load request asks
    as many, a probe ``probe_tokens``). The references need not fit together: the gate and the
    server take them in turn."""
    if pool_tokens is None or not prompts:
        return
    new_tokens = min(max(settings.reference_tokens, settings.probe_tokens), 4096)
    longest = max(len(prompt) for prompt in prompts)
    if longest + new_tokens < pool_tokens:
        return
    raise ConfigError(
        f"{url}: the canary's longest request needs {longest + new_tokens:,} KV tokens (a "
        f"prompt of {longest:,} and {new_tokens:,} new tokens) and the server's KV pool holds "
        f"{pool_tokens:,}: it would wait for ever; lower [canary] reference_tokens or "
        "max_prompt_tokens, or run with --no-canary"
    )


def _log(
    ledger: LineLog,
    url: str,
    kind: Literal["baseline", "check"],
    trigger: str,
    verdict: str,
    stats: dict[str, float],
    limits: dict[str, float],
    reason: str,
    measured: Measured | None,
    ranks: Sequence[RankVerdict] = (),
    via: str | None = None,
) -> None:
    line = QualityLine(
        time=time.time(),
        server=url,
        via=via,
        kind=kind,
        trigger=trigger,
        verdict=verdict,
        stats=stats,
        thresholds=limits,
        reason=reason,
        requests=measured.requests if measured else 0,
        prompt_tokens=measured.prompt_tokens if measured else 0,
        seconds=round(measured.seconds, 4) if measured else 0.0,
        cold=measured.cold if measured else 0,
        ranks=[
            RankLine(rank=v.rank, stats=v.stats, thresholds=v.limits, fired=v.fired) for v in ranks
        ],
    )
    ledger.append(line)


class CanaryMonitor:
    """The canary as one of the checks that release held results (run/holding.py).

    ``due`` says when a server needs a check: first contact, every ``period_s``, when its
    ``/server_info`` facts changed, when ``guard_max_held`` of its results wait; reconnects are
    checked by the holder. A check that fires is rerun at once; two fires in a row are drift
    (``CanaryDriftError``, exit 4). A token mismatch, or a change past the hard limits, stops at
    once.

    ``targets`` says where a check of a server looks: behind an sglang-router, every worker the
    KV guard found there (``KVGuard.targets``), each scored directly. The router would send a
    reference's warm-up and its scoring to workers of its choosing (a cold scoring is blind to the
    pooled KV), and one degraded worker among healthy ones would be a fraction of one check; so
    the router's results are vouched for only when every worker passes.
    """

    name = "canary"

    def __init__(
        self,
        scorer: CanaryScorer,
        baseline: Baseline,
        *,
        period_s: float,
        max_held: int,
        ledger: LineLog | None,
        facts_key: Callable[[str], object] | None = None,
        targets: Callable[[str], Sequence[str]] | None = None,
    ) -> None:
        self.targets = targets or (lambda url: [url])
        self.scorer = scorer
        self.baseline = baseline
        self.period_s = period_s
        self.max_held = max_held
        self.ledger = ledger
        self.facts_key = facts_key
        self._last: dict[str, float] = {}
        self._facts: dict[str, object] = {}
        self._reference = baseline.reference
        self._limits = baseline.thresholds
        self._shares: dict[int, list[RankShare]] = {}
        self.checks = 0
        self.spent_s = 0.0

    def due(self, url: str, held: int) -> str | None:
        now = time.monotonic()
        if url not in self._last:
            return "start"
        if self.facts_key is not None and self.facts_key(url) != self._facts.get(url):
            return "server_info"
        if held >= self.max_held:
            return "held"
        if now - self._last[url] >= self.period_s:
            return "period"
        return None

    def next_due_at(self, url: str) -> float | None:
        """When the period makes the next check of ``url`` due (monotonic), None if due now."""
        last = self._last.get(url)
        return None if last is None else last + self.period_s

    async def check(self, url: str, trigger: str) -> None:
        """Score, compare, log; raise on drift (or ``ServerUnavailableError`` if it cannot).
        A router passes when every one of its workers does."""
        for target in self.targets(url):
            await self._check_target(target, None if target == url else url, trigger)
        self._last[url] = time.monotonic()
        if self.facts_key is not None:
            self._facts[url] = self.facts_key(url)

    async def _check_target(self, url: str, via: str | None, trigger: str) -> None:
        """One server (a worker behind the router ``via``) scored against the baseline."""
        where = url if via is None else f"{url} (behind the router {via})"
        for attempt in range(2):
            try:
                measured = await self.scorer.score(url, self.baseline.canary_set)
            except ServerUnavailableError as exc:
                if self.ledger is not None:
                    reason = str(exc)
                    _log(self.ledger, url, "check", trigger, "error", {}, {}, reason, None, via=via)
                raise
            self.checks += 1
            self.spent_s += measured.seconds
            stats = compare(measured.scoring, self._reference)
            ranks = rank_verdicts(measured.scoring, self._rank_shares(url), self.baseline)
            record = (url, via, trigger)
            if measured.mismatch:
                self._record(*record, "mismatch", stats, measured.mismatch, measured, ranks)
                raise CanaryDriftError(
                    f"{where} failed the canary: {measured.mismatch}; the server is not "
                    "token-faithful; the run is saved: fix the server and run 'eagledata resume "
                    "RUN_DIR'"
                )
            hard = hard_stop(stats, self.baseline.rules) + [h for v in ranks for h in v.hard]
            fires = hard or fired(stats, self._limits) + [f for v in ranks for f in v.fires]
            if not fires:
                note = f"{measured.cold} references scored cold" if measured.cold else ""
                self._record(*record, "pass", stats, note, measured, ranks)
                return
            if hard or attempt == 1:
                self._record(*record, "drift", stats, "; ".join(fires), measured, ranks)
                raise CanaryDriftError(
                    f"{where} drifted from the canary baseline: {fires[0]}; nothing it produced "
                    "since its last passing canary was kept; the run is saved: fix the server "
                    "and run 'eagledata resume RUN_DIR'"
                )
            reason = "; ".join(fires) + " (rerun)"
            self._record(*record, "fired", stats, reason, measured, ranks)
            trigger = "rerun"

    def _rank_shares(self, url: str) -> list[RankShare]:
        """Each DP rank's share of the references and of the baseline (``canary_ranks``)."""
        ranks = self.scorer.ranks(url)
        if ranks not in self._shares:
            self._shares[ranks] = rank_shares(self.baseline, ranks)
        return self._shares[ranks]

    def _record(
        self,
        url: str,
        via: str | None,
        trigger: str,
        verdict: str,
        stats: dict[str, float],
        reason: str,
        measured: Measured,
        ranks: Sequence[RankVerdict] = (),
    ) -> None:
        if self.ledger is not None:
            _log(
                self.ledger,
                url,
                "check",
                trigger,
                verdict,
                stats,
                self._limits,
                reason,
                measured,
                ranks,
                via=via,
            )
