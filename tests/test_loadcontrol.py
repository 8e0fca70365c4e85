"""Issue 9: ``--concurrency auto`` against the simulated capacity engine, and its arithmetic."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest

from conftest import SAMPLES, make_config, read_failures, read_records, sim_config, until
from eagledata.capacity.controller import Lane, LaneSample, Ticket, fallback_concurrency
from eagledata.capacity.controller_settings import ControllerSettings
from eagledata.capacity.forecast import Flight, peak_quantile
from eagledata.capacity.lengths import RECENT, LengthModel, kaplan_meier
from eagledata.config import LoadSettings
from eagledata.run import pipeline, session_open
from eagledata.run.load_lanes import ServerPlan
from eagledata.run.loadcontrol import LoadController
from eagledata.rundir.lines import TelemetryLine
from eagledata.rundir.status import latest_load
from eagledata.rundir.telemetry import ROTATED_FILE, TelemetryLog, read_telemetry
from eagledata.rundir.verify import verify_run
from eagledata.server.client import SGLangClient
from eagledata.server.loads import RankLoad
from eagledata.simserver import SimServerThread, expected_output

DATASET = str(SAMPLES / "sharegpt.jsonl")  # 40 rows
FAST_LOAD = {
    "poll_interval_s": 0.02,
    "telemetry_interval_s": 0.05,
    "creep_every_s": 0.1,
    "freeze_s": 0.3,
}


def engine(tokenizer_dir: str, **overrides: Any) -> Any:
    """A small, fast SGLang capacity engine: a 2,500-token pool, 100x time."""
    fields: dict[str, Any] = {
        "engine": "sglang",
        "max_total_num_tokens": 2500,
        "time_scale": 0.01,
        "steps_per_tick": 4,
        "length_fraction": 0.0,
        "output_len_mean": 300.0,
        "output_len_spread": 0.3,
    }
    fields.update(overrides)
    return sim_config(tokenizer_dir, **fields)


def lane(**fields: Any) -> Lane:
    settings = ControllerSettings(freeze_s=10, creep_every_s=1, backoff_gap_s=0.5)
    return Lane(server="http://s", rank=None, settings=settings, pool_tokens=10_000, **fields)


# --- the arithmetic -----------------------------------------------------------------------------


def test_length_model_learns_a_high_percentile_per_prompt_bucket() -> None:
    model = LengthModel(prior=4096, quantile=0.9, min_samples=10)
    assert model.estimate(100) == 4096  # nothing learned: the pessimistic prior
    for n in range(1, 21):
        model.add(100, n * 10)  # short prompts, answers 10..200
    assert model.estimate(100) == 180
    assert model.estimate(5000) == 180  # an empty bucket borrows every bucket's percentile
    for n in range(1, 21):
        model.add(5000, 1000 + n)
    assert model.estimate(5000) == 1018
    assert model.estimate(100) == 180


def test_the_survival_curve_counts_the_requests_still_running() -> None:
    # Early in a run only the short answers have ended; ten long ones are still running.
    ended = list(range(100, 200, 10))
    alone = kaplan_meier(ended, [], cap=4096)
    assert alone.at(500) == 0.0  # the ended answers alone: nothing runs past 200
    curve = kaplan_meier(ended, [1000] * 10, cap=4096)
    assert curve.at(500) == pytest.approx(0.5)  # half the requests are known to run past 1000
    assert curve.alive(1000, 2000) == pytest.approx(1.0)  # unknown past 1000: kept alive...
    assert curve.alive(1000, 3096) == 0.0  # ...up to max_new_tokens, never past it
    assert curve.alive(150, 0) == pytest.approx(1.0)
    # A request older than every answer and every other request gets a quarter more.
    assert alone.alive(400, 50) == 1.0 and alone.alive(400, 100) == 0.0


def test_seeded_lengths_stand_for_every_bucket_until_it_has_its_own() -> None:
    model = LengthModel(prior=8192, quantile=0.9, min_samples=8, window=512, cap=8192)
    assert model.curve(3000) is None and model.estimate(3000) == 8192
    # The newest 512, oldest first: the older long answers fall out of the window (a ramp
    # four times over: the latest of it are no longer than the rest).
    assert model.seed([5000] * 100 + list(range(1000, 3048, 16)) * 4) == 512
    assert model.curve(3000) is not None
    assert model.estimate(3000) == 2840 and model.estimate(100) == 2840
    for _ in range(8):
        model.add(100, 300)  # short prompts' own answers
    assert model.estimate(100) == 300 and model.estimate(3000) == 2840


def test_answers_that_grow_are_followed_within_the_latest_and_a_shrink_over_the_window() -> None:
    """Answers of 400 tokens, then of 800: the projection follows the growth once the long ones
    weigh in the latest ``RECENT`` answers, though they are under a tenth of the window (a long
    answer projected short is a retraction); a shrink only as the window turns over (a short
    one projected long is room left for a while)."""
    model = LengthModel(prior=1024, quantile=0.9, min_samples=16, window=512, cap=1024)
    for _ in range(512):
        model.add(100, 400)
    for _ in range(40):
        model.add(100, 800)
    assert model.estimate(100) == 800  # the window alone: 400 (40 long answers of 512)
    for _ in range(RECENT):
        model.add(100, 400)
    assert model.estimate(100) == 400  # the latest short again: the window's own

    shrinking = LengthModel(prior=1024, quantile=0.9, min_samples=16, window=512, cap=1024)
    for _ in range(512):
        shrinking.add(100, 800)
    for _ in range(RECENT):
        shrinking.add(100, 400)
    assert shrinking.estimate(100) == 800  # three quarters of the window still long


def test_the_length_model_hands_out_curves_with_the_running_requests() -> None:
    model = LengthModel(prior=8192, min_samples=4, cap=8192)
    assert model.curve(100) is None  # nothing ended yet: the forecast uses the prior
    for length in (100, 120, 140, 160):
        model.add(100, length)
    assert model.curve(100).at(300) == 0.0  # type: ignore[union-attr]
    model.set_running([(100, 3000), (100, 3000), (100, 3000), (100, 3000)])
    assert model.curve(100).at(300) == pytest.approx(0.5)  # type: ignore[union-attr]


def test_the_first_answers_give_a_curve_that_keeps_the_prior_where_they_say_nothing() -> None:
    """Two answers of a job whose first ten requests all started together: the forecast has a
    curve at once (before, the prior ``max_new_tokens`` stood alone until ``min_samples``
    answers, and held the reference job's pool at about half full), but the mass they do not
    settle still runs to ``max_new_tokens``; the projection and the creep wait for
    ``min_samples``."""
    model = LengthModel(prior=8192, min_samples=8, cap=8192)
    model.add(3000, 1500)
    assert model.curve(3000) is None and not model.learned  # one answer: the prior alone
    model.add(3000, 1600)
    model.set_running([(3000, 1700)] * 8)
    curve = model.curve(3000)
    assert curve is not None and not model.learned
    assert model.estimate(3000) == 8192
    assert curve.at(1550) == pytest.approx(0.9)  # one of the ten at risk at 1,500 ended there
    # The eight still running are past every answer seen: nothing but the cap bounds them.
    assert curve.alive(1700, 6000) == pytest.approx(1.0)
    assert curve.alive(1700, 8192 - 1700) == 0.0
    peak = peak_quantile(
        [Flight(held=4700, age=1700, end=8192, curve=curve, draws=np.full(256, 0.5))] * 8, 0.9
    )
    assert peak == pytest.approx(8 * (3000 + 8192))
    for _ in range(6):
        model.add(3000, 1700)
    assert model.learned


def test_two_short_answers_do_not_settle_the_tail_of_the_requests_younger_than_them() -> None:
    """The real server's first answers (a 2,048-token pool, ``max_new_tokens`` 256, prompts of
    ~50 tokens): 3 and 22 tokens, with three requests 5-18 tokens along. Kaplan-Meier alone
    settled every answer at 22 (no one at risk past it), the forecast saw five requests end
    within 22 tokens, and the gate let a burst of 25 in at once where ~6 fit at the prior.
    Until ``min_samples`` answers are in, the share not seen yet keeps running to the cap."""
    model = LengthModel(prior=256, min_samples=8, cap=256)
    model.add(50, 3)
    model.add(50, 22)
    model.set_running([(50, 5), (50, 12), (50, 18)])
    curve = model.curve(50)
    assert curve is not None and not model.learned
    assert curve.at(21) == pytest.approx(0.8)  # what the two answers say, where they say it
    assert curve.alive(18, 200) >= 0.75  # six of the eight answers unseen: at the prior
    young = [
        Flight(held=50 + age, age=age, end=256, curve=curve, draws=np.full(256, 0.5))
        for age in (5, 12, 18)
    ]
    budget = 0.85 * 2048
    admitted = 0
    while peak_quantile([*young, *[young[0]] * (admitted + 1)], 0.9) <= budget:
        admitted += 1
    assert admitted <= 3  # six in flight at most, as at the prior: not a burst
    for length in (30, 40, 25, 60, 35, 28):
        model.add(50, length)
    assert model.learned and model.curve(50).at(60) == 0.0  # eight answers: the data alone


def test_the_gate_fills_the_pool_to_its_target_and_no_further() -> None:
    gate = lane(usage_target=0.9)
    lengths = kaplan_meier(list(range(80, 121)), [], cap=4096)  # answers of 80-120 tokens
    admitted = 0
    while True:
        ticket = Ticket(gate, 200, 320, 0.0, lengths)
        if gate.room(ticket, 0.0) is None:
            break
        gate.tickets[ticket] = None
        admitted += 1
    # They all start now, so the pool peaks when the first one ends, each then holding 200 + ~80
    # tokens: 9,000 / 280 = 32 fit. (Each one's own peak, 200 + 120, never comes at the same
    # time as the others': a bound of 320 a request would admit only 28.)
    assert 29 <= admitted <= 32
    assert gate.peak(0.0) <= 0.9 * 10_000


def test_the_retraction_counter_appearing_is_a_retraction() -> None:
    """SGLang 0.5.23 has no ``num_retracted_requests_total`` sample before its first retraction
    (the real-server tier saw a run's only retraction go unseen): a counter that appears between
    two samples is one; a counter already there at the first sample is history."""
    gate = lane(usage_target=0.85)
    assert not gate.observe(
        LaneSample(time=0.0, load=RankLoad(0, token_usage=0.5), retracted_total=5), 0.0
    )
    fresh = lane(usage_target=0.85)
    fresh.observe(LaneSample(time=0.0, load=RankLoad(0, token_usage=0.5)), 0.0)
    assert fresh.observe(
        LaneSample(time=1.0, load=RankLoad(0, token_usage=0.9), retracted_total=1), 1.0
    )
    assert fresh.target.retractions == 1


def test_a_retraction_backs_off_and_freezes_then_calm_creeps_back() -> None:
    gate = lane(usage_target=0.85)
    gate.observe(LaneSample(time=0.0, load=RankLoad(0, token_usage=0.5), retracted_total=0), 0.0)
    assert gate.observe(
        LaneSample(time=1.0, load=RankLoad(0, token_usage=0.9), retracted_total=2), 1.0
    )
    assert gate.target.value == pytest.approx(0.80)
    # The same retraction seen again (the counter unchanged) is not news.
    assert not gate.observe(
        LaneSample(time=1.2, load=RankLoad(0, token_usage=0.5), retracted_total=2), 1.2
    )
    assert gate.target.value == pytest.approx(0.80)
    gate.target.held_back = True  # the target held work back meanwhile
    frozen = LaneSample(time=5.0, load=RankLoad(0, token_usage=0.5), retracted_total=2)
    gate.observe(frozen, 5.0)
    assert gate.target.value == pytest.approx(0.80)
    gate.observe(LaneSample(time=12.0, load=RankLoad(0, token_usage=0.5), retracted_total=2), 12.0)
    assert gate.target.value == pytest.approx(0.81)
    # A calm period in which the target held nothing back says nothing about it: no creep.
    gate.observe(LaneSample(time=14.0, load=RankLoad(0, token_usage=0.5), retracted_total=2), 14.0)
    assert gate.target.value == pytest.approx(0.81)
    # A peak within reach of a retraction lowers it before one happens.
    gate.target.held_back = True
    gate.observe(LaneSample(time=15.0, load=RankLoad(0, token_usage=0.99), retracted_total=2), 15.0)
    gate.observe(LaneSample(time=16.0, load=RankLoad(0, token_usage=0.7), retracted_total=2), 16.0)
    assert gate.target.value == pytest.approx(0.80)


def test_the_creep_stops_below_the_target_that_retracted_until_the_ceiling_lifts() -> None:
    settings = ControllerSettings(
        freeze_s=10, creep_every_s=1, backoff_gap_s=0.5, ceiling_hold_s=100
    )
    gate = Lane(
        server="http://s", rank=None, settings=settings, pool_tokens=10_000, usage_target=0.9
    )
    gate.observe(LaneSample(time=0.0, load=RankLoad(0, token_usage=0.5), retracted_total=0), 0.0)
    assert gate.observe(
        LaneSample(time=1.0, load=RankLoad(0, token_usage=0.9), retracted_total=1), 1.0
    )
    assert gate.target.value == pytest.approx(0.85) and gate.target.ceiling == pytest.approx(0.9)

    def calm_periods(start: int, count: int) -> None:
        for second in range(start, start + count):
            gate.target.held_back = True  # the target held work back in every period
            gate.observe(
                LaneSample(time=second, load=RankLoad(0, token_usage=0.6), retracted_total=1),
                second,
            )

    calm_periods(12, 30)  # after the freeze: +0.01 a period, up to half a backoff below 0.90
    assert gate.target.value == pytest.approx(0.87)
    calm_periods(42, 40)  # the ceiling still holds 80 s after the retraction
    assert gate.target.value == pytest.approx(0.87)
    calm_periods(82, 30)  # 100 s without a retraction: the ceiling lifts one step
    assert gate.target.ceiling == pytest.approx(0.91) and gate.target.value == pytest.approx(0.88)
    # A retraction at a lower target than the ceiling lowers the ceiling to it.
    assert gate.observe(
        LaneSample(time=120.0, load=RankLoad(0, token_usage=0.9), retracted_total=2), 120.0
    )
    assert gate.target.ceiling == pytest.approx(0.88) and gate.target.value == pytest.approx(0.83)


@pytest.mark.parametrize("answers", [0, 2])
def test_the_early_answers_do_not_raise_the_target(answers: int) -> None:
    # Before any answer ends, the prior holds requests back: that is no reason to raise u*.
    # Nor after two: their curve carries the prior's mass (``CURVE_MIN_ANSWERS``).
    gate = lane(usage_target=0.85)
    gate.lengths_learned = False
    lengths = kaplan_meier([3000, 3100], [3200] * 4, cap=4000) if answers else None
    for step in range(30):
        ticket = Ticket(gate, 200, 4000, float(step), lengths)
        if gate.room(ticket, float(step)) is not None:
            gate.tickets[ticket] = None
        gate.observe(
            LaneSample(time=float(step), load=RankLoad(0, token_usage=0.3), retracted_total=0),
            float(step),
        )
    assert gate.held_by.get("forecast", 0) > 0
    assert gate.target.value == pytest.approx(0.85)


def test_a_request_ages_from_when_the_server_admitted_it() -> None:
    gate = lane(decode_rate=10.0)
    tickets = [Ticket(gate, 100, 400, float(sent)) for sent in (0, 1, 2)]
    for ticket in tickets:
        gate.tickets[ticket] = None
    # At t=4 the server runs two requests and queues one: ours, first come first served.
    gate.observe(LaneSample(time=4.0, load=RankLoad(0, waiting=1)), 4.0)
    assert [t.started_at is not None for t in tickets] == [True, True, False]
    assert gate.age(tickets[2], 6.0) == 0  # still queued: it holds its prompt, nothing more
    assert 0 < gate.age(tickets[1], 6.0) < gate.age(tickets[0], 6.0) <= 60
    gate.observe(LaneSample(time=5.0, load=RankLoad(0, waiting=0)), 5.0)
    assert tickets[2].started_at == pytest.approx(4.5)  # admitted between the two samples


def test_a_cohort_that_ends_together_does_not_read_as_a_faster_server() -> None:
    """``gen_throughput`` is the mean of the server's last logging window, the running count is
    live. Seven requests sent together end together; the one left must not get the seven's
    throughput, or its age (and that of every request sent next) reads several times too high
    and the gate admits into a pool it thinks is about to empty."""
    gate = lane(decode_rate=250.0)
    old = Ticket(gate, 29, 329, 0.0, started_at=0.0)
    gate.tickets[old] = None

    def observe(second: float, running: int, throughput: float) -> None:
        load = RankLoad(0, running=running, waiting=0, gen_throughput=throughput)
        gate.observe(LaneSample(time=second, load=load), second)

    observe(1.0, 7, 1750.0)
    observe(1.1, 7, 1750.0)
    assert gate.decode_rate == pytest.approx(250.0)  # 1,750 tok/s over seven
    observe(1.2, 1, 1750.0)  # six ended; the window is the one of seven
    assert gate.decode_rate == pytest.approx(250.0)
    observe(1.3, 1, 1610.0)  # refreshed: a window that began with seven running
    assert gate.age(old, 1.3) <= 1.3 * 250
    expected = 0.7 * 250 + 0.3 * 1610 / 7
    assert gate.decode_rate == pytest.approx(expected)
    for second, throughput in ((1.4, 240.0), (1.5, 250.0)):  # the next windows: one alone
        observe(second, 1, throughput)
        expected = 0.7 * expected + 0.3 * throughput
    assert gate.decode_rate == pytest.approx(expected)


def test_requests_not_on_the_server_yet_do_not_make_running_ones_look_ended() -> None:
    """Three answers of ~300 tokens that queued a moment at first, and three requests sent a few
    milliseconds before the sample was asked for, not on the server yet. The server counts three
    of our six: the three still running must not be taken as ended (their age, from when they
    were sent, passes 300; from when the server took them, it does not), or the sample's KV
    goes to the three new ones and every age reads several times too high."""
    gate = lane(decode_rate=250.0)
    running = [Ticket(gate, 66, 366, 0.0, started_at=0.12) for _ in range(3)]
    arriving = [Ticket(gate, 50, 350, 1.27) for _ in range(3)]
    for ticket in running + arriving:
        gate.tickets[ticket] = None
    generated = int((1.3 - 0.12) * 250)
    load = RankLoad(0, running=3, waiting=0, used_tokens=3 * (66 + generated))
    gate.observe(LaneSample(time=1.3, load=load, asked=1.28, ours_at_ask=6), 1.3)
    assert not any(t.gone for t in running)
    assert gate.age_scale == pytest.approx(1.0, abs=0.01)
    assert all(gate.age(t, 1.3) <= 10 for t in arriving)


def test_one_overflow_backs_off_once_however_many_times_it_retracts() -> None:
    gate = lane(usage_target=0.9)
    gate.observe(LaneSample(time=0.0, load=RankLoad(0, token_usage=0.9), retracted_total=0), 0.0)
    # The pool overflows: SGLang retracts, the rest keep growing, it retracts again.
    for second, total in ((1, 1), (2, 2), (3, 4)):
        assert gate.observe(
            LaneSample(time=second, load=RankLoad(0, token_usage=0.98), retracted_total=total),
            second,
        )
    assert gate.target.value == pytest.approx(0.85) and gate.target.retractions == 3
    # Back under the target: the next retraction is news again.
    gate.observe(LaneSample(time=4.0, load=RankLoad(0, token_usage=0.7), retracted_total=4), 4.0)
    assert gate.observe(
        LaneSample(time=30.0, load=RankLoad(0, token_usage=0.9), retracted_total=5), 30.0
    )
    assert gate.target.value == pytest.approx(0.80)
    # A server that reports no usage: a freeze without a retraction ends the overflow.
    blind = lane(usage_target=0.9)
    blind.target.back_off(1.0)
    blind.target.back_off(5.0)  # within the freeze (10 s): the same overflow
    assert blind.target.value == pytest.approx(0.85)
    blind.target.back_off(16.0)  # a freeze passed since the last one: news
    assert blind.target.value == pytest.approx(0.80)


def test_a_retraction_reported_again_by_its_response_backs_off_once() -> None:
    async def targets() -> tuple[float, float]:
        async with SGLangClient(["http://127.0.0.1:9"], in_flight=1) as client:
            control = LoadController(
                client, LoadSettings(), fixed=None, max_new_tokens=1024, telemetry=None,
                note=lambda _: None,
            )  # fmt: skip
            control.add_server(ServerPlan("http://127.0.0.1:9", None, None))
            counted, blind = control.lanes["http://127.0.0.1:9"][0], lane()
            counted.pool_tokens = 10_000
            counted.observe(LaneSample(time=0.0, load=RankLoad(0), retracted_total=0), 0.0)
            counted.observe(
                LaneSample(time=1.0, load=RankLoad(0), retracted_total=1), 1.0
            )  # the counter: -0.05
            for gate in (counted, blind):
                ticket = Ticket(gate, 100, 400, 0.0)
                gate.tickets[ticket] = None
                # Minutes later the retracted request ends and its response says so too.
                control.release(ticket, completion_tokens=300, retractions=1)
            return counted.target.value, blind.target.value

    counted, blind = asyncio.run(targets())
    assert counted == pytest.approx(0.80)  # once, from the counter, not again from the response
    assert blind == pytest.approx(0.80)  # a server without a counter: the response is the news


def test_a_retracted_request_waiting_in_the_queue_is_one_retraction() -> None:
    gate = lane(usage_target=0.85)
    assert gate.observe(LaneSample(time=0.0, load=RankLoad(0, retracted_waiting=1)), 0.0)
    assert not gate.observe(LaneSample(time=1.0, load=RankLoad(0, retracted_waiting=1)), 1.0)
    assert gate.target.value == pytest.approx(0.80)


def test_the_gate_never_fills_the_queue_cap_the_server_reports() -> None:
    """``max_queued_requests`` from /server_info: our requests in flight less those the last
    sample counted running (a request still on its way counts as queued, and no answer that
    ends is credited: an upper bound) stay below it, whatever the depth rule and the forecast
    say, so our own traffic can get no 503."""
    gate = lane(queue_target=100, queue_limit=6)  # one slot spare: for a retracted request
    lengths = kaplan_meier([50] * 20, [], cap=4096)
    for sent in range(4):
        gate.tickets[Ticket(gate, 100, 150, 0.1 * sent, lengths)] = None
    # Read while four were in flight: one running, two queued, one not yet arrived.
    gate.observe(LaneSample(time=1.0, load=RankLoad(0, waiting=2, running=1), ours_at_ask=4), 1.0)
    assert gate.queued_at_most() == 3
    admitted = 0
    while gate.room(ticket := Ticket(gate, 100, 150, 1.0, lengths), 1.0) is not None:
        gate.tickets[ticket] = None
        admitted += 1
    assert admitted == 2 and gate.held_by == {"queue_cap": 1}  # 3 + 2 = 5: full but one
    oldest = min(gate.tickets, key=lambda t: t.sent_at)
    gate.tickets.pop(oldest)
    gate.ended(oldest, 1.5, 150, data=True)  # the running one ends: no credit for the queue
    assert gate.room(Ticket(gate, 100, 150, 1.5, lengths), 1.5) is None
    gate.observe(
        LaneSample(time=2.0, load=RankLoad(0, waiting=1, running=4), ours_at_ask=5, ended_at_ask=1),
        2.0,
    )
    assert gate.room(Ticket(gate, 100, 150, 2.0, lengths), 2.0) is not None  # the queue moved


def test_requests_sent_after_a_sample_and_ended_do_not_fill_the_queue_bound() -> None:
    """The canary's check sends a burst of short requests (warm-ups of no new token) that come
    back within one poll: the sample never counted them, so their ends free no slot it counted
    as running. Taking them off its running count made the bound count every request it saw
    running as queued, and a check held the run's requests at the queue cap until the next
    sample while the pool ran down."""
    gate = lane(queue_target=100, queue_limit=8)  # held at 7: one slot spare
    lengths = kaplan_meier([50] * 20, [], cap=4096)
    for sent in range(6):
        gate.tickets[Ticket(gate, 100, 150, 0.1 * sent, lengths)] = None
    gate.observe(LaneSample(time=1.0, load=RankLoad(0, waiting=0, running=6), ours_at_ask=6), 1.0)
    for _ in range(6):  # the burst, after the sample, back before the next
        warm_up = Ticket(gate, 100, 100, 1.1, None)
        gate.tickets[warm_up] = None
        gate.tickets.pop(warm_up)
        gate.ended(warm_up, 1.2, 100, data=False)
    admitted = 0
    while gate.room(ticket := Ticket(gate, 100, 150, 1.2, lengths), 1.2) is not None:
        gate.tickets[ticket] = None
        admitted += 1
    assert admitted == 7 and gate.held_by == {"queue_cap": 1}  # the six run, seven may queue
    # A sample asked at 1.25 and read at 1.4: of what ended in between, the one sent before
    # the ask is taken off its counts, the one sent after is not.
    first = min(gate.tickets, key=lambda t: t.sent_at)
    gate.tickets.pop(first)
    gate.ended(first, 1.3, 150, data=True)
    late = Ticket(gate, 100, 100, 1.3, None)
    gate.tickets[late] = None
    gate.tickets.pop(late)
    gate.ended(late, 1.35, 100, data=False)
    gate.observe(
        LaneSample(
            time=1.4,
            load=RankLoad(0, waiting=7, running=5),
            asked=1.25,
            ours_at_ask=13,
            ended_at_ask=gate.ended_total - 2,
        ),
        1.4,
    )
    assert gate.ended_of_asked == 1 and gate.queued_at_most() == 12 - (5 - 1)


def test_a_canary_check_counts_for_one_prefill_chunk_not_its_whole_burst() -> None:
    """A check sends its scorings at once: requests that generate nothing, each holding KV only
    while its prefill batch runs, and the server prefills at most a chunk at a time. Counted
    whole, ten of 800 tokens took the pool's budget and the run's requests waited out the
    check; counted as one chunk, the run goes on beside it."""
    lengths = kaplan_meier([50] * 20, [], cap=4096)

    def admitted_beside(burst: int) -> int:
        gate = lane()  # a pool of 10,000 at u* 0.85: 8,500
        gate.prefill_chunk = 1000
        for _ in range(10):
            gate.tickets[Ticket(gate, 100, 150, 0.0, lengths)] = None
        load = RankLoad(0, waiting=0, running=10, used_tokens=1500, pool_tokens=10_000)
        gate.observe(LaneSample(time=0.5, load=load, ours_at_ask=10), 0.5)
        for _ in range(burst):  # the check's scorings, sent after the sample
            gate.tickets[Ticket(gate, 800, 800, 0.6)] = None
        admitted = 0
        while gate.room(ticket := Ticket(gate, 100, 150, 0.7, lengths), 0.7) is not None:
            gate.tickets[ticket] = None
            admitted += 1
        return admitted

    alone = admitted_beside(0)
    assert alone > 40
    # 8,000 tokens of scorings take at most a chunk's room: ten requests of 100 at most.
    assert alone - 10 <= admitted_beside(10) <= alone


def test_a_503_teaches_a_queue_cap_that_is_not_one_slot_for_good() -> None:
    """A server that reports no cap but answers 503: the queue we may have had at the 503 was
    at least its cap, and the gate keeps below that; a calm ceiling period relaxes it by one."""
    gate = lane(queue_target=8)
    gate.observe(LaneSample(time=0.0, load=RankLoad(0, waiting=4, running=2)), 0.0)
    for sent in range(3):
        gate.tickets[Ticket(gate, 100, 150, 0.5 + sent)] = None
    gate.queue_full(3.0, gate.queued_at_most())  # 4 + 3 sent since: the cap is at most 6
    assert gate.queue_cap() == 6 and gate.queue_target == 8
    gate.queue_full(3.1, 2)  # a second 503 with less in the queue lowers it...
    gate.queue_full(3.2, 5)  # ...a later one with more does not raise it
    assert gate.queue_cap() == 1
    hold = gate.settings.ceiling_hold_s
    gate.maybe_creep(3.2 + hold)
    gate.maybe_creep(3.2 + 2 * hold)
    assert gate.queue_cap() == 3  # relaxed, one per ceiling period without a 503
    reported = lane(queue_limit=64)
    reported.queue_full(1.0, 70)  # another client's burst: the reported cap stands
    assert reported.queue_cap() == 64 and reported.rejections == 1


def test_fallback_is_the_planners_number() -> None:
    # The planner: pool / (prompt + answer / 2 + 150) x 1.1.
    assert fallback_concurrency(116_000, mean_prompt_tokens=300, mean_output_tokens=4500) == 48


# --- signals from the simulated server ----------------------------------------------------------


async def _read(url: str) -> Any:
    async with SGLangClient([url], in_flight=1) as client:
        return await client.read_load(url)


@pytest.mark.parametrize(
    ("fields", "source"),
    [
        ({}, "loads"),
        ({"version": "0.5.7"}, "metrics"),  # before /v1/loads (0.5.8)
        ({"version": "0.5.7", "enable_metrics": False}, "get_load"),
        ({"hide_load_routes": True}, None),
    ],
)
def test_the_best_load_signal_the_server_offers(
    tokenizer_dir: str, fields: dict[str, Any], source: str | None
) -> None:
    with SimServerThread(engine(tokenizer_dir, **fields)) as sim:
        load = asyncio.run(_read(sim.url))
    if source is None:
        assert load is None
    else:
        assert load is not None and load.source == source
        assert load.ranks[0].running == 0


@pytest.mark.slow
def test_no_signal_at_all_falls_back_once_and_the_run_completes(
    tokenizer_dir: str, tmp_path: Path
) -> None:
    with SimServerThread(engine(tokenizer_dir, hide_load_routes=True)) as sim:
        notes: list[str] = []

        async def run() -> LoadController:
            async with SGLangClient([sim.url], in_flight=8) as client:
                control = LoadController(
                    client,
                    LoadSettings(**FAST_LOAD),
                    fixed=None,
                    max_new_tokens=256,
                    telemetry=None,
                    note=notes.append,
                )
                control.add_server(ServerPlan(sim.url, None, None))
                polled = asyncio.Event()
                read_load = client.read_load

                async def noted(url: str) -> Any:
                    try:
                        return await read_load(url)
                    finally:
                        polled.set()

                client.read_load = noted  # type: ignore[method-assign]
                task = asyncio.create_task(control.run())
                async with asyncio.timeout(60):  # generous: the first poll admits it
                    ticket = await control.acquire(100)
                control.release(ticket, completion_tokens=50)
                async with asyncio.timeout(60):  # five more polls find no signal: said once
                    for _ in range(5):
                        polled.clear()
                        await polled.wait()
                task.cancel()
                return control

        control = asyncio.run(run())
        assert len(notes) == 1 and "the planner's number" in notes[0]
        assert control.lanes[sim.url][0].fallback_limit == 64  # no pool known: a plain 64
        summary = run_auto(sim, tmp_path / "run")
    assert (summary.written, summary.failed) == (40, 0)


# --- the whole run ------------------------------------------------------------------------------


def run_auto(sim: SimServerThread, out: Path, **sections: dict[str, Any]) -> Any:
    generation = {"max_new_tokens": 512, "temperature": 1.0}
    config = make_config(
        [sim.url],
        out,
        run={"concurrency": "auto", **sections.pop("run", {})},
        load=FAST_LOAD,
        generation=generation,
        **sections,
    )
    return pipeline.generate(config, DATASET, out, progress=False)


@pytest.mark.slow
def test_auto_fills_the_pool_without_retraction_and_writes_everything_once(
    tokenizer_dir: str, tmp_path: Path
) -> None:
    """Every answer is 300 tokens (less the few a word boundary trims): once the first eight
    have ended, the forecast of what is in flight is exact but for the requests' ages, which
    each sample sets from the KV the server counts. No tail is left to price, so a retraction
    here is the controller's fault, never the chance its 90th percentile leaves (answers of
    300 +-30% overflow this pool, which ~9 requests fill, about once in 200: docs/throughput.md,
    A small pool). At 20x, not the engine's usual 100x: a client on a loaded machine reacts
    tens of milliseconds late, which at 100x is seconds of the server's time and the whole
    margin of this pool. Answers of one length end together, which is what broke it at 20x
    under load (6 of 40 runs beside four busy processes; 0 of 40 since):
    ``test_a_cohort_that_ends_together_does_not_read_as_a_faster_server`` and
    ``test_requests_not_on_the_server_yet_do_not_make_running_ones_look_ended``."""
    with SimServerThread(engine(tokenizer_dir, output_len_spread=0.0, time_scale=0.05)) as sim:
        summary = run_auto(sim, tmp_path / "run")
        stats = sim.stats()
    assert (summary.planned, summary.written, summary.failed) == (40, 40, 0)
    assert verify_run(tmp_path / "run").ok
    assert sorted(r["id"] for r in read_records(tmp_path / "run")) == sorted(
        {r["id"] for r in read_records(tmp_path / "run")}
    )
    assert stats["engine"][0]["retracted_total"] == 0
    assert stats["outcomes"].get("queue_full", 0) == 0
    entries = list(read_telemetry(tmp_path / "run"))
    assert entries, "telemetry.jsonl was not written"
    assert entries[-1].source == "loads"
    # It filled the pool: at some point more than half of it held our requests.
    assert max(e.token_usage or 0 for e in entries) > 0.5


def test_a_resumed_run_starts_from_the_answer_lengths_its_records_hold(
    tokenizer_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seeded: list[tuple[int, int]] = []
    real = session_open.load_controller

    async def spy(*args: Any, **kwargs: Any) -> LoadController:
        control = await real(*args, **kwargs)
        seeded.append((control.lengths.samples, control.lengths.estimate(100)))
        return control

    monkeypatch.setattr(session_open, "load_controller", spy)
    with SimServerThread(engine(tokenizer_dir)) as sim:
        run_auto(sim, tmp_path / "run")
        summary = pipeline.resume(tmp_path / "run", progress=False)
    assert (summary.planned, summary.written) == (40, 40)
    lengths = sorted(r["completion_tokens"] for r in read_records(tmp_path / "run"))
    assert seeded[0] == (0, 512)  # a new run: nothing learned, the max_new_tokens prior
    ninetieth = lengths[-(-9 * len(lengths) // 10) - 1]
    assert seeded[1] == (40, ninetieth)  # resumed: what its 40 records say


@pytest.mark.slow
def test_fixed_concurrency_over_admits_and_the_server_retracts(
    tokenizer_dir: str, tmp_path: Path
) -> None:
    """The same workload with 40 in flight: SGLang's decaying reservation lets the pool overflow
    (what auto exists to prevent). Retracted requests keep their output: records still land."""
    config = engine(tokenizer_dir, output_len_mean=400.0, clip_max_new_tokens_estimation=512)
    with SimServerThread(config) as sim:
        generation = {"max_new_tokens": 1024, "temperature": 1.0}
        run_config = make_config(
            [sim.url], tmp_path / "run", run={"concurrency": 40}, generation=generation
        )
        summary = pipeline.generate(run_config, DATASET, tmp_path / "run", progress=False)
        stats = sim.stats()
    assert summary.written == 40
    assert stats["engine"][0]["retracted_total"] > 0
    assert verify_run(tmp_path / "run").ok


def test_a_503_never_spends_an_attempt(tokenizer_dir: str, tmp_path: Path) -> None:
    """Half the requests answered 503 and one attempt per item: every item still lands."""
    with SimServerThread(engine(tokenizer_dir, fail_503_rate=0.5)) as sim:
        summary = run_auto(sim, tmp_path / "run", server={"max_attempts": 1})
        stats = sim.stats()
    assert stats["outcomes"]["fail_503"] > 5
    assert (summary.written, summary.failed) == (40, 0)
    assert read_failures(tmp_path / "run") == []


def test_the_telemetry_counts_the_503s_of_a_fixed_concurrency(
    tokenizer_dir: str, tmp_path: Path
) -> None:
    """40 in flight against a queue capped at 2: the server refuses many, and the run's
    telemetry says how many (it counted none under a fixed ``--concurrency``: no ticket to
    release there, so a 503 never reached the lane's count)."""
    config = engine(tokenizer_dir, max_queued_requests=2, output_len_mean=100.0)
    with SimServerThread(config) as sim:
        generation = {"max_new_tokens": 256, "temperature": 1.0}
        run_config = make_config(
            [sim.url], tmp_path / "run", run={"concurrency": 40}, load=FAST_LOAD,
            generation=generation,
        )  # fmt: skip
        summary = pipeline.generate(run_config, DATASET, tmp_path / "run", progress=False)
        refused = sim.stats()["outcomes"].get("queue_full", 0)
    assert summary.written == 40
    assert refused > 0
    entries = list(read_telemetry(tmp_path / "run"))
    assert entries[-1].queue_full == refused


def test_the_controller_backs_off_on_a_real_retraction_and_a_503(tokenizer_dir: str) -> None:
    config = engine(tokenizer_dir, output_len_mean=400.0, clip_max_new_tokens_estimation=512)
    with SimServerThread(config) as sim:

        async def flood() -> None:
            async with httpx.AsyncClient(timeout=60) as http:
                body = {
                    "input_ids": list(range(20, 120)),
                    "sampling_params": {"max_new_tokens": 1024},
                }
                await asyncio.gather(
                    *(
                        http.post(sim.url + "/generate", json={**body, "rid": f"r{i}"})
                        for i in range(40)
                    )
                )

        async def watch() -> Lane:
            async with SGLangClient([sim.url], in_flight=8) as client:
                control = LoadController(
                    client,
                    LoadSettings(**FAST_LOAD),
                    fixed=None,
                    max_new_tokens=1024,
                    telemetry=None,
                    note=lambda _: None,
                )
                control.add_server(ServerPlan(sim.url, None, None))
                task = asyncio.create_task(control.run())
                await flood()
                lane = control.lanes[sim.url][0]
                await until(lambda: lane.target.retractions)  # the next poll reads the counter
                task.cancel()
                return lane

        gate = asyncio.run(watch())
    assert gate.target.retractions >= 1
    assert gate.target.value < 0.85
    gate.queue_full(0.0, 3)  # the server reports no cap: a 503 teaches one
    assert gate.queue_cap() == 2


@pytest.mark.slow
def test_an_answer_that_ends_opens_the_gate_before_the_next_poll(tokenizer_dir: str) -> None:
    """The server frees an answer's KV before it replies, while its last sample still counts
    it: the request waiting for that room must not wait for the next poll to get in."""
    # The answer (100 tokens, ~7.7 modelled s) lasts ~5.5 s here, so the poll at 4 s samples the
    # pool while it runs, and the next poll is not due until 8 s: the gate must open within a
    # second of the answer's end (a second for one local sample, on a busy machine).
    poll = 4.0
    config = engine(tokenizer_dir, output_len_mean=100.0, output_len_spread=0.0, time_scale=0.71)
    with SimServerThread(config) as sim:

        async def run() -> float:
            load = LoadSettings(**{**FAST_LOAD, "poll_interval_s": poll})
            async with SGLangClient([sim.url], in_flight=8) as client:
                control = LoadController(
                    client, load, fixed=None, max_new_tokens=256, telemetry=None, note=print
                )
                control.add_server(ServerPlan(sim.url, None, None))
                task = asyncio.create_task(control.run())
                lane = control.lanes[sim.url][0]
                await until(lambda: lane.sample is not None)  # the first: a 2,500-token pool
                # A short request stays in flight throughout (an empty lane admits anything).
                async with asyncio.timeout(60):
                    await control.acquire(100)
                async with asyncio.timeout(60):
                    first = await control.acquire(1200)
                # Two of 1,200 + 256 do not fit within 0.85 of the pool: this one waits.
                second = asyncio.create_task(control.acquire(1200))
                body = {
                    "input_ids": [20 + n % 100 for n in range(1200)],
                    "sampling_params": {"max_new_tokens": 256},
                }
                async with httpx.AsyncClient(timeout=30) as http:
                    answer = (await http.post(sim.url + "/generate", json=body)).json()
                assert not second.done()
                control.release(first, completion_tokens=answer["meta_info"]["completion_tokens"])
                ended = asyncio.get_running_loop().time()
                async with asyncio.timeout(poll):
                    await second
                waited = asyncio.get_running_loop().time() - ended
                task.cancel()
                return waited

        waited = asyncio.run(run())
    assert waited < poll / 4  # the next poll was ~2.5 s away


def test_a_server_that_shrinks_its_pool_is_followed(tokenizer_dir: str, tmp_path: Path) -> None:
    with SimServerThread(engine(tokenizer_dir, max_total_num_tokens=12_000)) as sim:

        async def watch() -> tuple[int | None, int | None]:
            async with SGLangClient([sim.url], in_flight=8) as client:
                control = LoadController(
                    client,
                    LoadSettings(**FAST_LOAD),
                    fixed=None,
                    max_new_tokens=256,
                    telemetry=None,
                    note=lambda _: None,
                )
                control.add_server(ServerPlan(sim.url, None, None))
                task = asyncio.create_task(control.run())
                lane = control.lanes[sim.url][0]
                await until(lambda: lane.sample is not None)  # the first poll
                before = lane.pool_tokens
                sim.control(max_total_num_tokens=5000)  # restarted with a smaller pool
                await until(lambda: lane.pool_tokens != before)  # a later poll
                task.cancel()
                return before, lane.pool_tokens

        before, after = asyncio.run(watch())
        assert (before, after) == (12_000, 5000)
        summary = run_auto(sim, tmp_path / "run")
        stats = sim.stats()
    assert summary.written == 40
    assert stats["engine"][0]["retracted_total"] == 0


def test_work_goes_where_there_is_room(tokenizer_dir: str, tmp_path: Path) -> None:
    """Two servers, one with three times the pool: it gets most of the work."""
    with (
        SimServerThread(engine(tokenizer_dir, max_total_num_tokens=6000)) as big,
        SimServerThread(engine(tokenizer_dir, max_total_num_tokens=2000, seed=1)) as small,
    ):
        config = make_config(
            [big.url, small.url],
            tmp_path / "run",
            run={"concurrency": "auto"},
            load=FAST_LOAD,
            generation={"max_new_tokens": 256, "temperature": 1.0},
        )
        summary = pipeline.generate(config, DATASET, tmp_path / "run", progress=False)
    assert summary.written == 40
    by_server: dict[str, int] = {}
    for record in read_records(tmp_path / "run"):
        by_server[record["server"]] = by_server.get(record["server"], 0) + 1
    assert by_server.get(big.url, 0) > by_server.get(small.url, 0)


def test_a_server_that_runs_few_at_once_is_not_given_a_queue_its_pool_would_hold(
    tokenizer_dir: str, tmp_path: Path
) -> None:
    """Two servers of one pool (~20 requests fill it), the second running at most 4 at once
    (its batch, not its pool, binds): its queue is kept at most 4 deep, so it never holds more
    than 8 of ours. The queue target was the prefill chunk over the mean prompt (~100 here),
    and the capped server, whose pool stays emptiest, took every request its pool let through
    (19 here; the real SGLang beside a server running 17-30: 42 in flight, 35 queued)."""
    with (
        SimServerThread(engine(tokenizer_dir, max_total_num_tokens=6000)) as free,
        SimServerThread(
            engine(tokenizer_dir, max_total_num_tokens=6000, max_running_requests=4, seed=1)
        ) as capped,
    ):
        config = make_config(
            [free.url, capped.url],
            tmp_path / "run",
            run={"concurrency": "auto"},
            load=FAST_LOAD,
            generation={"max_new_tokens": 256, "temperature": 1.0},
        )
        summary = pipeline.generate(config, DATASET, tmp_path / "run", progress=False)
    assert summary.written == 40
    on_capped = [e.in_flight for e in read_telemetry(tmp_path / "run") if e.server == capped.url]
    assert on_capped and max(on_capped) <= 4 + 4


def sample(**fields: Any) -> TelemetryLine:
    return TelemetryLine(source="loads", **fields)


def test_telemetry_is_bounded_and_status_shows_the_latest(tmp_path: Path) -> None:
    log = TelemetryLog(tmp_path, max_bytes=4096)
    for n in range(2000):
        log.append(sample(time=n, server="http://a", token_usage=n / 2000))
    log.close()
    total = (tmp_path / "telemetry.jsonl").stat().st_size
    total += (tmp_path / ROTATED_FILE).stat().st_size
    assert total <= 2 * 4096
    latest = latest_load(tmp_path)
    assert latest is not None and latest["http://a"]["time"] == 1999
    assert [e.time for e in read_telemetry(tmp_path)][-1] == 1999
    assert (
        orjson.loads((tmp_path / "telemetry.jsonl").read_bytes().splitlines()[-1])["time"] == 1999
    )


def test_status_keeps_one_latest_sample_per_dp_rank(tmp_path: Path) -> None:
    """Under DP attention each rank has a pool and a controller of its own: the latest sample of
    one rank must not hide the other's (they share a server URL)."""
    log = TelemetryLog(tmp_path, max_bytes=1 << 20)
    for n in range(10):
        for rank in (0, 1):
            log.append(sample(time=n, server="http://a", rank=rank, token_usage=0.5 + rank / 4))
        log.append(sample(time=n, server="http://b", token_usage=0.1))
    log.close()
    latest = latest_load(tmp_path)
    assert latest is not None
    assert sorted(latest) == ["http://a rank 0", "http://a rank 1", "http://b"]
    assert latest["http://a rank 1"]["token_usage"] == 0.75
    assert {entry["time"] for entry in latest.values()} == {9}


def test_the_engine_retracts_the_youngest_and_they_keep_their_output(tokenizer_dir: str) -> None:
    """SGLang's retract_decode: the fewest generated tokens go first; a retracted request keeps
    its output and is re-prefilled, so its answer is the same as without retraction."""
    config = engine(
        tokenizer_dir, max_total_num_tokens=1200, output_len_mean=300.0, output_len_spread=0.0,
        clip_max_new_tokens_estimation=64, time_scale=0.02,
    )  # fmt: skip

    async def send_staggered(url: str) -> list[dict[str, Any]]:
        async with httpx.AsyncClient(timeout=60) as http:

            async def one(index: int) -> dict[str, Any]:
                # in order: each once the server has taken the ones before it (its own count),
                # at least 0.05 s later, so that the older ones have more output
                while index:
                    if (await http.get(url + "/_sim/stats")).json()["requests"] >= index:
                        await asyncio.sleep(0.05)
                        break
                    await asyncio.sleep(0.01)
                body = {
                    "input_ids": list(range(20 + index, 120 + index)),
                    "sampling_params": {"max_new_tokens": 512},
                    "rid": f"r{index}",
                }
                response = await http.post(url + "/generate", json=body)
                return dict(response.json())

            return list(await asyncio.gather(*(one(i) for i in range(6))))

    with SimServerThread(config) as sim:
        answers = asyncio.run(send_staggered(sim.url))
        retracted = sim.stats()["engine"][0]["retracted_total"]
    counts = [answer["meta_info"]["total_retractions"] for answer in answers]
    assert retracted > 0 and sum(counts) == retracted
    assert counts[0] == 0  # the oldest request, with the most output, is never the one to go
    assert max(counts[3:]) > 0
    for index, answer in enumerate(answers):
        ids = list(range(20 + index, 120 + index))
        expected, _ = expected_output(ids, {"max_new_tokens": 512}, config)
        assert answer["output_ids"] == expected
