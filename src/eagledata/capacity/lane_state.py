"""A lane's state and the bookkeeping of our requests on it, for ``--concurrency auto``: a request
in flight (``Ticket``), what the server said at a sample (``LaneSample``: its rank's
``RankLoad`` whole), and ``LaneState``: the lane's fields, the bounds on our requests in the
server's queue, the cap a 503 teaches, and the answers that end. The gate and the forecast over
this state are ``controller.py`` (``Lane``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import InitVar, dataclass, field

import numpy as np

from eagledata.capacity.controller_settings import ControllerSettings
from eagledata.capacity.drain import LaneSpeed
from eagledata.capacity.forecast import Floats
from eagledata.capacity.lengths import SurvivalCurve
from eagledata.capacity.usage_target import UsageTarget
from eagledata.server.loads import RankLoad


@dataclass(slots=True, eq=False)
class Ticket:
    """One request in flight on a lane."""

    lane: LaneState
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
class LaneState:
    """One DP rank of one server (or a router's workers together): its state, and the
    bookkeeping of our requests on it (``Lane``, ``controller.py``, adds the gate)."""

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
