"""Adaptive concurrency: how many requests one process lets run at once, learnt from
the latency of the requests it lets run.

A fixed limit is a number an operator must guess, and the right number moves with the
service's own load. Like TCP's congestion control (and Netflix's concurrency-limits,
Envoy's adaptive concurrency filter), the limit here follows the latency the service
shows. The rule, an AIMD on latency:

- Every request admitted and finished gives a sample: its latency. `short` is their
  exponentially weighted mean over about `short_window` samples: the latency now.
- `best` is the lowest latency sampled since the last probe (below): the service
  without a queue.
- While `short` stays within `tolerance × best`, the limit grows by one (smoothed:
  `smoothing` of a step per sample). Once it exceeds it, the limit is multiplied by
  `tolerance × best / short` (at least 0.5; smoothed the same way). It stays within
  [`floor`, `maximum`].
- A sample taken while fewer than half the limit were in flight says nothing about the
  limit: the service was not asked for that much. It may lower the limit, never raise it.
- Every `probe_every` seconds the process admits only `floor` requests for `probe_for`
  seconds and measures `best` again: a service that became slower or faster for good is
  then judged against what it is now, and a limit that crept up under a queue meets its
  unloaded latency again.

Times are the caller's (seconds): tests and replays pass them explicitly. Thread-safe.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

__all__ = ["AdaptiveLimiter", "Ticket"]


@dataclass(frozen=True, slots=True)
class Ticket:
    """An admitted request: when it started and how many were in flight with it."""

    started: float
    in_flight: int


class AdaptiveLimiter:
    """The in-flight limit of one process, learnt from latency (see the module)."""

    def __init__(
        self,
        maximum: int,
        floor: int = 1,
        *,
        initial: int | None = None,
        tolerance: float = 1.5,
        smoothing: float = 0.2,
        short_window: int = 10,
        probe_for: float = 1.0,
        probe_every: float = 60.0,
    ) -> None:
        if not 1 <= floor <= maximum:
            raise ValueError(f"need 1 <= floor <= maximum, got floor {floor}, maximum "
                             f"{maximum}")
        if tolerance < 1 or not 0 < smoothing <= 1 or short_window < 1:
            raise ValueError("need tolerance >= 1, 0 < smoothing <= 1, short_window >= 1")
        if probe_for <= 0 or probe_every <= probe_for:
            raise ValueError("need probe_for > 0 and probe_every > probe_for")
        self.maximum, self.floor = maximum, floor
        self.tolerance, self.smoothing = tolerance, smoothing
        self.probe_for, self.probe_every = probe_for, probe_every
        self._alpha = 2 / (short_window + 1)
        self._estimate = float(floor if initial is None else min(maximum, max(floor, initial)))
        self._lock = threading.Lock()
        self.in_flight = 0
        self.short: float | None = None
        self._best = math.inf
        self._probe_at: float | None = None  # when the last probe started
        self._probing_until = -math.inf

    @property
    def limit(self) -> int:
        """How many requests may be in flight now."""
        return max(self.floor, math.floor(self._estimate))

    @property
    def best(self) -> float | None:
        """The lowest latency since the last probe (None before the first sample)."""
        return None if self._best == math.inf else self._best

    def acquire(self, now: float) -> Ticket | None:
        """A ticket when one more request may run now, else None (refuse it)."""
        with self._lock:
            self._tick(now)
            allowed = self.floor if now < self._probing_until else self.limit
            if self.in_flight >= allowed:
                return None
            self.in_flight += 1
            return Ticket(now, self.in_flight)

    def release(self, ticket: Ticket, now: float, *, sample: bool = True) -> None:
        """The request of `ticket` finished at `now`; its latency teaches the limit
        unless `sample` is False (a request that failed fast says nothing of the load)."""
        with self._lock:
            self.in_flight = max(0, self.in_flight - 1)
            if sample:
                self._learn(max(0.0, now - ticket.started), ticket.in_flight, now)

    def _tick(self, now: float) -> None:
        """Start a probe when one is due (the first call starts the clock)."""
        if self._probe_at is None:
            self._probe_at = now
        elif now - self._probe_at >= self.probe_every:
            self._probe_at = now
            self._probing_until = now + self.probe_for
            self._best = math.inf  # measured again, without a queue

    def _learn(self, rtt: float, in_flight: int, now: float) -> None:
        self._tick(now)
        self._best = min(self._best, rtt)
        self.short = rtt if self.short is None else (
            self.short + self._alpha * (rtt - self.short)
        )
        limit = self._estimate
        if self.short <= self.tolerance * self._best:
            if in_flight < limit / 2:
                return  # the service was not asked for this much: no evidence to grow
            target = limit + 1
        else:
            target = limit * max(0.5, self.tolerance * self._best / self.short)
        smoothed = limit + (target - limit) * self.smoothing
        self._estimate = min(float(self.maximum), max(float(self.floor), smoothed))
