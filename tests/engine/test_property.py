"""Random request sequences at explicit times: both backends must decide identically."""

from __future__ import annotations

import itertools
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ratelimits.engine import ALGORITHMS, Limit, MemoryEngine, RedisEngine
from ratelimits.engine.registry import REGISTRY
from tests.engine.conftest import T0

_run = itertools.count()


@st.composite
def limits(draw):
    algorithm = draw(st.sampled_from(ALGORITHMS))
    limit = draw(st.integers(1, 20))
    period = draw(st.sampled_from([0.5, 1, 7, 60, 3600]))
    burst = None
    spec = REGISTRY[algorithm]
    if spec.has_burst and draw(st.booleans()):
        # a queue may be empty; a bucket of capacity 0 could admit nothing
        burst = draw(st.integers(0 if spec.delays else 1, 25))
    shadow = draw(st.booleans())
    max_wait = warmup = 0.0
    if spec.reserves and draw(st.booleans()):
        max_wait = draw(st.sampled_from([0.001, 0.05, 0.3, 1.0, 7.5]))
    if spec.warms and draw(st.booleans()):
        warmup = draw(st.sampled_from([0.01, 0.5, 3, 60]))
    return Limit("k", algorithm, limit, period, burst=burst, shadow=shadow,
                 max_wait=max_wait, warmup=warmup)


@st.composite
def scenarios(draw):
    chosen = draw(st.lists(limits(), min_size=1, max_size=3))
    capacity = min(lim.capacity for lim in chosen)
    steps = draw(
        st.lists(
            st.tuples(
                st.sampled_from([0, 0, 1e-6, 0.001, 0.05, 0.3, 1, 5, 61]),
                st.integers(1, max(1, min(capacity, 3))),
                st.booleans(),  # release the concurrency slots afterwards
            ),
            min_size=1,
            max_size=40,
        )
    )
    return chosen, steps


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(scenario=scenarios())
def test_redis_and_memory_engines_agree(redis_client, scenario):
    chosen, steps = scenario
    run = next(_run)
    chosen = [replace(lim, name=f"r{run}-{i}") for i, lim in enumerate(chosen)]
    redis_engine, memory_engine = RedisEngine(redis_client), MemoryEngine()
    now = T0
    for dt, cost, release in steps:
        now += dt
        batch = [replace(lim, cost=min(cost, lim.capacity)) for lim in chosen]
        a = redis_engine.evaluate(batch, now=now)
        b = memory_engine.evaluate(batch, now=now)
        assert a.allowed == b.allowed
        assert a.results == b.results
        assert (a.retry_after, a.delay) == (b.retry_after, b.delay)
        if release:
            redis_engine.release(a)
            memory_engine.release(b)
    hours = {int(T0 // 3600), int(now // 3600)}
    for lim in chosen:
        for hour in hours:
            assert redis_engine.offenders(lim.name, hour) == memory_engine.offenders(lim.name, hour)
