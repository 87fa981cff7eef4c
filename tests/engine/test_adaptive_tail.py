"""The adaptive limit against a tail the median hides, in simulated time: a process
that keeps up with CAPACITY requests at once, where each one beyond them waits for the
process (its own CPU, one interpreter lock) and comes back SLOW. Below twice CAPACITY
fewer than half of the answers are slow, so the median of the latencies looks unloaded
while the tail is several times the unloaded latency."""

from __future__ import annotations

import statistics

from ratelimits.engine.adaptive import AdaptiveLimiter

WORK = 0.006  # a request's latency while the process keeps up (seconds)
SLOW = 4 * WORK  # one that waited for the process
CAPACITY = 4


def serve(limiter: AdaptiveLimiter, rounds: int) -> tuple[list[int], list[float]]:
    """`rounds` bursts of as many requests as the limit admits, the first CAPACITY of
    each answered in WORK and the others in SLOW; the limit after each burst, and the
    latencies of the last half of the rounds."""
    now, limits, latencies = 0.0, [], []
    for round_ in range(rounds):
        tickets = []
        while (ticket := limiter.acquire(now)) is not None:
            tickets.append(ticket)
        for i, ticket in enumerate(tickets):
            took = WORK if i < CAPACITY else SLOW
            limiter.release(ticket, now + took)
            if round_ >= rounds // 2:
                latencies.append(took)
        now += SLOW
        limits.append(limiter.limit)
    return limits, latencies


def test_a_tail_of_slow_answers_that_the_median_hides_holds_the_limit_down():
    """With the median as the latency now, the limit settled near 6 and a third of the
    answers were slow; with the latency nine tenths of the recent answers are at or
    below, it stays near CAPACITY and fewer than a quarter are."""
    limits, latencies = serve(AdaptiveLimiter(maximum=64, floor=1), rounds=400)
    settled = limits[200:]
    slow_share = sum(took == SLOW for took in latencies) / len(latencies)
    assert statistics.fmean(settled) <= CAPACITY + 1, statistics.fmean(settled)
    assert slow_share < 0.25, slow_share
    assert min(settled) > 1  # held down, not collapsed to the floor


def test_the_limit_still_grows_to_capacity_when_no_answer_is_slow():
    """The same process with room for every request: nothing slow, nothing to hold."""
    limiter = AdaptiveLimiter(maximum=16, floor=1)
    now = 0.0
    for _ in range(400):
        tickets = []
        while (ticket := limiter.acquire(now)) is not None:
            tickets.append(ticket)
        for ticket in tickets:
            limiter.release(ticket, now + WORK)
        now += SLOW
    assert limiter.limit == 16
