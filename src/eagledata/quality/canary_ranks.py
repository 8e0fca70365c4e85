"""A canary verdict per DP rank, beside the pooled one.

On a server with several DP ranks the scorer pins reference ``i`` (warm-up and scoring) to rank
``i mod N`` and probe ``j`` to rank ``j mod N`` (``canary_scorer``). A fault on one rank alone
then moves only its share of the references, and the pooled statistics see ``1/N`` of the shift
(measured on the simulator: 18.5x the ``mean_shift`` threshold with the whole server degraded,
2.7x with one rank of four; ``docs/quality.md``). So each rank's references are also compared on
their own: against the same references' per-token median in the baseline, with thresholds
derived the same way from the same baseline runs restricted to them (a smaller subset is
noisier, and its null says by how much). A rank fires when its own statistics do.

A share too small has a null too thin to set thresholds from: with 48-96 scored tokens a rank
(the tests' small canary on four ranks) fired in 6% of healthy checks, mostly ``top1_flip``
(``benchmarks/canary_null.py --ranks 4``). Below ``MIN_RANK_TOKENS`` per rank, the pooled
verdict alone covers the server.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from eagledata.quality.canary_baseline import Baseline
from eagledata.quality.canary_stats import (
    Scoring,
    compare,
    fired,
    hard_stop,
    median_reference,
    null_statistics,
    thresholds,
)

MIN_RANK_TOKENS = 512
"""Scored tokens each rank's share needs for verdicts of its own (the default canary gives each
of four ranks 3,072, of eight 1,536)."""


@dataclass(frozen=True)
class RankShare:
    """What one DP rank scores in every check, and what its healthy self looked like."""

    rank: int
    positions: np.ndarray
    """Indices into a scoring's concatenated reference tokens."""
    probes: list[int]
    reference: Scoring
    limits: dict[str, float]


@dataclass(frozen=True)
class RankVerdict:
    """One rank's statistics in one check, its thresholds, and what fired."""

    rank: int
    stats: dict[str, float]
    limits: dict[str, float]
    fires: list[str]
    hard: list[str]

    @property
    def fired(self) -> list[str]:
        """What fails the check on this rank: its hard stops, else what crossed a threshold."""
        return self.hard or self.fires


def rank_shares(baseline: Baseline, ranks: int) -> list[RankShare]:
    """The references and probes each rank scores, with the baseline restricted to them.
    Nothing when the server has a single rank, or when a rank's share would be under
    ``MIN_RANK_TOKENS``."""
    lengths = [len(reference) for _, reference in baseline.canary_set.references]
    if ranks < 2 or len(lengths) < ranks:
        return []
    if min(sum(lengths[rank::ranks]) for rank in range(ranks)) < MIN_RANK_TOKENS:
        return []
    starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    shares = []
    for rank in range(ranks):
        mine = range(rank, len(lengths), ranks)
        positions = np.concatenate([np.arange(starts[i], starts[i + 1]) for i in mine])
        probes = list(range(rank, len(baseline.canary_set.probes), ranks))
        runs = [take(run, positions, probes) for run in baseline.runs]
        shares.append(
            RankShare(
                rank,
                positions,
                probes,
                median_reference(runs),
                thresholds(null_statistics(runs), baseline.rules),
            )
        )
    return shares


def take(scoring: Scoring, positions: np.ndarray, probes: Sequence[int]) -> Scoring:
    """The part of a scoring one rank produced."""
    has_top = scoring.top_ids.ndim == 2 and len(scoring.top_ids) == len(scoring.lps)
    return Scoring(
        scoring.lps[positions],
        scoring.top_ids[positions] if has_top else scoring.top_ids,
        scoring.top_lps[positions] if has_top else scoring.top_lps,
        [scoring.greedy[j] for j in probes if j < len(scoring.greedy)],
    )


def rank_verdicts(
    scoring: Scoring, shares: Sequence[RankShare], baseline: Baseline
) -> list[RankVerdict]:
    """Each rank's statistics against its own share of the baseline."""
    verdicts = []
    for share in shares:
        stats = compare(take(scoring, share.positions, share.probes), share.reference)
        verdicts.append(
            RankVerdict(
                share.rank,
                stats,
                share.limits,
                [f"rank {share.rank}: {fire}" for fire in fired(stats, share.limits)],
                [f"rank {share.rank}: {fire}" for fire in hard_stop(stats, baseline.rules)],
            )
        )
    return verdicts
