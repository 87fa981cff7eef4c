"""Process state and time: one reset for every holder, and the one clock the app reads.

Every layer imports this module, so it imports only the standard library.

**Reset.** A module that keeps process-wide state (a cached setting, an engine, a
snapshot, a "logged once" flag) registers the function that forgets it, where the state
is defined: `on_reset(fn)`, also as a decorator. `reset_process()` calls them all; tests
call it between cases, so no module needs to know, or write, another's private names.

**Time.** `clock()` is the clock installed now: `time()` (epoch seconds: what decisions
are made at), `monotonic()` (intervals: the circuit breaker, log throttling, the policy
version and table re-checks), `sleep()` and `asleep()` (a request waiting its turn, on
the blocking and the async stack). The real clock by default; `use_clock()` or
`using_clock()` installs another (`ratelimits.testing.Clock`). `reset_process()` puts
the real one back.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Protocol, TypeVar

__all__ = [
    "REAL",
    "Clock",
    "RealClock",
    "clock",
    "decision_time",
    "on_reset",
    "reset_process",
    "use_clock",
    "using_clock",
]

#: What a function of yours (`EXEMPT`, `TIER`, `REJECT_VIEW`) may raise that the request
#: path takes as that function failing: all but KeyboardInterrupt. SystemExit too, so
#: that no function of yours stops a worker or turns a request into a 500.
FUNCTION_FAILED = (Exception, SystemExit, GeneratorExit)

Reset = TypeVar("Reset", bound=Callable[[], object])

_lock = threading.Lock()
_resets: list[Callable[[], object]] = []


def on_reset(fn: Reset) -> Reset:
    """Have `reset_process()` call `fn` (once however often it is registered); returns
    `fn`, so it works as a decorator."""
    with _lock:
        if fn not in _resets:
            _resets.append(fn)
    return fn


def reset_process() -> None:
    """Forget every piece of process-wide state: each registered reset, in the order the
    holders registered them."""
    with _lock:
        resets = list(_resets)
    for reset in resets:
        reset()


class Clock(Protocol):
    """What the app reads time from and waits with."""

    def time(self) -> float:
        """Seconds since the epoch: the time requests are decided at."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back: for intervals only."""
        ...

    def sleep(self, seconds: float) -> None:
        """Hold the calling thread for `seconds`."""
        ...

    async def asleep(self, seconds: float) -> None:
        """Hold the calling task for `seconds`; the event loop serves others meanwhile."""
        ...


class RealClock:
    """The system's clocks and waits."""

    # the system's own functions, not wrappers: read on every request
    monotonic = staticmethod(time.monotonic)
    time = staticmethod(time.time)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    async def asleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


REAL = RealClock()
_current: Clock = REAL


def clock() -> Clock:
    """The clock installed now (the real one unless a test installed another)."""
    return _current


def use_clock(new: Clock | None) -> None:
    """Read time from `new` from now on, in every thread; None: the real clock."""
    global _current
    _current = REAL if new is None else new


@contextlib.contextmanager
def using_clock(new: Clock) -> Iterator[Clock]:
    """`use_clock(new)` for a block; the clock installed before is back after it."""
    before = _current
    use_clock(new)
    try:
        yield new
    finally:
        use_clock(before)


def decision_time() -> float | None:
    """The time to hand the engines: None under the real clock, so that the store's own
    clock decides (Redis `TIME`: processes with skewed clocks agree), else the
    installed clock's."""
    current = _current
    return None if current is REAL else current.time()


@on_reset
def _real_time_again() -> None:
    use_clock(None)
