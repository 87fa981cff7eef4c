"""`acquire()` and `aacquire()`: wait for a turn instead of being refused.

The clock is the test's: its `sleep()` moves time on at once, so a wait of ten seconds
takes none, and the engine decides at the clock's time. Redis still expires keys in real
time, so the paces here keep their state for seconds, not the fraction of one that a
loaded machine can spend between two calls.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from ratelimits.engine import Limit, MemoryEngine
from tests.engine.conftest import T0


class Clock:
    def __init__(self, at: float) -> None:
        self.at = at
        self.slept: list[float] = []

    def now(self) -> float:
        return self.at

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.at += seconds


def test_reserved_turns_are_waited_for_in_order(engine):
    """One every 10 s, no burst: each call is admitted and waits for its own turn, 10 s
    after the previous one, and never two for one turn."""
    clock = Clock(T0)
    partner = Limit("partner-api", "gcra", 6, 60, burst=1, name="partner")
    starts, delays = [], []
    for _ in range(5):
        clock.at = T0  # five workers asking at the same instant
        decision = engine.acquire([partner], clock=clock)
        assert decision.allowed
        starts.append(round(clock.at - T0, 6))
        delays.append(decision.delay)
    assert starts == [0.0, 10.0, 20.0, 30.0, 40.0]
    # each turn was charged when asked (a reservation), not found by asking again
    assert delays == pytest.approx([0.0, 10.0, 20.0, 30.0, 40.0])
    assert not engine.evaluate([partner], now=T0 + 45).allowed  # the next is at 50


def test_a_turn_beyond_the_timeout_is_refused_at_once(engine):
    clock = Clock(T0)
    slow = Limit("report", "gcra", 1, 10, burst=1, name="report")
    assert engine.acquire([slow], timeout=0, clock=clock).allowed
    refused = engine.acquire([slow], timeout=2, clock=clock)
    assert not refused.allowed
    assert clock.slept == []  # nothing waited for: the turn is 10 s away
    assert refused.results[0].retry_after == pytest.approx(10 - 2)  # beyond the 2 s asked
    admitted = engine.acquire([slow], timeout=10, clock=clock)
    assert admitted.allowed and clock.at == pytest.approx(T0 + 10)
    # the refusal charged nothing: the turn at 10 was still free for the next call


def test_a_window_is_asked_again_when_its_refusal_ends(engine):
    """The windows cannot reserve: the call sleeps until the refusal's time and asks
    again, up to the timeout."""
    clock = Clock(T0 + 1)
    window = Limit("export", "fixed_window", 2, 10, name="export")
    for _ in range(2):
        assert engine.acquire([window], clock=clock).allowed
    assert not engine.acquire([window], timeout=5, clock=clock).allowed
    assert clock.at == T0 + 1  # the window ends in 9 s: not worth waiting 5
    decision = engine.acquire([window], timeout=30, clock=clock)
    assert decision.allowed
    assert clock.at == pytest.approx(T0 + 10, abs=0.01)  # the next window


def test_every_limit_must_admit_and_only_the_admitting_call_is_charged(engine):
    clock = Clock(T0)
    paced = Limit("k", "token_bucket", 6, 60, burst=1, name="fast")  # one per 10 s
    log = Limit("k", "sliding_log", 3, 600, name="slow")
    times = []
    for _ in range(3):
        assert engine.acquire([paced, log], clock=clock).allowed
        times.append(round(clock.at - T0, 6))
    assert times == [0.0, 10.0, 20.0]
    # the log is full until 600: the bucket's reservation must not be kept meanwhile
    decision = engine.acquire([paced, log], timeout=15, clock=clock)
    assert not decision.allowed
    clock.at = T0 + 600
    assert engine.acquire([paced, log], timeout=0, clock=clock).allowed


def test_a_shadow_limit_is_not_waited_for(engine):
    clock = Clock(T0)
    watched = Limit("k", "gcra", 1, 60, burst=1, shadow=True, name="watched")
    for _ in range(3):
        assert engine.acquire([watched], clock=clock).allowed
    assert clock.slept == []


def test_aacquire_waits_on_the_event_loop(engine):
    clock = Clock(T0)
    partner = Limit("partner-api", "gcra", 6, 60, burst=1, name="partner")

    async def main():
        for _ in range(3):
            clock.at = T0
            assert (await engine.aacquire([partner], clock=clock)).allowed
        return clock.slept

    assert asyncio.run(main()) == pytest.approx([10.0, 20.0])


def test_a_real_wait_is_slept_and_leaves_the_loop_free():
    """Real time, once: the second call sleeps its turn (50 ms) in `asyncio.sleep`, and
    other tasks run meanwhile."""
    engine = MemoryEngine()
    partner = Limit("partner-api", "gcra", 20, 1, burst=1, name="partner")
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.005)

    async def main():
        assert (await engine.aacquire([partner])).allowed
        task = asyncio.create_task(ticker())
        began = time.monotonic()
        assert (await engine.aacquire([partner], timeout=1)).allowed
        waited = time.monotonic() - began
        task.cancel()
        return waited

    waited = asyncio.run(main())
    assert 0.04 <= waited < 1
    assert ticks >= 3
    began = time.monotonic()
    assert engine.acquire([partner], timeout=1).allowed
    assert 0.01 <= time.monotonic() - began < 1
