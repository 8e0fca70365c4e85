"""What the controller knows of answer lengths: a high percentile per prompt-length bucket (the
projection) and a survival curve (the forecast).

Why a survival curve and not the lengths of the answers that ended: early in a run the answers
that have ended are the short ones (a long answer is still running), so a distribution of ended
answers alone promises room that is not there, and the first forecasts over-admit. The
Kaplan-Meier estimator counts each request still running as an answer known to be longer than
what it has generated so far (a censored observation), which removes that bias: until the long
answers end, the curve keeps their mass alive, up to ``max_new_tokens``.
"""

from __future__ import annotations

import bisect
import itertools
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from eagledata.rundir.percentile import percentile

RECENT = 128
"""The latest answers that stand alone for a bucket when they are longer than its window's."""

CURVE_MIN_ANSWERS = 2
"""Answers before a survival curve stands for the forecast (all buckets' together until a
bucket holds ``min_samples``): fewer than the projection needs, because the Kaplan-Meier curve
counts every request still running as longer than its age and sends the mass no answer has
settled to ``max_new_tokens``. A curve of two answers is the prior where it knows nothing and
the answers where it does; before, the prior alone held the reference job's pool at about half
full until 8 answers were in."""

BUCKET_EDGES = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
"""Prompt-length buckets (tokens): long prompts often ask for long answers."""


def bucket_of(prompt_tokens: int) -> int:
    return bisect.bisect_right(BUCKET_EDGES, prompt_tokens)


GRID = 4096
"""Steps of the survival probability on which a draw's threshold is read (a lookup, not a
search, per request and future: the forecast runs at every admission)."""


@dataclass(frozen=True, slots=True)
class CurveArrays:
    """A curve as the forecast draws from it (``capacity/forecast.py``): its lengths, its
    survival, for each grid step ``g`` the index of the first length where ``S <= g / GRID``,
    and the lengths with ``cap`` appended."""

    times: npt.NDArray[np.float64]
    surviving: npt.NDArray[np.float64]
    first_at_most: npt.NDArray[np.intp]
    ends_at: npt.NDArray[np.float64]

    @classmethod
    def of(cls, times: Sequence[int], surviving: Sequence[float], cap: int) -> CurveArrays:
        lengths = np.asarray(times, dtype=np.float64)
        alive = np.asarray(surviving, dtype=np.float64)
        grid = np.arange(GRID + 1, dtype=np.float64) / GRID
        first_at_most = np.searchsorted(-alive, -grid, side="left")
        return cls(lengths, alive, first_at_most, np.append(lengths, float(cap)))


@dataclass(frozen=True, slots=True)
class SurvivalCurve:
    """``S(t) = P(an answer is longer than t tokens)``, a step function, and no answer runs past
    ``cap`` (``max_new_tokens``)."""

    times: Sequence[int]
    """The distinct lengths answers ended at, ascending."""
    surviving: Sequence[float]
    """``S`` just after each of ``times``."""
    cap: int
    arrays: CurveArrays = field(init=False, repr=False, compare=False)
    """The curve as the forecast draws from it, computed once with the curve (a curve is
    immutable, and the length model makes a new one when its answers change)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "arrays", CurveArrays.of(self.times, self.surviving, self.cap))

    def at(self, tokens: int) -> float:
        if tokens >= self.cap:
            return 0.0
        index = bisect.bisect_right(self.times, tokens)
        return 1.0 if index == 0 else self.surviving[index - 1]

    def alive(self, age: int, ahead: int) -> float:
        """P(a request that has generated ``age`` tokens is still running ``ahead`` later).

        A request older than every answer seen, with no other request running that long (the
        curve is 0 there), is given another quarter of its age."""
        if age + ahead >= self.cap:
            return 0.0
        now = self.at(age)
        if now <= 0.0:
            return 1.0 if ahead < max(16, age // 4) else 0.0
        return self.at(age + ahead) / now


def kaplan_meier(ended: Sequence[int], running: Sequence[int], cap: int) -> SurvivalCurve:
    """The survival curve of answer lengths from the answers that ended (``ended``, ascending)
    and the ages of the requests still running (``running``, ascending: answers known to be
    longer than their age). At each length ``t`` an answer ended at, ``S`` falls by the share
    of the requests at risk there (ended at ``t`` or later, or running at age ``t`` or older)
    that ended at ``t``."""
    times: list[int] = []
    surviving: list[float] = []
    survival = 1.0
    index = 0
    total_ended, total_running = len(ended), len(running)
    while index < total_ended:
        length = ended[index]
        same = bisect.bisect_right(ended, length, lo=index) - index
        at_risk = (total_ended - index) + (total_running - bisect.bisect_left(running, length))
        survival *= 1.0 - same / at_risk
        times.append(length)
        surviving.append(survival)
        index += same
    return SurvivalCurve(times, surviving, cap)


class LengthModel:
    """Answer lengths per prompt-length bucket, over the latest answers.

    Until a bucket holds ``min_samples`` answers it borrows all buckets', and until those do,
    ``prior`` (``max_new_tokens`` unless seeded: the pessimistic start). The survival curve
    starts sooner (``CURVE_MIN_ANSWERS``)."""

    def __init__(
        self,
        *,
        prior: int,
        quantile: float = 0.9,
        min_samples: int = 16,
        window: int = 512,
        cap: int | None = None,
    ) -> None:
        self.prior = prior
        self.quantile = quantile
        self.min_samples = min_samples
        self.cap = cap if cap is not None else prior
        self._buckets: dict[int, deque[int]] = {}
        self._all: deque[int] = deque(maxlen=window)
        self._window = window
        self._cache: dict[int, int] = {}
        self._running: dict[int | None, list[int]] = {None: []}
        self._curves: dict[int | None, SurvivalCurve] = {}
        self._sources: dict[int, tuple[int | None, Sequence[int]] | None] = {}
        """``_source`` per prompt bucket, until the next answer (it sorts the window twice)."""

    def add(self, prompt_tokens: int, completion_tokens: int) -> None:
        bucket = self._buckets.setdefault(bucket_of(prompt_tokens), deque(maxlen=self._window))
        bucket.append(completion_tokens)
        self._all.append(completion_tokens)
        self._cache.clear()
        self._sources.clear()
        self._curves.clear()

    def seed(self, completion_tokens: Sequence[int]) -> int:
        """Answers a previous session of the run already wrote (their lengths only: a shard
        index does not keep each record's prompt length), oldest first. They count for every
        bucket until a bucket has answers of its own, so a resumed run starts from what its
        records say instead of the ``max_new_tokens`` prior. Returns how many were taken."""
        taken = completion_tokens[-self._window :]
        self._all.extend(taken)
        self._cache.clear()
        self._sources.clear()
        self._curves.clear()
        return len(taken)

    def set_running(self, requests: Iterable[tuple[int, int]]) -> None:
        """The requests in flight now, as (prompt tokens, tokens generated so far)."""
        running: dict[int | None, list[int]] = {None: []}
        for prompt_tokens, age in requests:
            running.setdefault(bucket_of(prompt_tokens), []).append(age)
            running[None].append(age)
        for ages in running.values():
            ages.sort()
        self._running = running
        self._curves.clear()

    def _source(self, prompt_tokens: int) -> tuple[int | None, Sequence[int]] | None:
        """The answers that stand for this prompt's: its bucket's, else all, else None; of
        those, the latest ``RECENT`` alone when their percentile is the higher (``_latest``)."""
        key = bucket_of(prompt_tokens)
        if key in self._sources:
            return self._sources[key]
        bucket = self._buckets.get(key)
        source: tuple[int | None, Sequence[int]] | None = None
        if bucket is not None and len(bucket) >= self.min_samples:
            source = key, self._latest(bucket)
        elif len(self._all) >= self.min_samples:
            source = None, self._latest(self._all)
        self._sources[key] = source
        return source

    def _latest(self, answers: deque[int]) -> Sequence[int]:
        """Answers that grow are followed within ``RECENT`` answers, not within the window: the
        latest alone stand for what runs now when their percentile is above the window's (an
        answer longer than projected is a retraction; one shorter, room left for a while). So
        the model follows a growth at once and a shrinking over the window."""
        if len(answers) < 2 * RECENT:
            return answers
        latest = list(itertools.islice(answers, len(answers) - RECENT, None))
        if _percentile(latest, self.quantile) > _percentile(answers, self.quantile):
            return latest
        return answers

    def estimate(self, prompt_tokens: int) -> int:
        """The ``quantile`` of the answers that ended (the projection ``P + L90``)."""
        key = bucket_of(prompt_tokens)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        source = self._source(prompt_tokens)
        value = self.prior if source is None else _percentile(source[1], self.quantile)
        self._cache[key] = value
        return value

    def curve(self, prompt_tokens: int) -> SurvivalCurve | None:
        """The survival curve that stands for this prompt's answer (its bucket's, else all
        buckets'), with the requests running now counted; None while fewer than
        ``CURVE_MIN_ANSWERS`` ended.
        A new object after every ``add`` or ``set_running``: safe to keep."""
        source = self._source(prompt_tokens)
        if source is None:
            if len(self._all) < CURVE_MIN_ANSWERS:
                return None
            source = None, self._all
        key, ended = source
        curve = self._curves.get(key)
        if curve is None:
            running = self._running.get(key, [])
            curve = kaplan_meier(sorted(ended), running, self.cap)
            if not self.learned:
                curve = _with_prior(curve, 1.0 - len(self._all) / self.min_samples)
            self._curves[key] = curve
        return curve

    @property
    def samples(self) -> int:
        return len(self._all)

    @property
    def learned(self) -> bool:
        """As many answers as the projection needs: the curve of fewer still holds the prior's
        mass, and the usage target does not probe its margin on it."""
        return len(self._all) >= self.min_samples


def _with_prior(curve: SurvivalCurve, unsettled: float) -> SurvivalCurve:
    """A curve of fewer than ``min_samples`` answers, whose survival never falls below the
    share of them not seen yet (``unsettled``): that share still runs to the cap, as the prior
    says. Kaplan-Meier over a handful of answers settles the whole tail at its last one once
    the requests still running are younger than it: two answers of 3 and 22 tokens beside three
    requests 5-18 tokens along said every answer ends by 22, and ``auto`` sent 25 at once to a
    real server that ran 7 of them (a 2,048-token pool)."""
    floored = [max(alive, unsettled) for alive in curve.surviving]
    return SurvivalCurve(curve.times, floored, curve.cap)


def _percentile(values: Iterable[int], quantile: float) -> int:
    found = percentile(values, quantile)  # nearest rank, as status and the report say it
    assert found is not None, "called with answers only"
    return found
