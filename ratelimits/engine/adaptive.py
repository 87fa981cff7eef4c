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
  `smoothing` of a step per sample), for each sample itself within it too: the mean
  lags a few samples behind a queue that just formed, and growing meanwhile overshoots.
  Once `short` exceeds it, the limit is multiplied by `tolerance × best / short` (at
  least 0.5; smoothed the same way). It stays within
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

import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ratelimits.engine.keynames import new_token
from ratelimits.engine.types import Decision, Limit, Outcome, Result

__all__ = ["AdaptiveEngine", "AdaptiveLimiter", "Ticket"]

logger = logging.getLogger("ratelimits")


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
        #: Nothing is refused (a shadow policy): probes would measure the queue, so
        #: `best` is the lowest latency since the start instead.
        self.shadow = False

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
            if self.in_flight >= self._allowed(now):
                return None
            return self._enter(now)

    def room(self, now: float) -> bool:
        """Whether one more request may run now (nothing is taken)."""
        with self._lock:
            return self.in_flight < self._allowed(now)

    def enter(self, now: float) -> Ticket:
        """Count one more request in flight, room or not (in shadow nothing is refused,
        and the limiter learns from every request that runs)."""
        with self._lock:
            self._tick(now)
            return self._enter(now)

    def reconfigure(self, maximum: int, floor: int, probe_every: float) -> None:
        """New bounds (the policy was edited); what was learnt is kept within them."""
        with self._lock:
            if not 1 <= floor <= maximum or probe_every <= self.probe_for:
                raise ValueError("need 1 <= floor <= maximum and probe_every > probe_for")
            self.maximum, self.floor, self.probe_every = maximum, floor, probe_every
            self._estimate = min(float(maximum), max(float(floor), self._estimate))

    def _allowed(self, now: float) -> int:
        self._tick(now)
        return self.floor if now < self._probing_until else self.limit

    def _enter(self, now: float) -> Ticket:
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
            if self.shadow:
                return  # a probe that refuses nothing cannot see the unloaded latency
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
            if in_flight < limit / 2 or rtt > self.tolerance * self._best:
                # the service was not asked for this much, or this sample is already
                # slow (the mean lags it): no evidence to grow
                return
            target = limit + 1
        else:
            target = limit * max(0.5, self.tolerance * self._best / self.short)
        smoothed = limit + (target - limit) * self.smoothing
        self._estimate = min(float(self.maximum), max(float(self.floor), smoothed))


#: Whole seconds a refused request is told to wait: about as long as a probe lasts,
#: and many latencies, so slots will have freed by then.
RETRY_AFTER = 1
#: A limiter's limit is logged when it changed, at most this often (seconds).
LOG_EVERY = 10.0

#: Called with each sample: the limit, when it was taken, the latency (seconds) and the
#: limit it left (requests in flight).
OnSample = Callable[[Limit, float, float, int], None]


class AdaptiveEngine:
    """The adaptive limits of one process, decided like a store engine's `evaluate`: one
    `AdaptiveLimiter` per policy and client, a request admitted under every limit or
    none. `release()` after the response gives each limiter the request's latency.

    A shadow limit refuses nothing: every request is counted in flight and teaches it,
    and the outcome says whether it would have been refused. Thread-safe.
    """

    def __init__(self, *, on_sample: OnSample | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.on_sample = on_sample
        self._clock = clock
        self._lock = threading.Lock()
        self._limiters: dict[tuple[str, str], AdaptiveLimiter] = {}
        self._held: dict[str, list[tuple[Limit, AdaptiveLimiter, Ticket]]] = {}
        self._told: dict[tuple[str, str], tuple[int, float]] = {}  # limit logged, when

    def limiter(self, limit: Limit) -> AdaptiveLimiter:
        """The limiter of `limit`'s policy and client, made on first use."""
        with self._lock:
            return self._limiter(limit)

    def take(self, limits: Sequence[Limit], now: float | None = None
             ) -> tuple[Decision, Decision | None]:
        """Admit one request under every limit, or refuse it; the decision, and the
        same decision as the receipt `refund()` takes when it holds tickets (else None)."""
        at = self._clock() if now is None else now
        with self._lock:
            limiters = [self._limiter(limit) for limit in limits]
            room = [limiter.room(at) for limiter in limiters]
            admitted = all(ok or limit.shadow for ok, limit in zip(room, limits, strict=True))
            held = []
            results = []
            for limit, limiter, ok in zip(limits, limiters, room, strict=True):
                if admitted:
                    held.append((limit, limiter, limiter.enter(at)))
                if not ok:
                    outcome = Outcome.WOULD_REJECT if limit.shadow else Outcome.REJECTED
                else:
                    outcome = Outcome.ADMITTED if admitted else Outcome.SPARED
                wait = 0.0 if ok else float(RETRY_AFTER)
                results.append(Result(limit, ok, max(0, limiter.limit - limiter.in_flight),
                                      float(RETRY_AFTER), wait, outcome=outcome))
            token = new_token() if held else None
            if token is not None:
                self._held[token] = held
        decision = Decision(admitted, tuple(results),
                            retry_after=0 if admitted else RETRY_AFTER, token=token)
        return decision, decision if token is not None else None

    def evaluate(self, limits: Sequence[Limit], now: float | None = None) -> Decision:
        """`take()`'s decision (release it with `release()` once the request ran)."""
        return self.take(limits, now)[0]

    def refund(self, receipt: Decision) -> Decision:
        """Give back the tickets of `take()`, whose request something else refused: they
        teach nothing (the request did not run). The decision as if refused here."""
        with self._lock:
            held = self._held.pop(receipt.token or "", [])
        at = self._clock()
        for _, limiter, ticket in held:
            limiter.release(ticket, at, sample=False)
        results = tuple(
            dataclasses.replace(r, outcome=Outcome.SPARED)
            if r.outcome is Outcome.ADMITTED else r
            for r in receipt.results
        )
        return dataclasses.replace(receipt, allowed=False, results=results, token=None,
                                   retry_after=max(RETRY_AFTER, receipt.retry_after))

    def release(self, decision: Decision, now: float | None = None) -> None:
        """The request of `decision` finished now: each limiter learns its latency."""
        with self._lock:
            held = self._held.pop(decision.token or "", [])
        at = self._clock() if now is None else now
        for limit, limiter, ticket in held:
            limiter.release(ticket, at)
            learnt = limiter.limit
            if self.on_sample is not None:
                self.on_sample(limit, at, max(0.0, at - ticket.started), learnt)
            self._tell(limit, limiter, learnt, at)

    async def arelease(self, decision: Decision) -> None:
        """`release()` for async code (in process: nothing to wait for)."""
        self.release(decision)

    #: A ticket lasts until its request is released: nothing expires, nothing to renew.
    slots_expire = False

    def renew(self, decisions: Sequence[Decision], now: float | None = None) -> None:
        """Nothing to renew: a ticket lasts until `release()` (see `slots_expire`)."""

    def in_flight(self) -> int:
        """Requests holding tickets now, over every limiter."""
        with self._lock:
            return len(self._held)

    def _limiter(self, limit: Limit) -> AdaptiveLimiter:
        key = (limit.name, limit.key)
        floor = limit.floor or 1
        found = self._limiters.get(key)
        if found is None:
            found = self._limiters[key] = AdaptiveLimiter(limit.limit, floor,
                                                          probe_every=limit.period)
        elif (found.maximum, found.floor, found.probe_every) != (limit.limit, floor,
                                                                limit.period):
            found.reconfigure(limit.limit, floor, limit.period)  # the policy was edited
        found.shadow = limit.shadow
        return found

    def _tell(self, limit: Limit, limiter: AdaptiveLimiter, learnt: int, at: float) -> None:
        """Log a limit that moved, at most every `LOG_EVERY` per limiter: in shadow, the
        limit it would have set."""
        key = (limit.name, limit.key)
        told = self._told.get(key)
        if told is not None and (told[0] == learnt or at - told[1] < LOG_EVERY):
            return
        self._told[key] = (learnt, at)
        logger.info(
            "ratelimits: adaptive policy %r%s: limit %d in flight (was %s); latency "
            "%.1f ms, best %.1f ms", limit.name, " would set (shadow)" if limit.shadow
            else "", learnt, "-" if told is None else told[0],
            1000 * (limiter.short or 0.0), 1000 * (limiter.best or 0.0))
