"""Scenario tables, with explicit times, that both backends must answer identically.

Each row: (seconds after T0, cost) -> (allowed, remaining, retry_after, delay).
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from ratelimits.engine import Limit
from tests.engine.conftest import T0

SCENARIOS = {
    # 5 per 10 s aligned windows: the limit resets at the boundary, so 10 pass in 0.2 s.
    "fixed_window boundary burst": (
        Limit("c", "fixed_window", 5, 10),
        [
            ((9.8, 1), (True, 4, 0, 0)),
            ((9.8, 1), (True, 3, 0, 0)),
            ((9.8, 2), (True, 1, 0, 0)),
            ((9.8, 1), (True, 0, 0, 0)),
            ((9.9, 1), (False, 0, 0.1, 0)),
            ((10.0, 5), (True, 0, 0, 0)),
            ((10.1, 1), (False, 0, 9.9, 0)),
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
    # 10 per second, up to 3 queued: delays of 0.1 s per queued request, then rejection.
    "leaky_bucket delays": (
        Limit("c", "leaky_bucket", 10, 1, burst=3),
        [
            ((0.0, 1), (True, 3, 0, 0.0)),
            ((0.0, 1), (True, 2, 0, 0.1)),
            ((0.0, 1), (True, 1, 0, 0.2)),
            ((0.0, 1), (True, 0, 0, 0.3)),
            ((0.0, 1), (False, 0, 0.1, 0)),
            ((0.1, 1), (True, 0, 0, 0.3)),
            ((1.0, 1), (True, 3, 0, 0.0)),
        ],
    ),
    # Without a burst a leaky bucket is a pure shaper: one per 0.1 s, none queued.
    "leaky_bucket without queue": (
        Limit("c", "leaky_bucket", 10, 1),
        [
            ((0.0, 1), (True, 0, 0, 0)),
            ((0.05, 1), (False, 0, 0.05, 0)),
            ((0.1, 1), (True, 0, 0, 0)),
        ],
    ),
    # 7 per second, burst 2: retry_after is the emission interval 1/7 s, to the µs.
    "gcra burst and exact retry": (
        Limit("c", "gcra", 7, 1, burst=2),
        [
            ((0.0, 1), (True, 1, 0, 0)),
            ((0.0, 1), (True, 0, 0, 0)),
            ((0.0, 1), (False, 0, 0.142858, 0)),
            ((0.142858, 1), (True, 0, 0, 0)),
            ((0.142858, 1), (False, 0, 0.142857, 0)),
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
def test_scenario(engine, name):
    limit, rows = SCENARIOS[name]
    for (at, cost), (allowed, remaining, retry_after, delay) in rows:
        lim = dataclasses.replace(limit, cost=cost)
        decision = engine.evaluate([lim], now=T0 + at)
        result = decision.results[0]
        got = (result.allowed, result.remaining, result.retry_after, result.delay)
        assert decision.allowed is allowed, (at, cost, got)
        assert result.allowed is allowed, (at, cost, got)
        assert result.remaining == remaining, (at, cost, got)
        assert result.retry_after == pytest.approx(retry_after, abs=1e-6), (at, cost, got)
        assert result.delay == pytest.approx(delay, abs=1e-6), (at, cost, got)
        # the request's Retry-After: this wait in whole seconds, rounded up, at least 1
        assert decision.retry_after == (0 if allowed else max(1, math.ceil(result.retry_after)))
