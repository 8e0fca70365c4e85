"""The baseline checks itself: did the server change while it was being measured?

The baseline's scorings are taken one after the other (idle, then under load), after the server
sampled the references. A server that degrades meanwhile leaves its mark in them: the scorings
from some point on move together, or drift, and the pairs across that point inflate the null, so
the thresholds absorb the change and every later check passes a degraded server. Before a
baseline is kept, its scorings, in time order, are tested three ways; any one refuses it
(``BaselineChangedError``, exit 4):

* **steps**: for every point between two scorings (and, so that a change that began during one
  scoring cannot hide, every scoring left out as the point), the scorings after it against those
  before it: their medians compared with the statistics of a check, against thresholds derived
  by the check's rules from the noise each side shows on its own (the pairs within the before
  side and within the after side, never across). ``mean_shift`` counts either way here. The
  point between the idle and the load scorings is this test too: they must agree within the
  noise they themselves show.
* **trend**: each scoring's level (its trimmed signed mean against the baseline's median), fitted
  by a line over time; the change the line makes from the first scoring to the last, against
  the ``mean_shift`` threshold derived from the levels left once the line is taken out (a
  gradual change spreads over every pair, and no single step stands out).
* **the references as sampled**: the logprobs the server gave each reference token when it
  sampled it (SGLang's ``output_token_logprobs``, temperature 1) are the series' first point. A
  degradation from the first scoring on moves every scoring together (no step, no trend) but
  scores the references lower than their own sampling did (E = -KL <= 0): one-sided, against
  the ``mean_shift`` threshold a check of this baseline would have (one comparison, as a check
  makes), its noise never under this comparison's own standard error. Decode and prefill
  kernels round each token differently: on average that costs KL(decode || prefill), far under
  the threshold's floor, but token by token it moves the mean of a small canary by chance as
  far as the floor, and a server whose prefill is deterministic (the CPU) shows none of that
  in its scorings' pairs. Skipped when the server returned no output logprobs (an older
  baseline file, a proxy that drops them).

The steps and the trend are a dozen comparisons per baseline, each against the noise of fewer
pairs than a check's threshold rests on, so each gets ``MARGIN`` times a check's room.

What it cannot see: a server already degraded when it sampled the references (use a shared
baseline recorded on a known-good server), a change smaller than the noise, and anything in a
baseline of two scorings (``baseline_idle_runs + baseline_load_runs`` of 2; the default is 6): one
pair of scorings is too thin a noise estimate to judge against, so every test is skipped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from eagledata.quality.canary_stats import (
    Rules,
    Scoring,
    compare,
    fired,
    hard_stop,
    median_reference,
    null_statistics,
    thresholds,
    trimmed_mean_se,
    trimmed_signed_mean,
)

MARGIN = 2.0
"""How much wider than a check's threshold a step's and the trend's are. A check is one
comparison against the noise of every pair of the baseline; these are a dozen (every point,
with and without the scoring at it, and the trend), each against the noise of fewer pairs (one
side's, or what a line leaves), so each gets twice the room, to keep the family's false
refusals as rare as a check's false alarms (measured: ``benchmarks/canary_null.py
--self-check``)."""
MIN_SIDE_PAIRS = 1
"""A step is judged only when at least one side has a pair of scorings to show its noise."""
MIN_TREND_RUNS = 4
"""A line through fewer scorings leaves too few to measure the noise around it."""
MIN_SAMPLED_RUNS = 3
"""The references-as-sampled test needs three pairs of scorings (three scorings) behind its
threshold. From one pair, the threshold is that pair's chance difference times four, often under
the floor: a healthy two-scoring baseline of 4 x 24 tokens was refused 85 times in 2,000 (the
simulator's model with its batch noise); with three scorings this test refused 12 in 2,000, with
six 1 in 2,000 (``benchmarks/canary_null.py --offline 2000 --references 4 --reference-tokens 24
--idle-runs 1 --load-runs 1``, then 2 and 1, then 3 and 3)."""


@dataclass(frozen=True)
class Finding:
    """Why a baseline was refused: what was compared, and what crossed its threshold."""

    what: str
    fires: list[str]

    def __str__(self) -> str:
        return f"{self.what}: {self.fires[0]}"


def self_check(
    runs: Sequence[Scoring],
    kinds: Sequence[str],
    rules: Rules,
    sampled: np.ndarray | None = None,
) -> Finding | None:
    """The first sign that the server changed during the baseline, or None."""
    return _sampled(runs, rules, sampled) or _steps(runs, kinds, rules) or _trend(runs, rules)


def wider(limits: dict[str, float]) -> dict[str, float]:
    """A check's thresholds, ``MARGIN`` times as far from no change."""
    out = {name: value * MARGIN for name, value in limits.items()}
    out["greedy_divergence"] = limits["greedy_divergence"] / MARGIN
    return out


def _step_fires(stats: dict[str, float], limits: dict[str, float], rules: Rules) -> list[str]:
    """What a check would fire on, with ``mean_shift`` counted either way."""
    fires = hard_stop(stats, rules) or fired(stats, limits)
    shift, bound = stats["mean_shift"], -limits["mean_shift"]
    if shift > bound:
        fires.append(f"mean_shift +{shift:.4g} > +{bound:.4g}")
    return fires


def _name(index: int, kinds: Sequence[str]) -> str:
    return f"scoring {index + 1} ({kinds[index]})"


def _steps(runs: Sequence[Scoring], kinds: Sequence[str], rules: Rules) -> Finding | None:
    """The step that stands out most (by ``mean_shift`` against its threshold), or None."""
    n = len(runs)
    idle = sum(1 for kind in kinds if kind == "idle")
    found: list[tuple[float, Finding]] = []
    for point in range(1, n):
        # the point between two scorings, then with the scoring after it left out (a change
        # that began during it left it half-way: on neither side)
        for skip in (0, 1):
            before, after = list(runs[:point]), list(runs[point + skip :])
            if not after:
                continue
            within = null_statistics(before) + null_statistics(after)
            if len(within) < 2 * MIN_SIDE_PAIRS:
                continue
            limits = wider(thresholds(within, rules))
            stats = compare(median_reference(after), median_reference(before))
            fires = _step_fires(stats, limits, rules)
            if not fires:
                continue
            if skip == 0 and point == idle and 0 < idle < n:
                what = "the load scorings against the idle ones, beyond the noise each shows"
            else:
                left = f", {_name(point, kinds)} left out" if skip else ""
                what = (
                    f"the scorings after {_name(point - 1, kinds)} against those before"
                    f"{left}, beyond the noise each side shows"
                )
            found.append((abs(stats["mean_shift"] / limits["mean_shift"]), Finding(what, fires)))
    return max(found, key=lambda entry: entry[0])[1] if found else None


def levels(runs: Sequence[Scoring]) -> np.ndarray:
    """Each scoring's signed level against the per-token median of all of them (trimmed as
    ``mean_shift`` is)."""
    reference = median_reference(runs).lps
    return np.array([trimmed_signed_mean(run.lps - reference) for run in runs])


def _trend(runs: Sequence[Scoring], rules: Rules) -> Finding | None:
    n = len(runs)
    if n < MIN_TREND_RUNS:
        return None
    level = levels(runs)
    t = np.arange(n, dtype=np.float64)
    slope, intercept = np.polyfit(t, level, 1)
    change = float(slope * (n - 1))
    residual = level - (slope * t + intercept)
    # the residuals' pairs are the noise once the line is out: the check's mean_shift rule
    noise = max(abs(a - b) for i, a in enumerate(residual) for b in residual[i + 1 :])
    bound = MARGIN * max(rules.mean_shift_factor * noise, rules.mean_shift_floor)
    if abs(change) <= bound:
        return None
    return Finding(
        f"a trend over the {n} scorings, beyond the noise around it",
        [f"mean_shift moved {change:+.4g} from the first to the last, past +-{bound:.4g}"],
    )


def _sampled(runs: Sequence[Scoring], rules: Rules, sampled: np.ndarray | None) -> Finding | None:
    if sampled is None or len(runs) < MIN_SAMPLED_RUNS:
        return None
    reference = median_reference(runs).lps
    if sampled.shape != reference.shape:
        return None
    delta = reference - sampled
    shift = trimmed_signed_mean(delta)
    # One comparison, as a check makes: the check's own threshold, its noise never taken under
    # what this comparison's own shift moves by chance. Decode and prefill round each token
    # differently, and where prefill is deterministic (SGLang on the CPU: every scoring equal
    # to 1e-9) the scorings' pairs show none of that noise: of 400 healthy 4 x 32 sets of the
    # real server, 5 fell under the floor alone, none under this bound (docs/quality.md).
    noise_limit = -rules.mean_shift_factor * trimmed_mean_se(delta)
    limit = min(thresholds(null_statistics(runs), rules)["mean_shift"], noise_limit)
    if shift >= limit:
        return None
    return Finding(
        "the scorings against the references as the server sampled them",
        [f"mean_shift {shift:.4g} < {limit:.4g}"],
    )
