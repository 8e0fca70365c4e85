"""The arithmetic of ``--concurrency auto``: how much work one server (DP rank) can take now.

No I/O and no clock of its own (every method takes ``now``), so tests drive it directly. The live
loop that feeds it the server's signals and our requests is ``run/loadcontrol.py``. ``Lane``
here is the gate and the forecast; its fields, a request in flight (``Ticket``), a sample
(``LaneSample``) and the bookkeeping of our requests (the queue bounds, the answers that end)
are ``capacity/lane_state.py``.

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
  requests that ran in the window, ``LaneState.window_rate``), scaled so that our requests add
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
  ``q* = max(2, ceil(chunked_prefill_size / mean prompt))``, counted from what the client knows
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
  gate, ``run/load_gate.py``).

In steady state this converges near ``W* = u* C / E_held`` running requests, where ``E_held =
E[P L + L^2 / 2] / E[L]`` is the time-weighted KV of one request: the planner's estimate of the
same quantity from an assumed answer length (``capacity/planner.py``).
"""

from __future__ import annotations

import math

from eagledata.capacity.forecast import Flight, new_draws, peak_quantile
from eagledata.capacity.lane_state import LaneSample, LaneState, Ticket
from eagledata.capacity.planner import CLIENT_QUEUE_HEADROOM


class Lane(LaneState):
    """One DP rank of one server (or a router's workers together): its gate, and the target
    share of its pool the gate admits to (``LaneState``: its fields and bookkeeping)."""

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
        if (
            previous is not None
            and previous.retracted_total is not None
            and sample.retracted_total is not None
            and sample.retracted_total > previous.retracted_total
        ):
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
