"""Waiting for a turn instead of being refused: `engine.acquire()` and `aacquire()`.

For work outside requests (a Celery task calling a partner API at most 10 times a
second from every worker): block until every limit admits one call, or until `timeout`.

A limit whose algorithm reserves a future turn (`Algorithm.reserves`: token bucket,
GCRA, leaky bucket) is asked once with `max_wait` set to the time left: the store
charges the turn now and says how long to wait for it, so waiters are served in the
order they asked and never more than the rate over time. Any other limit (the windows,
the log, concurrency) cannot promise a future turn, so the call is asked again when the
refusal's retry time has passed (a slot freed earlier is seen then). A turn reserved on
one limit while another refuses is not kept: the engine charges all or nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections.abc import Sequence
from typing import Protocol

from ratelimits.engine.types import Decision, Limit

__all__ = ["Acquiring", "Clock"]

#: With no timeout, a reservation reaches at most this many periods ahead; a longer
#: wait is taken in steps (each one asks again), so a waiter far back in a queue does
#: not pin a turn long before it.
_AHEAD_PERIODS = 1.0


class Clock(Protocol):
    """What `acquire` waits with: a test's clock moves on `sleep()` without sleeping."""

    def now(self) -> float: ...
    def sleep(self, seconds: float) -> None: ...


class _RealClock:
    now = staticmethod(time.time)
    sleep = staticmethod(time.sleep)


class Acquiring:
    """`acquire()` and `aacquire()` for an engine that has `evaluate(limits, now)`, and
    `aevaluate()`/`arelease()`/`aread_version()`: in a worker thread unless the engine
    awaits its store natively (`LocalFirst` with an asyncio twin, `engine.aio`) or has
    none to wait for (`MemoryEngine`)."""

    def evaluate(self, limits: Sequence[Limit], now: float | None = None) -> Decision:
        raise NotImplementedError

    def release(self, decision: Decision) -> None:
        raise NotImplementedError

    def read_version(self, now: float | None = None) -> int:
        raise NotImplementedError

    async def aevaluate(self, limits: Sequence[Limit], now: float | None = None) -> Decision:
        """`evaluate()` for async code."""
        return await asyncio.to_thread(self.evaluate, limits, now)

    async def arelease(self, decision: Decision) -> None:
        """`release()` for async code."""
        await asyncio.to_thread(self.release, decision)

    async def aread_version(self) -> int:
        """`read_version()` for async code."""
        return await asyncio.to_thread(self.read_version)

    def acquire(self, limits: Sequence[Limit], timeout: float | None = None, *,
                clock: Clock | None = None) -> Decision:
        """Block until every limit admits one call (`cost` units each) and return the
        admitting decision; after `timeout` seconds (None: no end), the last refusal
        (`allowed` False). `clock` replaces real time (the engine then decides at its
        `now()`)."""
        real = clock is None
        tick: Clock = _RealClock() if clock is None else clock
        deadline = None if timeout is None else tick.now() + max(0.0, timeout)
        while True:
            decision = self.evaluate(*_asked(limits, tick, deadline, real))
            wait = _wait(decision, tick, deadline)
            if wait is None:
                return decision
            tick.sleep(wait)
            if decision.allowed:
                return decision

    async def aacquire(self, limits: Sequence[Limit], timeout: float | None = None, *,
                       clock: Clock | None = None) -> Decision:
        """`acquire()` for async code: the event loop serves others while it waits, and
        the store is asked with `aevaluate()` (on the loop where the engine can)."""
        real = clock is None
        tick: Clock = _RealClock() if clock is None else clock
        deadline = None if timeout is None else tick.now() + max(0.0, timeout)
        while True:
            decision = await self.aevaluate(*_asked(limits, tick, deadline, real))
            wait = _wait(decision, tick, deadline)
            if wait is None:
                return decision
            if real:
                await asyncio.sleep(wait)
            else:
                tick.sleep(wait)
            if decision.allowed:
                return decision


def _asked(limits: Sequence[Limit], tick: Clock, deadline: float | None,
           real: bool) -> tuple[list[Limit], float | None]:
    """The limits to ask now (those that can reserve a turn up to the deadline) and the
    time to decide at (None: the store's own clock)."""
    now = tick.now()
    left = None if deadline is None else max(0.0, deadline - now)
    return [_reserving(limit, left) for limit in limits], None if real else now


def _reserving(limit: Limit, left: float | None) -> Limit:
    """`limit` allowed to reserve a turn up to `left` seconds ahead, if it can."""
    if not limit.spec.reserves or limit.shadow:
        return limit
    ahead = limit.period * _AHEAD_PERIODS if left is None else left
    return dataclasses.replace(limit, max_wait=max(limit.max_wait, ahead))


def _wait(decision: Decision, tick: Clock, deadline: float | None) -> float | None:
    """How long to sleep now: an admitted call's delay (its reserved turn), or until a
    refused one may pass; None when there is nothing to wait for (admitted at once, or
    refused past the deadline)."""
    if decision.allowed:
        return decision.delay if decision.delay > 0 else None
    retry = _retry_after(decision)
    if deadline is not None:
        left = deadline - tick.now()
        if left <= 0 or retry > left:
            return None
    return retry


def _retry_after(decision: Decision) -> float:
    """The precise time until the refused call may pass (the decision's Retry-After is
    whole seconds, too coarse to wait on)."""
    rejected = decision.rejected_by
    if not rejected:
        return 0.0
    # at least a millisecond: a refusal whose time has just come is not asked in a spin
    return max(0.001, *(math.nextafter(r.retry_after, math.inf) for r in rejected))

