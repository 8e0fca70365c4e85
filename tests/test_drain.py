"""Issue 21, two servers of unequal speed: once the last requests wait at the gate, none starts
on a lane where it would end after the job's end on the others (``capacity/drain.py``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from eagledata.capacity.controller import Lane
from eagledata.capacity.drain import LaneSpeed, drain_horizon, lanes_to_skip
from eagledata.config import LoadSettings
from eagledata.run.load_lanes import ServerPlan
from eagledata.run.loadcontrol import LoadController
from eagledata.run.scheduler import Scheduler
from eagledata.server.client import SGLangClient

FAST = LaneSpeed(life_s=2.2, rate=35.0)
SLOW = LaneSpeed(life_s=4.6, rate=18.5)


# --- the arithmetic -----------------------------------------------------------------------------


def test_the_tail_is_shared_so_that_every_lane_ends_together() -> None:
    """With many requests left both lanes take work, and each ends at the horizon: the fast
    lane's share plus its answers' life equals the slow lane's."""
    horizon = drain_horizon([FAST, SLOW], 500)
    assert horizon > SLOW.life_s
    shares = [lane.rate * (horizon - lane.life_s) for lane in (FAST, SLOW)]
    assert sum(shares) == pytest.approx(500)
    assert lanes_to_skip([FAST, SLOW], 500) == [False, False]


def test_the_slow_lane_stops_taking_work_when_the_fast_one_would_end_first() -> None:
    """The slow lane gets none of the last ``rate_fast x (life_slow - life_fast)`` requests
    (84 here): the fast one ends them all before one started on the slow one would end."""
    cut = FAST.rate * (SLOW.life_s - FAST.life_s)
    assert lanes_to_skip([FAST, SLOW], int(cut) + 1) == [False, False]
    assert lanes_to_skip([FAST, SLOW], int(cut) - 1) == [False, True]
    assert lanes_to_skip([SLOW, FAST], 1) == [True, False]  # the order of the lanes is kept


def test_lanes_of_one_speed_and_lanes_of_unknown_speed_are_never_held_back() -> None:
    same = [LaneSpeed(life_s=2.0, rate=10.0)] * 8  # the DP ranks of one server
    assert lanes_to_skip(same, 1) == [False] * 8
    assert lanes_to_skip([FAST, None, SLOW], 1) == [False, False, True]
    assert drain_horizon([], 10) == float("inf")
    assert lanes_to_skip([None, None], 1) == [False, False]


# --- the gate -----------------------------------------------------------------------------------

SLOW_URL, FAST_URL = "http://127.0.0.1:9", "http://127.0.0.1:10"


def _gate(client: SGLangClient, to_come: int | None) -> tuple[LoadController, Lane, Lane]:
    control = LoadController(
        client, LoadSettings(), fixed=None, max_new_tokens=256, telemetry=None,
        note=lambda _: None,
    )  # fmt: skip
    control.add_server(ServerPlan(SLOW_URL, None, None))
    control.add_server(ServerPlan(FAST_URL, None, None))
    slow, fast = control.lanes[SLOW_URL][0], control.lanes[FAST_URL][0]
    # The slow server has the larger pool: left to the room alone, work would go there first.
    slow.pool_tokens, fast.pool_tokens = 200_000, 2_000
    # Their last 32 answers came at their pace, up to now (the gate's clock is the monotonic one).
    now = time.monotonic()
    for lane, speed in ((slow, SLOW), (fast, FAST)):
        lane.lifetime_s = speed.life_s
        lane.answered_at.extend(now - i / speed.rate for i in reversed(range(32)))
    control.still_to_come = lambda: to_come
    return control, slow, fast


def test_the_last_requests_wait_for_the_fast_lane_rather_than_start_on_the_slow_one() -> None:
    """Ten requests left: each goes to the fast server as its room opens, though the slow one
    has room for all of them; while the dataset has more to send, the room decides."""

    async def run() -> None:
        async with SGLangClient([SLOW_URL, FAST_URL], in_flight=16) as client:
            control, slow, fast = _gate(client, to_come=None)
            assert (await control.acquire(100)).lane is slow  # the most room: not the tail yet

            control, slow, fast = _gate(client, to_come=0)
            first = await control.acquire(100)
            assert first.lane is fast
            # 100 + 256 each in the forecast: the fast lane's 0.85 x 2,000 holds four
            held = [await control.acquire(100) for _ in range(3)]
            waiting = [asyncio.create_task(control.acquire(100)) for _ in range(6)]
            await asyncio.sleep(0)
            assert not any(task.done() for task in waiting)  # the slow lane's room is not taken
            assert slow.in_flight == 0 and slow.held_by["tail"] > 0
            for ticket in [first, *held]:
                control.release(ticket, completion_tokens=200)
            await asyncio.sleep(0)
            admitted = [task.result() for task in waiting if task.done()]
            assert admitted and all(ticket.lane is fast for ticket in admitted)
            for task in waiting:
                task.cancel()
            await asyncio.gather(*waiting, return_exceptions=True)

    asyncio.run(run())


def test_a_fast_server_that_goes_down_leaves_the_tail_to_the_slow_one() -> None:
    """The tail is shared among the healthy servers only: the last request is not left waiting
    for a server that is down."""

    async def run() -> None:
        async with SGLangClient([SLOW_URL, FAST_URL], in_flight=16) as client:
            control, slow, _ = _gate(client, to_come=0)
            endpoint = client.endpoint(FAST_URL)
            assert endpoint is not None
            endpoint.healthy = False
            assert (await control.acquire(100)).lane is slow

    asyncio.run(run())


# --- the scheduler ------------------------------------------------------------------------------


def test_the_scheduler_says_how_many_are_left_once_the_dataset_has_no_more() -> None:
    async def run() -> None:
        scheduler: Scheduler[int] = Scheduler(concurrency=2, queue_size=8)
        seen: list[int | None] = []
        release = asyncio.Event()

        async def source() -> AsyncIterator[int]:
            for item in range(6):
                yield item
            seen.append(scheduler.unstarted())  # the last item not yielded to the end yet

        async def handle(item: int) -> None:
            await release.wait()
            seen.append(scheduler.unstarted())

        task = asyncio.create_task(scheduler.run(source(), handle))
        for _ in range(20):
            await asyncio.sleep(0)
        left_waiting = scheduler.unstarted()
        release.set()
        await task
        assert seen[0] is None
        assert left_waiting == 4  # six items, two in the workers' hands
        assert seen[-1] == 0

    asyncio.run(run())
