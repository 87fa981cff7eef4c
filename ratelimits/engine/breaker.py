"""A circuit breaker: after consecutive failures, stop waiting on a dead store for a while.

While open, calls fail at once (no socket is touched); after the cool-down one caller
probes, and its success closes the circuit again. Thread-safe; clock injectable for tests.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half-open"


class CircuitBreaker:
    def __init__(
        self,
        failures: int = 3,
        cooldown: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if failures < 1 or cooldown < 0:
            raise ValueError("failures must be at least 1 and cooldown non-negative")
        self.failures = failures
        self.cooldown = cooldown
        self._clock = clock
        self._lock = threading.Lock()
        self._count = 0
        self._opened_at = 0.0
        self._probing = False
        self.state = CLOSED
        #: Closed with no failure counted: a call's success has nothing to tell (read
        #: without the lock by callers that skip `success()` then).
        self.clear = True
        #: How many times the circuit opened: lets callers log once per outage.
        self.trips = 0

    def allow(self) -> bool:
        """Whether a call may go to the store now (False: fail fast)."""
        if self.state == CLOSED:
            return True
        with self._lock:
            if self.state == OPEN and self._clock() - self._opened_at >= self.cooldown:
                self.state = HALF_OPEN
                self._probing = False
            if self.state == HALF_OPEN and not self._probing:
                self._probing = True  # exactly one caller probes
                return True
            return False

    def success(self) -> None:
        if self.clear:
            return
        with self._lock:
            self._count = 0
            self._probing = False
            self.state = CLOSED
            self.clear = True

    def failure(self) -> None:
        with self._lock:
            self._count += 1
            self._probing = False
            self.clear = False
            if self.state == HALF_OPEN or self._count >= self.failures:
                if self.state == CLOSED:  # a failed probe is the same outage
                    self.trips += 1
                self.state = OPEN
                self._opened_at = self._clock()
