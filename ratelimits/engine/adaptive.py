"""Adaptive concurrency: how many requests one process lets run at once, learnt from
the latency of the requests it lets run.

A fixed limit is a number an operator must guess, and the right number moves with the
service's own load. Like TCP's congestion control (and Netflix's concurrency-limits,
Envoy's adaptive concurrency filter), the limit here follows the latency the service
shows. The rule, an AIMD on latency:

- Every request admitted and finished gives a sample: its latency (less the time it
  waited on the client, such as a slow upload: `waited`). `short` is the latency now:
  the latency nine tenths of the last `short_window` samples are at or below (the 9th
  fastest of 10). What the limit keeps down is the tail, not the middle: a process
  whose own CPU is full (many threads, one interpreter lock) shows it first as a share
  of slow samples that grows with the load while the median still looks unloaded. One
  odd request among ten (a cold cache, an upload whose wait was not seen) does not move
  it.
- `best` is the service without a queue: a low quantile of the recent samples
  (`BEST_RANK` of the last `BEST_WINDOW` must be at or below it, or, while fewer are
  known, half of them), kept at its lowest since the last probe (below). A cheap answer
  now and then (a 404 in a millisecond beside requests that take 50) is not the
  service's latency: alone it never becomes `best`, nor a single fast or slow sample.
  Until `BEST_MIN` samples are known there is no `best`, and the limit does not move.
- While `short` stays within `tolerance × best`, the limit grows by one (smoothed:
  `smoothing` of a step per sample), for each sample itself within it too: `short`
  lags a few samples behind a queue that just formed, and growing meanwhile overshoots.
  Once `short` exceeds it, the limit is multiplied by `tolerance × best / short` (at
  least 0.5; smoothed the same way). It stays within [`floor`, `maximum`].
- A sample taken while fewer than half the limit were in flight says nothing about the
  limit: the service was not asked for that much. It may lower the limit, never raise it.
- Every `probe_every` seconds the process admits only `floor` requests for `probe_for`
  seconds (longer, up to half of `probe_every`, until `BEST_MIN` requests that started
  in it have finished) and measures `best` again from those alone: a service that became
  slower or faster for good is then judged against what it is now, and a limit that
  crept up under a queue meets its unloaded latency again.

The caller decides which requests teach (`sample`): one whose answer says nothing of the
service's load (refused elsewhere, a client error) should not. The limit is per process:
a server that runs one request at a time per process (gunicorn's sync workers) never has
a second one in flight to refuse.

Times are the caller's (seconds): tests and replays pass them explicitly. Thread-safe.
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ratelimits.engine.keynames import new_token
from ratelimits.engine.types import Decision, Limit, Outcome, Result

__all__ = ["AdaptiveEngine", "AdaptiveLimiter", "Ticket"]

logger = logging.getLogger("ratelimits")

#: `best` is the latency that this many of the last `BEST_WINDOW` samples are at or
#: below (a tenth): a few cheap answers among them cannot be it ...
BEST_RANK = 10
BEST_WINDOW = 100
#: ... and none is known before this many samples (a probe lasts until it has them);
#: fewer than 2 × BEST_RANK samples: their median.
BEST_MIN = 5
#: `short` is the latency that this share of the last `short_window` samples are at or
#: below: high enough to see a tail that the median hides, low enough that one odd
#: sample of ten is not it.
SHORT_SHARE = 0.9


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
        tolerance: float = 1.3,
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
        self._estimate = float(floor if initial is None else min(maximum, max(floor, initial)))
        self._lock = threading.Lock()
        self.in_flight = 0
        self.short: float | None = None
        self._latest: deque[float] = deque(maxlen=short_window)  # for `short`
        self._window: deque[float] = deque(maxlen=BEST_WINDOW)  # for `best`
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
        """The unloaded latency since the last probe (None while too few samples)."""
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
        return self.floor if self._probing(now) else self.limit

    def _probing(self, now: float) -> bool:
        """Whether a probe runs now: for `probe_for`, and on until it measured `best`
        (at most half of `probe_every`: a probe that sees no traffic ends)."""
        if now < self._probing_until:
            return True
        return (self._probe_at is not None and self._best == math.inf and not self.shadow
                and self._probing_until > -math.inf
                and now < self._probe_at + self.probe_every / 2)

    def _enter(self, now: float) -> Ticket:
        self.in_flight += 1
        return Ticket(now, self.in_flight)

    def step_out(self) -> None:
        """A request in flight waits on its client (its body's upload): it leaves the
        count until `step_in()`, so a slow client holds no room of the service's."""
        with self._lock:
            self.in_flight = max(0, self.in_flight - 1)

    def step_in(self) -> None:
        """The request of `step_out()` runs again (counted, room or not)."""
        with self._lock:
            self.in_flight += 1

    def release(self, ticket: Ticket, now: float, *, sample: bool = True,
                waited: float = 0.0) -> None:
        """The request of `ticket` finished at `now`; its latency, less `waited` (seconds
        it waited on the client, such as for its body), teaches the limit unless `sample`
        is False (a request whose answer says nothing of the load)."""
        with self._lock:
            self.in_flight = max(0, self.in_flight - 1)
            if sample:
                self._learn(max(0.0, now - ticket.started - waited), ticket, now)

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
            self._window.clear()

    def _learn(self, rtt: float, ticket: Ticket, now: float) -> None:
        self._tick(now)
        self._latest.append(rtt)
        self.short = self._recent()
        if self._probe_at is None or ticket.started >= self._probe_at or self.shadow:
            # a request that started before the last probe ran with a queue: not `best`
            self._window.append(rtt)
            self._best = min(self._best, self._baseline())
        best, limit = self._best, self._estimate
        if best == math.inf:
            return  # too few samples to tell a queue from a cheap answer
        if self.short <= self.tolerance * best:
            if ticket.in_flight < limit / 2 or rtt > self.tolerance * best:
                # the service was not asked for this much, or this sample is already
                # slow (`short` lags it): no evidence to grow
                return
            target = limit + 1
        else:
            target = limit * max(0.5, self.tolerance * best / self.short)
        smoothed = limit + (target - limit) * self.smoothing
        self._estimate = min(float(self.maximum), max(float(self.floor), smoothed))

    def _recent(self) -> float:
        """`short`: the latency `SHORT_SHARE` of the recent samples are at or below."""
        latest = sorted(self._latest)
        return latest[max(0, math.ceil(SHORT_SHARE * len(latest)) - 1)]

    def _baseline(self) -> float:
        """The latency `best` may fall to now: a low quantile of the window (see the
        module), inf while it holds fewer than `BEST_MIN` samples."""
        n = len(self._window)
        if n < BEST_MIN:
            return math.inf
        rank = min(BEST_RANK, (n + 1) // 2)
        return heapq.nsmallest(rank, self._window)[-1]


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
        self._paused: set[str] = set()  # tokens of requests waiting on their client
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
        held = self._take_back(receipt)
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

    def release(self, decision: Decision, now: float | None = None, *, learn: bool = True,
                waited: float = 0.0) -> None:
        """The request of `decision` finished now: each limiter learns its latency, less
        `waited` (seconds it waited on the client: a slow upload is not the service's
        latency); nothing when `learn` is False (an answer that says nothing of the
        service's load, such as a 404)."""
        held = self._take_back(decision)
        at = self._clock() if now is None else now
        for limit, limiter, ticket in held:
            limiter.release(ticket, at, sample=learn, waited=waited)
            if not learn:
                continue
            learnt = limiter.limit
            if self.on_sample is not None:
                self.on_sample(limit, at, max(0.0, at - ticket.started - waited), learnt)
            self._tell(limit, limiter, learnt, at)

    def pause(self, decision: Decision) -> None:
        """The request of `decision` waits on its client (a read of its body): its
        tickets do not count in flight until `resume()`."""
        token = decision.token or ""
        with self._lock:
            held = self._held.get(token)
            if not held or token in self._paused:
                return
            self._paused.add(token)
        for _, limiter, _ in held:
            limiter.step_out()

    def resume(self, decision: Decision) -> None:
        """The request of `pause()` runs again."""
        token = decision.token or ""
        with self._lock:
            if token not in self._paused:
                return  # released meanwhile
            self._paused.discard(token)
            held = self._held.get(token, [])
        for _, limiter, _ in held:
            limiter.step_in()

    def _take_back(self, decision: Decision) -> list[tuple[Limit, AdaptiveLimiter, Ticket]]:
        """The tickets of `decision`, no longer held, each counted in flight again if
        its request was paused (its release counts it out)."""
        token = decision.token or ""
        with self._lock:
            held = self._held.pop(token, [])
            paused = token in self._paused
            self._paused.discard(token)
        if paused:
            for _, limiter, _ in held:
                limiter.step_in()
        return held

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
