"""Helpers for testing your own views under rate limits: policies installed for one test
without the database, a clock you move, and counters that start from zero.

    from ratelimits.testing import limited

    LOGIN = {"name": "login", "rate": "5/m", "algorithm": "sliding_log",
             "path": "/login/", "methods": "POST"}

    class LoginTests(TestCase):
        def test_sixth_attempt_waits_a_minute(self):
            with limited(LOGIN) as limits:
                for _ in range(5):
                    self.client.post("/login/", {...})
                self.assertEqual(self.client.post("/login/", {...}).status_code, 429)
                limits.clock.advance(60)
                self.assertEqual(self.client.post("/login/", {...}).status_code, 200)

Inside `limited(...)` the app decides with a fresh in-process engine at the clock's time
(frozen unless advanced; a request told to wait advances it instead of sleeping), with
exactly the policies given (and the limits declared in code with `@ratelimit`), never
the database's; leaving it forgets all of it. The pytest plugin offers the same as the
`ratelimits` fixture.

The clock starts at `START` (midnight UTC, 1 January 2024), not at the wall clock's time:
a window of any usual period (a second, a minute, an hour, a day) begins there, so a
window algorithm's `Retry-After` is the same whichever second the test runs at. `at=`
starts it elsewhere.
"""

from __future__ import annotations

import functools
import inspect
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from ratelimits.engine import MemoryEngine
from ratelimits.pipeline import engines
from ratelimits.pipeline.resolver import load_snapshot, pinned_snapshot, resolver
from ratelimits.pipeline.state import reset_state
from ratelimits.runtime import use_clock

__all__ = ["START", "Clock", "Limits", "limited"]

F = TypeVar("F", bound=Callable[..., Any])

#: Where a test's clock starts unless told: 2024-01-01T00:00:00Z in seconds since the
#: epoch. A whole number of days, so every window whose period divides a day (1 s, 10 s,
#: a minute, an hour, a day ...) starts exactly there: a test decides the same, and gets
#: the same `Retry-After`, at whatever second of the minute it runs.
START = 1_704_067_200.0


class Clock:
    """A clock that stands still until told: `advance(seconds)` or `freeze(at)`. It
    starts at `start` (seconds since the epoch), by default at the wall clock's time;
    `limited()` moves it to `START` unless given `at`.

    An implementation of `ratelimits.runtime.Clock`: installed (as `limited()` does, or
    with `runtime.using_clock()`), the app decides at its time, measures its intervals
    on it, and a request told to wait advances it instead of sleeping. Subclass it to
    watch the waits (override `sleep` and `asleep`).
    """

    def __init__(self, start: float | None = None) -> None:
        self._lock = threading.Lock()
        self._now = time.time() if start is None else float(start)

    def time(self) -> float:
        """The time the engines decide at, in seconds since the epoch."""
        with self._lock:
            return self._now

    def now(self) -> float:
        """`time()`, by its name in `limits.clock.now()` (and `engine.acquire`'s clocks)."""
        return self.time()

    def monotonic(self) -> float:
        """The same reading: intervals pass only as the clock is moved."""
        return self.time()

    def advance(self, seconds: float) -> float:
        """Move the clock forward; returns the new time."""
        if seconds < 0:
            raise ValueError(f"a clock only moves forward; got {seconds!r} seconds")
        with self._lock:
            self._now += seconds
            return self._now

    def freeze(self, at: float) -> None:
        """Stand the clock at `at` (seconds since the epoch)."""
        with self._lock:
            self._now = float(at)

    def sleep(self, seconds: float) -> None:
        """What a request told to wait does under this clock: the time passes at once."""
        self.advance(max(0.0, seconds))

    async def asleep(self, seconds: float) -> None:
        """`sleep()` on the async stack."""
        self.sleep(seconds)


class Limits:
    """The policies, clock and counters of the test running inside `limited()`."""

    def __init__(self, policies: Iterable[Mapping[str, Any] | Any], clock: Clock) -> None:
        self._policies = list(policies)
        self.clock = clock
        self._start = clock.time()
        self.engine = MemoryEngine()
        self._depth = 0

    def use(self, *policies: Mapping[str, Any] | Any) -> None:
        """Decide with these policies from now on (replacing the ones installed)."""
        resolver.pinned = pinned_snapshot(policies)
        self._policies = list(policies)

    def load(self) -> None:
        """Decide with the policies saved in the test database (and their overrides),
        as they are now: call it again after changing them. An override's `expires` is
        compared with this clock's time, which starts at `START` unless told."""
        resolver.pinned = None
        resolver.pinned = load_snapshot(None)

    def reset(self) -> None:
        """Forget every count, as if no request had been made."""
        self.engine = MemoryEngine()
        engines.install(self.engine)

    def __enter__(self) -> Limits:
        if self._depth == 0:
            reset_state()
            self.clock.freeze(self._start)  # each test decorated starts at the same time
            self.reset()
            self.use(*self._policies)
            use_clock(self.clock)
        self._depth += 1
        return self

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if self._depth == 0:
            reset_state()

    def __call__(self, test: F) -> F:
        """As a decorator: on a test function, or on a test class (each `test*` method)."""
        if isinstance(test, type):
            for name, method in list(vars(test).items()):
                if name.startswith("test") and callable(method):
                    setattr(test, name, self(method))
            return test
        if inspect.iscoroutinefunction(test):

            @functools.wraps(test)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                with self:
                    return await test(*args, **kwargs)

            return run_async  # type: ignore[return-value]

        @functools.wraps(test)
        def run(*args: Any, **kwargs: Any) -> Any:
            with self:
                return test(*args, **kwargs)

        return run  # type: ignore[return-value]


def limited(
    *policies: Mapping[str, Any] | Any, at: float | None = None, clock: Clock | None = None
) -> Limits:
    """Rate-limit with exactly these policies, in process, at a clock you move.

    Each policy is a dict of `Policy` fields (`rate="5/m"` may stand for `limit` and
    `period`; `mode` is "enforce" unless given) or an unsaved `Policy`; an invalid one
    raises the model's ValidationError. `at` starts the clock (seconds since the epoch);
    without it the clock starts at `START`, a fixed midnight where every usual window
    begins, so the decisions and their `Retry-After` never depend on when the test runs.
    `clock` is one of your own (a `Clock` subclass that records the waits), set to the
    same start; else a new one. A context manager giving the `Limits`, and a decorator
    for test functions and classes.
    """
    start = START if at is None else at
    if clock is None:
        clock = Clock(start)
    else:
        clock.freeze(start)
    return Limits(policies, clock)
