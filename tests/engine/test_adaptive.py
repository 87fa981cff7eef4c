"""The adaptive limiter's rule, driven with explicit times: bounds, growth, the guard
against growing unasked, probing, and a closed-loop simulation of a service whose latency
grows with the requests in flight."""

from __future__ import annotations

import heapq
import math

import pytest

from ratelimits.engine.adaptive import BEST_MIN, AdaptiveLimiter

BASE = 0.005  # the service's latency with one request in flight (seconds)


def _serve(limiter: AdaptiveLimiter, n: int, start: float, latency: float) -> float:
    """Up to `n` requests at once (as many as the limiter admits), each taking
    `latency`; the time they end."""
    tickets = [limiter.acquire(start) for _ in range(n)]
    for ticket in tickets:
        if ticket is not None:
            limiter.release(ticket, start + latency)
    return start + latency


def test_the_arguments_are_checked():
    with pytest.raises(ValueError, match="floor"):
        AdaptiveLimiter(maximum=5, floor=6)
    with pytest.raises(ValueError, match="tolerance"):
        AdaptiveLimiter(maximum=5, tolerance=0.5)
    with pytest.raises(ValueError, match="probe_every"):
        AdaptiveLimiter(maximum=5, probe_for=10, probe_every=5)


def test_a_flat_latency_grows_the_limit_to_its_maximum_and_no_further():
    limiter = AdaptiveLimiter(maximum=50, floor=2)
    now = 0.0
    for _ in range(200):  # always using the whole limit, latency never moves
        now = _serve(limiter, limiter.limit, now, BASE)
    assert limiter.limit == 50


def test_rising_latency_shrinks_the_limit_but_never_below_the_floor():
    limiter = AdaptiveLimiter(maximum=50, floor=3, initial=40)
    now = _serve(limiter, 40, 0.0, BASE)  # the best latency, unloaded
    for _ in range(100):
        now = _serve(limiter, limiter.limit, now, 20 * BASE)  # a queue of 20× builds up
    assert limiter.limit == 3


def test_a_limit_not_used_does_not_grow():
    """Samples with fewer than half the limit in flight are no evidence for more."""
    limiter = AdaptiveLimiter(maximum=100, floor=1, initial=20)
    now = 0.0
    for _ in range(200):
        now = _serve(limiter, 2, now, BASE)
    assert limiter.limit == 20


def test_refuses_once_the_limit_is_in_flight():
    limiter = AdaptiveLimiter(maximum=10, floor=3)
    tickets = [limiter.acquire(0.0) for _ in range(4)]
    assert [t is not None for t in tickets] == [True, True, True, False]
    limiter.release(tickets[0], 0.001)
    assert limiter.acquire(0.001) is not None


def test_a_probe_measures_the_best_latency_again():
    """A service that got slower for good: the old best goes, the limit recovers."""
    limiter = AdaptiveLimiter(maximum=40, floor=1, initial=10, probe_for=0.1, probe_every=1.0)
    now = 0.0
    for _ in range(50):
        now = _serve(limiter, limiter.limit, now, BASE)
    grown = limiter.limit
    for _ in range(500):  # four times slower, whatever the load
        now = _serve(limiter, limiter.limit, now, 4 * BASE)
    assert limiter.best == pytest.approx(4 * BASE)
    assert limiter.limit >= grown  # the slowdown is the new normal, not a queue


def simulate(acquire, release, clients: int = 40, seconds: float = 60.0,
             retry: float = 0.005, parallel: int = 1) -> tuple[list[float], int]:
    """A closed loop of `clients`, each sending its next request when the last one ends
    (or `retry` after a refusal), against a service that runs `parallel` requests at
    BASE each and slows down in proportion beyond: a request's latency is BASE ×
    max(1, in flight / parallel) when it starts. Returns the latencies of the requests
    admitted after the first tenth of the run, and how many were admitted then."""
    events = [(0.0, i) for i in range(clients)]  # (time, client) of each next attempt
    heapq.heapify(events)
    ends: list[tuple[float, int, object]] = []
    in_flight = 0
    latencies: list[float] = []
    admitted = 0
    warm = seconds / 10
    while events or ends:
        if ends and (not events or ends[0][0] <= events[0][0]):
            at, client, ticket = heapq.heappop(ends)
            in_flight -= 1
            release(ticket, at)
            if at < seconds:
                heapq.heappush(events, (at, client))
            continue
        at, client = heapq.heappop(events)
        ticket = acquire(at)
        if ticket is None:
            heapq.heappush(events, (at + retry, client))
            continue
        in_flight += 1
        latency = BASE * max(1.0, in_flight / parallel)
        heapq.heappush(ends, (at + latency, client, ticket))
        if at >= warm:
            latencies.append(latency)
            admitted += 1
    return latencies, admitted


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[math.ceil(0.95 * len(ordered)) - 1]


class _Fixed:
    def __init__(self, limit: int) -> None:
        self.limit, self.in_flight = limit, 0

    def acquire(self, now: float) -> object | None:
        if self.in_flight >= self.limit:
            return None
        self.in_flight += 1
        return object()

    def release(self, ticket: object, now: float) -> None:
        self.in_flight -= 1


@pytest.mark.parametrize("parallel", [1, 8])
def test_forty_clients_keep_the_latency_near_the_unloaded_one(parallel):
    """The issue's scenario in simulated time (`parallel` 1: latency 5 ms × in flight),
    and a service that runs 8 at once before it slows down: with the adaptive limit the
    p95 latency stays within 3× the unloaded latency and the throughput within 0.8× of
    the best fixed limit of a sweep; without a limit, the latency is the whole crowd's."""
    limiter = AdaptiveLimiter(maximum=40, floor=1)
    latencies, admitted = simulate(limiter.acquire, limiter.release, parallel=parallel)
    assert _p95(latencies) <= 3 * BASE
    swept = {}
    for limit in (1, 2, 4, 8, 16, 40):
        fixed = _Fixed(limit)
        swept[limit] = simulate(fixed.acquire, fixed.release, parallel=parallel)[1]
    assert admitted >= 0.8 * max(swept.values()), (admitted, swept)
    unlimited = _Fixed(10**9)
    crowd = simulate(unlimited.acquire, unlimited.release, parallel=parallel)[0]
    assert _p95(crowd) >= 40 / parallel * BASE


# -- the engine of a process's adaptive limits ---------------------------------------------

from ratelimits.engine.adaptive import AdaptiveEngine  # noqa: E402
from ratelimits.engine.types import Limit, Outcome  # noqa: E402


def _limit(name="busy", maximum=4, floor=2, shadow=False, period=60.0):
    return Limit("global", "adaptive", maximum, period, floor=floor, name=name, shadow=shadow)


def test_the_engine_admits_up_to_the_learnt_limit_and_refuses_with_a_retry_after():
    engine = AdaptiveEngine()
    limit = _limit(floor=2)  # a new limiter starts at its floor
    first, second, third = (engine.take([limit], now=0.0)[0] for _ in range(3))
    assert [d.allowed for d in (first, second, third)] == [True, True, False]
    assert third.results[0].outcome is Outcome.REJECTED
    assert third.retry_after == 1
    assert first.token and second.token and third.token is None
    engine.release(first, now=0.005)
    assert engine.take([limit], now=0.005)[0].allowed  # the slot came back


def test_release_teaches_the_limit_and_reports_each_sample():
    samples = []
    engine = AdaptiveEngine(on_sample=lambda *args: samples.append(args))
    limit = _limit(maximum=10, floor=1)
    now = 0.0
    for _ in range(100):  # one in flight at a time, always at the limit, latency flat
        decisions = [engine.take([limit], now=now)[0]
                     for _ in range(engine.limiter(limit).limit)]
        for decision in decisions:
            engine.release(decision, now=now + BASE)
        now += BASE
    assert engine.limiter(limit).limit == 10
    assert len(samples) >= 100
    seen_limit, at, latency, learnt = samples[-1]
    assert seen_limit == limit and at == pytest.approx(now) and learnt == 10
    assert latency == pytest.approx(BASE)


def test_all_or_nothing_over_two_limits_and_a_refund_teaches_nothing():
    engine = AdaptiveEngine()
    wide, narrow = _limit("wide", 5, 5), _limit("narrow", 1, 1)
    held, _ = engine.take([wide, narrow], now=0.0)
    refused, receipt = engine.take([wide, narrow], now=0.0)
    assert not refused.allowed and receipt is None
    assert [r.outcome for r in refused.results] == [Outcome.SPARED, Outcome.REJECTED]
    assert engine.limiter(wide).in_flight == 1  # the refused request took nothing
    engine.release(held, now=0.01)
    decision, receipt = engine.take([wide, narrow], now=0.02)
    assert decision.allowed and receipt is not None
    spared = engine.refund(receipt)  # refused after this engine admitted it
    assert not spared.allowed
    assert [r.outcome for r in spared.results] == [Outcome.SPARED, Outcome.SPARED]
    assert engine.limiter(narrow).in_flight == 0 and engine.in_flight() == 0
    assert engine.limiter(narrow).short == pytest.approx(0.01)  # only the first taught it


def test_a_shadow_limit_refuses_nothing_and_counts_every_request_in_flight(caplog):
    engine = AdaptiveEngine()
    limit = _limit(floor=1, shadow=True)
    decisions = [engine.take([limit], now=0.0)[0] for _ in range(3)]
    assert all(d.allowed for d in decisions)
    assert [d.results[0].outcome for d in decisions] == [
        Outcome.ADMITTED, Outcome.WOULD_REJECT, Outcome.WOULD_REJECT]
    assert engine.limiter(limit).in_flight == 3
    with caplog.at_level("INFO", logger="ratelimits"):
        for decision in decisions:
            engine.release(decision, now=0.05)
    assert "'busy' would set (shadow): limit 1 in flight" in caplog.text


def test_a_shadow_probe_keeps_the_best_latency_it_cannot_measure_again():
    limiter = AdaptiveLimiter(maximum=40, floor=1, probe_every=10)
    limiter.shadow = True
    now = 0.0
    for _ in range(BEST_MIN):  # enough unloaded samples to know the unloaded latency
        now = _serve(limiter, 1, now, BASE)
    for _ in range(50):  # every request runs: latency of the whole crowd
        tickets = [limiter.enter(now) for _ in range(40)]
        for ticket in tickets:
            limiter.release(ticket, now + 40 * BASE)
        now += 40 * BASE
    assert now > 10  # past a probe's time
    assert limiter.best == pytest.approx(BASE)
    assert limiter.limit == 1


def test_an_edited_policy_keeps_what_was_learnt_within_its_new_bounds():
    engine = AdaptiveEngine()
    limiter = engine.limiter(_limit(maximum=50, floor=1))
    now = 0.0
    for _ in range(300):
        now = _serve(limiter, limiter.limit, now, BASE)
    assert limiter.limit == 50
    assert engine.limiter(_limit(maximum=20, floor=1)) is limiter
    assert limiter.limit == 20
    engine.limiter(_limit(maximum=20, floor=20))
    assert limiter.limit == 20 and limiter.floor == 20
