"""Scenario tables, with explicit times, that every engine must answer identically: in
process, Redis, Redis behind the local-first layer, the cluster, and both asyncio twins.

Each row: (seconds after T0, cost) -> (allowed, remaining, retry_after, delay).

The tables' clock stands still, but Redis expires a key in real time, after as long as
its state matters from the row that wrote it. So no table keeps state for less than
several seconds: a machine that stalls a few hundred milliseconds between two rows must
not see a key vanish that the table's clock says is alive.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from ratelimits.engine import Limit
from tests.engine.conftest import T0

SCENARIOS = {
    # 5 per 1000 s aligned windows: the limit resets at the boundary, so 10 pass in 20 s.
    "fixed_window boundary burst": (
        Limit("c", "fixed_window", 5, 1000),
        [
            ((980.0, 1), (True, 4, 0, 0)),
            ((980.0, 1), (True, 3, 0, 0)),
            ((980.0, 2), (True, 1, 0, 0)),
            ((980.0, 1), (True, 0, 0, 0)),
            ((990.0, 1), (False, 0, 10.0, 0)),
            ((1000.0, 5), (True, 0, 0, 0)),
            ((1010.0, 1), (False, 0, 990.0, 0)),
        ],
    ),
    # The same traffic through a sliding window: the previous window still weighs in.
    "sliding_window no boundary burst": (
        Limit("c", "sliding_window", 5, 10),
        [
            ((9.8, 5), (True, 0, 0, 0)),
            ((10.0, 1), (False, 0, 2.0, 0)),  # needs 5 * (10 - e)/10 <= 4: e >= 2
            ((12.0, 1), (True, 0, 0, 0)),
            ((12.0, 1), (False, 0, 2.0, 0)),  # cur 1: needs 5(10-e)/10 <= 3: e >= 4
            ((15.0, 1), (True, 0, 0, 0)),  # est 2.5 + 1 + 1 <= 5
        ],
    ),
    # Exact: no more than 5 in any 10 s interval, and retry_after names the instant.
    "sliding_log exact": (
        Limit("c", "sliding_log", 5, 10),
        [
            ((1.0, 2), (True, 3, 0, 0)),
            ((9.8, 3), (True, 0, 0, 0)),
            ((10.0, 1), (False, 0, 1.0, 0)),
            ((11.0, 1), (True, 1, 0, 0)),  # the two units of t=1 left at t=11
            ((11.0, 1), (True, 0, 0, 0)),
            ((11.0, 1), (False, 0, 8.8, 0)),
            ((19.8, 3), (True, 0, 0, 0)),
        ],
    ),
    # Burst of 5, then one every 6 s (10 per minute).
    "token_bucket burst then steady": (
        Limit("c", "token_bucket", 10, 60, burst=5),
        [((0.0, 1), (True, 4 - i, 0, 0)) for i in range(5)]
        + [
            ((0.0, 1), (False, 0, 6.0, 0)),
            ((3.0, 1), (False, 0, 3.0, 0)),
            ((6.0, 1), (True, 0, 0, 0)),
            ((12.0, 2), (False, 1, 6.0, 0)),
            ((18.0, 2), (True, 0, 0, 0)),
            ((60.0, 5), (True, 0, 0, 0)),  # refilled to the burst, no further
        ],
    ),
    # 10 per 100 s, up to 3 queued: delays of 10 s per queued request, then rejection.
    "leaky_bucket delays": (
        Limit("c", "leaky_bucket", 10, 100, burst=3),
        [
            ((0.0, 1), (True, 3, 0, 0.0)),
            ((0.0, 1), (True, 2, 0, 10.0)),
            ((0.0, 1), (True, 1, 0, 20.0)),
            ((0.0, 1), (True, 0, 0, 30.0)),
            ((0.0, 1), (False, 0, 10.0, 0)),
            ((10.0, 1), (True, 0, 0, 30.0)),
            ((100.0, 1), (True, 3, 0, 0.0)),
        ],
    ),
    # Without a burst a leaky bucket is a pure shaper: one per 10 s, none queued.
    "leaky_bucket without queue": (
        Limit("c", "leaky_bucket", 10, 100),
        [
            ((0.0, 1), (True, 0, 0, 0)),
            ((5.0, 1), (False, 0, 5.0, 0)),
            ((10.0, 1), (True, 0, 0, 0)),
        ],
    ),
    # 7 per 100 s, burst 2: retry_after is the emission interval 100/7 s, to the µs
    # (rounded up: 14.2857142... s is 14.285715).
    "gcra burst and exact retry": (
        Limit("c", "gcra", 7, 100, burst=2),
        [
            ((0.0, 1), (True, 1, 0, 0)),
            ((0.0, 1), (True, 0, 0, 0)),
            ((0.0, 1), (False, 0, 14.285715, 0)),
            ((14.285715, 1), (True, 0, 0, 0)),
            ((14.285715, 1), (False, 0, 14.285714, 0)),
        ],
    ),
    # Warm-up (T = 1 s, burst 3 so C = 3 s, W = 6 s). A cold client is paced without
    # burst, each request's gap 1 + 2w/W seconds for the warm-up w still to go, which the
    # request uses up: gaps of 3 s, 2 s, then warm (w - gap <= 0), with the full rate and
    # the burst the algorithm saved meanwhile.
    "gcra warm-up from cold": (
        Limit("c", "gcra", 1, 1, burst=3, warmup=6),
        [
            ((0.0, 1), (True, 0, 0, 0)),  # gap 3: next at 3, w 3
            ((1.0, 1), (False, 0, 2.0, 0)),  # paced at a third of the rate
            ((3.0, 1), (True, 0, 0, 0)),  # gap 2: next at 5, w 1
            ((4.0, 1), (False, 0, 1.0, 0)),
            ((5.0, 1), (True, 2, 0, 0)),  # warm: gcra's own figures again
            ((5.0, 1), (True, 1, 0, 0)),  # and its burst
            ((5.0, 1), (True, 0, 0, 0)),
            ((5.0, 1), (False, 0, 1.0, 0)),  # refused by gcra, not by the warm-up
        ],
    ),
    # Idleness cools a client again (W = 4 s, C = 2 s): 1.5 s idle after its last turn
    # (6.5) gives back 3 s of warm-up, a gap of 2.5 s; 2 s idle makes it cold.
    "gcra warm-up cools when idle": (
        Limit("c", "gcra", 1, 1, burst=2, warmup=4),
        [
            ((0.0, 1), (True, 0, 0, 0)),  # gap 3
            ((3.0, 1), (True, 1, 0, 0)),  # gap 1.5 uses the last 1 s of warm-up: warm
            ((4.5, 1), (True, 1, 0, 0)),
            ((4.5, 1), (True, 0, 0, 0)),  # the last turn: 5.5 to 6.5
            ((8.0, 1), (True, 0, 0, 0)),  # w 3: gap 2.5, 0.5 s of warm-up left
            ((9.0, 1), (False, 0, 1.5, 0)),
            ((10.5, 1), (True, 1, 0, 0)),  # gap 1.25: warm
            ((10.5, 1), (True, 0, 0, 0)),  # the last turn: 11.75 to 12.75
            ((14.75, 1), (True, 0, 0, 0)),  # 2 s idle: cold, gap 3
            ((15.75, 1), (False, 0, 2.0, 0)),
        ],
    ),
    # The same rule on a token bucket: its tokens refill while the warm-up paces.
    "token_bucket warm-up from cold": (
        Limit("c", "token_bucket", 1, 1, burst=2, warmup=4),
        [
            ((0.0, 1), (True, 0, 0, 0)),
            ((1.0, 1), (False, 0, 2.0, 0)),
            ((3.0, 1), (True, 1, 0, 0)),  # warm, and the bucket is full again
            ((3.0, 1), (True, 0, 0, 0)),
            ((3.0, 1), (False, 0, 1.0, 0)),
        ],
    ),
    # max_wait 25 s at one per 10 s without burst: a turn within 25 s is admitted now with
    # its wait as the delay (a reservation); one further ahead is refused until it is within.
    "gcra max_wait reserves turns": (
        Limit("c", "gcra", 10, 100, burst=1, max_wait=25),
        [
            ((0.0, 1), (True, 0, 0, 0)),
            ((0.0, 1), (True, 0, 0, 10.0)),
            ((0.0, 1), (True, 0, 0, 20.0)),
            ((0.0, 1), (False, 0, 5.0, 0)),  # its turn, 30, is 5 s beyond the wait
            ((5.0, 1), (True, 0, 0, 25.0)),
            ((5.0, 1), (False, 0, 10.0, 0)),  # the turns up to 40 are all taken
        ],
    ),
    # A token bucket borrows against its refill: tokens go below zero by at most what
    # max_wait refills (30 s at one per 10 s = 3), each borrowed token a 10 s later turn.
    "token_bucket max_wait borrows ahead": (
        Limit("c", "token_bucket", 10, 100, burst=2, max_wait=30),
        [
            ((0.0, 1), (True, 1, 0, 0)),
            ((0.0, 1), (True, 0, 0, 0)),
            ((0.0, 1), (True, 0, 0, 10.0)),
            ((0.0, 1), (True, 0, 0, 20.0)),
            ((0.0, 1), (True, 0, 0, 30.0)),
            ((0.0, 1), (False, 0, 10.0, 0)),
            ((100.0, 2), (True, 0, 0, 0)),  # paid back: 7 refilled, capped at 2
        ],
    ),
    # A leaky bucket's queue grows by max_wait: burst 1 (10 s) + 20 s.
    "leaky_bucket max_wait lengthens the queue": (
        Limit("c", "leaky_bucket", 10, 100, burst=1, max_wait=20),
        [
            ((0.0, 1), (True, 1, 0, 0)),
            ((0.0, 1), (True, 0, 0, 10.0)),
            ((0.0, 1), (True, 0, 0, 20.0)),
            ((0.0, 1), (True, 0, 0, 30.0)),
            ((0.0, 1), (False, 0, 10.0, 0)),
        ],
    ),
    # Warm-up with max_wait: a paced turn within the wait is reserved, not refused.
    "gcra warm-up with max_wait": (
        Limit("c", "gcra", 1, 1, burst=2, warmup=4, max_wait=2),
        [
            ((0.0, 1), (True, 0, 0, 0)),  # paced: the next turn at 3
            ((0.5, 1), (False, 0, 0.5, 0)),  # 2.5 s away: beyond the wait by 0.5 s
            ((1.0, 1), (True, 1, 0, 2.0)),  # within it: admitted, to wait 2 s
        ],
    ),
    # Two in flight at most; entries that are never released expire after the period.
    "concurrency expiry": (
        Limit("c", "concurrency", 2, 30),
        [
            ((0.0, 1), (True, 1, 0, 0)),
            ((1.0, 1), (True, 0, 0, 0)),
            ((2.0, 1), (False, 0, 1.0, 0)),
            ((30.0, 1), (True, 0, 0, 0)),  # the first slot expired
            ((30.5, 1), (False, 0, 1.0, 0)),
        ],
    ),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_scenario(every_engine, name):
    limit, rows = SCENARIOS[name]
    for (at, cost), (allowed, remaining, retry_after, delay) in rows:
        lim = dataclasses.replace(limit, cost=cost)
        decision = every_engine.evaluate([lim], now=T0 + at)
        result = decision.results[0]
        got = (result.allowed, result.remaining, result.retry_after, result.delay)
        assert decision.allowed is allowed, (at, cost, got)
        assert result.allowed is allowed, (at, cost, got)
        assert result.remaining == remaining, (at, cost, got)
        assert result.retry_after == pytest.approx(retry_after, abs=1e-6), (at, cost, got)
        assert result.delay == pytest.approx(delay, abs=1e-6), (at, cost, got)
        # the request's Retry-After: this wait in whole seconds, rounded up, at least 1
        assert decision.retry_after == (0 if allowed else max(1, math.ceil(result.retry_after)))
