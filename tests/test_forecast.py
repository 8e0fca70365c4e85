"""The gate's forecast: the KV peak of the requests in flight over sampled futures."""

from __future__ import annotations

import numpy as np
import pytest

from eagledata.capacity.forecast import (
    FUTURES,
    Flight,
    curve_remaining_many,
    new_draws,
    peak_quantile,
)
from eagledata.capacity.lengths import kaplan_meier


def fixed(held: int, age: int, end: int) -> Flight:
    """A request with no curve: it ends at its projection ``end``."""
    return Flight(held, age, end, None, np.full(FUTURES, 0.5))


def true_peak(held: list[int], left: list[int]) -> int:
    """The highest sum over the steps ahead, step by step (what the pool would show)."""
    return max(
        sum(h + t for h, r in zip(held, left, strict=True) if t <= r) for t in range(max(left) + 1)
    )


def test_the_peak_is_the_highest_sum_over_the_path_not_each_request_at_its_end() -> None:
    # A request 60 tokens from its end beside a young long one: their sum peaks when the first
    # ends (160 + 90 = 250), above the young one's own end (230) and far below the sum of each
    # one's own peak (160 + 230 = 390).
    flights = [fixed(held=100, age=40, end=100), fixed(held=30, age=0, end=200)]
    assert peak_quantile(flights, 0.9) == true_peak([100, 30], [60, 200]) == 250
    held = [50 * i for i in range(1, 30)]
    many = [fixed(held=h, age=i, end=300 - 7 * i) for i, h in enumerate(held, start=1)]
    left = [300 - 8 * i for i in range(1, 30)]
    assert peak_quantile(many, 0.5) == true_peak(held, left)
    assert peak_quantile([], 0.9) == 0.0


def test_a_request_past_every_answer_seen_runs_to_max_new_tokens() -> None:
    # Three answers ended at 100-300 tokens; two requests are still running at 500: the curve
    # knows nothing past 300 but that they outlived it, so they may run to the cap.
    curve = kaplan_meier([100, 200, 300], [500, 500], cap=4096)
    draws = np.linspace(0.01, 0.99, FUTURES)
    old, young = curve_remaining_many(curve, np.asarray([500.0, 0.0]), np.stack([draws, draws]))
    assert set(old) == {4096 - 500}
    assert set(young) == {100, 200, 300, 4096}
    # 3 of 5 end at 100-300, 2 of 5 run to the cap: the draws follow the curve.
    assert np.mean(young == 4096) == pytest.approx(0.4, abs=0.02)


def test_the_quantile_is_calibrated_against_futures_drawn_from_the_true_lengths() -> None:
    # Answers uniform in 1,500-4,500 tokens; the curve is learned from 400 of them. A world is
    # what a full pool holds at a random instant: 20 requests whose lengths are length-biased
    # (a long answer is running more of the time), each at a uniform point of its life. Over
    # many worlds the true peak passes the 90th percentile forecast in about 10% of them.
    rng = np.random.default_rng(7)
    curve = kaplan_meier(sorted(rng.integers(1500, 4501, 400).tolist()), [], cap=8192)
    passed = 0
    worlds = 300
    for _ in range(worlds):
        lengths = length_biased(rng, 20)
        ages = (rng.uniform(0, 1, 20) * lengths).astype(int)
        prompts = rng.integers(700, 6600, 20)
        held = (prompts + ages).tolist()
        flights = [
            Flight(h, int(a), 3000, curve, new_draws(rng)) for h, a in zip(held, ages, strict=True)
        ]
        forecast = peak_quantile(flights, 0.9)
        passed += true_peak_fast(held, (lengths - ages).tolist()) > forecast
    assert 0.04 <= passed / worlds <= 0.17


def length_biased(rng: np.random.Generator, count: int) -> np.ndarray:
    """Lengths uniform in 1,500-4,500 tokens, drawn in proportion to their length."""
    out: list[int] = []
    while len(out) < count:
        length = int(rng.integers(1500, 4501))
        if rng.uniform() < length / 4500:
            out.append(length)
    return np.asarray(out)


def true_peak_fast(held: list[int], left: list[int]) -> int:
    order = sorted(range(len(left)), key=lambda i: left[i])
    return max(
        sum(held[i] for i in order[j:]) + (len(order) - j) * left[order[j]]
        for j in range(len(order))
    )


def test_the_same_request_keeps_its_futures() -> None:
    rng = np.random.default_rng(0)
    curve = kaplan_meier(list(range(100, 1100, 10)), [], cap=2048)
    flights = [Flight(500, 0, 0, curve, new_draws(rng)) for _ in range(10)]
    assert peak_quantile(flights, 0.9) == peak_quantile(flights, 0.9)
    assert (
        peak_quantile(flights, 0.5) <= peak_quantile(flights, 0.9) <= peak_quantile(flights, 0.99)
    )
