"""The arithmetic of ``--concurrency auto``: how much work one server (DP rank) can take now.

No I/O and no clock of its own (every method takes ``now``), so tests drive it directly. The live
loop that feeds it the server's signals and our requests is ``run/loadcontrol.py``. ``Lane``
here is one lane whole: its fields, the bookkeeping of our requests (the queue bounds, the
answers that end), the gate and the forecast; with a request in flight (``Ticket``) and what
the server said at a sample (``LaneSample``: its rank's ``RankLoad`` whole).

Why a client must do this (``docs/sglang.md``, "Admission and retraction"): SGLang
admits a request while the pool covers its prompt plus ``min(max_new, 4096) x new_token_ratio``
for each running request, a ratio that decays to ~0.1. For multi-thousand-token answers it
over-admits, then retracts the requests with the fewest tokens when the pool overflows, and
re-prefills them later: compute thrown away. Too few requests and the pool idles instead.

The gate, per lane (one DP rank of one server, or a router's workers together):

* **Answer lengths** are learned per prompt-length bucket (``capacity/lengths.py``); a request's
  **projection** is ``P + min(max_new, L90)``, ``L90`` its bucket's 90th percentile (the prior,
  ``max_new_tokens``, until 8 answers are in).
* Each request in flight holds ``P + g`` tokens, ``g`` its generated tokens: seconds since sent x
  the per-request decode rate the server reports (its windowed ``gen_throughput`` over the most
  requests that ran in the window, ``Lane.window_rate``), scaled so that our requests add
  up to the KV the server last measured (``calibrate``). It grows one token per decode step
  until it ends; its end follows its bucket's survival curve given that it has run ``g``
  tokens (Kaplan-Meier over the answers that ended and the requests still running, so the
  short answers that end first do not make the forecast optimistic), or, before any answers
  end, it ends at its projection.
* The controller **forecasts** the highest KV its requests will hold before they end, over
  sampled futures (``capacity/forecast.py``: each request's remaining length drawn from its
  curve given its age), and admits a request only if the ``overflow_quantile`` of that peak,
  with the request added, plus the load the server reports that ours does not explain, stays
  within ``u* x pool``. The pool's measured use plus what was sent since must stay within it
  too.
* The server's queue is kept just deep enough to fill its next prefill batch:
  ``q* = max(2, ceil(chunked_prefill_size / mean prompt))``, at most the requests it runs at
  once (``max_running_requests``), counted from what the client knows
  rather than from the last sample alone: the queue the sample saw, plus what was sent since,
  less what ended since (each answer that ends lets the server take the next request from its
  queue). So a slow poll does not make a slow admission: every answer that ends admits one.
* The server's own queue cap (``max_queued_requests`` from ``/server_info``) is never reached:
  the queue the sample saw plus everything sent since (nothing credited: an upper bound) stays
  below it, so our traffic gets no 503 by construction. A server that reports no cap but
  answers 503 teaches one (the bound at the 503), which relaxes by one a ceiling period later.
* At a measured usage above 0.97 with a queue, admissions pause (a retraction is imminent).
* A request that generates nothing (the canary's warm-ups and scorings, ``max_new_tokens`` 0)
  holds KV only while its prefill batch runs: SGLang takes it into a batch of at most
  ``chunked_prefill_size`` new tokens, only into the room its running requests leave, and the
  request ends with its batch (its KV goes to the evictable radix cache, which the pool's
  usage does not count). So such requests count together for at most one prefill chunk, now
  and in ``present``, however many are in flight: counted whole, a canary check's 24
  scorings of ~800 tokens held half the ``queue-cap`` pool in the forecast, and the run's
  requests ran down to half while it lasted.
* ``u*`` itself (start 0.85, in [0.60, 0.95]) moves by AIMD on the server's retractions, under
  a ceiling learned from them (``capacity/usage_target.py``), at a pace set by how long a
  request lives on this server: on a fast one its periods shrink with the answers' lifetime.
* The measured use is a sample's: between samples, the KV of the requests that ended since is
  taken off it, and the load our requests do not explain is the sample's, not the sample's
  less what is in flight now (which would count every answer that ended since as a stranger's).
* No signal at all: the planner's number (``fallback_concurrency``), in-flight requests only.
* Across lanes, once the dataset has no more to send: a request does not start on a lane where
  it would end after the job's end on the faster ones (``capacity/drain.py``, applied by the
  gate, ``run/loadcontrol.py``).

In steady state this converges near ``W* = u* C / E_held`` running requests, where ``E_held =
E[P L + L^2 / 2] / E[L]`` is the time-weighted KV of one request: the planner's estimate of the
same quantity from an assumed answer length (``capacity/planner.py``).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import InitVar, dataclass, field

import numpy as np

from eagledata.capacity.controller_settings import ControllerSettings
from eagledata.capacity.drain import LaneSpeed
from eagledata.capacity.forecast import Flight, Floats, new_draws, peak_quantile
from eagledata.capacity.lengths import SurvivalCurve
from eagledata.capacity.planner import CLIENT_QUEUE_HEADROOM
from eagledata.capacity.usage_target import UsageTarget
from eagledata.server.loads import RankLoad


@dataclass(slots=True, eq=False)
class Ticket:
    """One request in flight on a lane."""

    lane: Lane
    prompt_tokens: int
    projected: int
    sent_at: float
    lengths: SurvivalCurve | None = None
    """The answer-length survival curve it is forecast with (None: it ends at ``projected``);
    the live loop refreshes it as answers end."""
    started_at: float | None = None
    """When the server admitted it, estimated from its queue counts (None: still queued)."""
    draws: Floats | None = None
    """Its uniforms for the sampled futures (``capacity/forecast.py``), drawn on first use and
    kept for its life."""
    gone: bool = False
    """The last sample says the server no longer holds it: it ended there, and its answer has
    not reached us yet (a busy client). The forecast gives it no KV."""

    @property
    def prefill_only(self) -> bool:
        """It generates nothing (the canary's warm-ups and scorings: ``max_new_tokens`` 0)."""
        return self.projected <= self.prompt_tokens


@dataclass(frozen=True, slots=True)
class LaneSample:
    """What the server said about one lane at ``time``: its rank's ``RankLoad`` whole (a new
    signal is a field there, ``server/loads.py``), and when and against what it was read."""

    time: float
    load: RankLoad
    """The lane's numbers (None where not reported); ``spec_accept_length`` is telemetry's
    only: the controller does not read it."""
    retracted_total: float | None = None
    """The server's retraction counter, the lane's share of it (it is summed over ranks)."""
    asked: float | None = None
    """When the read began (``time`` is when its answer came): a request sent between the two
    may or may not be in its counts, so the queue's bound counts it as sent after."""

    ours_at_ask: int | None = None
    """Our requests in flight on the lane when the read began."""
    ended_at_ask: int = 0
    """The lane's ``ended_total`` when the read began."""

    @property
    def since(self) -> float:
        """Requests sent after this are not in the sample's queue count, for the bound."""
        return self.time if self.asked is None else self.asked


@dataclass(eq=False)
class Lane:
    """One DP rank of one server (or a router's workers together): its state, the bookkeeping
    of our requests on it (the bounds on our requests in the server's queue, the cap a 503
    teaches, the answers that end), its gate, and the target share of its pool the gate admits
    to."""

    server: str
    rank: int | None
    settings: ControllerSettings
    pool_tokens: int | None = None
    max_running: int | None = None
    fallback_limit: int | None = None
    """Set when the server offers no load signal: then only this many in flight."""
    usage_target: InitVar[float] = 0.85
    """The initial ``u*``; the lane's ``target`` moves it (``capacity/usage_target.py``)."""
    queue_target: int = 2
    """``q*``: the server queue the gate keeps (``initial_queue_target``)."""
    prefill_chunk: int = 8192
    """The most new tokens the server prefills in one batch (its ``chunked_prefill_size``):
    what its requests that generate nothing hold together at once (``Ticket.prefill_only``)."""
    lengths_learned: bool = True
    """The length model holds enough answers for a projection (the gate sets it): before, the
    forecast's prior, not ``u*``, holds work back, and ``u*`` does not creep."""
    queue_limit: int | None = None
    """The server's ``max_queued_requests`` (per DP rank): the queue never reaches it."""
    learned_limit: int | None = None
    """A queue cap learned from a 503, when the server reports none."""
    learned_at: float = 0.0
    tickets: dict[Ticket, None] = field(default_factory=dict)
    sample: LaneSample | None = None
    decode_rate: float = 10.0
    age_scale: float = 1.0
    window_throughput: float | None = None
    """The server's ``gen_throughput`` at the last sample: a mean over its last logging window
    (SGLang refreshes it every ``decode_log_interval`` decode steps), not a live figure."""
    window_running: int = 0
    """The most requests running at any sample since that figure last changed, and at the
    sample before: the batch its window ran, as far as the samples tell."""
    rejections: int = 0
    ended_total: int = 0
    """Requests that ended with an answer, ever (a sample keeps the count it was read at)."""
    ended_of_asked: int = 0
    """Of those, the ones that ended after the last sample was asked for and were sent before:
    the requests its counts may hold that have ended since. One sent after the ask (a canary's
    warm-up, back in a blink) was never in them, and taking it off them would make the queue's
    bound count it as queued."""
    ends_sent_at: deque[float] = field(default_factory=lambda: deque(maxlen=4096))
    """When each of the latest requests to end was sent, in the order they ended."""
    freed_since_sample: float = 0.0
    """KV the sample counted that the requests ending since have freed."""
    foreign_tokens: float = 0.0
    """KV the last sample showed that our requests did not account for, then."""
    lifetime_s: float | None = None
    """How long one of our requests lives here, sent to answered (a moving mean)."""
    answered_at: deque[float] = field(default_factory=lambda: deque(maxlen=32))
    """When the last of the run's answers here came back: the pace room opens on the lane."""
    held_by: dict[str, int] = field(default_factory=dict)
    """Requests held back since the last telemetry line, by the rule that held them."""
    last_hold: str | None = None
    """The rule that held the last request this lane refused (None: it admitted it)."""
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))
    target: UsageTarget = field(init=False)

    def __post_init__(self, usage_target: float) -> None:
        self.target = UsageTarget(self.settings, usage_target)

    @property
    def in_flight(self) -> int:
        return len(self.tickets)

    def queued_at_most(self) -> int:
        """An upper bound on our requests in the server's queue, from what the client knows:
        those in flight now, less those the last sample counted running that have not ended
        since (a request that ended was taken; a running one is not queued). A request on its
        way when the sample was read, not yet counted by the server, counts as queued, and so
        does everything sent since. Nothing is credited for an answer that ends: it is no
        proof that the server took another."""
        sample = self.sample
        if sample is None or sample.load.running is None or sample.ours_at_ask is None:
            return self._queued_by_waiting()
        running = min(sample.load.running, sample.ours_at_ask) - self.ended_of_asked
        return max(0, len(self.tickets) - max(0, running))

    def _queued_by_waiting(self) -> int:
        """The bound from a sample's queue count alone (a sample without our counts)."""
        if self.sample is None:
            return sum(1 for ticket in self.tickets if ticket.started_at is None)
        since = self.sample.since
        recent = sum(1 for ticket in self.tickets if ticket.sent_at > since)
        return (self.sample.load.waiting or 0) + recent

    def queued_estimate(self) -> int:
        """Our requests in the server's queue, as the client knows it: those in flight now
        less those the last sample counted running. Each answer that ends takes one off (the
        server takes the next queued request into the room it leaves): not bound to the poll."""
        sample = self.sample
        if sample is None:
            return 0
        if sample.load.running is None or sample.ours_at_ask is None:
            return self._queued_by_waiting()
        return max(0, len(self.tickets) - min(sample.load.running, sample.ours_at_ask))

    def queue_cap(self) -> int | None:
        """The queue the gate never reaches: the server's ``max_queued_requests``, or one a
        503 taught."""
        if self.queue_limit is not None:
            return self.queue_limit
        return self.learned_limit

    def queue_spare(self, cap: int) -> int:
        """Queue slots the gate leaves free under a cap: SGLang puts a request it retracts back
        in its queue, and aborts it with 503 (its output lost) if the queue is full."""
        return max(1, cap // 16) if cap > 1 else 0

    def queue_full(self, now: float, bound: int) -> None:
        """A 503: the server's queue was at its cap. One it reports is never reached (our
        traffic cannot have done it: another client's did); without one, the queue we may
        have had at most (``bound``, the refused request counted) was at least its cap: the
        gate keeps below that from now on, not one slot for good."""
        self.rejections += 1
        if self.queue_limit is None:
            learned = max(1, bound - 1)
            self.learned_limit = min(self.learned_limit or learned, learned)
            self.learned_at = now

    def maybe_creep(self, now: float) -> None:
        """A creep period of the target (``UsageTarget.period``); a ceiling period without a
        503 relaxes a learned queue cap by one (the cap that refused may have been a burst of
        another client's)."""
        self.target.period(now)
        hold = self.settings.ceiling_hold_s * self.target.pace
        if self.learned_limit is not None and now - self.learned_at >= hold:
            self.learned_limit += 1
            self.learned_at = now

    def ended(self, ticket: Ticket, now: float, held: int | None, *, data: bool) -> None:
        """A request of this lane ended with an answer, holding ``held`` KV tokens at its end:
        the server took it out of its pool (and the next request out of its queue). ``data``:
        one of the run's own (its lifetime paces the usage target)."""
        self.ended_total += 1
        self.ends_sent_at.append(ticket.sent_at)
        sample = self.sample
        if sample is not None and ticket.sent_at <= sample.since:
            self.ended_of_asked += 1
        if (
            sample is not None
            and ticket.sent_at <= sample.since
            and not ticket.gone  # the sample did not count it
            and held is not None
        ):
            self.freed_since_sample += held
        if data:
            self.answered_at.append(now)
            life = now - ticket.sent_at
            if life > 0:
                self.lifetime_s = (
                    life if self.lifetime_s is None else (0.9 * self.lifetime_s + 0.1 * life)
                )
                self.target.pace_by(self.lifetime_s)

    def count_ended_of_asked(self, sample: LaneSample) -> None:
        """``ended_of_asked`` for a new sample: of the requests that ended since it was asked
        for, those sent before."""
        since = min(len(self.ends_sent_at), max(0, self.ended_total - sample.ended_at_ask))
        recent = list(self.ends_sent_at)[len(self.ends_sent_at) - since :] if since else []
        self.ended_of_asked = sum(1 for sent_at in recent if sent_at <= sample.since)

    def window_rate(self, load: RankLoad, before: int | None) -> float | None:
        """Tokens a second one running request gets, from a sample's ``gen_throughput``, or None
        when the sample says nothing new. The throughput is the mean of the server's last
        logging window; the running count is live. Divided by the live count, a cohort that
        ended together (answers cut at one length) read as several times the rate: 1,700 tok/s
        of seven requests over the one left is 7x, and ages that fast made the requests sent
        after it look half done (measured: a 2,500-token pool overfilled by three at once).
        So it is divided by the most requests the samples saw running over the window (from
        the sample before it began), and a figure the server has not refreshed is skipped."""
        running, throughput = load.running, load.gen_throughput
        if running is None:
            return None
        if throughput == self.window_throughput:  # the same window: nothing new
            self.window_running = max(self.window_running, running)
            return None
        batch = max(self.window_running, running)
        # The next window began after the sample before this one.
        self.window_throughput, self.window_running = throughput, max(before or 0, running)
        if not throughput or batch <= 0:
            return None
        return throughput / batch

    def speed(self) -> LaneSpeed | None:
        """How long the run's requests live here and how many end a second (None until eight
        have ended): what the job's tail is shared out by (``capacity/drain.py``)."""
        ends = self.answered_at
        if self.lifetime_s is None or len(ends) < 8 or ends[-1] <= ends[0]:
            return None
        return LaneSpeed(life_s=self.lifetime_s, rate=(len(ends) - 1) / (ends[-1] - ends[0]))

    def learn_rate(self, completion_tokens: int, seconds: float) -> None:
        """A finished request's tokens over its time (queue wait included: an underestimate,
        used only until the server reports its throughput)."""
        if seconds > 0 and completion_tokens > 0 and self.sample is None:
            self.decode_rate = 0.8 * self.decode_rate + 0.2 * completion_tokens / seconds

    def counts_retractions(self) -> bool:
        """True when the server's samples carry a retraction count (the counter or the
        retracted requests waiting): they report a retraction when it happens."""
        sample = self.sample
        return sample is not None and (
            sample.retracted_total is not None or sample.load.retracted_waiting is not None
        )

    # --- the gate -----------------------------------------------------------------------------

    def age(self, ticket: Ticket, now: float) -> int:
        """Tokens it has generated, estimated: seconds since the server admitted it x the
        per-request rate, scaled so that our requests account for the KV the server last
        measured (``calibrate``). One still queued, as far as the samples tell, has none."""
        start = ticket.started_at
        if start is None:
            sample = self.sample
            if sample is not None and sample.load.waiting:
                return 0  # behind a queue the server had: not started yet, as far as we know
            start = ticket.sent_at  # no queue to wait in (or a server that does not count it)
        return int(max(0.0, now - start) * self.decode_rate * self.age_scale)

    def mark_gone(self, sample: LaneSample, now: float) -> int:
        """Ours the server no longer counts (neither running nor waiting) are on their way, to
        it (the newest) or back from it (an answer the client has not read yet: the oldest).
        Of the oldest, those past the length 90% of answers stay under are taken as ended: a
        client that reads its answers late must not see their KV as the server's. Their age is
        the gate's estimate (from when the server admitted them), not the upper bound from when
        they were sent: taking a request that still runs as ended gives its KV to the others
        in ``calibrate`` (measured: three sent a few ms before the sample were not on the
        server yet, three that had queued were taken as ended, and the age scale doubled).
        Returns how many of ours the server did not count and are not taken as ended (still
        to arrive)."""
        for ticket in self.tickets:
            ticket.gone = False
        if sample.load.running is None or sample.load.waiting is None or sample.ours_at_ask is None:
            return 0
        # Those that ended while the sample was read were not counted either: gone already.
        missing = (
            sample.ours_at_ask - sample.load.running - sample.load.waiting - self.ended_of_asked
        )
        if missing <= 0:
            return 0
        oldest = sorted((t for t in self.tickets if t.sent_at <= sample.since), key=_sent_at)
        for ticket in oldest:
            if missing <= 0:
                break
            longest = ticket.projected - ticket.prompt_tokens
            if self.age(ticket, sample.time) < longest:
                break  # younger than an answer of its length: not ended yet
            ticket.gone = True
            missing -= 1
        return missing

    def mark_started(
        self, sample: LaneSample, previous: LaneSample | None, arriving: int = 0
    ) -> None:
        """Which of our requests the server has admitted: all but the newest ``waiting`` (its
        queue is first come first served), and the ``arriving`` (not on the server yet). One
        sent while the server had no queue started when it was sent; one admitted out of a
        queue since the last sample started, on average, halfway between the two (or between
        its sending and this sample)."""
        if sample.load.waiting is None:
            return
        no_queue = previous is None or not previous.load.waiting
        # Judged by this sample: what was sent before it was asked for (what was sent while
        # it was read may or may not be in its counts; the next sample tells).
        sent = sorted(
            (t for t in self.tickets if t.sent_at <= sample.since and not t.gone), key=_sent_at
        )
        waiting = sample.load.waiting + arriving
        for ticket in sent[: max(0, len(sent) - waiting)]:
            if ticket.started_at is None:
                if no_queue:
                    ticket.started_at = ticket.sent_at
                    continue
                since = ticket.sent_at if previous is None else max(ticket.sent_at, previous.time)
                ticket.started_at = (since + sample.time) / 2

    def calibrate(self, sample: LaneSample) -> None:
        """Fit the age scale to the server's own count: the requests it runs hold their prompts
        plus what they generated; the queued ones hold nothing yet. Keeps the forecast right
        when the rate estimate is off (a loaded client, a server that slows down)."""
        if sample.load.used_tokens is None:
            return
        self.age_scale, scale = 1.0, self.age_scale
        running = [t for t in self.tickets if t.sent_at <= sample.since and not t.gone]
        if sample.load.waiting is not None:
            running = [t for t in running if t.started_at is not None]
        raw = sum(self.age(t, sample.time) for t in running)
        self.age_scale = scale
        if not running or raw <= 0:
            return
        generated = sample.load.used_tokens - sum(t.prompt_tokens for t in running)
        self.age_scale = min(4.0, max(0.25, generated / raw))

    def flight(self, ticket: Ticket, now: float) -> Flight:
        """A request as the forecast sees it now."""
        if ticket.draws is None:
            ticket.draws = new_draws(self.rng)
        if ticket.gone:
            return Flight(held=0, age=0, end=0, curve=None, draws=ticket.draws)
        age = self.age(ticket, now)
        return Flight(
            held=ticket.prompt_tokens + age,
            age=age,
            end=ticket.projected - ticket.prompt_tokens,
            curve=ticket.lengths,
            draws=ticket.draws,
        )

    def explain(self, sample: LaneSample) -> None:
        """The KV the sample shows that our requests running then do not account for (another
        client's, or growth we underestimate): it stays in every forecast until the next
        sample. Measured at the sample's time, against what ran then: our requests that end
        later free their own KV, not a stranger's."""
        if sample.load.used_tokens is None:
            self.foreign_tokens = 0.0
            return
        ours = sum(
            t.prompt_tokens + self.age(t, sample.time)
            for t in self.tickets
            # everything of ours the sample may have counted: what is left is no one's we know
            if t.sent_at <= sample.time and not t.gone
        )
        self.foreign_tokens = max(0.0, sample.load.used_tokens - ours)

    def peak(self, now: float, extra: Ticket | None = None) -> float:
        """The highest KV what is in flight (and ``extra``, admitted now) will hold before it
        ends, at the ``overflow_quantile`` of the sampled futures, plus the unexplained load."""
        flights = []
        prefill = 0
        for ticket in self.tickets:
            if ticket.prefill_only:
                prefill += 0 if ticket.gone else ticket.prompt_tokens
            else:
                flights.append(self.flight(ticket, now))
        if extra is not None:
            if extra.prefill_only:
                prefill += extra.prompt_tokens
            else:
                flights.append(self.flight(extra, now))
        peak = peak_quantile(flights, self.settings.overflow_quantile)
        # The prefill-only requests end within their batch: they count now, not at the peak
        # of the others (the forecast's first instant holds everything in flight).
        now_held = sum(flight.held for flight in flights) + self._prefill_held(prefill)
        return self.foreign_tokens + max(peak, now_held)

    def _prefill_held(self, prompt_tokens: int) -> int:
        """What requests that generate nothing, of ``prompt_tokens`` together, hold at once."""
        return min(prompt_tokens, self.prefill_chunk)

    def budget(self) -> float | None:
        """The KV the lane may hold: the target share of the pool."""
        if self.pool_tokens is None:
            return None
        return self.target.value * self.pool_tokens

    def present(self, prompt_tokens: int) -> float | None:
        """The pool's measured use, less what the requests that ended since freed, plus what
        we sent since it was measured, plus this prompt: it must stay within the target share
        whatever the forecast says."""
        sample = self.sample
        if sample is None or sample.load.used_tokens is None or self.pool_tokens is None:
            return None
        recent = [t for t in self.tickets if t.sent_at > sample.since]
        generating = sum(t.prompt_tokens for t in recent if not t.prefill_only)
        prefill = sum(t.prompt_tokens for t in recent if t.prefill_only)
        used = max(0.0, sample.load.used_tokens - self.freed_since_sample)
        return used + generating + self._prefill_held(prefill) + prompt_tokens

    def room(self, candidate: Ticket, now: float) -> float | None:
        """Free projected KV if this request were admitted (>= 0), or None: not now (the
        reason is counted in ``held_by``)."""
        reason = self._holds(candidate, now)
        if isinstance(reason, str):
            self.held_by[reason] = self.held_by.get(reason, 0) + 1
            self.last_hold = reason
            return None
        self.last_hold = None
        return reason

    def _holds(self, candidate: Ticket, now: float) -> float | str:
        if self.fallback_limit is not None:
            free = self.fallback_limit - self.in_flight
            return float(free) if free > 0 else "fallback"
        budget = self.budget()
        if budget is None:
            return "no_pool"
        if self.max_running is not None and self.in_flight >= self.max_running + self.queue_target:
            return "max_running"
        cap = self.queue_cap()
        if cap is not None and self.queued_at_most() >= cap - self.queue_spare(cap):
            return "queue_cap"
        queued = self.queued_estimate()
        # The depth rule holds only behind a queue the server showed: one that admits all it
        # gets (its queue empty at the last sample) is not to be fed at q* per sample.
        if self.sample is not None and self.sample.load.waiting and queued >= self.queue_target:
            return "queue"
        sample = self.sample
        if (
            sample is not None
            and (sample.load.token_usage or 0.0) > self.settings.pause_usage
            and (queued > 0)
        ):
            return "pause"
        present = self.present(candidate.prompt_tokens)
        if (
            present is not None
            and present > self.target.value * (self.pool_tokens or 0)
            and (self.in_flight > 0)
        ):
            self.target.held_back |= self.lengths_learned and candidate.lengths is not None
            return "present"
        left = budget - self.peak(now, candidate)
        if left < 0 and self.in_flight > 0:
            self.target.held_back |= self.lengths_learned and candidate.lengths is not None
            return "forecast"
        return max(0.0, left)

    # --- adaptation ---------------------------------------------------------------------------

    def observe(self, sample: LaneSample, now: float) -> bool:
        """Take a new server sample; True if it shows a retraction (the caller logs it)."""
        previous = self.sample
        self.sample = sample
        self.count_ended_of_asked(sample)
        if sample.load.pool_tokens:
            self.pool_tokens = sample.load.pool_tokens
        if sample.load.max_running:
            self.max_running = sample.load.max_running
        rate = self.window_rate(sample.load, previous.load.running if previous else None)
        if rate is not None:
            self.decode_rate = 0.7 * self.decode_rate + 0.3 * rate
        arriving = self.mark_gone(sample, now)
        self.mark_started(sample, previous, arriving)
        self.calibrate(sample)
        self.explain(sample)
        self.freed_since_sample = 0.0
        usage = sample.load.token_usage
        if usage is None and sample.load.used_tokens is not None and self.pool_tokens:
            usage = sample.load.used_tokens / self.pool_tokens
        # Edge-triggered: a retracted request waits in the queue for a while, and the gauge
        # and the queue count stay up meanwhile; only a new one is news.
        before = previous.load.retracted_waiting if previous is not None else 0
        retracted = (sample.load.retracted_waiting or 0) > (before or 0)
        if previous is not None and sample.retracted_total is not None:
            # SGLang creates the counter at its first retraction: one that appears between two
            # samples is a retraction since the last (the real server's first went unseen).
            before_total = previous.retracted_total or 0.0
            if sample.retracted_total > before_total:
                retracted = True
        if retracted:
            self.target.back_off(now)
        else:
            self.target.measured(usage)
            self.maybe_creep(now)
        return retracted

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


def _sent_at(ticket: Ticket) -> float:
    return ticket.sent_at


def initial_queue_target(
    chunked_prefill_size: int, mean_prompt_tokens: float, max_running: int | None = None
) -> int:
    """Enough queued requests to fill the next prefill batch, no deeper; and no more than the
    server runs at once (``max_running``): a prefill batch never starts more than that, and a
    server whose batch is capped below what its pool holds took every request the pool rule
    let through into its queue (a real server capped at 8 running beside one running 17-30:
    ``auto`` queued 35 on the capped one, which got more than half the job and ended 3 s after
    the other)."""
    if mean_prompt_tokens <= 0 or chunked_prefill_size <= 0:
        target = 2
    else:
        target = max(2, math.ceil(chunked_prefill_size / mean_prompt_tokens))
    return target if max_running is None else max(2, min(target, max_running))


def fallback_concurrency(
    pool_tokens: int, *, mean_prompt_tokens: float, mean_output_tokens: float, slack: int = 150
) -> int:
    """The planner's number (``capacity/planner.py``): the pool over a running request's mean
    footprint (prompt + half its answer + slack), with the planner's small client queue."""
    footprint = max(1.0, mean_prompt_tokens + mean_output_tokens / 2 + slack)
    return max(1, math.ceil(pool_tokens / footprint * CLIENT_QUEUE_HEADROOM))
