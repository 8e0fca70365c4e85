"""The canary's statistics: how far one scoring of the references is from the baseline, and the
thresholds that say "not noise" (docs/quality.md, "Statistics and thresholds"; the multipliers
are hypotheses, so they are settings here, and the floor under them is measured, not assumed).

A *scoring* is what one canary run measured: the logprob the server gave each reference token
(teacher-forced, after a warm-up), the top-k candidates at each position, and the greedy output of
each decode probe. The *baseline* is several scorings taken at the start (idle and under load);
its per-token median is the reference ``lp_ref``, and every pair of its scorings, one standing in
for the reference, gives one draw of the noise: the *null*.

Statistics of a scoring against a reference:

* ``mean_shift``: mean of (lp - lp_ref) over the scored tokens, 5% trimmed at each end. Signed: a
  reference sampled from the healthy model scores lower, on average, on any other model
  (E = -KL <= 0), while batch noise averages out (its standard error shrinks with the token
  count); the trim keeps MoE routing flips (a few positions moved far) from setting the floor.
* ``trimmed_abs``: mean of |lp - lp_ref| over all but the largest 10%: MoE routing flips move a
  few positions a lot; trimming keeps them from voting.
* ``topk_kl``: mean over positions (all but the largest 10%, as above) of the KL from the
  reference to the current distribution over the reference's top-k ids plus one bucket for the
  rest (``topk_kl_per_position``: >= 0, a lower bound of the full KL); an id missing from the
  current top-k gets the smaller of the current k-th probability and its share of what the
  current top-k leaves.
* ``top1_flip``: share of positions whose most likely token changed.
* ``greedy_divergence``: median over decode probes of where the greedy output first differs from
  the baseline's, as a fraction of its length (1.0: never).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

STATS = ("mean_shift", "trimmed_abs", "topk_kl", "top1_flip", "greedy_divergence")


@dataclass
class Scoring:
    """One canary run's measurements, every reference concatenated in order."""

    lps: np.ndarray
    top_ids: np.ndarray
    top_lps: np.ndarray
    greedy: list[list[int]] = field(default_factory=list)

    def to_json(self, top: bool = True) -> dict[str, Any]:
        """Logprobs as float32 (7 significant digits: far below any threshold); the top-k
        only when ``top`` (a baseline keeps it for its reference run alone)."""
        out: dict[str, Any] = {"lps": self.lps.astype(np.float32), "greedy": self.greedy}
        if top:
            out["top_ids"] = self.top_ids.astype(np.int32)
            out["top_lps"] = self.top_lps.astype(np.float32)
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Scoring:
        return cls(
            np.asarray(raw["lps"], dtype=np.float64),
            np.asarray(raw.get("top_ids", np.zeros((0, 0))), dtype=np.int64),
            np.asarray(raw.get("top_lps", np.zeros((0, 0))), dtype=np.float64),
            [list(map(int, g)) for g in raw.get("greedy", [])],
        )


def first_divergence(now: Sequence[int], then: Sequence[int]) -> float:
    """Where ``now`` first differs from ``then``, as a fraction of ``then`` (1.0: never)."""
    if not then:
        return 1.0
    for index, (a, b) in enumerate(zip(now, then, strict=False)):
        if a != b:
            return index / len(then)
    return 1.0 if len(now) >= len(then) else len(now) / len(then)


def compare(now: Scoring, reference: Scoring, trim: float = 0.1) -> dict[str, float]:
    """The statistics of ``now`` against ``reference`` (the same references, the same order)."""
    if now.lps.shape != reference.lps.shape:
        raise ValueError("the scorings cover different tokens")
    delta = now.lps - reference.lps
    absolute = np.sort(np.abs(delta))
    keep = max(1, round(len(absolute) * (1.0 - trim)))
    stats = {
        "mean_shift": trimmed_signed_mean(delta, trim / 2),
        "trimmed_abs": float(absolute[:keep].mean()) if len(absolute) else 0.0,
        "topk_kl": 0.0,
        "top1_flip": 0.0,
        "greedy_divergence": 1.0,
    }
    k = min(reference.top_ids.shape[1], now.top_ids.shape[1]) if reference.top_ids.ndim == 2 else 0
    if k and len(reference.top_ids):
        ref_ids, ref_lps = reference.top_ids[:, :k], reference.top_lps[:, :k]
        now_ids, now_lps = now.top_ids[:, :k], now.top_lps[:, :k]
        kl = np.sort(topk_kl_per_position(ref_ids, ref_lps, now_ids, now_lps))
        stats["topk_kl"] = float(kl[: max(1, round(len(kl) * (1.0 - trim)))].mean())
        stats["top1_flip"] = float((ref_ids[:, 0] != now_ids[:, 0]).mean())
    if reference.greedy:
        divergences = [
            first_divergence(a, b) for a, b in zip(now.greedy, reference.greedy, strict=False)
        ]
        stats["greedy_divergence"] = float(np.median(divergences)) if divergences else 1.0
    return stats


def topk_kl_per_position(
    ref_ids: np.ndarray, ref_lps: np.ndarray, now_ids: np.ndarray, now_lps: np.ndarray
) -> np.ndarray:
    """KL(ref || now) at each position, over the reference's top-k ids and one bucket for every
    other id: both sides are whole distributions, so it is >= 0 (Gibbs' inequality) and a lower
    bound of the full KL (coarse-graining loses information, never adds it).

    The sum of p_ref (lp_ref - lp_now) over the top-k alone is no divergence: the top-k does not
    hold all of p_ref's mass, and when the current server moves mass into those ids from the rest
    the sum goes negative. A reference id missing from the current top-k has at most the current
    k-th probability, and all of them together at most what the current top-k leaves: each gets
    the smaller of the two (the share of the rest), so the current side never sums past 1.
    """
    ref_p = np.exp(ref_lps)
    now_p = np.exp(now_lps)
    match = ref_ids[:, :, None] == now_ids[:, None, :]
    found = match.any(axis=2)
    first = np.take_along_axis(now_p, match.argmax(axis=2), axis=1)
    outside = np.clip(1.0 - now_p.sum(axis=1, keepdims=True), 0.0, None)
    missing = (~found).sum(axis=1, keepdims=True)
    share = np.minimum(now_p[:, -1:], outside / np.maximum(missing, 1))
    now_q = np.where(found, first, share)
    ref_rest = np.clip(1.0 - ref_p.sum(axis=1), 0.0, None)
    now_rest = np.clip(1.0 - now_q.sum(axis=1), 0.0, None)
    tiny = np.finfo(np.float64).tiny
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(ref_p > 0, ref_p * (np.log(ref_p) - np.log(np.maximum(now_q, tiny))), 0.0)
        rest = np.where(
            ref_rest > 0, ref_rest * (np.log(ref_rest) - np.log(np.maximum(now_rest, tiny))), 0.0
        )
    # >= 0 in exact arithmetic; float rounding of equal distributions can leave -1e-17
    return np.asarray(np.maximum(terms.sum(axis=1) + rest, 0.0))


def trimmed_signed_mean(delta: np.ndarray, tail: float = 0.05) -> float:
    """Mean of ``delta`` without its ``tail`` share at each end: a routing flip moves a few
    positions a lot either way and would otherwise set the noise floor; a systematic shift
    moves them all and survives the trim."""
    if not len(delta):
        return 0.0
    ordered = np.sort(delta)
    cut = int(len(ordered) * tail)
    kept = ordered[cut : len(ordered) - cut] if len(ordered) - 2 * cut > 0 else ordered
    return float(kept.mean())


def trimmed_mean_se(delta: np.ndarray, tail: float = 0.05) -> float:
    """The standard error of ``trimmed_signed_mean(delta, tail)`` when the positions' noise is
    independent: the winsorized sample's spread over (1 - 2 * tail) * sqrt(n) (the
    Tukey-McLaughlin estimate). What the trimmed mean of these tokens moves by chance alone."""
    n = len(delta)
    ordered = np.sort(delta)
    cut = int(n * tail)
    if n < 3 or n - 2 * cut < 2:
        return 0.0
    winsorized = np.clip(ordered, ordered[cut], ordered[n - 1 - cut])
    return float(winsorized.std(ddof=1) / ((1.0 - 2.0 * cut / n) * np.sqrt(n)))


def median_reference(runs: Sequence[Scoring]) -> Scoring:
    """The per-token median of the baseline runs; top-k and greedy outputs of the first run."""
    lps = np.median(np.stack([run.lps for run in runs]), axis=0)
    first = runs[0]
    return Scoring(lps, first.top_ids, first.top_lps, first.greedy)


class Rules(BaseModel):
    """How thresholds derive from the null (the protocol's hypotheses, to be calibrated)."""

    model_config = ConfigDict(extra="forbid")

    mean_shift_factor: float = 4.0
    mean_shift_floor: float = 1e-3
    trimmed_abs_factor: float = 3.0
    trimmed_abs_margin: float = 5e-3
    topk_kl_factor: float = 4.0
    topk_kl_floor: float = 5e-4
    top1_flip_factor: float = 4.0
    top1_flip_floor: float = 0.01
    top1_flip_positions: int = 4
    """``top1_flip`` never fires on this many flipped positions or fewer: on a small canary the
    0.01 floor is under three positions, which healthy routing noise reaches."""
    greedy_divergence_factor: float = 0.5
    hard_trimmed_abs: float = 0.05
    hard_top1_flip: float = 0.05


def null_statistics(runs: Sequence[Scoring]) -> list[dict[str, float]]:
    """One statistics dict per ordered pair of baseline runs (the second as the reference), with
    the standard error of its ``mean_shift`` (``mean_shift_se``) and the positions its
    ``top1_flip`` counts over (``top1_positions``): the floors under those two thresholds
    (``thresholds``)."""
    return [
        {
            **compare(a, b),
            "mean_shift_se": trimmed_mean_se(a.lps - b.lps),
            "top1_positions": float(len(b.top_ids)),
        }
        for a, b in itertools.permutations(runs, 2)
    ]


def thresholds(null: Sequence[dict[str, float]], rules: Rules) -> dict[str, float]:
    """From the noise floor: the worst the null did, times a factor, never under a floor."""
    if not null:
        raise ValueError("the baseline needs at least two runs")
    # A few pairs can all land near zero by chance (1 baseline in 90-200 of the tests' 6 x 48
    # canary: 4 m0 under the 1e-3 floor, and up to 1.6% of healthy checks fired). The per-token
    # noise says how far a pair's mean_shift moves by chance: m0 is never taken below it.
    # (A baseline stored before this key existed keeps the old rule.)
    m0 = max(max(abs(s["mean_shift"]), s.get("mean_shift_se", 0.0)) for s in null)
    a0 = max(s["trimmed_abs"] for s in null)
    kl0 = max(s["topk_kl"] for s in null)
    f0 = max(s["top1_flip"] for s in null)
    d0 = min(s["greedy_divergence"] for s in null)
    # top1_flip counts positions: its floor is a count too, so that a canary of a few hundred
    # positions does not fire on three routing flips (about 1 check in 27,000 did). A baseline
    # stored before top1_positions existed keeps the old rule.
    positions = min(s.get("top1_positions", 0.0) for s in null)
    flip_count_floor = rules.top1_flip_positions / positions if positions else 0.0
    return {
        "mean_shift": -max(rules.mean_shift_factor * m0, rules.mean_shift_floor),
        "trimmed_abs": max(rules.trimmed_abs_factor * a0, a0 + rules.trimmed_abs_margin),
        "topk_kl": max(rules.topk_kl_factor * kl0, rules.topk_kl_floor),
        "top1_flip": max(rules.top1_flip_factor * f0, rules.top1_flip_floor, flip_count_floor),
        "greedy_divergence": d0 * rules.greedy_divergence_factor,
    }


def fired(stats: dict[str, float], limits: dict[str, float]) -> list[str]:
    """The statistics past their threshold, each as ``name value vs threshold``."""
    out = []
    if stats["mean_shift"] < limits["mean_shift"]:
        out.append(f"mean_shift {stats['mean_shift']:.4g} < {limits['mean_shift']:.4g}")
    for name in ("trimmed_abs", "topk_kl", "top1_flip"):
        if stats[name] > limits[name]:
            out.append(f"{name} {stats[name]:.4g} > {limits[name]:.4g}")
    if stats["greedy_divergence"] < limits["greedy_divergence"]:
        out.append(
            f"greedy_divergence {stats['greedy_divergence']:.3g} < "
            f"{limits['greedy_divergence']:.3g}"
        )
    return out


def hard_stop(stats: dict[str, float], rules: Rules) -> list[str]:
    """Changes too large to be noise whatever the null: no rerun."""
    out = []
    if stats["trimmed_abs"] > rules.hard_trimmed_abs:
        out.append(f"trimmed_abs {stats['trimmed_abs']:.4g} > {rules.hard_trimmed_abs:g}")
    if stats["top1_flip"] > rules.hard_top1_flip:
        out.append(f"top1_flip {stats['top1_flip']:.4g} > {rules.hard_top1_flip:g}")
    return out
