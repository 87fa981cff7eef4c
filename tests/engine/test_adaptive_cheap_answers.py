"""The adaptive limit against odd samples, in simulated time: cheap answers beside the
real traffic (a 404 every half second), one slow request (a slow upload), a first sample
that is either; none of them may drive the learnt limit down. And what the pipeline
passes: time spent waiting on the client is left out, an answer that says nothing of the
load teaches nothing."""

from __future__ import annotations

import heapq
import statistics
from dataclasses import dataclass, field

import pytest

from ratelimits.engine.adaptive import BEST_MIN, AdaptiveEngine, AdaptiveLimiter
from ratelimits.engine.types import Limit

WORK = 0.050  # the victims' latency while the service is not full (seconds)
PARALLEL = 8  # requests the service runs at once before it slows down
CHEAP = 0.001  # a 404's latency
CHEAP_EVERY = 0.5


@dataclass
class Run:
    """What `simulate` saw after its warm-up: admitted victims, the limit over time."""

    admitted: int = 0
    limits: list[int] = field(default_factory=list)

    @property
    def mean_limit(self) -> float:
        return statistics.fmean(self.limits)


def simulate(limiter: AdaptiveLimiter, *, cheap: bool, seconds: float = 30.0,
             clients: int = 24, retry: float = 0.02) -> Run:
    """`clients` closed-loop victims (next request when the last ends, or `retry` after
    a refusal) on a service that takes WORK × max(1, in flight / PARALLEL); with `cheap`,
    a request answered in CHEAP every CHEAP_EVERY seconds beside them, taught like any
    other (the engine cannot tell a cheap 200 from a costly one)."""
    attempts = [(0.0, i) for i in range(clients)]  # (time, client); client -1: cheap
    if cheap:
        attempts.append((CHEAP_EVERY, -1))
    heapq.heapify(attempts)
    ends: list[tuple[float, int, object]] = []
    in_flight, run, warm = 0, Run(), seconds / 3
    while attempts or ends:
        if ends and (not attempts or ends[0][0] <= attempts[0][0]):
            at, client, ticket = heapq.heappop(ends)
            in_flight -= 1
            limiter.release(ticket, at)  # type: ignore[arg-type]
            if at >= warm:
                run.limits.append(limiter.limit)
            if client >= 0 and at < seconds:
                heapq.heappush(attempts, (at, client))
            continue
        at, client = heapq.heappop(attempts)
        if client < 0 and at + CHEAP_EVERY < seconds:  # its own pace, admitted or not
            heapq.heappush(attempts, (at + CHEAP_EVERY, client))
        ticket = limiter.acquire(at)
        if ticket is None:
            if client >= 0:
                heapq.heappush(attempts, (at + retry, client))
            continue
        in_flight += 1
        latency = CHEAP if client < 0 else WORK * max(1.0, in_flight / PARALLEL)
        heapq.heappush(ends, (at + latency, client, ticket))
        if client >= 0 and at >= warm:
            run.admitted += 1
    return run


def test_a_cheap_answer_every_half_second_leaves_the_limit_where_it_was():
    """The red team's case: without the 404s the limit settles near the service's
    PARALLEL; with them, the lowest latency was the 404's, every victim looked like a
    queue of 50 and the limit fell to its floor."""
    alone = simulate(AdaptiveLimiter(maximum=40, floor=1, probe_every=10), cheap=False)
    beside = simulate(AdaptiveLimiter(maximum=40, floor=1, probe_every=10), cheap=True)
    assert alone.mean_limit >= PARALLEL / 2  # it learnt something worth keeping
    assert beside.mean_limit >= 0.8 * alone.mean_limit, (alone.mean_limit,
                                                         beside.mean_limit)
    assert beside.admitted >= 0.8 * alone.admitted, (alone.admitted, beside.admitted)


def _grown(maximum: int = 40) -> tuple[AdaptiveLimiter, float]:
    """A limiter at its maximum on a flat latency, and the time it got there."""
    limiter = AdaptiveLimiter(maximum=maximum, floor=1)
    now = 0.0
    while limiter.limit < maximum:
        tickets = [limiter.acquire(now) for _ in range(limiter.limit)]
        now += WORK
        for ticket in tickets:
            assert ticket is not None
            limiter.release(ticket, now)
    return limiter, now


def _serve_at_limit(limiter: AdaptiveLimiter, now: float, rounds: int) -> tuple[float, int]:
    """`rounds` of the whole limit at the flat latency; the time after, and the lowest
    limit seen meanwhile."""
    lowest = limiter.limit
    for _ in range(rounds):
        tickets = [limiter.acquire(now) for _ in range(limiter.limit)]
        now += WORK
        for ticket in tickets:
            if ticket is not None:
                limiter.release(ticket, now)
                lowest = min(lowest, limiter.limit)
    return now, lowest


def test_one_slow_request_does_not_collapse_a_learnt_limit():
    """A slow upload counted as latency (200× the others): the median of the recent
    latencies does not move for one sample, so neither does the limit."""
    limiter, now = _grown()
    slow = limiter.acquire(now)
    assert slow is not None
    now, lowest = _serve_at_limit(limiter, now, 1)
    limiter.release(slow, now + 200 * WORK)
    now, lowest_after = _serve_at_limit(limiter, now + 200 * WORK, 20)
    assert min(lowest, lowest_after) >= 36  # of 40: a few cheap steps at most
    assert limiter.limit == 40


@pytest.mark.parametrize("first", [200 * WORK, CHEAP])
def test_one_odd_first_sample_does_not_become_the_baseline(first):
    """From a cold start, the first sample is a slow upload or a 404: the limit grows as
    it does without it, and the baseline is the service's latency."""
    plain = AdaptiveLimiter(maximum=40, floor=1)
    odd = AdaptiveLimiter(maximum=40, floor=1)
    ticket = odd.acquire(0.0)
    assert ticket is not None
    odd.release(ticket, first)
    end = {}
    for name, limiter in (("plain", plain), ("odd", odd)):
        _serve_at_limit(limiter, first, 60)
        end[name] = limiter.limit
        assert limiter.best == pytest.approx(WORK)
    assert end["odd"] >= end["plain"] - 1, end


def test_no_baseline_and_no_change_before_enough_samples():
    limiter = AdaptiveLimiter(maximum=40, floor=1, initial=10)
    now = 0.0
    for _ in range(BEST_MIN - 1):
        ticket = limiter.acquire(now)
        assert ticket is not None
        now += WORK
        limiter.release(ticket, now)
        assert limiter.best is None and limiter.limit == 10


def test_a_probe_of_a_slow_service_lasts_until_it_measured_the_unloaded_latency():
    """0.4 s a request alone: a one-second probe at one request in flight would see two
    or three, too few to tell the service from an odd answer; it goes on until it has
    BEST_MIN, so `best` is the unloaded latency again, not the queue before the probe."""
    unit = 0.4
    limiter = AdaptiveLimiter(maximum=8, floor=1, initial=8, probe_every=30)
    now = 0.0
    while now < 30:  # a queue: 8 in flight, 8 × unit each
        tickets = [limiter.acquire(now) for _ in range(8)]
        now += 8 * unit
        for ticket in tickets:
            if ticket is not None:
                limiter.release(ticket, now)
    probed = 0
    while True:
        first, second = limiter.acquire(now), limiter.acquire(now)
        assert first is not None
        if second is not None:
            break  # the probe is over
        now += unit
        limiter.release(first, now)
        probed += 1
    assert probed == BEST_MIN
    assert limiter.best == pytest.approx(unit)


# -- what the pipeline passes ---------------------------------------------------------


def _limit() -> Limit:
    return Limit("global", "adaptive", 40, 60.0, floor=1, name="busy")


def test_the_time_spent_waiting_on_the_client_is_left_out():
    samples = []
    engine = AdaptiveEngine(on_sample=lambda *args: samples.append(args))
    decision = engine.take([_limit()], now=0.0)[0]
    engine.release(decision, now=10.0 + WORK, waited=10.0)  # a 10-second upload
    assert engine.limiter(_limit()).short == pytest.approx(WORK)
    assert samples[0][2] == pytest.approx(WORK)


def test_an_answer_that_says_nothing_of_the_load_teaches_nothing():
    samples = []
    engine = AdaptiveEngine(on_sample=lambda *args: samples.append(args))
    decision = engine.take([_limit()], now=0.0)[0]
    engine.release(decision, now=CHEAP, learn=False)  # a 404
    limiter = engine.limiter(_limit())
    assert (limiter.in_flight, limiter.short, samples) == (0, None, [])
    assert engine.in_flight() == 0


def test_a_request_waiting_on_its_client_holds_no_room():
    """A new limiter allows one request in flight; one that waits for its upload leaves
    room for another, counts again once it reads no more, and a release meanwhile
    leaves the count right."""
    engine = AdaptiveEngine()
    uploading = engine.take([_limit()], now=0.0)[0]
    limiter = engine.limiter(_limit())
    assert uploading.allowed and not engine.take([_limit()], now=0.0)[0].allowed
    engine.pause(uploading)
    other = engine.take([_limit()], now=0.0)[0]
    assert other.allowed
    engine.resume(uploading)  # counted again, room or not
    assert limiter.in_flight == 2
    engine.release(other, now=WORK)
    engine.pause(uploading)
    engine.release(uploading, now=WORK)  # released while it waited
    engine.resume(uploading)  # too late: nothing to count again
    assert limiter.in_flight == 0 and engine.in_flight() == 0
