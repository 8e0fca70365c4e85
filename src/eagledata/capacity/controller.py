"""The arithmetic of ``--concurrency auto``: how much work one server (DP rank) can take now.

No I/O and no clock of its own (every method takes ``now``), so tests drive it directly. The live
loop that feeds it the server's signals and our requests is ``run/loadcontrol.py``.

Why a client must do this (``reference/sglang-quality-and-load.md`` sections 3.3 and 4.2): SGLang
admits a request while the pool covers its prompt plus ``min(max_new, 4096) x new_token_ratio``
for each running request, a ratio that decays to ~0.1. For multi-thousand-token answers it
over-admits, then retracts the requests with the fewest tokens when the pool overflows, and
re-prefills them later: compute thrown away. Too few requests and the pool idles instead.

The gate, per lane (one DP rank of one server, or a router's workers together):

* **Answer lengths** are learned per prompt-length bucket (``LengthModel``); a request's
  **projection** is ``P + min(max_new, L90)``, ``L90`` its bucket's 90th percentile (the prior,
  ``max_new_tokens``, until 8 answers are in).
* Each request in flight holds ``P + g`` tokens, ``g`` its generated tokens: seconds since sent x
  the per-request decode rate the server reports, scaled so that our requests add up to the KV
  the server last measured (``calibrate``). It grows one token per decode step until it ends; its
  end is distributed like its bucket's learned answers, given that it has run ``g`` tokens (or,
  before any are learned, it ends at its projection).
* The controller **forecasts** the KV its requests will hold over the coming steps, per interval
  between ``HORIZONS`` (each request bounded from above over the interval), as a mean and a
  variance, and admits a request only if ``max over intervals (mean + margin_sd x sd)``, plus
  the load the server reports that ours does not explain, stays within ``u* x pool``. The pool's
  measured use plus what was sent since must stay within it too.
* The server's queue is kept just deep enough to fill its next prefill batch:
  ``q* = max(2, ceil(chunked_prefill_size / mean prompt))``, halved on a 503.
* AIMD on the target usage ``u*`` (start 0.85, in [0.60, 0.95]): any retraction takes 0.05 off
  and freezes increases for ``freeze_s``; ``creep_every_s`` without one, with the peak measured
  usage below ``u* - 0.03``, adds 0.01 and gives one queue slot back. At a measured usage above
  0.97 with a queue, admissions pause (a retraction is imminent).
* No signal at all: the planner's number (``fallback_concurrency``), in-flight requests only.

In steady state this converges near ``W* = u* C / E_held`` running requests, where ``E_held =
E[P L + L^2 / 2] / E[L]`` is the time-weighted KV of one request: the planner's estimate of the
same quantity from an assumed answer length (``capacity/planner.py``).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from eagledata.capacity.planner import CLIENT_QUEUE_HEADROOM


@dataclass(frozen=True, slots=True)
class ControllerSettings:
    target_usage: float = 0.85
    min_usage: float = 0.60
    max_usage: float = 0.95
    backoff: float = 0.05
    creep: float = 0.01
    freeze_s: float = 120.0
    creep_every_s: float = 30.0
    pause_usage: float = 0.97
    length_quantile: float = 0.9
    min_samples: int = 8
    chunked_prefill_size: int = 8192
    default_decode_rate: float = 10.0
    """Tokens per second per request before the server or a result says otherwise (the
    reference run decoded ~10-12 tok/s per sequence)."""
    backoff_gap_s: float = 2.0
    """Signals of one retraction arrive through several channels: one backoff per gap."""
    margin_sd: float = 1.0
    """The forecast's safety margin, in standard deviations of the KV it forecasts."""


BUCKET_EDGES = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
"""Prompt-length buckets (tokens): long prompts often ask for long answers."""


def bucket_of(prompt_tokens: int) -> int:
    return bisect.bisect_right(BUCKET_EDGES, prompt_tokens)


class LengthModel:
    """A high percentile of answer lengths per prompt-length bucket, over the latest answers.

    Until a bucket holds ``min_samples`` answers it borrows all buckets' percentile, and until
    those do, ``prior`` (``max_new_tokens`` unless seeded: the pessimistic start)."""

    def __init__(
        self, *, prior: int, quantile: float = 0.9, min_samples: int = 16, window: int = 512
    ) -> None:
        self.prior = prior
        self.quantile = quantile
        self.min_samples = min_samples
        self._buckets: dict[int, deque[int]] = {}
        self._all: deque[int] = deque(maxlen=window)
        self._window = window
        self._cache: dict[int, int] = {}
        self._sorted: dict[int, list[int]] = {}

    def add(self, prompt_tokens: int, completion_tokens: int) -> None:
        bucket = self._buckets.setdefault(bucket_of(prompt_tokens), deque(maxlen=self._window))
        bucket.append(completion_tokens)
        self._all.append(completion_tokens)
        self._cache.clear()
        self._sorted.clear()

    def _percentile(self, values: Iterable[int]) -> int:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, math.ceil(self.quantile * len(ordered)) - 1)]

    def estimate(self, prompt_tokens: int) -> int:
        key = bucket_of(prompt_tokens)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        bucket = self._buckets.get(key)
        if bucket is not None and len(bucket) >= self.min_samples:
            value = self._percentile(bucket)
        elif len(self._all) >= self.min_samples:
            value = self._percentile(self._all)
        else:
            value = self.prior
        self._cache[key] = value
        return value

    def distribution(self, prompt_tokens: int) -> list[int] | None:
        """The sorted answer lengths that stand for this prompt's (its bucket, else all), or
        None while too few are known. A new list after every ``add``: safe to keep."""
        key = bucket_of(prompt_tokens)
        cached = self._sorted.get(key)
        if cached is not None:
            return cached
        bucket = self._buckets.get(key)
        if bucket is not None and len(bucket) >= self.min_samples:
            values = sorted(bucket)
        elif len(self._all) >= self.min_samples:
            values = sorted(self._all)
        else:
            return None
        self._sorted[key] = values
        return values

    @property
    def samples(self) -> int:
        return len(self._all)


@dataclass(slots=True, eq=False)
class Ticket:
    """One request in flight on a lane."""

    lane: Lane
    prompt_tokens: int
    projected: int
    sent_at: float
    lengths: list[int] | None = None
    """The answer-length distribution it is forecast with (None: it ends at ``projected``)."""


@dataclass(frozen=True, slots=True)
class LaneSample:
    """What the server said about one lane at ``time`` (None: not reported)."""

    time: float
    used_tokens: int | None = None
    pool_tokens: int | None = None
    running: int | None = None
    waiting: int | None = None
    token_usage: float | None = None
    gen_throughput: float | None = None
    retracted_total: float | None = None
    retracted_waiting: int | None = None
    max_running: int | None = None
    spec_accept_length: float | None = None
    """Speculative tokens per verify step (telemetry only; the controller does not read it)."""


@dataclass(eq=False)
class Lane:
    """One DP rank of one server (or a router's workers together): its gate and its AIMD."""

    server: str
    rank: int | None
    settings: ControllerSettings
    pool_tokens: int | None = None
    max_running: int | None = None
    fallback_limit: int | None = None
    """Set when the server offers no load signal: then only this many in flight."""
    usage_target: float = 0.85
    queue_target: int = 2
    queue_cap: int = 2
    tickets: dict[Ticket, None] = field(default_factory=dict)
    sample: LaneSample | None = None
    decode_rate: float = 10.0
    age_scale: float = 1.0
    frozen_until: float = 0.0
    last_backoff: float = -math.inf
    last_creep: float = 0.0
    peak_usage: float = 0.0
    retractions: int = 0
    rejections: int = 0

    @property
    def in_flight(self) -> int:
        return len(self.tickets)

    # --- the gate -----------------------------------------------------------------------------

    def age(self, ticket: Ticket, now: float) -> int:
        """Tokens it has generated, estimated: seconds since sent x the per-request rate, scaled
        so that our requests account for the KV the server last measured (``calibrate``)."""
        return int(max(0.0, now - ticket.sent_at) * self.decode_rate * self.age_scale)

    def calibrate(self, sample: LaneSample) -> None:
        """Fit the age scale to the server's own count: the requests it runs hold their prompts
        plus what they generated. The newest ``waiting`` requests are still queued (FCFS) and
        hold nothing yet. Keeps the forecast right when the rate estimate is off (a loaded
        client, a server that slows down)."""
        if sample.used_tokens is None:
            return
        sent = sorted((t for t in self.tickets if t.sent_at <= sample.time), key=_sent_at)
        running = sent[: max(0, len(sent) - (sample.waiting or 0))]
        raw = sum(max(0.0, sample.time - t.sent_at) * self.decode_rate for t in running)
        if not running or raw <= 0:
            return
        generated = sample.used_tokens - sum(t.prompt_tokens for t in running)
        self.age_scale = min(4.0, max(0.25, generated / raw))

    def forecast(self, now: float) -> tuple[list[float], list[float]]:
        """Mean and variance of the KV our requests hold at each of ``HORIZONS`` tokens ahead."""
        mean = [0.0] * len(HORIZONS)
        var = [0.0] * len(HORIZONS)
        for ticket in self.tickets:
            add_request(mean, var, ticket.prompt_tokens, self.age(ticket, now), ticket)
        return mean, var

    def unexplained(self, now: float) -> float:
        """KV the server reports that our requests in flight do not account for (another
        client's, or growth we underestimate): it stays in every forecast."""
        sample = self.sample
        if sample is None or sample.used_tokens is None:
            return 0.0
        ours = sum(ticket.prompt_tokens + self.age(ticket, now) for ticket in self.tickets)
        return max(0.0, sample.used_tokens - ours)

    def peak(self, now: float, extra: Ticket | None = None) -> float:
        """The highest KV forecast over the horizons (mean + ``margin_sd`` standard deviations),
        with ``extra`` admitted, plus the unexplained load."""
        mean, var = self.forecast(now)
        if extra is not None:
            add_request(mean, var, extra.prompt_tokens, 0, extra)
        z = self.settings.margin_sd
        worst = max(m + z * math.sqrt(v) for m, v in zip(mean, var, strict=True))
        return self.unexplained(now) + worst

    def budget(self) -> float | None:
        """The KV the lane may hold: the target share of the pool."""
        if self.pool_tokens is None:
            return None
        return self.usage_target * self.pool_tokens

    def present(self, prompt_tokens: int) -> float | None:
        """The pool's measured use now plus what we sent since it was measured, plus this
        prompt: it must stay within the target share whatever the forecast says."""
        sample = self.sample
        if sample is None or sample.used_tokens is None or self.pool_tokens is None:
            return None
        recent = sum(t.prompt_tokens for t in self.tickets if t.sent_at > sample.time)
        return sample.used_tokens + recent + prompt_tokens

    def queued_estimate(self) -> int:
        """The server's queue as we last saw it, plus what we sent since (it may be queued)."""
        if self.sample is None:
            return 0
        recent = sum(1 for ticket in self.tickets if ticket.sent_at > self.sample.time)
        return (self.sample.waiting or 0) + recent

    def room(self, candidate: Ticket, now: float) -> float | None:
        """Free projected KV if this request were admitted (>= 0), or None: not now."""
        if self.fallback_limit is not None:
            free = self.fallback_limit - self.in_flight
            return float(free) if free > 0 else None
        budget = self.budget()
        if budget is None:
            return None
        if self.max_running is not None and self.in_flight >= self.max_running + self.queue_target:
            return None
        queued = self.queued_estimate()
        if queued >= self.queue_target:
            return None
        sample = self.sample
        if (
            sample is not None
            and (sample.token_usage or 0.0) > self.settings.pause_usage
            and (queued > 0)
        ):
            return None
        present = self.present(candidate.prompt_tokens)
        if (
            present is not None
            and present > self.usage_target * (self.pool_tokens or 0)
            and (self.in_flight > 0)
        ):
            return None
        left = budget - self.peak(now, candidate)
        if left < 0 and self.in_flight > 0:
            return None
        return max(0.0, left)

    # --- adaptation ---------------------------------------------------------------------------

    def observe(self, sample: LaneSample, now: float) -> bool:
        """Take a new server sample; True if it shows a retraction (the caller logs it)."""
        previous = self.sample
        self.sample = sample
        if sample.pool_tokens:
            self.pool_tokens = sample.pool_tokens
        if sample.max_running:
            self.max_running = sample.max_running
        if sample.running and sample.gen_throughput:
            rate = sample.gen_throughput / sample.running
            self.decode_rate = 0.7 * self.decode_rate + 0.3 * rate
        self.calibrate(sample)
        usage = sample.token_usage
        if usage is None and sample.used_tokens is not None and self.pool_tokens:
            usage = sample.used_tokens / self.pool_tokens
        self.peak_usage = max(self.peak_usage, usage or 0.0)
        # Edge-triggered: a retracted request waits in the queue for a while, and the gauge
        # and the queue count stay up meanwhile; only a new one is news.
        before = previous.retracted_waiting if previous is not None else 0
        retracted = (sample.retracted_waiting or 0) > (before or 0)
        if (
            previous is not None
            and previous.retracted_total is not None
            and sample.retracted_total is not None
            and sample.retracted_total > previous.retracted_total
        ):
            retracted = True
        if retracted:
            self.back_off(now)
        else:
            self.maybe_creep(now)
        return retracted

    def back_off(self, now: float) -> None:
        """A retraction: lower the target usage and hold it there for a while."""
        self.frozen_until = now + self.settings.freeze_s
        self.peak_usage = 0.0  # what counts for the next increase is the calm after this
        if now - self.last_backoff < self.settings.backoff_gap_s:
            return
        self.last_backoff = now
        self.retractions += 1
        self.usage_target = max(self.settings.min_usage, self.usage_target - self.settings.backoff)

    def queue_full(self) -> None:
        """A 503: the server's queue is at its cap; keep a shallower one."""
        self.rejections += 1
        self.queue_target = max(1, self.queue_target // 2)

    def maybe_creep(self, now: float) -> None:
        settings = self.settings
        if now < self.frozen_until or now - self.last_creep < settings.creep_every_s:
            return
        self.last_creep = now
        peak = self.peak_usage
        self.peak_usage = 0.0
        calm = peak < self.usage_target - 0.03
        if calm and self.queued_estimate() <= self.queue_target:
            self.usage_target = min(settings.max_usage, self.usage_target + settings.creep)
        self.queue_target = min(self.queue_cap, self.queue_target + 1)

    def learn_rate(self, completion_tokens: int, seconds: float) -> None:
        """A finished request's tokens over its time (queue wait included: an underestimate,
        used only until the server reports its throughput)."""
        if seconds > 0 and completion_tokens > 0 and self.sample is None:
            self.decode_rate = 0.8 * self.decode_rate + 0.2 * completion_tokens / seconds

    def sustainable_running(self) -> int | None:
        """``W*``: the requests this lane holds at its target, at the mean projection in flight
        (reported next to the server's running count)."""
        if self.fallback_limit is not None:
            return self.fallback_limit
        budget = self.budget()
        if budget is None or not self.tickets:
            return None
        # A request holds P at its start and P + L at its end: P + L/2 on average over its life.
        held = sum((t.prompt_tokens + t.projected) / 2 for t in self.tickets) / len(self.tickets)
        return max(1, int(budget / max(1.0, held)))


HORIZONS = (0, 16, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 16384)
"""Tokens ahead where the forecast's intervals start (every running request grows one per
step); dense near now, where admission decisions bite."""


def survival(lengths: list[int] | None, age: int, end: int, ahead: int) -> float:
    """P(a request that has generated ``age`` tokens is still running ``ahead`` tokens later).

    From the learned lengths when there are any; else it ends at ``end`` (its projection). A
    request older than every known answer is given another quarter of its age."""
    if lengths is not None:
        alive = len(lengths) - bisect.bisect_right(lengths, age)
        if alive > 0:
            return (len(lengths) - bisect.bisect_right(lengths, age + ahead)) / alive
        end = max(age + 16, age * 5 // 4)
    elif age >= end:
        end = max(age + 16, age * 5 // 4)
    return 1.0 if age + ahead < end else 0.0


def add_request(mean: list[float], var: list[float], prompt: int, age: int, ticket: Ticket) -> None:
    """Add one request's KV forecast over each interval between two horizons: it holds at most
    prompt + age + (the interval's end) tokens, if it is still running at the interval's start
    (a bound over the whole interval, so a peak between two horizons is not missed)."""
    end = ticket.projected - ticket.prompt_tokens
    for index, ahead in enumerate(HORIZONS):
        alive = survival(ticket.lengths, age, end, ahead)
        if alive <= 0.0:
            break
        following = HORIZONS[index + 1] if index + 1 < len(HORIZONS) else 2 * ahead
        held = prompt + age + following
        mean[index] += held * alive
        var[index] += held * held * alive * (1.0 - alive)


def _sent_at(ticket: Ticket) -> float:
    return ticket.sent_at


def initial_queue_target(chunked_prefill_size: int, mean_prompt_tokens: float) -> int:
    """Enough queued requests to fill the next prefill batch, no deeper."""
    if mean_prompt_tokens <= 0 or chunked_prefill_size <= 0:
        return 2
    return max(2, math.ceil(chunked_prefill_size / mean_prompt_tokens))


def fallback_concurrency(
    pool_tokens: int, *, mean_prompt_tokens: float, mean_output_tokens: float, slack: int = 150
) -> int:
    """The planner's number (``capacity/planner.py``): the pool over a running request's mean
    footprint (prompt + half its answer + slack), with the planner's small client queue."""
    footprint = max(1.0, mean_prompt_tokens + mean_output_tokens / 2 + slack)
    return max(1, math.ceil(pool_tokens / footprint * CLIENT_QUEUE_HEADROOM))
